#!/usr/bin/env python3
# -*- coding: utf-8 -*-
"""Deploy benchmark (not a test): wall time of a deploy, of the no-change re-run, and their ratio.

  .venv/bin/python benchmarks/deploy_bench.py [--inventory inventories/lab/hosts.yml] [--fresh]

--fresh destroys CT 129 first (tests/lab/labctl ct-destroy 129), so the first run creates everything.
Prints the figures and writes reports/bench-deploy.json.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The runs below write their reports where this script reads them (the roles default to ~/.local/state).
os.environ.setdefault("INFEROPS_REPORT_DIR", os.path.join(ROOT, "reports"))


def run_deploy(inventory: str) -> tuple[float, dict]:
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"))
    env.setdefault("ANSIBLE_VAULT_PASSWORD_FILE", "/var/lib/inferops-lab/vault-pass")
    env["PATH"] = os.path.join(ROOT, ".venv", "bin") + os.pathsep + env.get("PATH", "")
    start = time.monotonic()
    r = subprocess.run([os.path.join(ROOT, ".venv", "bin", "ansible-playbook"), "-i", inventory, "playbooks/deploy.yml"],
                       cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    wall = time.monotonic() - start
    if r.returncode != 0:
        sys.stderr.write(r.stdout[-4000:] + r.stderr[-2000:])
        raise SystemExit(f"deploy failed (rc {r.returncode})")
    recap = {}
    for host, ok, changed in re.findall(r"^(\S+)\s+:\s+ok=(\d+)\s+changed=(\d+)", r.stdout, re.M):
        recap[host] = {"ok": int(ok), "changed": int(changed)}
    return wall, recap


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inventory", default="inventories/lab/hosts.yml")
    parser.add_argument("--fresh", action="store_true", help="destroy CT 129 first")
    args = parser.parse_args()
    if args.fresh:
        subprocess.run([os.path.join(ROOT, "tests", "lab", "labctl"), "ct-destroy", "129"], check=False, capture_output=True)
    deploy_s, deploy_recap = run_deploy(args.inventory)
    rerun_s, rerun_recap = run_deploy(args.inventory)
    result = {
        "measured_at": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "inventory": args.inventory,
        "fresh": args.fresh,
        "deploy_wall_s": round(deploy_s, 1),
        "rerun_wall_s": round(rerun_s, 1),
        "rerun_to_deploy_ratio": round(rerun_s / deploy_s, 3),
        "deploy_recap": deploy_recap,
        "rerun_recap": rerun_recap,
        "rerun_changed_total": sum(h["changed"] for h in rerun_recap.values()),
    }
    os.makedirs(os.path.join(ROOT, "reports"), exist_ok=True)
    with open(os.path.join(ROOT, "reports", "bench-deploy.json"), "w") as f:
        json.dump(result, f, indent=2)
        f.write("\n")
    print(f"deploy {result['deploy_wall_s']} s, no-change re-run {result['rerun_wall_s']} s "
          f"(ratio {result['rerun_to_deploy_ratio']}, re-run changed={result['rerun_changed_total']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
