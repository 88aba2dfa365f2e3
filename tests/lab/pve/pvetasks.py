"""Tasks: UPIDs, logs, status (PVE::RESTEnvironment::fork_worker semantics), and a task's worker process
(`labctl task-worker`, tests/lab/programs.py).

Part of the simulated PVE node (tests/lab/pve/__init__.py).
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import time
import traceback

from pve import apischema, pvenode, taskops


def proc_starttime(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            data = f.read()
        return int(data.rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def make_upid(pid: int, ttype: str, tid: str, user: str, starttime: int | None = None) -> str:
    # proxmox-lxc.md §3: UPID:<node>:<pid hex>:<pstart hex>:<starttime hex>:<type>:<id>:<user>:
    pstart = proc_starttime(pid) or 0
    starttime = starttime or int(time.time())
    return f"UPID:{pvenode.NODE}:{pid:08X}:{pstart:08X}:{starttime:08X}:{ttype}:{tid}:{user}:"


def parse_upid(upid: str) -> dict:
    """pve-common PVE::Tools::upid_decode; an unparsable UPID is 400 `{"upid": "unable to parse worker upid"}`
    (pve-manager PVE/API2/Tasks.pm, `raise_param_exc`)."""
    m = re.fullmatch(r"UPID:([a-zA-Z0-9]([a-zA-Z0-9\-]*[a-zA-Z0-9])?):([0-9A-Fa-f]{8}):([0-9A-Fa-f]{8,9}):"
                     r"([0-9A-Fa-f]{8}):([^:\s]+):([^:\s]*):([^:\s]+):", upid or "")
    if not m:
        raise pvenode.param_error({"upid": "unable to parse worker upid"})
    return {"upid": upid, "node": m.group(1), "pid": int(m.group(3), 16), "pstart": int(m.group(4), 16),
            "starttime": int(m.group(5), 16), "type": m.group(6), "id": m.group(7), "user": m.group(8)}


def task_file_checked(upid: str) -> dict:
    """upid_decode plus the task's file: 400 `{"upid": "no such task"}` without it (Tasks.pm)."""
    info = parse_upid(upid)
    if info["node"] != pvenode.NODE or not os.path.exists(task_file(upid, "log")):
        raise pvenode.param_error({"upid": "no such task"})
    return info


def task_file(upid: str, ext: str) -> str:
    return f"{pvenode.TASK_DIR}/{upid.replace(':', '_')}.{ext}"


class Task:
    """One running task: writes its log like PVE (lines, then TASK OK / TASK ERROR: ...)."""

    def __init__(self, ttype: str, tid, user: str, echo: bool = False):
        os.makedirs(pvenode.TASK_DIR, exist_ok=True)
        self.upid = make_upid(os.getpid(), ttype, str(tid), user)
        self.echo = echo
        self.log = open(task_file(self.upid, "log"), "a", buffering=1)

    def say(self, line: str) -> None:
        self.log.write(line.rstrip("\n") + "\n")
        if self.echo:
            print(line, flush=True)

    def finish(self, error: str | None) -> None:
        status = "OK" if error is None else error.strip()
        if error is None:
            self.log.write("TASK OK\n")
        else:
            self.log.write(f"TASK ERROR: {status}\n")
            if self.echo:
                print(status, file=sys.stderr, flush=True)
        self.log.close()
        tmp = task_file(self.upid, "status.tmp")
        with open(tmp, "w") as f:
            json.dump({"exitstatus": status, "endtime": int(time.time())}, f)
        os.replace(tmp, task_file(self.upid, "status"))


def run_task(task: Task, func, *args) -> bool:
    try:
        func(task, *args)
    except pvenode.PVEError as e:
        task.finish(e.msg)
        return False
    except Exception as e:  # a lab bug: keep the traceback in the task log
        task.say(traceback.format_exc())
        task.finish(str(e) or e.__class__.__name__)
        return False
    task.finish(None)
    return True


def _task_exitstatus(upid: str) -> str | None:
    try:
        with open(task_file(upid, "status")) as f:
            return json.load(f)["exitstatus"]
    except FileNotFoundError:
        return None


def task_status(upid: str) -> dict:
    """GET tasks/{upid}/status (pve-manager PVE/API2/Tasks.pm read_task_status): running while the worker
    (pid + start time) lives; stopped with `exitstatus` (upid_read_status: `OK`, the error, or
    `unexpected status` when the log has no end line) otherwise."""
    info = task_file_checked(upid)
    res = dict(info)
    if proc_starttime(info["pid"]) == info["pstart"]:
        res["status"] = "running"
        return res
    res["status"] = "stopped"
    res["exitstatus"] = _task_exitstatus(upid) or "unexpected status"
    return res


def task_log(upid: str, start: int = 0, limit: int = 50) -> list:
    task_file_checked(upid)
    with open(task_file(upid, "log")) as f:
        lines = f.read().splitlines()
    sel = lines[start:start + limit] if limit else lines[start:]
    return [{"n": start + i + 1, "t": t} for i, t in enumerate(sel)]


def _status_type(status: str | None) -> str:
    """pve-common PVE::Tools::upid_normalize_status_type."""
    if not status:
        return "unknown"
    if status == "OK":
        return "ok"
    if status.startswith("WARNINGS:"):
        return "warning"
    if status == "RUNNING":
        return "unknown"
    return "error"


def list_tasks(p: dict | None = None) -> list:
    """GET /nodes/{node}/tasks as pve-manager PVE/API2/Tasks.pm node_tasks: `source` archive (default: the
    finished tasks, newest first, `status` = the exit text), active (the running ones, status `RUNNING`) or
    all; the filters userfilter (substring, case-insensitive), typefilter, vmid, since/until, statusfilter or
    errors, then start/limit."""
    p = dict(p or {})
    start, limit = int(p.get("start") or 0), int(p.get("limit") if p.get("limit") not in (None, "") else 50)
    source = p.get("source") or "archive"
    statusfilter = {"ok": True, "warning": True, "error": True, "unknown": True}
    errors_only = p.get("errors") == "1"
    if p.get("statusfilter") is not None and not errors_only:
        statusfilter = {k: False for k in statusfilter}
        for f in apischema.split_list(p["statusfilter"]):
            statusfilter[f.lower()] = True
    elif errors_only:
        statusfilter["ok"] = False
    tasks = []
    if os.path.isdir(pvenode.TASK_DIR):
        for name in os.listdir(pvenode.TASK_DIR):
            if not name.endswith(".log"):
                continue
            upid = name[:-4].replace("_", ":")
            try:
                info = parse_upid(upid)
            except pvenode.PVEError:
                continue
            if info["node"] != pvenode.NODE:  # another node's task (each node lists its own, /var/log/pve/tasks)
                continue
            exit_text = _task_exitstatus(upid)
            running = exit_text is None and proc_starttime(info["pid"]) == info["pstart"]
            if running:
                info["status"] = "RUNNING"
            else:
                info["status"] = exit_text or "unexpected status"
                with contextlib.suppress(OSError, ValueError, KeyError):
                    with open(task_file(upid, "status")) as f:
                        info["endtime"] = int(json.load(f)["endtime"])
            info["_running"] = running
            tasks.append(info)
    tasks.sort(key=lambda t: t["starttime"], reverse=True)
    res, count = [], 0
    for t in tasks:
        if source == "archive" and t["_running"] or source == "active" and not t["_running"]:
            continue
        if p.get("userfilter") and p["userfilter"].lower() not in t["user"].lower():
            continue
        if p.get("typefilter") and t["type"] != p["typefilter"]:
            continue
        if p.get("vmid") and t["id"] != str(p["vmid"]):
            continue
        if p.get("since") not in (None, "") and t["starttime"] < int(p["since"]):
            continue
        if p.get("until") not in (None, "") and t["starttime"] > int(p["until"]):
            continue
        if not statusfilter.get(_status_type(t["status"])):
            continue
        count += 1
        if count <= start or len(res) >= limit:
            continue
        t.pop("_running")
        res.append(t)
    return res


def spawn_task(ttype: str, tid, user: str, func_name: str, args: list) -> str:
    """Runs a task in a detached worker process (like fork_worker) and returns its UPID at once."""
    cmd = [sys.executable, pvenode.LABCTL, "task-worker", json.dumps(
        {"type": ttype, "id": str(tid), "user": user, "func": func_name, "args": args})]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, start_new_session=True,
                         close_fds=True)
    line = p.stdout.readline().decode().strip()
    p.stdout.close()
    import threading
    threading.Thread(target=p.wait, daemon=True).start()
    if not line.startswith("UPID:"):
        raise pvenode.PVEError(f"unable to start worker: {line}")
    return line


def worker_main(spec: dict) -> int:
    task = Task(spec["type"], spec["id"], spec["user"])
    print(task.upid, flush=True)
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    ok = run_task(task, taskops.TASK_FUNCS[spec["func"]], *spec["args"])
    return 0 if ok else 1


def main(argv: list[str]) -> int:
    if len(argv) >= 2 and argv[0] == "worker":
        return worker_main(json.loads(argv[1]))
    print("usage: labctl task-worker JSON", file=sys.stderr)
    return 2
