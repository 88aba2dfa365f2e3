#!/usr/bin/env python3
"""The -e bypass test: no extra variable can make SGLang run with a --hicache-size other than the plan's.

  tests/corpus/run_bypass.py [--jobs N]        (root, on the lab, with CT 129 deployed by deploy.yml)

1. Every variable the deploy roles set or keep private is found by reading the roles themselves (set_fact keys,
   register names, loop variables, vars/main.yml, handlers) and deploy.yml (the private values it hands the roles);
   every one but the published result sglang_server_result is private (__role_*, _role_*). deploy.yml runs
   once per name with `-e NAME=<a hostile value>`; each run must fail before any change (the world is read before
   and after: tests/corpus/labstate.py).
2. Every flag the plan owns, smuggled through sglang_server_extra_args, the same.
3. A unit edited by hand to --hicache-size 300 does not start: the launcher (the start guard) refuses it, and no
   process with that size appears; a plain deploy then restores the planned server.
Prints one line per run and "N of N held". (An AWX survey with every optional answer blank is run through
ansible-runner by tests/corpus/scan_secrets.py, which checks the running size too.)
"""
from __future__ import annotations

import argparse
import concurrent.futures
import glob
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.request

import yaml

import labstate  # beside this script, on sys.path as its directory

ROLES = ("pve_gpu_container", "sglang_server")


def names_the_roles_set() -> list[str]:
    names: set[str] = set()

    def walk(node):
        if isinstance(node, dict):
            for key, value in node.items():
                if key in ("ansible.builtin.set_fact", "set_fact") and isinstance(value, dict):
                    names.update(k for k in value if k != "cacheable")
                elif key == "register" and isinstance(value, str):
                    names.add(value)
                elif key == "loop_var" and isinstance(value, str):
                    names.add(value)
                walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    for role in ROLES:
        for path in glob.glob(os.path.join(labstate.ROOT, "roles", role, "tasks", "*.yml")) + \
                glob.glob(os.path.join(labstate.ROOT, "roles", role, "handlers", "*.yml")):
            with open(path) as f:
                walk(yaml.safe_load(f))
        with open(os.path.join(labstate.ROOT, "roles", role, "vars", "main.yml")) as f:
            names.update((yaml.safe_load(f) or {}).keys())
    with open(os.path.join(labstate.ROOT, "playbooks", "deploy.yml")) as f:  # what the playbook computes for the roles
        for play in yaml.safe_load(f):
            for role in play.get("roles") or []:
                names.update(role.get("vars") or {})
            names.update(play.get("vars") or {})
    return sorted(names)


HOSTILE = {"hicache_size_gb": 300, "per_rank_gb": 300, "fits": True, "argv": ["--hicache-size", "300"]}


def deploy(extra: dict, args: list | None = None) -> subprocess.CompletedProcess:
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(extra, f)
    try:
        return subprocess.run([labstate.ansible_playbook(), "-i", labstate.INVENTORY,
                               os.path.join(labstate.ROOT, "playbooks", "deploy.yml"), "-e", "@" + f.name] + (args or []),
                              capture_output=True, text=True, timeout=1200, env=labstate.playbook_env(), cwd=labstate.ROOT)
    finally:
        os.unlink(f.name)


def refused_before_change(label: str, extra: dict, before: dict) -> dict:
    start = time.monotonic()
    r = deploy(extra)
    out = r.stdout + r.stderr
    problems = []
    if r.returncode == 0:
        problems.append("deploy succeeded")
    if any(int(n) for n in re.findall(r"changed=(\d+)", out)):
        problems.append("a host reports changes")
    if "Traceback (most recent call last)" in out:
        problems.append("traceback")
    world = labstate.diff(before, labstate.state())
    if world:
        problems.append("the world changed: " + "; ".join(world))
    msg = re.findall(r"msg: (.*?)(?=\n\S|\nPLAY RECAP|\Z)", out, re.S)
    return {"label": label, "ok": not problems, "problems": problems, "seconds": round(time.monotonic() - start, 1),
            "message": re.sub(r"\s+", " ", msg[-1])[:140] if msg else "", "tail": out[-2500:] if problems else ""}


def running_size() -> dict:
    """The --hicache-size the running server has, read from the process table and from the server itself."""
    pid = labstate.in_ct(labstate.VMID, "systemctl", "show", "-p", "MainPID", "--value", "sglang.service")
    cmdline = labstate.in_ct(labstate.VMID, "cat", f"/proc/{pid}/cmdline").split("\0") if pid not in ("", "0") else []
    size_argv = cmdline[cmdline.index("--hicache-size") + 1] if "--hicache-size" in cmdline else None
    req = urllib.request.Request("http://10.77.0.129:30000/server_info",
                                 headers={"Authorization": "Bearer " + labstate.secret("sglang-api-key")})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            info = json.load(resp)
    except OSError as exc:
        info = {"error": str(exc)}
    launch = json.loads(labstate.in_ct(labstate.VMID, "cat", "/etc/sglang/launch.json") or "{}")
    sizes = labstate.in_ct(labstate.VMID, "sh", "-c", "cat /proc/[0-9]*/cmdline | tr '\\0' ' ' | grep -o -- '--hicache-size [0-9]*'")
    return {"pid": pid, "argv": size_argv, "server_info": info.get("hicache_size", info.get("error")),
            "planned": launch.get("hicache_size"), "all_processes": sorted(set(sizes.splitlines()))}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=4)
    args = ap.parse_args()
    before = labstate.state()
    if not before["server_pids"]:
        print("bypass: SGLang is not running in CT 129: deploy it first (make demo)", file=sys.stderr)
        return 2
    planned = running_size()
    print(f"bypass: running before: {planned}")
    results = []
    runs = [(f"-e {n}", {n: HOSTILE if n.startswith("_") or n.endswith(("plan", "state", "result", "request", "launch")) else 300})
            for n in names_the_roles_set()]
    for flag in ("--hicache-size", "--hicache-size=300", "--hicache-s", "--enable-hierarchical-cache", "--tp-size", "--host",
                 "--port", "--api-key", "--hicache-ratio"):
        runs.append((f"extra args {flag}", {"sglang_server_extra_args": [flag] + ([] if "=" in flag else ["300"])}))
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(args.jobs, 1)) as pool:
        for res in pool.map(lambda item: refused_before_change(item[0], item[1], before), runs):
            results.append(res)
            print(f"{'held  ' if res['ok'] else 'BYPASS'} {res['seconds']:5.1f}s  {res['label']}: {res['message']}", flush=True)

    # 3. The unit edited by hand: the start guard refuses the size that is not the plan's.
    start = time.monotonic()
    unit = "/etc/systemd/system/sglang.service"
    labstate.in_ct(labstate.VMID, "sh", "-c", f"sed -i 's/--hicache-size [0-9]*/--hicache-size 300/' {unit} && "
                                             "systemctl daemon-reload && systemctl reset-failed sglang.service; "
                                             "systemctl restart sglang.service; sleep 5")
    journal = labstate.in_ct(labstate.VMID, "journalctl", "-u", "sglang.service", "--no-pager", "-n", "30", "-o", "cat")
    edited = running_size()
    problems = []
    if "refusing to start: the unit passes --hicache-size 300" not in journal:
        problems.append("the start guard did not refuse: " + journal[-800:])
    if any(s.strip() == "--hicache-size 300" for s in edited["all_processes"]):
        problems.append(f"a process runs with --hicache-size 300: {edited}")
    r = deploy({})
    restored = running_size()
    if r.returncode != 0 or restored["argv"] != str(planned["planned"]) or restored["server_info"] != planned["planned"]:
        problems.append(f"a plain deploy did not restore the planned server: rc {r.returncode}, {restored}")
    results.append({"label": "unit edited by hand to --hicache-size 300", "ok": not problems, "problems": problems,
                    "seconds": round(time.monotonic() - start, 1), "message": "start guard refused; deploy restored", "tail": ""})
    print(f"{'held  ' if not problems else 'BYPASS'} {results[-1]['seconds']:5.1f}s  unit edited by hand: "
          f"{'refused by the start guard, restored by deploy' if not problems else problems}")

    failed = [r for r in results if not r["ok"]]
    for res in failed:
        print(f"\n--- {res['label']}:\n  " + "\n  ".join(res["problems"]) + "\n" + res["tail"])
    print(f"\n{len(results) - len(failed)} of {len(results)} held (no -e, extra argument or hand edit ran a size other than the plan's)")
    return 0 if not failed else 1


if __name__ == "__main__":
    sys.exit(main())
