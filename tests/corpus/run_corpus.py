#!/usr/bin/env python3
"""The bad-input corpus: every case must be refused before any change, with a message that says what to do.

  tests/corpus/run_corpus.py [--jobs N] [CASE ...]      (root, on the lab, with CT 129 deployed)

Each case is one small YAML file in tests/corpus/cases/: `title`, `vars` (given to deploy.yml as -e, the way an
operator or an AWX survey gives them), `expect` (the words the failure must contain) and, for a few, `setup` /
`teardown` (shell run on the node, e.g. to hide a device node). For each case the runner reads the world before and
after (CT configs, which CTs exist, the server's PIDs, the unit and plan files: tests/corpus/labstate.py) and checks
the run failed, no host reports a change, the expected words are in the output, no Python traceback reached the
operator, and the world is unchanged. It prints one line per case and "N of N caught before any change".
Cases without setup run in parallel (they change nothing when they pass); the others run one at a time after.
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

import yaml

import labstate  # beside this script, on sys.path as its directory

CASES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cases")


def load(path: str) -> dict:
    with open(path) as f:
        case = yaml.safe_load(f)
    case["name"] = os.path.basename(path)[:-4]
    expect = case["expect"]
    case["expect"] = [expect] if isinstance(expect, str) else list(expect)
    return case


def run_case(case: dict, before: dict) -> dict:
    start = time.monotonic()
    if case.get("setup"):
        subprocess.run(case["setup"], shell=True, check=True, timeout=120)
    try:
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            json.dump(case.get("vars") or {}, f)
        argv = [labstate.ansible_playbook(), "-i", labstate.INVENTORY, os.path.join(labstate.ROOT, "playbooks", "deploy.yml"),
                "-e", "@" + f.name] + list(case.get("args") or [])
        r = subprocess.run(argv, capture_output=True, text=True, timeout=900, env=labstate.playbook_env(), cwd=labstate.ROOT)
        os.unlink(f.name)
    finally:
        if case.get("teardown"):
            subprocess.run(case["teardown"], shell=True, timeout=120)
    out = r.stdout + r.stderr
    flat = re.sub(r"\s+", " ", out)
    after = labstate.state()
    problems = []
    if r.returncode == 0:
        problems.append("the run succeeded")
    changed = re.findall(r"^(\S+)\s+: ok=\d+\s+changed=(\d+)", out, re.M)
    if any(int(n) for _, n in changed):
        problems.append("a host reports changes: %s" % changed)
    for words in case["expect"]:
        if re.sub(r"\s+", " ", words) not in flat:
            problems.append("message lacks %r" % words)
    if "Traceback (most recent call last)" in out:
        problems.append("a Python traceback reached the output")
    world = labstate.diff(before, after)
    if world:
        problems.append("the world changed: " + "; ".join(world))
    msgs = re.findall(r"msg: (.*?)(?=\n\S|\nPLAY RECAP|\Z)", out, re.S)
    return {"name": case["name"], "title": case["title"], "ok": not problems, "problems": problems,
            "seconds": round(time.monotonic() - start, 1), "message": re.sub(r"\s+", " ", msgs[-1])[:300] if msgs else "",
            "output_tail": out[-3000:] if problems else ""}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cases", nargs="*", help="case names (default: all)")
    ap.add_argument("--jobs", type=int, default=4)
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    paths = sorted(glob.glob(os.path.join(CASES, "*.yml")))
    cases = [load(p) for p in paths if not args.cases or os.path.basename(p)[:-4] in args.cases]
    before = labstate.state()
    if not before["server_pids"]:
        print("corpus: SGLang is not running in CT 129: deploy it first (make demo)", file=sys.stderr)
        return 2
    results = []
    plain = [c for c in cases if not c.get("setup")]
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(args.jobs, 1)) as pool:
        for res in pool.map(lambda c: run_case(c, before), plain):
            results.append(res)
            print(f"{'caught' if res['ok'] else 'MISSED'}  {res['seconds']:5.1f}s  {res['name']}: {res['message'][:150]}", flush=True)
    for case in [c for c in cases if c.get("setup")]:
        res = run_case(case, before)
        results.append(res)
        print(f"{'caught' if res['ok'] else 'MISSED'}  {res['seconds']:5.1f}s  {res['name']}: {res['message'][:150]}", flush=True)
    missed = [r for r in results if not r["ok"]]
    for r in missed:
        print(f"\n--- {r['name']} ({r['title']}):\n  " + "\n  ".join(r["problems"]) + "\n" + r["output_tail"])
    print(f"\n{len(results) - len(missed)} of {len(results)} caught before any change")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0 if not missed else 1


if __name__ == "__main__":
    sys.exit(main())
