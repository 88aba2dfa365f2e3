# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

import json

import pytest

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.testing import patch_module_args

from ansible_collections.inferops.gpu_inference.plugins.modules import gpu_diagnose

VMID = 9876  # no such container on the test machine: the host scan finds none of its processes
GPU_CSV = ("6, NVIDIA RTX PRO 6000, 97887, {used6}, GPU-6, 00000000:DB:00.0, 580.95.05, Enabled, 0\n"
           "7, NVIDIA RTX PRO 6000, 97887, 0, GPU-7, 00000000:BA:00.0, 580.95.05, Enabled, 0\n")


DECLARED = [{"host": "ct9876", "vmid": VMID, "node_host": "pve1"}]
# What gpu_baseline records for GPUs 6 and 7 at idle (MemAvailable 1 byte: any host passes).
BASE67 = {"vmid": VMID, "gpus": [{"index": 6, "uuid": "GPU-6", "memory_used_mib": 0},
                                 {"index": 7, "uuid": "GPU-7", "memory_used_mib": 0}],
          "host": {"mem_available_bytes": 1, "shmem_bytes": 0, "mlocked_bytes": 0}}


def run(monkeypatch, capsys, tmp_path, used6=0, baseline=None, service="inactive", smi_rc=0, config_rc=0,
        declared=None, allow_undeclared=False, action6="None", action_rc=0, ignore_baseline=False, kmsg=None,
        since=None, tags="inferops-gpu", minors=None, config_devs="dev0: /dev/nvidia6\ndev1: /dev/nvidia7\n",
        stop_when_decided=False, poll=None):
    minors = {6: 6, 7: 7} if minors is None else minors
    gpu_queries = []  # one per sample: used6 may be a list, GPU 6's memory.used in each sample in turn
    if baseline is not None:
        (tmp_path / ("%d.json" % VMID)).write_text(json.dumps(baseline))

    def get_bin_path(self, name, required=False, opt_dirs=None):
        return {"nvidia-smi": "/usr/bin/nvidia-smi", "pct": "/usr/sbin/pct"}.get(name)

    def run_command(self, args, **kwargs):
        cmd = list(args)
        if "status" in cmd:
            return 0, "status: running\npid: 1\n", ""
        if "config" in cmd:
            if config_rc:
                return config_rc, "", "CT is locked (backup)\n"
            return 0, config_devs + "memory: 4096\n" + ("tags: %s\n" % tags if tags else ""), ""
        if cmd[-1] == "-q":
            # nvidia-smi -q as NVIDIA's prints it: a "GPU <bus id>" heading, the Minor Number in its section.
            return 0, ("\n==============NVSMI LOG==============\n\nAttached GPUs                  : 2\n"
                       "GPU 00000000:DB:00.0\n    Product Name          : NVIDIA RTX PRO 6000\n"
                       "    Minor Number          : %s\n\nGPU 00000000:BA:00.0\n    Minor Number          : %s\n"
                       % (minors.get(6, "N/A"), minors.get(7, "N/A"))), ""
        if "exec" in cmd:
            return 0, "ActiveState=%s\nSubState=dead\nUnitFileState=disabled\nMainPID=0\nLoadState=loaded\n" % service, ""
        if "--query-gpu=index,gpu_recovery_action" in cmd:
            if action_rc:
                return action_rc, 'Field "gpu_recovery_action" is not a valid field to query.\n\n', ""
            return 0, "6, %s\n7, None\n" % action6, ""
        if any(a.startswith("--query-gpu") for a in cmd):
            gpu_queries.append(cmd)
            now6 = used6[min(len(gpu_queries), len(used6)) - 1] if isinstance(used6, list) else used6
            return (smi_rc, "" if smi_rc else GPU_CSV.format(used6=now6), "")
        if any(a.startswith("--query-compute-apps") for a in cmd):
            return 0, "", ""
        return 1, "", "unsupported"

    monkeypatch.setattr(AnsibleModule, "get_bin_path", get_bin_path)
    monkeypatch.setattr(AnsibleModule, "run_command", run_command)
    extra = {}
    if kmsg is not None:
        reads = iter(kmsg)  # what each read of the kernel log returns, in order
        monkeypatch.setattr(gpu_diagnose.rk, "read_kmsg", lambda path: next(reads))
        extra = {"kernel_log": True, "kernel_since_seq": since}
    with patch_module_args({"vmid": VMID, "node": "pve1", "declared": DECLARED if declared is None else declared,
                            "allow_undeclared": allow_undeclared, "ignore_baseline": ignore_baseline,
                            "samples": 2, "sample_interval": 0, "baseline_dir": str(tmp_path),
                            "kernel_log": False, "_ansible_check_mode": True, "stop_when_decided": stop_when_decided,
                            **(poll or {}), **extra}):
        with pytest.raises(SystemExit):
            gpu_diagnose.main()
    return json.loads(capsys.readouterr().out)


def test_without_a_baseline_never_clean_and_no_rung_to_climb(monkeypatch, capsys, tmp_path):
    res = run(monkeypatch, capsys, tmp_path)
    assert res["changed"] is False
    assert res["verdict"] == "Not clean" and res["clean"] is False and res["recommended_rung"] == 0
    assert res["findings"]["baseline_missing"] is True
    assert any(r.startswith("no baseline at") and "recover_record_baseline=true" in r for r in res["reasons"])
    assert res["rung_reason"].startswith("nothing a rung can change: no baseline")
    assert res["evidence"]["container"]["gpus"] == [6, 7]
    assert res["evidence"]["container"]["gpus_from"] == "pct config devN"
    assert any("no baseline" in n for n in res["notes"])


def test_driver_held_memory_recommends_container_stop(monkeypatch, capsys, tmp_path):
    res = run(monkeypatch, capsys, tmp_path, used6=86140)
    assert res["verdict"] == "Not clean"
    assert res["recommended_rung"] == 4
    assert res["findings"]["gpu_excess_without_process"] is True


def test_active_service_recommends_rung_1(monkeypatch, capsys, tmp_path):
    res = run(monkeypatch, capsys, tmp_path, used6=86140, service="active")
    assert res["recommended_rung"] == 1


def test_baseline_gpus_and_memory_used(monkeypatch, capsys, tmp_path):
    base = {"vmid": VMID, "gpus": [{"index": 6, "uuid": "GPU-6", "memory_used_mib": 100},
                                   {"index": 7, "uuid": "GPU-7", "memory_used_mib": 0}],
            "host": {"mem_available_bytes": 1, "shmem_bytes": 0, "mlocked_bytes": 0}}
    res = run(monkeypatch, capsys, tmp_path, used6=110, baseline=base)
    assert res["evidence"]["container"]["gpus"] == [6, 7]
    assert res["evidence"]["baseline"]["present"] is True
    assert res["verdict"] == "Clean", res["reasons"]


def test_nvidia_smi_fallen_off_the_bus_is_a_reboot(monkeypatch, capsys, tmp_path):
    res = run(monkeypatch, capsys, tmp_path, smi_rc=15)
    assert res["verdict"] == "Not clean"
    assert res["recommended_rung"] == 6
    assert res["findings"]["reboot_signals"] == ["a GPU has fallen off the bus (nvidia-smi rc 15)"]


def test_undeclared_container_is_refused_before_anything_is_read(monkeypatch, capsys, tmp_path):
    res = run(monkeypatch, capsys, tmp_path, declared=[{"host": "ct129", "vmid": 129, "node_host": "pve1"}])
    assert res["failed"] is True and res["refused"] == "scope"
    assert "CT %d is not a GPU container the inventory declares on pve1 (declared there: 129 (ct129))" % VMID in res["msg"]
    assert "verdict" not in res


def test_undeclared_container_named_explicitly_is_diagnosed(monkeypatch, capsys, tmp_path):
    res = run(monkeypatch, capsys, tmp_path, declared=[], allow_undeclared=True, baseline=BASE67)
    assert res["verdict"] == "Clean"
    assert res["evidence"]["container"]["scope"] == {"vmid": VMID, "declared_as": None, "override": True, "adopt": False}


def test_stale_baseline_is_refused(monkeypatch, capsys, tmp_path):
    base = {"vmid": VMID, "gpus": [{"index": 0, "uuid": "GPU-0", "memory_used_mib": 0}], "host": {}}
    res = run(monkeypatch, capsys, tmp_path, baseline=base)
    assert res["failed"] is True and res["refused"] == "gpus"
    assert "is stale: it was recorded for GPUs [0], but pct config %d now passes GPUs [6, 7]" % VMID in res["msg"]


def test_failed_pct_config_is_refused(monkeypatch, capsys, tmp_path):
    res = run(monkeypatch, capsys, tmp_path, config_rc=2)
    assert res["failed"] is True and "unknown is not clean" in res["msg"] and "CT is locked (backup)" in res["msg"]


@pytest.mark.parametrize("action,rung,reason", [
    ("Reset", 5, "the GPU must be reset"),
    ("Drain and Reset", 5, "the GPU must be reset"),
    ("Node Reboot", 6, "the node must be rebooted"),
    ("[Unknown Error]", 4, "unreadable: it cannot be judged clean"),
])
def test_the_drivers_recovery_action_is_part_of_the_gate(monkeypatch, capsys, tmp_path, action, rung, reason):
    res = run(monkeypatch, capsys, tmp_path, action6=action)
    assert res["verdict"] == "Not clean"
    assert any(r.startswith("GPU 6: the driver's recovery action is") and reason in r for r in res["reasons"]), res["reasons"]
    assert res["recommended_rung"] == rung
    assert res["evidence"]["recovery_actions"]["6"] == (None if action.startswith("[") else action)


def test_a_driver_without_the_recovery_action_field_is_noted_not_judged(monkeypatch, capsys, tmp_path):
    res = run(monkeypatch, capsys, tmp_path, action_rc=2, baseline=BASE67)
    assert res["verdict"] == "Clean"
    assert any(n.startswith("gpu_recovery_action not checked") for n in res["notes"])


def test_record_baseline_sets_a_stale_baseline_aside(monkeypatch, capsys, tmp_path):
    stale = {"vmid": VMID, "gpus": [{"index": 0, "uuid": "GPU-0", "memory_used_mib": 0}], "host": {}}
    res = run(monkeypatch, capsys, tmp_path, baseline=stale, ignore_baseline=True)
    assert "failed" not in res and res["evidence"]["container"]["gpus"] == [6, 7]
    assert res["findings"]["baseline_missing"] is True and res["recommended_rung"] == 0
    assert any("set aside" in n for n in res["notes"])


def kmsg(cursor, *lines):
    return {"records": [{"seq": seq, "usec": 0, "level": 4, "facility": 0, "message": m} for seq, m in lines],
            "cursor": cursor, "lost": 0, "error": None}


XID_GPU6 = "NVRM: Xid (PCI:0000:DB:00): %d, pid=1, name=python3, text"


@pytest.mark.parametrize("xid, rung, verdict", [(13, 0, "Not clean"), (79, 6, "Not clean")])
def test_a_new_xid_on_a_container_gpu_is_not_clean(monkeypatch, capsys, tmp_path, xid, rung, verdict):
    res = run(monkeypatch, capsys, tmp_path, baseline=BASE67,
              kmsg=[kmsg(100, (90, XID_GPU6 % 31)), kmsg(101, (90, XID_GPU6 % 31), (101, XID_GPU6 % xid))])
    assert res["verdict"] == verdict and res["recommended_rung"] == rung
    assert res["kernel_cursor"] == 100 and res["findings"]["new_xids"] == [xid]
    if rung == 0:
        assert any("kernel Xid 13 on GPU 6" in r for r in res["reasons"])
        assert res["rung_reason"].startswith("nothing a rung can change")
    else:
        assert res["findings"]["reboot_signals"] == ["kernel Xid 79 on GPU 6 since the run started"]


def test_an_old_xid_is_evidence_and_the_cursor_is_kept(monkeypatch, capsys, tmp_path):
    res = run(monkeypatch, capsys, tmp_path, baseline=BASE67, since=95,
              kmsg=[kmsg(120, (90, XID_GPU6 % 79)), kmsg(120, (90, XID_GPU6 % 79))])
    assert res["verdict"] == "Clean" and res["kernel_cursor"] == 95
    assert any("before this run" in n for n in res["notes"])


def test_an_unreadable_kernel_log_is_not_clean(monkeypatch, capsys, tmp_path):
    bad = {"records": [], "cursor": None, "lost": 0, "error": "/dev/kmsg: Permission denied"}
    res = run(monkeypatch, capsys, tmp_path, baseline=BASE67, kmsg=[bad, bad])
    assert res["verdict"] == "Not clean" and res["recommended_rung"] == 0
    assert any("kernel log not readable" in r for r in res["reasons"])


def test_unreadable_memory_alone_is_not_clean_and_asks_for_no_rung(monkeypatch, capsys, tmp_path):
    res = run(monkeypatch, capsys, tmp_path, used6="[N/A]", baseline=BASE67)
    assert res["verdict"] == "Not clean" and res["clean"] is False and res["recommended_rung"] == 0
    assert res["findings"]["only_unreadable"] is True
    assert any("GPU 6: nvidia-smi reports no memory.used figure" in r for r in res["reasons"])
    assert res["rung_reason"].startswith("nothing a rung can change")


# Ownership: a VMID the inventory declares but that someone else made again, without the collection's tag.
def test_a_container_without_the_owner_tag_is_refused_before_anything_is_judged(monkeypatch, capsys, tmp_path):
    res = run(monkeypatch, capsys, tmp_path, baseline=BASE67, tags="tenant-b;web")
    assert res["failed"] is True and res["refused"] == "owner"
    assert "does not carry the PVE tag 'inferops-gpu'" in res["msg"] and "(its tags: tenant-b;web)" in res["msg"]
    assert "pve_gpu_container_adopt=true" in res["msg"] and "Nothing has been changed" in res["msg"]
    assert "verdict" not in res


def test_no_tags_at_all_is_refused_too(monkeypatch, capsys, tmp_path):
    res = run(monkeypatch, capsys, tmp_path, baseline=BASE67, tags="")
    assert res["refused"] == "owner" and "(its tags: none)" in res["msg"]


def test_an_untagged_container_whose_host_adopts_it_is_diagnosed(monkeypatch, capsys, tmp_path):
    declared = [dict(DECLARED[0], adopt=True)]
    res = run(monkeypatch, capsys, tmp_path, baseline=BASE67, tags="", declared=declared)
    assert res["verdict"] == "Clean"
    assert res["evidence"]["container"]["owner"] == {"tag": "inferops-gpu", "tagged": False, "adopted": True}


def test_an_undeclared_container_named_explicitly_still_needs_the_tag(monkeypatch, capsys, tmp_path):
    res = run(monkeypatch, capsys, tmp_path, declared=[], allow_undeclared=True, baseline=BASE67, tags="other")
    assert res["refused"] == "owner"


# GPU numbering: /dev/nvidiaN is the driver's minor number, not the nvidia-smi index (nvidia-smi -q, Minor Number).
def test_device_minors_are_turned_into_nvidia_smi_indexes_through_the_driver(monkeypatch, capsys, tmp_path):
    # The container passes /dev/nvidia6 only; on this node minor 6 is GPU index 7 (bus BA) and minor 7 index 6.
    res = run(monkeypatch, capsys, tmp_path, used6=4096, minors={6: 7, 7: 6}, config_devs="dev0: /dev/nvidia6\n",
              baseline={"vmid": VMID, "gpus": [{"index": 7, "uuid": "GPU-7", "memory_used_mib": 0}],
                        "host": {"mem_available_bytes": 1, "shmem_bytes": 0, "mlocked_bytes": 0}})
    c = res["evidence"]["container"]
    assert c["gpus"] == [7] and c["gpu_minors"] == [6] and c["gpus_unmapped"] == []
    assert c["gpu_numbering"] == {"/dev/nvidia6": {"index": 7, "pci_bus_id": "0000:ba:00.0"}}
    # GPU index 6 (another tenant's, 4096 MiB used) is not judged as this container's: Clean.
    assert res["verdict"] == "Clean", res["reasons"]
    assert [g["index"] for g in res["evidence"]["gpus"]] == [7]


def test_the_same_memory_on_the_container_gpu_is_judged(monkeypatch, capsys, tmp_path):
    res = run(monkeypatch, capsys, tmp_path, used6=4096, minors={6: 7, 7: 6}, config_devs="dev0: /dev/nvidia7\n",
              baseline={"vmid": VMID, "gpus": [{"index": 6, "uuid": "GPU-6", "memory_used_mib": 0}],
                        "host": {"mem_available_bytes": 1, "shmem_bytes": 0, "mlocked_bytes": 0}})
    assert res["evidence"]["container"]["gpus"] == [6]
    assert res["verdict"] == "Not clean"
    assert any(r.startswith("GPU 6: 4096 MiB used") for r in res["reasons"]), res["reasons"]


def test_a_minor_the_driver_does_not_number_is_unknown_and_not_clean(monkeypatch, capsys, tmp_path):
    res = run(monkeypatch, capsys, tmp_path, baseline=BASE67, minors={6: 6})  # GPU 7's Minor Number: N/A
    c = res["evidence"]["container"]
    assert c["gpus"] == [6] and c["gpus_unmapped"] == [7]
    assert res["verdict"] == "Not clean"
    assert any("GPU(s) of the container unknown: /dev/nvidia7" in r and "Minor Number" in r for r in res["reasons"])


def _samples_taken(monkeypatch, capsys, tmp_path, **kw):
    res = run(monkeypatch, capsys, tmp_path, **kw)
    return res, len(res["evidence"]["samples"])


def test_a_decided_first_sample_ends_the_sampling_only_when_asked(monkeypatch, capsys, tmp_path):
    res, n = _samples_taken(monkeypatch, capsys, tmp_path, used6=86140, baseline=BASE67, stop_when_decided=True)
    assert (n, res["verdict"], res["recommended_rung"]) == (1, "Not clean", 4)
    res, n = _samples_taken(monkeypatch, capsys, tmp_path, used6=86140, baseline=BASE67)
    assert (n, res["verdict"], res["recommended_rung"]) == (2, "Not clean", 4)


def test_a_clean_sample_is_always_followed_by_the_next(monkeypatch, capsys, tmp_path):
    res, n = _samples_taken(monkeypatch, capsys, tmp_path, used6=0, baseline=BASE67, stop_when_decided=True)
    assert (n, res["verdict"]) == (2, "Clean")


def test_a_verification_polls_in_one_call_until_a_diagnosis_settles(monkeypatch, capsys, tmp_path):
    """The memory is held for the first diagnoses (each reads GPUs for the numbering and for its two samples), then
    released: the call goes on diagnosing until the gate passes, and says how many diagnoses it made."""
    import time
    held = [86140] * 6 + [0]
    res = run(monkeypatch, capsys, tmp_path, used6=held, baseline=BASE67,
              poll={"after_rung": 4, "rung_started_at": time.time(), "poll_budget": 30, "poll_delay": 0})
    assert (res["verdict"], res["settled"], res["polls"]) == ("Clean", True, 3)


def test_a_verification_stops_polling_when_its_budget_has_passed(monkeypatch, capsys, tmp_path):
    import time
    res = run(monkeypatch, capsys, tmp_path, used6=86140, baseline=BASE67,
              poll={"after_rung": 4, "rung_started_at": time.time(), "poll_budget": 0.3, "poll_delay": 0.1,
                    "release_grace": 600})
    # It returned, unsettled, with the last diagnosis's result (how many fit in the budget depends on the machine).
    assert res["verdict"] == "Not clean" and not res["settled"] and res["settled_reason"].startswith("waiting")
    assert res["polls"] >= 1


def test_without_a_rung_start_one_diagnosis_whatever_the_budget(monkeypatch, capsys, tmp_path):
    res = run(monkeypatch, capsys, tmp_path, used6=86140, baseline=BASE67, poll={"poll_budget": 30, "poll_delay": 0})
    assert res["polls"] == 1 and not res["settled"]


def test_a_vmid_that_is_no_guest_id_is_refused_before_anything_is_read(monkeypatch, capsys, tmp_path):
    # The inventory model's VMID rule (module_utils/common/gpu_inventory.py), the one every reader applies.
    def nothing_read(*args, **kwargs):
        raise AssertionError("read before the VMID was checked")

    monkeypatch.setattr(AnsibleModule, "run_command", nothing_read)
    with patch_module_args({"vmid": 42, "node": "pve1", "declared": DECLARED, "baseline_dir": str(tmp_path)}):
        with pytest.raises(SystemExit):
            gpu_diagnose.main()
    res = json.loads(capsys.readouterr().out)
    assert res["failed"] and res["msg"] == "vmid must be between 100 and 999999999 (a Proxmox VE guest ID), got 42"
