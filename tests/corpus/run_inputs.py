#!/usr/bin/env python3
"""The playbook-level input corpus: bad, tricky and forged extra variables, each refused with the message it must
produce (or, for the sound ones, planned with the size it must print). Offline: no case contacts a host.

Each case is one file in tests/corpus/inputs/: the playbook, the input path (cli: -e JSON and -e key=value strings,
file: -e @file, awx: env/extravars as AWX writes it (every string !unsafe), inventory: the host's host_vars), the
variables, whether it must be refused, and the words the message must contain.

Every case runs in-process through what the playbook runs first (the allow-list of
module_utils/deploy/playbook_inputs.py, Ansible's own key=value parser, plan.yml's first check and the calculator
sglang_deploy.calculate); a case marked `run: true` also runs through the real playbook (ansible-playbook, or
ansible-runner as AWX runs a job for the awx path), in parallel, and must fail (rc != 0) or pass as written, with no
traceback, and, when the allow-list refuses it, with no task run on any host (ok=0 in the recap).
A case the in-process stage cannot judge (plan_host, inventory) must be marked run.

  tests/corpus/run_inputs.py [--jobs N] [--in-process-only] [CASE-NAME-PREFIX ...]

Prints one line per wrong case and a summary; exit status 1 when any case is wrong. `make corpus` runs it.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

import yaml

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
CASES = os.path.join(ROOT, "tests", "corpus", "inputs")
BIN = os.path.dirname(sys.executable)
sys.path.insert(0, os.path.join(ROOT, ".collections"))
sys.path.insert(0, os.path.join(ROOT, "tests", "awx", "runner"))

from ansible.parsing.splitter import parse_kv  # noqa: E402

from ansible_collections.inferops.gpu_inference.plugins.module_utils.deploy import playbook_inputs, sglang_deploy  # noqa: E402
from ansible_collections.inferops.gpu_inference.plugins.module_utils.deploy.sglang_request import DeployError  # noqa: E402

PATHS = ("cli", "file", "awx", "inventory")
REPEAT = re.compile(r"^@@repeat (\S) (\d+)@@$")


def load_yaml(path):
    with open(path, encoding="utf-8") as f:
        return yaml.safe_load(f)


def expand(value):
    """'@@repeat x 100000@@' is 'x' * 100000 (the corpus keeps its huge values short)."""
    if isinstance(value, str):
        m = REPEAT.match(value)
        return m.group(1) * int(m.group(2)) if m else value
    if isinstance(value, dict):
        return {expand(k): expand(v) for k, v in value.items()}
    if isinstance(value, list):
        return [expand(v) for v in value]
    return value


def normal(text):
    """Output as the message reads: YAML's line folding and quote doubling undone."""
    return " ".join(text.replace("''", "'").split())


_ALLOWED = {}


def allowed(playbook):
    if playbook not in _ALLOWED:
        _ALLOWED[playbook] = playbook_inputs.allowed(playbook, load_yaml)
    return _ALLOWED[playbook]


def extra_vars_of(case):
    """The extra variables as Ansible builds them: the -e JSON/@file mapping, then each key=value string."""
    extra = dict(case.get("extra_vars") or {})
    for text in case.get("cli") or []:
        extra.update(parse_kv(text))
    return extra


def in_process(case):
    """(judged, refused, message) from what the playbook runs first; judged False when only the real run can say."""
    playbook = case["playbook"]
    extra = extra_vars_of(case)
    try:
        playbook_inputs.refuse_undocumented(list(extra), playbook, allowed(playbook))
    except playbook_inputs.InputsError as exc:
        return True, True, str(exc)
    if playbook != "plan.yml" or case["path"] == "inventory" or any(str(extra.get(k) or "").strip() for k in ("plan_host", "plan_node")):
        return False, None, ""
    settings = sorted(n for n in extra if re.match(r"^(sglang_server|pve_gpu_container)_", n))
    if settings:  # plan.yml's first play
        return True, True, "%s %s" % (", ".join(settings), "is a deploy setting" if len(settings) == 1 else "are deploy settings")
    try:
        result = sglang_deploy.calculate(extra.get("plan_input", {}), extra.get("plan_requested_gb"))
    except DeployError as exc:
        return True, True, str(exc)
    plan = result["calculation"]["plan"] if "calculation" in result else result["plan"]
    text = "\n".join(result["notes"] + plan["picture"] + plan["explain"] + plan["warnings"])
    if plan["fits"]:
        return True, False, text + "\n--hicache-size %d" % plan["per_rank_gb"]
    return True, True, text + "\ndoes not fit"


def real_run(case, tmp):
    """rc and output of the real playbook for the case."""
    extra = case.get("extra_vars") or {}
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0")
    env.pop("ANSIBLE_VAULT_PASSWORD_FILE", None)
    args = list(case.get("args") or [])
    if case["path"] == "awx":
        inventory = "inventories/lab/hosts.yml" if "inventories/lab/hosts.yml" in args else "inventories/example/hosts.yml"
        cmd = [sys.executable, os.path.join(ROOT, "tests", "awx", "runner", "awx_run.py"), "--playbook",
               "playbooks/" + case["playbook"], "--inventory", inventory]
        cmd += [a for k, v in extra.items() for a in ("--answer", "%s=%s" % (k, json.dumps(v)))]
        run = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False)
        return run.returncode, run.stdout + run.stderr
    cmd = [os.path.join(BIN, "ansible-playbook"), "playbooks/" + case["playbook"]] + args
    if case["path"] == "inventory":
        inv = os.path.join(tmp, "inventory")
        shutil.copytree(os.path.join(ROOT, "inventories", "lab"), inv)
        host_vars = os.path.join(inv, "host_vars", "ct129.yml")
        data = load_yaml(host_vars)
        data.update(case.get("host_vars") or {})
        with open(host_vars, "w", encoding="utf-8") as f:
            yaml.safe_dump(data, f, allow_unicode=True)
        cmd += ["-i", os.path.join(inv, "hosts.yml")]
    if case["path"] == "file":
        path = os.path.join(tmp, "extra.yml")
        with open(path, "w", encoding="utf-8") as f:
            yaml.safe_dump(extra, f, allow_unicode=True)
        cmd += ["-e", "@" + path]
    elif extra:
        cmd += ["-e", json.dumps(extra)]
    for text in case.get("cli") or []:
        cmd += ["-e", text]
    run = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False)
    return run.returncode, run.stdout + run.stderr


def judge_real(case, rc, out):
    problems = []
    if "Traceback" in out:
        problems.append("a traceback")
    if case["refused"] and rc == 0:
        problems.append("rc 0, expected a failure")
    if not case["refused"] and rc != 0:
        problems.append("rc %d, expected success" % rc)
    if case["expect"] not in normal(out):
        problems.append("the output lacks %r" % case["expect"])
    if "does not accept the extra variable" in case["expect"] or "has a space in its value" in case["expect"]:
        recap = [line for line in out.splitlines() if re.search(r"\bok=\d+", line)]
        if not recap or any(not re.search(r"\bok=0\b", line) for line in recap):
            problems.append("a task ran before the refusal: %s" % " | ".join(recap))
    if len(out) > 60000:
        problems.append("%d characters of output (an echoed value not clipped?)" % len(out))
    return problems


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--jobs", type=int, default=int(os.environ.get("CORPUS_JOBS", "4")))
    p.add_argument("--in-process-only", action="store_true")
    p.add_argument("names", nargs="*")
    args = p.parse_args(argv)
    files = sorted(glob.glob(os.path.join(CASES, "*.yml")))
    if args.names:
        files = [f for f in files if any(os.path.basename(f).startswith(n) for n in args.names)]
    start = time.time()
    wrong, counts, real = [], {}, []
    for path in files:
        name = os.path.basename(path)[:-4]
        case = expand(load_yaml(path))
        if case.get("path") not in PATHS or case.get("playbook") not in playbook_inputs.ENTRY_PLAYBOOKS or "expect" not in case:
            wrong.append("%s: malformed case (playbook, path in %s, refused, expect)" % (name, "/".join(PATHS)))
            continue
        counts[case["path"]] = counts.get(case["path"], 0) + 1
        counts[case["playbook"]] = counts.get(case["playbook"], 0) + 1
        judged, refused, message = in_process(case)
        if judged:
            if refused != case["refused"]:
                wrong.append("%s: in-process %s, expected %s: %s" % (name, "refused" if refused else "planned",
                                                                     "refused" if case["refused"] else "planned", message[:300]))
            elif case["expect"] not in normal(message):
                wrong.append("%s: in-process message lacks %r: %s" % (name, case["expect"], normal(message)[:400]))
            elif "Traceback" in message or re.search(r"\b(NoneType|_AnsibleTagged\w*|dict|str|int)\b object", message):
                wrong.append("%s: the message names an internal type: %s" % (name, message[:300]))
        elif not case.get("run"):
            wrong.append("%s: only the real playbook can judge this case: mark it run" % name)
        if case.get("run") and not args.in_process_only:
            real.append((name, case))

    def one(item):
        name, case = item
        tmp = tempfile.mkdtemp(prefix="corpus-")
        try:
            rc, out = real_run(case, tmp)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return name, rc, out, judge_real(case, rc, out)

    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        for name, rc, out, problems in pool.map(one, real):
            if problems:
                wrong.append("%s: through ansible-playbook (rc %d): %s\n    %s" % (name, rc, "; ".join(problems), normal(out)[-1500:]))
    for line in wrong:
        print("WRONG " + line)
    caught = len(files) - len({w.split(":", 1)[0] for w in wrong})
    print("%d of %d input cases caught as written (%s; %d also through the real playbook), %.0f s"
          % (caught, len(files), ", ".join("%s %d" % (k, counts[k]) for k in sorted(counts)), len(real), time.time() - start))
    return 1 if wrong or not files else 0


if __name__ == "__main__":
    sys.exit(main())
