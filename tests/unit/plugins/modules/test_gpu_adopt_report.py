"""gpu_adopt_report's build(): the report from the module's parameters and the processes read (the decisions are
adopt.py's, called for real)."""

from __future__ import annotations

from ansible_collections.inferops.gpu_inference.plugins.module_utils.deploy import sglang_request as rq
from ansible_collections.inferops.gpu_inference.plugins.modules import gpu_adopt_report as m

GIB = 2**30
SETTINGS = {
    "version": "0.5.9", "tp_size": 8, "pp_size": 1, "dp_size": 1, "enable_dp_attention": False,
    "nnodes": 1, "node_rank": 0, "model_preset": "kimi-k2", "kv_cache_dtype": "auto", "requested_gb": 0,
    "policy": {}, "plan_extra": {}, "extra_args": [], "host": "", "port": 30000, "api_key_set": True,
    "allow_unauthenticated": False, "model_path": "/models/kimi", "served_model_name": "",
    "dist_init_host": "", "dist_init_port": 50000,
}
GPUS = [{"index": i, "minor_number": i, "uuid": "GPU-%d" % i, "pci_bus_id": "00000000:%02X:00.0" % (0x10 + i),
         "memory_total_mib": 97887, "memory_used_mib": 90000, "name": "NVIDIA RTX PRO 6000"} for i in range(8)]
RAW = [["lxc.cgroup2.devices.allow", "c 195:* rwm"]] + [
    ["lxc.mount.entry", "/dev/nvidia%d dev/nvidia%d none bind,optional,create=file" % (i, i)] for i in range(8)]
CONFIG = {"hostname": "kimi", "cores": 96, "memory": 420 * 1024, "swap": 0, "rootfs": "local-lvm:vm-129-disk-0,size=200G",
          "net0": "name=eth0,bridge=vmbr0,ip=dhcp", "lxc": RAW}
SPEC = {"host": "ct129", "vmid": 129, "gpus": list(range(8)), "memory_mib": 420 * 1024, "swap_mib": 0, "cores": 8,
        "hostname": "sglang-129", "rootfs": "local-lvm:64", "features": {"nesting": True}, "adopt": True}
ARGV = ["/root/venv/bin/python3", "-m", "sglang.launch_server", "--model-path", "/models/kimi", "--tp-size", "8",
        "--enable-hierarchical-cache", "--hicache-size", "300", "--port", "30000"]


def params(**over):
    p = {"vmid": 129, "host": "ct129", "config": CONFIG, "spec": SPEC, "inventory_sets": [], "consent": False,
         "plan_base": rq.request(SETTINGS)["plan_base"], "planned_gb": 41, "port": 30000, "unit": "sglang.service",
         "node_gpus": GPUS, "mem_total_bytes": 449 * GIB, "mem_available_bytes": 40 * GIB,
         "container_held_bytes": 400 * GIB, "baseline_present": False, "stop_timeout_s": 120}
    p.update(over)
    return p


def procs():
    return [{"pid": 5000, "ppid": 4000, "pgid": 4990, "starttime": 77, "argv": ARGV, "unit": "", "ct_pid": 310}] + [
        {"pid": 5001 + r, "ppid": 5000, "pgid": 4990, "starttime": 78, "argv": ["sglang::scheduler_TP%d" % r], "unit": "",
         "ct_pid": 311 + r} for r in range(8)]


def test_the_incident_container_is_reported_as_overcommit_and_the_run_stops_without_consent():
    res = m.build(params(), procs())
    text = "\n".join(res["lines"])
    assert "your running --hicache-size 300 x 8 ranks does not fit: 2400 GB vs" in text and "OVERCOMMIT" in text
    assert res["refusal"] and "pve_gpu_container_adopt_interrupt=true" in res["refusal"]
    assert res["manage_devn"] is False and sorted(res["omit"]) == ["cores", "features", "hostname", "rootfs"]
    assert res["hand_run_servers"] == [{"pid": 5000, "pgid": 4990, "starttime": 77, "ct_pids": list(range(310, 319))}]
    assert res["record_baseline_now"] is False


def test_with_consent_the_run_goes_on_and_the_server_under_the_unit_is_not_hand_run():
    assert m.build(params(consent=True), procs())["refusal"] is None
    under_unit = [dict(p, unit="sglang.service") for p in procs()]
    res = m.build(params(), under_unit)
    assert res["hand_run"] == [] and res["refusal"] is None and not res["interrupts"]
