# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

import os

from ansible_collections.inferops.gpu_inference.plugins.module_utils.recover import recover_kernel as rk

BUS = {0: "00000000:18:00.0", 1: "00000000:2A:00.0", 6: "00000000:BA:00.0"}


def rec(seq, message):
    return {"seq": seq, "usec": seq * 1000, "level": 4, "facility": 0, "message": message}


def xid_line(bus, xid, text="Graphics Exception"):
    return "NVRM: Xid (PCI:0000:%s:00): %d, pid=4242, name=python3, %s" % (bus, xid, text)


def test_parse_record_of_dev_kmsg():
    r = rk.parse_record("4,1234,5678901,-;NVRM: Xid (PCI:0000:18:00): 79, pid='<unknown>', name=<unknown>, "
                        "GPU has fallen off the bus.\n SUBSYSTEM=pci\n DEVICE=+pci:0000:18:00.0\n")
    assert r == {"seq": 1234, "usec": 5678901, "level": 4, "facility": 0,
                 "message": "NVRM: Xid (PCI:0000:18:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."}
    assert rk.parse_record("12,7,0,-;user message\n")["facility"] == 1
    assert rk.parse_record("no record here") is None
    assert rk.parse_record("a,b,c;text") is None


def test_xid_placed_by_pci_address():
    assert rk.pci_key("00000000:18:00.0") == rk.pci_key("0000:18:00") == (0, 0x18, 0)
    assert rk.pci_key("garbage") is None and rk.pci_key(None) is None
    x = rk.parse_xid(xid_line("2A", 13))
    assert x["xid"] == 13 and x["pci"] == "0000:2A:00"
    assert rk.parse_xid("NVRM: loading NVIDIA UNIX x86_64 Kernel Module") is None


def test_only_xids_after_the_cursor_count():
    records = [rec(10, xid_line("18", 79)), rec(20, xid_line("18", 13))]
    old_only = rk.judge(records, 20, BUS, [0, 1])
    assert old_only["reasons"] == [] and old_only["reboot_signals"] == []
    assert [x["xid"] for x in old_only["old_xids"]] == [79, 13]
    assert any("before this run" in n for n in old_only["notes"])
    fresh = rk.judge(records, 15, BUS, [0, 1])
    assert [x["xid"] for x in fresh["new_xids"]] == [13]
    assert len(fresh["reasons"]) == 1 and "Xid 13 on GPU 0" in fresh["reasons"][0]
    assert fresh["reboot_signals"] == []


def test_without_a_cursor_everything_is_evidence():
    res = rk.judge([rec(1, xid_line("18", 79))], None, BUS, [0])
    assert res["new_xids"] == [] and res["reboot_signals"] == [] and res["reasons"] == []


def test_reboot_class_xids_are_reboot_signals():
    for xid in sorted(rk.REBOOT_XIDS):
        res = rk.judge([rec(5, xid_line("2A", xid))], 4, BUS, [0, 1])
        assert res["reboot_signals"] == ["kernel Xid %d on GPU 1 since the run started" % xid]
        assert res["reasons"] == []


def test_xid_on_another_containers_gpu_is_a_note_and_unplaced_counts_as_ours():
    other = rk.judge([rec(5, xid_line("BA", 79))], 4, BUS, [0, 1])
    assert other["reboot_signals"] == [] and other["reasons"] == []
    assert any("not a GPU of this container" in n for n in other["notes"])
    unplaced = rk.judge([rec(5, xid_line("E1", 31))], 4, BUS, [0, 1])
    assert len(unplaced["reasons"]) == 1 and "PCI 0000:E1:00" in unplaced["reasons"][0]


def test_new_nvrm_lines_without_xid_are_noted():
    res = rk.judge([rec(5, "NVRM: GPU at PCI:0000:18:00: GPU-abc"), rec(3, "NVRM: old")], 4, BUS, [0])
    assert res["reasons"] == [] and any("GPU at PCI:0000:18:00" in n for n in res["notes"])
    assert not any("old" in n for n in res["notes"])


def test_read_kmsg_on_a_missing_device_is_an_error(tmp_path):
    res = rk.read_kmsg(str(tmp_path / "kmsg"))
    assert res["error"] and res["cursor"] is None and res["records"] == []


def test_read_kmsg_reads_the_real_ring_buffer_when_allowed():
    """On a machine where /dev/kmsg is readable (root), the cursor is a sequence number; the lab writes there."""
    res = rk.read_kmsg()
    if os.geteuid() == 0 and os.path.exists("/dev/kmsg"):
        assert res["error"] is None and isinstance(res["cursor"], int)
    else:
        assert res["error"]


def test_parse_kernel_log():
    text = "\n".join([
        "[Sun Nov 29 17:08:50 2026] python3 invoked oom-killer: gfp_mask=0xcc0(GFP_KERNEL), order=0",
        "[Sun Nov 29 17:08:50 2026] oom-kill:constraint=CONSTRAINT_MEMCG,oom_memcg=/lxc/129,"
        "task_memcg=/lxc/129/ns/system.slice/sglang.service,task=sglang::schedul,pid=4242,uid=100000",
        "[Sun Nov 29 17:09:00 2026] NVRM: Xid (PCI:0000:18:00): 79, pid=123, GPU has fallen off the bus.",
        "[Sun Nov 29 17:10:00 2026] eth0: link up", ""])
    k = rk.parse_kernel_log(text, 129)
    assert k["oom_kills_in_container"] == 1
    assert len(k["lines"]) == 3
    assert rk.parse_kernel_log(text, 130)["oom_kills_in_container"] == 0


def test_the_newest_oom_kill_record_of_the_container():
    records = [
        {"seq": 10, "message": "oom-kill:constraint=CONSTRAINT_MEMCG,oom_memcg=/lxc/129,task_memcg=/lxc/129/ns,task=python3,pid=7,uid=0"},
        {"seq": 11, "message": "NVRM: Xid (PCI:0000:18:00): 13, pid=1"},
        {"seq": 14, "message": "oom-kill:constraint=CONSTRAINT_MEMCG,oom_memcg=/lxc/1290,task_memcg=/lxc/1290/ns,task=x,pid=8,uid=0"},
        {"seq": 15, "message": "oom-kill:constraint=CONSTRAINT_MEMCG,oom_memcg=/lxc/129/ns/inferops-oom,"
                               "task_memcg=/lxc/129/ns/inferops-oom,task=python3,pid=22144,uid=100000"},
    ]
    assert rk.last_oom_kill_seq(records, 129) == 15
    assert rk.last_oom_kill_seq(records, 1290) == 14
    assert rk.last_oom_kill_seq(records[:2], 132) is None


# The kernel's record as mm/oom_kill.c prints it (dump_oom_victim: constraint, nodemask, cpuset, mems_allowed, then
# mem_cgroup_print_oom_context's oom_memcg/global_oom and task_memcg, then task, pid, uid).
def oom_record(task_memcg, task="python3", oom_memcg=None, cpuset="/", pid=22144, uid=100000):
    ctx = ",oom_memcg=%s" % oom_memcg if oom_memcg else ",global_oom"
    return ("oom-kill:constraint=%s,nodemask=(null),cpuset=%s,mems_allowed=0%s,task_memcg=%s,task=%s,pid=%d,uid=%d"
            % ("CONSTRAINT_MEMCG" if oom_memcg else "CONSTRAINT_NONE", cpuset, ctx, task_memcg, task, pid, uid))


def test_parse_oom_kill_reads_the_kernel_record():
    rec = rk.parse_oom_kill(oom_record("/lxc/129/ns/system.slice/sglang.service", "sglang::schedul",
                                       oom_memcg="/lxc/129", cpuset="/lxc/129/ns"))
    assert rec == {"constraint": "CONSTRAINT_MEMCG", "task_memcg": "/lxc/129/ns/system.slice/sglang.service",
                   "task_memcg_readings": ["/lxc/129/ns/system.slice/sglang.service"], "task": "sglang::schedul",
                   "pid": 22144, "uid": 100000, "vmid": 129}
    # dmesg's timestamp (and PRINTK_CALLER's) in front of the record
    assert rk.parse_oom_kill("[  12.5][ T811] " + oom_record("/lxc/132"))["vmid"] == 132
    assert rk.parse_oom_kill(oom_record("/lxc.payload.140/x"))["vmid"] == 140       # plain LXC's naming
    assert rk.parse_oom_kill(oom_record("/lxc.payload/141"))["vmid"] == 141
    assert rk.parse_oom_kill(oom_record("/user.slice/user-1000.slice"))["vmid"] is None
    assert rk.parse_oom_kill("python3 invoked oom-killer: gfp_mask=0xcc0(GFP_KERNEL), order=0") is None
    assert rk.parse_oom_kill("Memory cgroup out of memory: Killed process 5 (lxc.payload.129)") is None


HOSTILE_NOT_129 = [
    # A process of CT 130 named after CT 129's cgroup (prctl PR_SET_NAME): the comm is no identity.
    oom_record("/lxc/130/ns/inferops-oom", "lxc.payload.129", oom_memcg="/lxc/130/ns/inferops-oom"),
    oom_record("/lxc/130/ns", "/lxc/129/", oom_memcg="/lxc/130"),
    oom_record("/lxc/130/ns", "lxc/129", oom_memcg="/lxc/130"),
    # Paths that contain 129 elsewhere than where the container's cgroup starts.
    oom_record("/lxc/1290/ns", oom_memcg="/lxc/1290"),
    oom_record("/lxc/130/ns/lxc/129", oom_memcg="/lxc/130"),
    oom_record("/user.slice/user-1000.slice/user@1000.service/lxc/129/x"),
    oom_record("/lxc.monitor/129"),                     # LXC's monitor of CT 129, not the container
    oom_record("/system.slice/pve-container@129.service"),
    oom_record("/lxc/130/ns", oom_memcg="/lxc/130", cpuset="/lxc/129/ns"),
    # A comm or a cgroup name that forges the record's own separators: the line reads two ways, neither is taken.
    oom_record("/lxc/130/ns/x,task_memcg=/lxc/129/ns", oom_memcg="/lxc/130"),
    oom_record("/lxc/130/ns", ",task_memcg=/lxc/129", oom_memcg="/lxc/130"),
    oom_record("/lxc/130/ns/a,task=b,task_memcg=/lxc/129", "c,task=d", oom_memcg="/lxc/130"),
    oom_record("/lxc/130/ns", oom_memcg="/lxc/130", cpuset="/x,task_memcg=/lxc/129/ns,task=y"),
    # Text around a record, or a record inside another line, is not the record.
    "python3 invoked oom-killer: " + oom_record("/lxc/129/ns"),
    "lxc.payload.129 oom-kill " + oom_record("/lxc/130/ns", oom_memcg="/lxc/130"),
]


def test_oom_kills_are_attributed_by_task_memcg_only():
    for line in HOSTILE_NOT_129:
        rec = rk.parse_oom_kill(line)
        assert rec is None or rec["vmid"] != 129, line
        assert rk.parse_kernel_log(line, 129)["oom_kills_in_container"] == 0, line
        assert rk.last_oom_kill_seq([{"seq": 7, "message": line}], 129) is None, line
    # The forged separators make the line read two ways: it is kept as evidence, counted as ambiguous.
    forged = rk.parse_kernel_log(HOSTILE_NOT_129[9], 130)
    assert forged["oom_kills_in_container"] == 0 and forged["oom_kills_ambiguous"] == 1
    assert len(forged["lines"]) == 1
    # The attacker's own kill stays its own when its name alone is hostile.
    assert rk.parse_kernel_log(HOSTILE_NOT_129[0], 130)["oom_kills_in_container"] == 1
    assert rk.last_oom_kill_seq([{"seq": 9, "message": HOSTILE_NOT_129[0]}], 130) == 9


def test_a_kill_in_the_container_is_found_whatever_its_name():
    for line in [oom_record("/lxc/129", "x"), oom_record("/lxc/129/ns/inferops-oom", "lxc.payload.130"),
                 oom_record("/lxc/129/ns/a,b", "c", cpuset="/"), oom_record("/lxc/129/ns", "lxc.monitor/130"),
                 oom_record("/lxc/129/ns", "a,pid=1,uid=0", oom_memcg="/lxc/129"),
                 oom_record("/lxc/129/ns/,task_memcg=/lxc/129/ns", oom_memcg="/lxc/129")]:
        assert rk.parse_oom_kill(line)["vmid"] == 129, line
        assert rk.parse_kernel_log(line, 129)["oom_kills_in_container"] == 1, line
        assert rk.parse_kernel_log(line, 130)["oom_kills_in_container"] == 0, line
    rec = rk.parse_oom_kill(oom_record("/lxc/129/ns", "a,pid=1,uid=0", pid=77, uid=100033))
    assert (rec["pid"], rec["uid"], rec["task"]) == (77, 100033, "a,pid=1,uid=0")
