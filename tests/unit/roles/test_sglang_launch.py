"""The unit's launcher (roles/sglang_server/files/sglang_launch.py): the start guard checks the argv it runs,
and the API key reaches SGLang without being in any command line. Run as a real process with a stand-in
`sglang.launch_server` that records what it received."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
LAUNCHER = os.path.join(HERE, "..", "..", "..", "roles", "sglang_server", "files", "sglang_launch.py")


@pytest.fixture()
def world(tmp_path):
    pkg = tmp_path / "lib" / "sglang"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    # Records sys.argv, its own /proc/self/cmdline, and the key as argparse reads it (SGLang's ServerArgs:
    # parser.add_argument("--api-key", type=str)), as the real launch_server would see them.
    (pkg / "launch_server.py").write_text(textwrap.dedent(f"""
        import argparse, json, sys
        if __name__ == "__main__":
            parser = argparse.ArgumentParser()
            parser.add_argument("--api-key", type=str, default=None)
            key = parser.parse_known_args()[0].api_key
            with open({str(tmp_path / 'seen.json')!r}, "w") as f:
                json.dump({{"argv": sys.argv[1:], "cmdline": open("/proc/self/cmdline").read().split("\\0"),
                           "api_key": key}}, f)
    """))
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho \"0, ${GPU0_MIB:-0}\"\necho \"1, 0\"\n")
    smi.chmod(0o755)
    key = tmp_path / "api-key"
    key.write_text("s3cret-key\n")
    launch = {"guard": {"hicache_size_gb": 4, "owned": {"--hicache-size": "4", "--tp-size": "2", "--host": "10.0.0.5",
                                                        "--port": "30000"},
                        "required_available_bytes": 1, "gpu_used_max_mib": 256, "nvidia_smi": str(smi)}}
    (tmp_path / "launch.json").write_text(json.dumps(launch))
    return tmp_path


def run(world, args, env=None, key=True):
    argv = [sys.executable, LAUNCHER, "--launch", str(world / "launch.json")]
    if key:
        argv += ["--api-key-file", str(world / "api-key")]
    e = dict(os.environ, PYTHONPATH=str(world / "lib"), **(env or {}))
    return subprocess.run(argv + ["--"] + args, capture_output=True, text=True, env=e, timeout=60, check=False)


GOOD = ["--model-path", "/m", "--host", "10.0.0.5", "--port", "30000", "--tp-size", "2",
        "--enable-hierarchical-cache", "--hicache-size", "4"]


def test_planned_argv_starts_and_the_key_is_in_sys_argv_but_not_in_the_command_line(world):
    r = run(world, GOOD)
    assert r.returncode == 0, r.stderr
    seen = json.loads((world / "seen.json").read_text())
    assert seen["argv"][-1] == "--api-key=s3cret-key" and seen["api_key"] == "s3cret-key"
    assert not any("s3cret" in part for part in seen["cmdline"])
    assert "s3cret" not in r.stdout + r.stderr


def test_a_key_that_starts_with_a_dash_reaches_sglang(world):
    # secrets.token_urlsafe keys start with "-" one time in 64: the lab's did on 2026-12-04, and SGLang exited 2
    # ("argument --api-key: expected one argument") on every start.
    (world / "api-key").write_text("-JPdash-first_key\n")
    r = run(world, GOOD)
    assert r.returncode == 0, r.stderr
    assert json.loads((world / "seen.json").read_text())["api_key"] == "-JPdash-first_key"


@pytest.mark.parametrize("edit", [
    ["--hicache-size", "300"], ["--hicache-size=300"], ["--hicache-si", "300"], ["--tp-size", "8"],
    ["--host", "0.0.0.0"], ["--tensor-parallel-size", "8"],
])
def test_a_hand_edited_owned_flag_does_not_start(world, edit):
    r = run(world, GOOD + edit)
    assert r.returncode == 1
    assert "refusing to start" in r.stderr and "the plan" in r.stderr
    assert not (world / "seen.json").exists()


def test_a_missing_hicache_size_does_not_start(world):
    r = run(world, [a for a in GOOD if a not in ("--hicache-size", "4")])
    assert r.returncode == 1 and "--hicache-size (missing)" in r.stderr


def test_a_key_on_the_command_line_is_refused(world):
    r = run(world, GOOD + ["--api-key", "visible"], key=False)
    assert r.returncode == 1 and "every user can read" in r.stderr


def test_gpu_memory_still_held_does_not_start(world):
    r = run(world, GOOD, env={"GPU0_MIB": "4096"})
    assert r.returncode == 1 and "GPU 0 still holds 4096 MiB" in r.stderr


def test_unknown_gpu_state_does_not_start(world):
    r = run(world, GOOD, env={"GPU0_MIB": "[N/A]"})
    assert r.returncode == 1 and "unknown" in r.stderr


def test_not_enough_memory_available_does_not_start(world):
    launch = json.loads((world / "launch.json").read_text())
    launch["guard"]["required_available_bytes"] = 10**18
    (world / "launch.json").write_text(json.dumps(launch))
    r = run(world, GOOD)
    assert r.returncode == 1 and "MemAvailable" in r.stderr
