#!/usr/bin/env python3
"""Write awx_module_options.json: the options (and aliases) of the awx.awx modules awx/apply.yml uses.

Run against a checkout of ansible/awx (its awx_collection/ directory) whenever apply.yml starts to use another
module or option:  tests/awx/snapshot_awx_options.py /path/to/awx [REVISION] > tests/awx/awx_module_options.json
No package carries awx.awx (neither PyPI nor the `ansible` package), so the offline test reads this snapshot.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import yaml

MODULES = ("credential", "credential_type", "inventory", "inventory_source", "job_template", "project",
           "workflow_job_template")


def _options(doc_options):
    out = {}
    for name, spec in (doc_options or {}).items():
        entry = {"aliases": sorted(spec.get("aliases") or [])}
        if spec.get("suboptions"):
            entry["suboptions"] = _options(spec["suboptions"])
        out[name] = entry
    return out


def _doc(text):
    ns = {}
    # DOCUMENTATION is a plain string assignment in every module; evaluate only that statement.
    start = text.index("DOCUMENTATION = ")
    end = text.index("'''", text.index("'''", start) + 3) + 3
    exec(compile(text[start:end], "<doc>", "exec"), ns)  # noqa: S102 - trusted checkout, a literal string
    return yaml.safe_load(ns["DOCUMENTATION"])


def main(awx, rev=""):
    coll = os.path.join(awx, "awx_collection")
    rev = rev or subprocess.run(["git", "-C", awx, "rev-parse", "HEAD"], capture_output=True, text=True, check=False).stdout.strip()
    with open(os.path.join(coll, "plugins", "doc_fragments", "auth.py"), encoding="utf-8") as f:
        auth = _doc(f.read().replace('r\'\'\'', '\'\'\''))
    result = {"source": "ansible/awx awx_collection at %s" % (rev or "unknown revision"),
              "auth_options": _options(auth["options"]), "modules": {}}
    for m in MODULES:
        with open(os.path.join(coll, "plugins", "modules", m + ".py"), encoding="utf-8") as f:
            result["modules"][m] = _options(_doc(f.read())["options"])
    json.dump(result, sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main(*sys.argv[1:3])
