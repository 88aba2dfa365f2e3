#!/usr/bin/env python3
# -*- coding: utf-8 -*-
"""Deploy benchmark (not a test): wall time of a full deploy into a fresh container, of the no-change re-run,
and their ratio; tasks and connection round trips per run.

  .venv/bin/python benchmarks/deploy_bench.py [--inventory inventories/lab/hosts.yml] [--full N] [--reruns N]

Each full deploy starts by destroying CT 129 (tests/lab/labctl ct-destroy 129), so it creates everything; each
re-run follows a deploy and must change nothing. Medians and spreads (max - min) are reported. One more re-run,
not timed, runs with -vvv to count the connection round trips: `pct exec` sessions into the container
(community.proxmox.proxmox_pct_remote) and SSH sessions to the node. Writes reports/bench-deploy.json.
"""
from __future__ import annotations

import argparse
import collections
import datetime
import json
import os
import re
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The runs below write their reports where this script reads them (the roles default to ~/.local/state).
os.environ.setdefault("INFEROPS_REPORT_DIR", os.path.join(ROOT, "reports"))


def run_deploy(inventory: str, verbose: bool = False) -> tuple[float, dict, str]:
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"))
    env.setdefault("ANSIBLE_VAULT_PASSWORD_FILE", "/var/lib/inferops-lab/vault-pass")
    env["PATH"] = os.path.join(ROOT, ".venv", "bin") + os.pathsep + env.get("PATH", "")
    start = time.monotonic()
    # CT 129 alone (deploy_containers), as the figures before the lab's second tenant (CT 132, inventories/lab):
    # the node play still reads the whole node and plans CT 129 with what CT 132 holds, if it runs.
    r = subprocess.run([os.path.join(ROOT, ".venv", "bin", "ansible-playbook"), "-i", inventory, "playbooks/deploy.yml",
                        "-e", "deploy_containers=ct129"] + (["-vvv"] if verbose else []), cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    wall = time.monotonic() - start
    if r.returncode != 0:
        sys.stderr.write(r.stdout[-4000:] + r.stderr[-2000:])
        raise SystemExit("deploy failed (rc {})".format(r.returncode))
    recap = {}
    for host, ok, changed, skipped in re.findall(r"^(\S+)\s+:\s+ok=(\d+)\s+changed=(\d+).*?skipped=(\d+)", r.stdout, re.M):
        recap[host] = {"ok": int(ok), "changed": int(changed), "skipped": int(skipped)}
    return wall, recap, r.stdout


def round_trips(out: str) -> dict:
    """Connection sessions opened by the run, from -vvv: `EXEC /usr/sbin/pct exec` (one per command in the
    container) and `SSH: EXEC` (one per ssh/sftp session to the node)."""
    return {"pct_exec": len(re.findall(r"EXEC /usr/sbin/pct exec", out)), "ssh_to_node": len(re.findall(r"SSH: EXEC ", out)),
            "tasks": len(re.findall(r"^TASK \[", out, re.M))}


def per_task_trips(out: str) -> list:
    """The tasks with the most `pct exec` sessions (where a re-run's time goes)."""
    counts: collections.Counter = collections.Counter()
    task = None
    for line in out.splitlines():
        m = re.match(r"^TASK \[(.*)\]", line)
        if m:
            task = m.group(1)
        elif task and "EXEC /usr/sbin/pct exec" in line:
            counts[task] += 1
    return counts.most_common(8)


def spread(values: list) -> float:
    return round(max(values) - min(values), 1) if values else 0.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inventory", default="inventories/lab/hosts.yml")
    parser.add_argument("--full", type=int, default=1, help="full deploys into a fresh container (BENCH_FULL=1: 2)")
    parser.add_argument("--reruns", type=int, default=3, help="no-change re-runs after each full deploy (the ratio is "
                        "the median of at least 3)")
    args = parser.parse_args()
    full, reruns, rerun_recaps = [], [], []
    deploy_recap = {}
    for _ in range(args.full):
        subprocess.run([os.path.join(ROOT, "tests", "lab", "labctl"), "ct-destroy", "129"], check=False, capture_output=True)
        wall, deploy_recap, _ = run_deploy(args.inventory)
        full.append(wall)
        for _ in range(args.reruns):
            wall, recap, _ = run_deploy(args.inventory)
            reruns.append(wall)
            rerun_recaps.append(recap)
    _, _, verbose_out = run_deploy(args.inventory, verbose=True)
    trips = round_trips(verbose_out)
    deploy_s, rerun_s = statistics.median(full), statistics.median(reruns)
    result = {
        "measured_at": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "machine": "%s, %d CPUs" % (os.uname().nodename, os.cpu_count() or 0),
        "inventory": args.inventory,
        "deploy_runs_s": [round(x, 1) for x in full],
        "rerun_runs_s": [round(x, 1) for x in reruns],
        "deploy_wall_s": round(deploy_s, 1),
        "deploy_spread_s": spread(full),
        "rerun_wall_s": round(rerun_s, 1),
        "rerun_spread_s": spread(reruns),
        "rerun_to_deploy_ratio": round(rerun_s / deploy_s, 3),
        "deploy_recap": deploy_recap,
        "rerun_recap": rerun_recaps[-1] if rerun_recaps else {},
        "rerun_changed_total": max((sum(h["changed"] for h in r.values()) for r in rerun_recaps), default=0),
        "rerun_round_trips": trips,
        "rerun_pct_exec_by_task": per_task_trips(verbose_out),
    }
    os.makedirs(os.path.join(ROOT, "reports"), exist_ok=True)
    with open(os.path.join(ROOT, "reports", "bench-deploy.json"), "w") as f:
        json.dump(result, f, indent=2)
        f.write("\n")
    print("deploy: full %.1f s (spread %.1f, n=%d), no-change re-run %.1f s (spread %.1f, n=%d), ratio %.2f, "
          "re-run changed=%d" % (result["deploy_wall_s"], result["deploy_spread_s"], len(full), result["rerun_wall_s"],
                                 result["rerun_spread_s"], len(reruns), result["rerun_to_deploy_ratio"],
                                 result["rerun_changed_total"]))
    print("deploy: a re-run runs %d tasks, %d pct exec sessions into the container and %d SSH sessions to the node"
          % (trips["tasks"], trips["pct_exec"], trips["ssh_to_node"]))
    print("deploy: re-run pct exec sessions by task: %s" % "; ".join("%s %d" % (t, n) for t, n in result["rerun_pct_exec_by_task"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
