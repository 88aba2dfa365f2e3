# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

import json

import pytest

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.testing import patch_module_args

from ansible_collections.inferops.gpu_inference.plugins.module_utils.recover import recover_procs as procs
from ansible_collections.inferops.gpu_inference.plugins.modules import gpu_baseline

GPU_CSV = ("0, NVIDIA H100, 81559, {used0}, GPU-0, 00000000:18:00.0, 580.95.05, Enabled, 0\n"
           "1, NVIDIA H100, 81559, 0, GPU-1, 00000000:2A:00.0, 580.95.05, Enabled, 0\n")


def run(monkeypatch, capsys, tmp_path, states, check=False, wait=0):
    """states: one (used0 MiB, apps csv) per nvidia-smi reading, the last one repeated."""
    states = list(states)
    monkeypatch.setattr(AnsibleModule, "get_bin_path", lambda self, name, required=False, opt_dirs=None:
                        {"nvidia-smi": "/usr/bin/nvidia-smi"}.get(name))

    def run_command(self, args, **kwargs):
        used0, apps = states[0]
        if any(a.startswith("--query-compute-apps") for a in args):
            if len(states) > 1:
                states.pop(0)
            return 0, apps, ""
        return 0, GPU_CSV.format(used0=used0), ""

    monkeypatch.setattr(AnsibleModule, "run_command", run_command)
    monkeypatch.setattr(procs, "read_text", lambda path: "0::/lxc/129/ns/system.slice/sglang.service\n"
                        if path == "/proc/4242/cgroup" else None)
    monkeypatch.setattr(gpu_baseline.time, "sleep", lambda s: None)
    with patch_module_args({"vmid": 129, "gpus": [0, 1], "baseline_dir": str(tmp_path), "container_memory_mib": 14336,
                            "wait": wait, "_ansible_check_mode": check}):
        with pytest.raises(SystemExit):
            gpu_baseline.main()
    return json.loads(capsys.readouterr().out)


def test_records_at_idle(monkeypatch, capsys, tmp_path):
    res = run(monkeypatch, capsys, tmp_path, [(2, "")])
    assert res["changed"] is True and res["path"] == str(tmp_path / "129.json")
    on_disk = json.loads((tmp_path / "129.json").read_text())
    assert on_disk == res["baseline"]
    assert [g["memory_used_mib"] for g in on_disk["gpus"]] == [2, 0]


def test_check_mode_writes_nothing(monkeypatch, capsys, tmp_path):
    res = run(monkeypatch, capsys, tmp_path, [(0, "")], check=True)
    assert res["changed"] is True and not (tmp_path / "129.json").exists()


def test_waits_for_the_gpus_to_be_released(monkeypatch, capsys, tmp_path):
    # SGLang's rank still holds GPU 0 on the first reading; gone on the second.
    res = run(monkeypatch, capsys, tmp_path, [(40000, "4242, sglang::scheduler_TP0, 40000, GPU-0\n"), (0, "")], wait=60)
    assert res["changed"] is True and res["baseline"]["gpus"][0]["memory_used_mib"] == 0


def test_refuses_leftovers_and_writes_nothing(monkeypatch, capsys, tmp_path):
    res = run(monkeypatch, capsys, tmp_path, [(300, "")], wait=0)
    assert res["failed"] is True and not (tmp_path / "129.json").exists()
    assert "GPU 0 uses 300 MiB with no process of its own" in res["msg"]


@pytest.mark.parametrize("vmid, says", [(99, "vmid must be between 100 and 999999999 (a Proxmox VE guest ID), got 99"),
                                        (1000000000, "got 1000000000")])
def test_a_vmid_that_is_no_guest_id_is_refused_before_anything_is_read(capsys, tmp_path, vmid, says):
    # The inventory model's VMID rule (module_utils/common/gpu_inventory.py), the one every reader applies.
    with patch_module_args({"vmid": vmid, "gpus": [0], "baseline_dir": str(tmp_path), "container_memory_mib": 14336}):
        with pytest.raises(SystemExit):
            gpu_baseline.main()
    res = json.loads(capsys.readouterr().out)
    assert res["failed"] and says in res["msg"] and not list(tmp_path.iterdir())
