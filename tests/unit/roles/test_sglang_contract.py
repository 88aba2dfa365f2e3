"""The launch contract of the memory tool (roles/sglang_server/files/sglang_memory.py `contract`): the unit's
ExecStartPre records what a start read (run here as a real process on real files, with systemd's INVOCATION_ID),
and the deploy's restart decision (restart_reasons) compares that record with the files installed now and the unit's
state as systemd reports it. A deploy that died after writing a new unit and before restarting must leave a
difference the next run sees, whatever that run changes itself."""

from __future__ import annotations

import importlib.util
import json
import os
import stat
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
TOOL = os.path.join(HERE, "..", "..", "..", "roles", "sglang_server", "files", "sglang_memory.py")

_spec = importlib.util.spec_from_file_location("sglang_memory_contract", TOOL)
mem = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(mem)

RUNNING = {"ActiveState": "active", "InvocationID": "inv-1", "NeedDaemonReload": "no", "MainPID": "4242"}


@pytest.fixture()
def installed(tmp_path):
    """A container's files as a deploy leaves them: the unit, launch.json, env and key files, the launcher, a
    virtualenv with two distributions, a model directory."""
    etc = tmp_path / "etc"
    etc.mkdir()
    files = {name: etc / name for name in ("sglang.service", "launch.json", "sglang.env", "api-key", "sglang-launch")}
    for name, path in files.items():
        path.write_text("content of %s\n" % name)
    site = tmp_path / "venv" / "lib" / "python3.12" / "site-packages"
    for dist in ("sglang-0.5.21.dist-info", "torch-2.8.0.dist-info"):
        (site / dist).mkdir(parents=True)
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    state = tmp_path / "run" / "inferops" / "sglang-contract.json"
    args = ["contract", "--unit", "sglang.service", "--state", str(state), "--venv", str(tmp_path / "venv"),
            "--tree", str(model)]
    for path in files.values():
        args += ["--file", str(path)]
    return {"files": files, "site": site, "model": model, "state": state, "args": args, "venv": str(tmp_path / "venv")}


def record(inst, invocation="inv-1"):
    """The unit's ExecStartPre, as a real process with systemd's environment variable of that start."""
    env = dict(os.environ, INVOCATION_ID=invocation)
    done = subprocess.run([sys.executable, TOOL, *inst["args"], "--record"], capture_output=True, text=True,
                          env=env, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    with open(inst["state"]) as f:
        return json.load(f)


def now_parts(inst):
    files = [str(p) for p in inst["files"].values()]
    return mem.contract_parts(files, inst["venv"], [str(inst["model"])])


def test_same_files_same_start_no_restart(installed):
    rec = record(installed)
    assert mem.restart_reasons(now_parts(installed), rec, RUNNING) == []


def test_unit_written_by_a_run_that_died_before_restart_is_a_reason(installed):
    rec = record(installed)
    installed["files"]["sglang.service"].write_text("ExecStart=/new --hicache-size 2\n")
    reasons = mem.restart_reasons(now_parts(installed), rec, RUNNING)
    assert len(reasons) == 1 and "file:%s" % installed["files"]["sglang.service"] in reasons[0]


@pytest.mark.parametrize("name", ["launch.json", "sglang.env", "sglang-launch"])
def test_each_file_the_start_reads_counts(installed, name):
    rec = record(installed)
    installed["files"][name].write_text("changed\n")
    reasons = mem.restart_reasons(now_parts(installed), rec, RUNNING)
    assert reasons and installed["files"][name].name in reasons[-1]


def test_api_key_file_removed_is_a_reason(installed):
    rec = record(installed)
    installed["files"]["api-key"].unlink()
    assert mem.restart_reasons(now_parts(installed), rec, RUNNING)


def test_package_installed_or_upgraded_is_a_reason(installed):
    rec = record(installed)
    (installed["site"] / "sglang-0.5.21.dist-info").rename(installed["site"] / "sglang-0.5.22.dist-info")
    reasons = mem.restart_reasons(now_parts(installed), rec, RUNNING)
    assert reasons and "venv:" in reasons[-1]


def test_model_file_replaced_is_a_reason(installed):
    rec = record(installed)
    config = installed["model"] / "config.json"
    st = os.stat(config)
    config.write_text('{"a": 1}')
    os.utime(config, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    reasons = mem.restart_reasons(now_parts(installed), rec, RUNNING)
    assert reasons and "tree:" in reasons[-1]


@pytest.mark.parametrize("unit, words", [
    (dict(RUNNING, ActiveState="inactive"), "inactive"),
    (dict(RUNNING, ActiveState="failed"), "failed"),
    (dict(RUNNING, ActiveState=None), "unreadable"),
    (dict(RUNNING, NeedDaemonReload="yes"), "NeedDaemonReload=yes"),
    (dict(RUNNING, NeedDaemonReload=None), "NeedDaemonReload=unreadable"),
    (dict(RUNNING, InvocationID="inv-2"), "another start"),
    (dict(RUNNING, InvocationID=""), "another start"),
])
def test_systemd_state_other_than_the_recorded_start_is_a_reason(installed, unit, words):
    rec = record(installed)
    reasons = mem.restart_reasons(now_parts(installed), rec, unit)
    assert reasons and any(words in r for r in reasons), reasons


def test_no_record_or_a_broken_one_is_a_reason(installed):
    assert mem.restart_reasons(now_parts(installed), None, RUNNING)
    assert mem.restart_reasons(now_parts(installed), {"digest": "x"}, RUNNING)
    installed["state"].parent.mkdir(parents=True)
    installed["state"].write_text("not json")
    assert mem.read_record(str(installed["state"])) is None


def test_record_is_roots_only_and_compare_prints_no_digest(installed):
    rec = record(installed)
    assert stat.S_IMODE(os.stat(installed["state"]).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(installed["state"].parent).st_mode) == 0o700
    done = subprocess.run([sys.executable, TOOL, *installed["args"], "--compare"], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    # This machine runs no sglang.service: whatever systemctl says, the decision is a restart.
    assert out["restart"] is True and out["restart_reasons"]
    assert out["changed_parts"] == []
    for digest in rec["parts"].values():
        assert digest not in done.stdout
    assert rec["digest"] not in done.stdout


def test_compare_names_the_changed_part(installed):
    record(installed)
    installed["files"]["launch.json"].write_text("{}\n")
    done = subprocess.run([sys.executable, TOOL, *installed["args"], "--compare"], capture_output=True, text=True,
                          timeout=60, check=False)
    assert json.loads(done.stdout)["changed_parts"] == ["file:%s" % installed["files"]["launch.json"]]
