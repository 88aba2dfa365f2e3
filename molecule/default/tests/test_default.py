# -*- coding: utf-8 -*-
"""Verify the main job on the lab from the node (this machine): CT 129, SGLang, the plan, the bystander."""
from __future__ import annotations

import json
import os
import subprocess

import testinfra

NODE = testinfra.get_host("local://")
VMID = 129
ROOT = os.environ.get("MOLECULE_PROJECT_DIRECTORY", os.getcwd())
REPORT = os.path.join(os.environ.get("INFEROPS_REPORT_DIR", os.path.join(ROOT, "reports")), "ct129", "deploy.json")


def pct(*cmd: str) -> str:
    return subprocess.run(["/usr/sbin/pct", "exec", str(VMID), "--", *cmd], check=True, capture_output=True, text=True).stdout


def report() -> dict:
    with open(REPORT) as f:
        return json.load(f)


def test_ct_running_with_passthrough_and_limit():
    conf = NODE.file(f"/etc/pve/lxc/{VMID}.conf").content_string
    assert "memory: 14336" in conf
    for dev in ("/dev/nvidia0", "/dev/nvidia1", "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"):
        assert any(line.startswith("dev") and line.split(": ", 1)[1].split(",")[0] == dev for line in conf.splitlines()), dev
    assert "/dev/nvidia2" not in conf
    assert "status: running" in NODE.check_output(f"pct status {VMID}")


def test_unit_active_and_health():
    assert pct("systemctl", "is-active", "sglang.service").strip() == "active"
    unit = pct("cat", "/etc/systemd/system/sglang.service")
    assert "KillMode=control-group" in unit and "ExecStartPre=" in unit
    assert NODE.check_output("curl -s -o /dev/null -w '%{http_code}' http://10.77.0.129:30000/health") == "200"


def test_running_hicache_size_equals_plan():
    data = report()
    launch = json.loads(pct("cat", "/etc/sglang/launch.json"))
    assert data["running_matches_plan"] is True
    assert data["running"]["hicache_size"] == data["plan"]["per_rank_gb"] == launch["hicache_size"] == 1
    assert launch["argv"][launch["argv"].index("--hicache-size") + 1] == "1"


def test_pinned_memory_within_plan():
    mem = report()["memory"]
    assert mem["pools_pinned"] and mem["within_plan"]
    assert mem["ranks_seen"] == 2


def test_baseline_recorded():
    base = json.loads(NODE.file(f"/var/lib/inferops/baseline/{VMID}.json").content_string)
    assert base["vmid"] == VMID and base["service"] == "sglang.service"
    assert [g["index"] for g in base["gpus"]] == [0, 1]
    assert base["container_memory_limit_bytes"] == 14336 * 1024 * 1024


def test_bystander_untouched():
    pid_file = os.path.join(os.environ.get("MOLECULE_EPHEMERAL_DIRECTORY", "/nonexistent"), "bystander.pid")
    status = NODE.check_output(f"{ROOT}/tests/lab/labctl status")
    assert "130    running" in status
    if os.path.exists(pid_file):
        with open(pid_file) as f:
            assert f"bystanderd host pid {f.read().strip()}" in status
