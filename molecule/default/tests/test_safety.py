# -*- coding: utf-8 -*-
"""The deploy's safety promises (docs/safety.md), checked against the deployed lab after converge and idempotence.

Each check is a script under tests/corpus/ that reads the world itself (tests/corpus/labstate.py) and prints its
figures; the output is kept under reports/ (INFEROPS_REPORT_DIR).
"""
from __future__ import annotations

import os
import subprocess
import sys

ROOT = os.environ.get("MOLECULE_PROJECT_DIRECTORY", os.getcwd())
REPORTS = os.environ.get("INFEROPS_REPORT_DIR", os.path.join(ROOT, "reports"))


def run(script: str, *args: str) -> str:
    r = subprocess.run([sys.executable, os.path.join(ROOT, "tests", "corpus", script), *args],
                       capture_output=True, text=True, timeout=2400)
    out = r.stdout + r.stderr
    os.makedirs(REPORTS, exist_ok=True)
    with open(os.path.join(REPORTS, script.replace(".py", ".log")), "w") as f:
        f.write(out)
    print(out)
    assert r.returncode == 0, out[-6000:]
    return out


def test_bad_input_corpus_every_case_caught_before_any_change():
    out = run("run_corpus.py", "--json", os.path.join(REPORTS, "corpus.json"))
    last = [line for line in out.splitlines() if line.endswith("caught before any change")][-1]
    caught, total = last.split(" of ")[0], last.split(" of ")[1].split()[0]
    assert caught == total and int(total) >= 50, last


def test_no_extra_variable_or_hand_edit_runs_another_size():
    out = run("run_bypass.py")
    last = [line for line in out.splitlines() if " held " in line and " of " in line][-1]
    assert last.split(" of ")[0] == last.split(" of ")[1].split()[0], last


def test_no_secret_in_any_output_artifact_or_process_list():
    out = run("scan_secrets.py")
    assert "none found" in out
