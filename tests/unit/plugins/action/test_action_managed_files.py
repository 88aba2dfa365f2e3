# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The action managed_files run over Ansible's real local connection: what it reports is checked against the files it
left on disk (content, mode), a second run changes nothing, check mode writes nothing (plugins/action/managed_files.py)."""
from __future__ import annotations

import os
import stat
import sys

from ansible_collections.inferops.gpu_inference.plugins.action import managed_files
from ansible_collections.inferops.gpu_inference.tests.unit.plugins.action import harness


def run(tmp_path, args, check_mode=False, diff=False):
    args = dict(args, owner=None, group=None, python=sys.executable)
    return harness.make(managed_files, args, tmp_path, check_mode=check_mode, diff=diff, local=True).run(task_vars={})


def mode(path):
    return stat.S_IMODE(os.stat(path).st_mode)


def test_files_are_written_whole_with_their_mode_and_a_rerun_changes_nothing(tmp_path):
    dest = tmp_path / "etc" / "sglang"
    args = {"directories": [str(dest)], "directory_mode": "0750",
            "files": [{"content": "one\n", "dest": str(dest / "launch.json"), "mode": "0640"},
                      {"content": "two\n", "dest": str(dest / "sglang.env"), "mode": "0600"}]}
    first = run(tmp_path, args)
    assert not first.get("failed"), first
    assert first["changed"]
    assert (dest / "launch.json").read_text() == "one\n" and (dest / "sglang.env").read_text() == "two\n"
    assert mode(dest / "launch.json") == 0o640 and mode(dest / "sglang.env") == 0o600 and mode(dest) == 0o750
    assert not [p for p in os.listdir(dest) if p not in ("launch.json", "sglang.env")]  # no temporary file left
    again = run(tmp_path, args)
    assert not again.get("failed") and again["changed"] is False


def test_only_what_differs_changes_and_check_mode_writes_nothing(tmp_path):
    target = tmp_path / "unit"
    target.write_text("old\n")
    os.chmod(target, 0o600)
    args = {"files": [{"content": "new\n", "dest": str(target), "mode": "0644"}]}
    checked = run(tmp_path, args, check_mode=True, diff=True)
    assert checked["changed"] and target.read_text() == "old\n" and mode(target) == 0o600
    assert "diff" in checked
    done = run(tmp_path, args)
    assert done["changed"] and target.read_text() == "new\n" and mode(target) == 0o644


def test_an_unknown_option_or_both_src_and_content_are_refused(tmp_path):
    refused = harness.make(managed_files, {"fils": []}, tmp_path, local=True).run(task_vars={})
    assert refused["failed"] and "fils" in refused["msg"]
    both = run(tmp_path, {"files": [{"content": "x", "src": "y", "dest": str(tmp_path / "z")}]})
    assert both["failed"] and "both src and content" in both["msg"] and not (tmp_path / "z").exists()
