# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The deploy's report (roles/sglang_server/tasks/verify.yml): deploy.txt written on the controller and the same
text printed in the run's output as a list, one line of the report an element, which ansible-core's default callback
(no ansible.cfg: callback_result_format=json) prints one a line. Run offline: the report's block of verify.yml, read
from the role's file, run against localhost with the figures the tasks before it would have set (the lab runs the
whole deploy)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
VERIFY = os.path.join(ROOT, "roles", "sglang_server", "tasks", "verify.yml")
BLOCK = "The report of the deploy, on the controller and in the run's output"
PICTURE = ["Host memory basis 15.0 GB (14.0 GiB)", "[#####oPPPPP.]", " # OS reserve           10.7 GB",
           " P KV pools              2.0 GB  (2 ranks x 1.0 GB)"]
EXPLAIN = ["SGLang 0.5.21: --hicache-size is decimal GB (1e9 bytes) PER RANK; \"quoted\" and a: colon",
           "  - OS reserve: max(10.0 GiB, 10% of 14.0 GiB RAM) = 10.7 GB", "  = budget for host KV pools: 3.2 GB"]
FIGURES = {
    "sglang_server_version": "0.5.21",
    "__sglang_server_node_state": {"vmid": 129, "node_host": "pve1"},
    "__sglang_server_launch_result": {"launch": {"hicache_size_gb": 1, "ranks": 2, "bind_host": "10.0.0.5", "plan": {
        "picture": PICTURE, "explain": EXPLAIN, "warnings": ["a warning"]}}},
    "__sglang_server_verify": {"verify": {"ok": True, "mismatches": [], "memory_text": "pinned 2.0 GB as planned",
                                          "overhead_seen": {"text": "0.4 GiB per rank", "offer_text": "for the next plan"}}},
    "__sglang_server_report": {"server": {"nnodes": 1, "node_rank": 0, "group": "", "members": []}},
}


def collections_path() -> str:
    if os.path.basename(os.path.dirname(os.path.dirname(ROOT))) == "ansible_collections":  # under ansible-test
        return os.path.dirname(os.path.dirname(os.path.dirname(ROOT)))
    return os.path.join(ROOT, ".collections")


def test_the_report_is_written_and_printed_as_lines(tmp_path):
    with open(VERIFY) as f:
        blocks = [t for t in yaml.safe_load(f) if t.get("name") == BLOCK]
    assert len(blocks) == 1, "verify.yml has no task %r" % BLOCK
    (tmp_path / "report.yml").write_text(yaml.safe_dump(blocks))
    play = [{"hosts": "localhost", "connection": "local", "gather_facts": False,
             "vars": dict(FIGURES, sglang_server_report_dir=str(tmp_path / "reports")),
             "tasks": [{"ansible.builtin.include_tasks": str(tmp_path / "report.yml")}]}]
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play))
    (tmp_path / "empty.cfg").write_text("")
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    env.update(ANSIBLE_CONFIG=str(tmp_path / "empty.cfg"), ANSIBLE_COLLECTIONS_PATH=collections_path(),
               ANSIBLE_LOCAL_TEMP=str(tmp_path / "tmp"), ANSIBLE_NOCOLOR="1")
    r = subprocess.run([os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i", "localhost,",
                        str(tmp_path / "play.yml")], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
                       check=False)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    assert "\\n" not in out, "a text printed with \\n inside one line"
    with open(tmp_path / "reports" / "localhost" / "deploy.txt") as f:
        written = f.read()
    # The printed list, read one output line an element (each must be one whole JSON string).
    lines = out[out.index("TASK [Show the report (deploy.txt)]"):].splitlines()
    start = lines.index('    "msg": [')
    printed = []
    for line in lines[start + 1:]:
        if line == "    ]":
            break
        text = line.strip()
        printed.append(json.loads(text[:-1] if text.endswith(",") else text))
    assert printed[0] == str(tmp_path / "reports" / "localhost" / "deploy.txt") + ":"
    assert printed[1:] == written.splitlines()
    assert written.splitlines()[:4] == [
        "SGLang 0.5.21 in CT 129 (localhost) on pve1",
        "--hicache-size 1 GB per rank x 2 ranks, listening on 10.0.0.5",
        "running server matches the plan: True",
        "pinned 2.0 GB as planned",
    ]
    for line in PICTURE + EXPLAIN + ["WARNING: a warning"]:
        assert line in printed, line
