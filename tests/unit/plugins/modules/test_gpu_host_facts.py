# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

import json

import pytest

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.testing import patch_module_args

from ansible_collections.inferops.gpu_inference.plugins.modules import gpu_host_facts

GPU_CSV = "0, NVIDIA H100 80GB HBM3, 81559, 0, GPU-aaaa, 00000000:18:00.0, 550.54.15, Enabled, 0\n"
APPS_CSV = "4242, sglang::scheduler_TP0, 70144, GPU-aaaa\n"


def run(monkeypatch, capsys, args, smi_path="/usr/bin/nvidia-smi", smi_rc=0, pct=None):
    def get_bin_path(self, name, required=False, opt_dirs=None):
        return {"nvidia-smi": smi_path, "pct": "/usr/sbin/pct"}.get(name)

    def run_command(self, args, **kwargs):
        # Every command runs under the bounded supervisor: [python, -c, code, timeout, limit, after, --, command...].
        assert args[1] == "-c" and args[6] == "--" and float(args[3]) == gpu_host_facts.COMMAND_TIMEOUT_S, args
        args = args[7:]
        if args[0] == "/usr/sbin/pct":
            return pct(args)
        if smi_rc:
            return smi_rc, "", "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."
        if args[1].startswith("--query-gpu"):
            return 0, GPU_CSV, ""
        if args[1:] == ["-q"]:
            return 0, "\nAttached GPUs : 1\nGPU 00000000:18:00.0\n    Minor Number                          : 3\n", ""
        return 0, APPS_CSV, ""

    monkeypatch.setattr(AnsibleModule, "get_bin_path", get_bin_path)
    monkeypatch.setattr(AnsibleModule, "run_command", run_command)
    with patch_module_args(args):
        with pytest.raises(SystemExit):
            gpu_host_facts.main()
    return json.loads(capsys.readouterr().out)


def test_reports_gpus_and_memory(monkeypatch, capsys):
    res = run(monkeypatch, capsys, {"_ansible_check_mode": True})
    assert res["changed"] is False
    facts = res["ansible_facts"]["gpu_host"]
    assert facts["gpu_count"] == 1
    assert facts["gpus"][0]["memory_total_mib"] == 81559
    assert facts["gpus"][0]["minor_number"] == 3 and facts["gpu_numbering_problems"] == []  # /dev/nvidia3 is GPU 0
    assert facts["compute_apps"][0]["pid"] == 4242
    assert facts["nvidia_smi_error"] is None
    assert facts["memory"]["mem_total_bytes"] > 0
    assert res["gpus"] == facts["gpus"]


def test_missing_nvidia_smi_is_not_a_failure(monkeypatch, capsys):
    res = run(monkeypatch, capsys, {}, smi_path=None)
    assert res.get("failed") is not True
    assert res["gpus"] == [] and "not found" in res["nvidia_smi_error"]


def test_require_gpus_fails_clearly(monkeypatch, capsys):
    res = run(monkeypatch, capsys, {"require_gpus": True}, smi_rc=9)
    assert res["failed"] is True
    assert "couldn't communicate with the NVIDIA driver" in res["msg"]
    assert "require_gpus" in res["msg"]


def test_container_memory_is_read_per_vmid_from_pct_status(monkeypatch, capsys):
    asked = []

    def pct(args):
        asked.append(args)
        return (0, "status: stopped\n", "") if args[2] == "131" else (2, "", "Configuration file 'nodes/pve1/lxc/132.conf' does not exist")
    res = run(monkeypatch, capsys, {"container_vmids": [131]}, pct=pct)
    assert asked == [["/usr/sbin/pct", "status", "131", "--verbose"]]
    assert res["containers_memory"] == {"131": {"cgroup_version": None, "path": None, "memory_limit_bytes": None,
                                                "memory_usage_bytes": None, "memory_held_bytes": None, "oom_kills": None}}
    res = run(monkeypatch, capsys, {"container_vmids": [132]}, pct=pct)
    assert res["failed"] is True and "pct status 132 --verbose failed (2)" in res["msg"]


def test_no_container_memory_unless_asked(monkeypatch, capsys):
    res = run(monkeypatch, capsys, {}, pct=lambda args: pytest.fail("pct called"))
    assert res["containers_memory"] == {}


def test_a_named_nvidia_smi_that_is_not_there_reads_as_none(monkeypatch, capsys, tmp_path):
    # The container play names /usr/bin/nvidia-smi; before the userspace driver is installed it is not there.
    res = run(monkeypatch, capsys, {"nvidia_smi_path": str(tmp_path / "nvidia-smi")})
    assert res.get("failed") is not True and res["gpus"] == [] and "not found" in res["nvidia_smi_error"]
    assert res["driver_version"] is None
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\n")
    smi.chmod(0o755)
    res = run(monkeypatch, capsys, {"nvidia_smi_path": str(smi)})
    assert res["driver_version"] == "550.54.15" and res["nvidia_smi_error"] is None


def test_a_kernel_the_driver_does_not_build_for_is_a_warning(monkeypatch, capsys):
    """The node's driver (550.54.15 here) and a kernel it can boot (PVE 9.1's 6.17): warned and listed, not a
    failure; a kernel it builds for gives nothing."""
    monkeypatch.setattr(gpu_host_facts.gpu_facts, "node_kernels", lambda root: ["6.14.11-4-pve", "6.17.13-2-pve"])
    monkeypatch.setattr(gpu_host_facts.gpu_facts, "read_kernel_module_version", lambda root: None)
    warned = []
    monkeypatch.setattr(AnsibleModule, "warn", lambda self, msg: warned.append(msg))
    res = run(monkeypatch, capsys, {})
    problems = res["ansible_facts"]["gpu_host"]["driver_kernel_problems"]
    assert len(problems) == 1 and "with kernel 6.17.13-2-pve" in problems[0] and "#1143" in problems[0]
    assert problems[0] in warned and not res.get("failed")
