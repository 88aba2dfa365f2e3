#!/usr/bin/env python3
"""Faults during a deploy: each run is cut at a chosen point; the next plain run must complete, nothing lost.

  tests/corpus/run_faults.py        (root, on the lab; molecule default runs it as `prepare`, on a fresh node)

Chained on one fresh CT 129, each fault hits a later phase of the deploy:
1. the node's API dies while pve_lxc waits for the container's create task (the lab's tasks, like PVE's, run in
   detached workers, so the create goes on without it); the API comes back (labctl up);
2. the container is killed (lxc-stop --kill) while pip installs SGLang in it;
3. the SSH connection to the node is cut between two tasks of the container play (the node's sshd stops after
   the configuration directories are made); sshd comes back (labctl up).
Each cut run must fail with a message that names the cause (never a Python traceback). What must follow, a plain
deploy.yml that completes with the planned server, is molecule's converge, and verify reads the world.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time

import labstate  # beside this script, on sys.path as its directory

LABCTL = os.path.join(labstate.ROOT, "tests", "lab", "labctl")


def _conf() -> str:
    try:
        with open(f"/etc/pve/lxc/{labstate.VMID}.conf") as f:
            return f.read()
    except OSError:
        return ""


def kill_pidfile(path: str) -> str:
    with open(path) as f:
        pid = int(f.read().split()[0])
    os.kill(pid, signal.SIGKILL)
    return f"killed pid {pid} ({path})"


FAULTS = [
    {"name": "API dies during the create task",
     "trigger": r"TASK \[inferops\.gpu_inference\.pve_gpu_container : Create or update the container",
     "delay": 2.0, "action": lambda: kill_pidfile("/run/inferops-lab/pve-api.pid"),
     "expect": r"Connection refused|unreachable|connect", "restore": [LABCTL, "-q", "up"]},
    {"name": "container killed during pip install",
     "trigger": r"TASK \[inferops\.gpu_inference\.sglang_server : Install SGLang",
     "delay": 3.0, "action": lambda: subprocess.run(["lxc-stop", "-n", str(labstate.VMID), "--kill"], capture_output=True,
                                                     text=True, timeout=120, check=False).stderr or "lxc-stop --kill 129",
     "expect": r"UNREACHABLE|unreachable|not running|FAILED", "restore": None},
    {"name": "connection to the node cut between two tasks",
     "trigger": r"TASK \[inferops\.gpu_inference\.sglang_server : Install the memory tool, the launcher",
     "delay": 0.0, "action": lambda: kill_pidfile("/run/inferops-lab/sshd.pid"),
     "expect": r"UNREACHABLE|unreachable|Connection refused|ssh", "restore": [LABCTL, "-q", "up"]},
]


def cut_run(fault: dict) -> dict:
    # CT 129 alone (the lab's second tenant, CT 132, is deployed beside it by molecule's converge).
    argv = [labstate.ansible_playbook(), "-i", labstate.INVENTORY, os.path.join(labstate.ROOT, "playbooks", "deploy.yml"),
            "-e", "deploy_containers=ct129"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=labstate.playbook_env(),
                            cwd=labstate.ROOT)
    out, fired = [], {}

    def fire():
        time.sleep(fault["delay"])
        fired["what"] = fault["action"]()
        fired["at"] = time.monotonic()

    start = time.monotonic()
    thread = None
    for line in proc.stdout:
        out.append(line)
        if not fired and re.search(fault["trigger"], line):
            fired["pending"] = True
            thread = threading.Thread(target=fire, daemon=True)
            thread.start()
    rc = proc.wait(timeout=1800)
    # The cut run can end before the fault's action returns (it fails as soon as the container dies, while
    # lxc-stop --kill is still waiting for it to be gone): judge only once the action has finished.
    if thread is not None:
        thread.join(timeout=300)
    text = "".join(out)
    problems = []
    if "what" not in fired:
        problems.append("the trigger task never ran: " + fault["trigger"])
    if rc == 0:
        problems.append("the cut run succeeded (the fault did not take)")
    if "Traceback (most recent call last)" in text:
        problems.append("a Python traceback reached the operator")
    if not re.search(fault["expect"], text):
        problems.append("the failure does not name the cause (%s)" % fault["expect"])
    if fault["restore"]:
        subprocess.run(fault["restore"], check=True, capture_output=True, timeout=600)
    # The create task goes on without the API (a detached worker, as on PVE). A re-run started before it ends is
    # refused by PVE with "CT is locked (create)" (clear, and the next run completes); the chain waits for it, as
    # an operator reading that message would, so that the next fault hits the phase it is meant for.
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and "lock: create" in _conf():
        time.sleep(2)
    return {"name": fault["name"], "rc": rc, "seconds": round(time.monotonic() - start, 1), "fault": fired.get("what"),
            "problems": problems, "tail": text[-2500:] if problems else ""}


def main() -> int:
    failed = 0
    for fault in FAULTS:
        res = cut_run(fault)
        ok = not res["problems"]
        failed += not ok
        print(f"{'cut   ' if ok else 'WRONG '} {res['seconds']:6.1f}s  {res['name']}: run failed with rc {res['rc']} after "
              f"{res['fault']}", flush=True)
        if not ok:
            print("  " + "\n  ".join(res["problems"]) + "\n" + res["tail"])
    print(f"{len(FAULTS) - failed} of {len(FAULTS)} deploys cut as planned; the next plain deploy must complete")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
