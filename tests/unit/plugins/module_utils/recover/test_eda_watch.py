# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""eda_watch: which containers are watched, which diagnosis is a fault, and when a fault becomes an event."""
from __future__ import annotations

import pytest

from ansible_collections.inferops.gpu_inference.plugins.module_utils.recover import eda_watch as ew

INV = {
    "_meta": {"hostvars": {
        "pve1": {}, "ct129": {"proxmox_vmid": 129}, "ct132": {"proxmox_vmid": "132", "gpu_recover_eda_relaunch": "true"},
        "ct140": {"pve_gpu_container_vmid": 140, "pve_gpu_container_node_host": "pve2"},
    }},
    "all": {"children": ["ungrouped", "proxmox_nodes", "sglang_containers"]},
    "proxmox_nodes": {"hosts": ["pve1", "pve2"]},
    "sglang_containers": {"hosts": ["ct129", "ct132"], "children": ["more"]},
    "more": {"hosts": ["ct140"]},
}

W129 = ew.Watched("ct129", 129, "pve1", False)


def diag(**findings):
    ev = findings.pop("evidence", {})
    base = {"gpu_excess_without_process": False, "holders": 0, "stuck": 0, "reboot_signals": [],
            "recovery_reset": False, "service_active": False}
    base.update(findings)
    return {"verdict": "Not clean", "reasons": ["r1"], "findings": base, "evidence": ev,
            "recommended_rung": 2, "recommended_rung_name": "kill_holders"}


def oom(n, seq=None, log_read=False):
    ev = {"container": {"memory": {"oom_kills": n}}}
    if log_read or seq is not None:
        ev["kernel_log"] = {"source": "/dev/kmsg", "oom_kill_last_seq": seq, "oom_kills_in_container": 0}
    return diag(evidence=ev)


def test_oom_mark_from_the_cgroup_counter_and_the_newest_kill_record():
    assert ew.oom_mark(oom(4, seq=812)) == {"cgroup": 4, "kernel_seq": 812}
    assert ew.oom_mark(oom(None, log_read=True)) == {"cgroup": None, "kernel_seq": -1}  # read, no kill record
    assert ew.oom_mark(oom(0)) == {"cgroup": 0, "kernel_seq": None}  # the log not read
    assert ew.oom_mark(diag()) == {"cgroup": None, "kernel_seq": None}


def test_a_kill_the_ring_buffer_shows_when_its_count_of_kills_stayed_the_same():
    # CI, 2026-12-04: a full ring buffer dropped an old kill as the new one came, so the count of the container's kill
    # records stayed 9 -> 9; the v1 child cgroup the kill ran in was removed, and its counter with it (0 -> 0).
    before = ew.oom_mark(diag(evidence={"container": {"memory": {"oom_kills": 0}},
                                        "kernel_log": {"source": "/dev/kmsg", "oom_kills_in_container": 9, "oom_kill_last_seq": 5120}}))
    now = diag(evidence={"container": {"memory": {"oom_kills": 0}},
                         "kernel_log": {"source": "/dev/kmsg", "oom_kills_in_container": 9, "oom_kill_last_seq": 5391}})
    found = ew.faults(now, before)
    assert [k for k, _why in found] == [ew.KIND_OOM_KILL] and "record 5391" in found[0][1]
    assert ew.faults(now, ew.oom_mark(now)) == []


def test_the_counter_alone_still_shows_a_kill_and_an_unread_source_keeps_its_mark():
    assert "2 more OOM kill(s)" in ew.new_oom_kills({"cgroup": 1, "kernel_seq": None}, ew.oom_mark(oom(3)))
    # the log not read this poll: its mark stays; read again with the same record, nothing new
    mark = ew.merge_oom_mark({"cgroup": 1, "kernel_seq": 700}, ew.oom_mark(oom(1)))
    assert mark == {"cgroup": 1, "kernel_seq": 700}
    assert ew.new_oom_kills(mark, ew.oom_mark(oom(1, seq=700))) is None
    # the newest kill record dropped from the buffer (-1), then a new kill: seen
    mark = ew.merge_oom_mark(mark, ew.oom_mark(oom(1, log_read=True)))
    assert mark["kernel_seq"] == -1 and ew.new_oom_kills(mark, ew.oom_mark(oom(1, seq=900)))
    assert ew.new_oom_kills(None, ew.oom_mark(oom(5, seq=900))) is None  # first poll: nothing to compare


def test_watched_containers_from_the_inventory_only():
    w = ew.watched_containers(INV)
    assert w == [ew.Watched("ct129", 129, "pve1", False), ew.Watched("ct132", 132, "pve1", True),
                 ew.Watched("ct140", 140, "pve2", False)]
    assert ew.declared(w)[0] == {"host": "ct129", "vmid": 129, "node_host": "pve1", "adopt": False}


@pytest.mark.parametrize("hv,msg", [({"proxmox_vmid": "x"}, "c: its VMID .proxmox_vmid. must be an integer"),
                                    ({"proxmox_vmid": 50}, "c: its VMID .proxmox_vmid. must be between 100"),
                                    ({}, "c: no VMID: set proxmox_vmid")])
def test_bad_vmid_refused(hv, msg):
    inv = {"_meta": {"hostvars": {"c": hv}}, "proxmox_nodes": {"hosts": ["n"]}, "sglang_containers": {"hosts": ["c"]}}
    with pytest.raises(ValueError, match=msg):
        ew.watched_containers(inv)


def test_duplicate_vmid_and_no_node_refused():
    inv = {"_meta": {"hostvars": {"a": {"proxmox_vmid": 129}, "b": {"proxmox_vmid": 129}}},
           "proxmox_nodes": {"hosts": ["n"]}, "sglang_containers": {"hosts": ["a", "b"]}}
    with pytest.raises(ValueError, match="a, b: VMID 129 is declared by each of them"):
        ew.watched_containers(inv)
    inv = {"_meta": {"hostvars": {"a": {"proxmox_vmid": 129}}}, "sglang_containers": {"hosts": ["a"]}}
    with pytest.raises(ValueError, match="a: no node: set pve_gpu_container_node_host"):
        ew.watched_containers(inv)


def test_a_serving_container_is_not_a_fault():
    # A running service holding its GPUs is Not clean for the ladder (rung 1) but not a fault.
    assert ew.faults(diag(service_active=True, holders=2), None) == []
    assert ew.faults({"verdict": "Clean", "findings": {}, "evidence": {}}, None) == []


def test_each_fault_kind():
    def kinds(d, prev=None):
        return [k for k, _why in ew.faults(d, prev)]

    assert kinds(diag(gpu_excess_without_process=True)) == [ew.KIND_HELD_NO_PROCESS]
    assert kinds(diag(holders=2)) == [ew.KIND_HOLDERS_WITHOUT_SERVICE]
    assert kinds(diag(stuck=1, service_active=True, holders=3)) == [ew.KIND_STUCK]
    assert kinds(diag(reboot_signals=["Xid 79"])) == [ew.KIND_REBOOT_SIGNAL]
    assert kinds(diag(recovery_reset=True)) == [ew.KIND_RESET_ASKED]
    assert kinds(diag(evidence={"service": {"active_state": "failed", "name": "sglang.service"}})) == [ew.KIND_SERVICE_FAILED]
    assert kinds(oom(3), {"cgroup": 2, "kernel_seq": None}) == [ew.KIND_OOM_KILL]
    assert kinds(oom(3), None) == [] and kinds(oom(3), {"cgroup": 3, "kernel_seq": None}) == []


def test_debounce_then_one_event_until_fixed():
    p = ew.Policy(ew.PolicySettings(debounce_s=10, cooldown_s=100, budget=3, budget_window_s=3600))
    d = diag(gpu_excess_without_process=True)
    assert p.observe(W129, d, 0) is None        # first sighting
    assert p.observe(W129, d, 5) is None        # not a grace apart yet
    e = p.observe(W129, d, 10)
    assert e["action"] == ew.ACTION_RECOVER and e["vmid"] == 129 and e["relaunch"] is False
    assert e["kinds"] == [ew.KIND_HELD_NO_PROCESS] and "GPU memory held" in e["reasons"][0]
    assert p.observe(W129, d, 20) is None       # in flight (still faulty, cool-down)
    assert p.observe(W129, diag(), 30) is None  # fixed
    assert p.observe(W129, d, 40) is None       # back: debounce again
    assert p.observe(W129, d, 50)["action"] == ew.ACTION_RECOVER


def test_a_transient_fault_makes_no_event():
    p = ew.Policy(ew.PolicySettings(debounce_s=10))
    assert p.observe(W129, diag(stuck=1), 0) is None
    assert p.observe(W129, diag(), 5) is None
    assert p.observe(W129, diag(stuck=1), 12) is None


def test_cooldown_ends_for_a_fault_that_stays():
    p = ew.Policy(ew.PolicySettings(debounce_s=0, cooldown_s=100, budget=5))
    d = diag(stuck=1)
    assert p.observe(W129, d, 0)["action"] == ew.ACTION_RECOVER
    assert p.observe(W129, d, 99) is None
    assert p.observe(W129, d, 100)["action"] == ew.ACTION_RECOVER


def test_budget_then_one_alert_then_nothing():
    p = ew.Policy(ew.PolicySettings(debounce_s=0, cooldown_s=0, budget=2, budget_window_s=3600))
    d = diag(holders=1)
    assert p.observe(W129, d, 0)["action"] == ew.ACTION_RECOVER
    assert p.observe(W129, d, 10)["action"] == ew.ACTION_RECOVER
    alert = p.observe(W129, d, 20)
    assert alert["action"] == ew.ACTION_ALERT and alert["relaunch"] is False
    assert "no more unattended recovery" in alert["message"]
    for t in (30, 4000, 9000):
        assert p.observe(W129, d, t) is None
    # Another container keeps its own budget.
    assert p.observe(ew.Watched("ct132", 132, "pve1", True), d, 30)["relaunch"] is True


def test_budget_window_slides():
    p = ew.Policy(ew.PolicySettings(debounce_s=0, cooldown_s=0, budget=1, budget_window_s=100))
    d = diag(holders=1)
    assert p.observe(W129, d, 0)["action"] == ew.ACTION_RECOVER
    assert p.observe(W129, diag(), 50) is None
    assert p.observe(W129, d, 101)["action"] == ew.ACTION_RECOVER


def test_oom_kill_needs_no_second_sighting():
    p = ew.Policy(ew.PolicySettings(debounce_s=60))
    assert p.observe(W129, oom(0), 0) is None
    e = p.observe(W129, oom(1), 5)
    assert e["action"] == ew.ACTION_RECOVER and e["kinds"] == [ew.KIND_OOM_KILL]


@pytest.mark.parametrize("kw", [{"budget": 0}, {"budget": True}, {"debounce_s": -1}, {"cooldown_s": "x"}])
def test_bad_settings_refused(kw):
    with pytest.raises(ValueError):
        ew.PolicySettings(**kw)


OK, DOWN, SLOW, FAIL = ew.READ_OK, ew.READ_UNREACHABLE, ew.READ_TIMED_OUT, ew.READ_FAILED


def test_an_unread_node_is_one_event_per_outage_after_its_polls_then_one_when_back():
    p = ew.Policy(ew.PolicySettings(unreachable_polls=3))
    assert p.observe_node("pve1", {129: (OK, "")}, 0) is None
    assert p.observe_node("pve1", {129: (DOWN, "ssh: connect refused")}, 10) is None
    assert p.observe_node("pve1", {129: (SLOW, "killed at 120 s")}, 20) is None
    assert p.node_states()["pve1"] == {"up": True, "failed_polls": 2, "last_read_at": 0}
    e = p.observe_node("pve1", {129: (DOWN, "ssh: connect refused"), 132: (DOWN, "not asked")}, 30)
    assert e["action"] == ew.ACTION_NODE_UNREACHABLE and e["node"] == "pve1" and e["vmids"] == [129, 132]
    assert e["failed_polls"] == 3 and e["first_failed_at"] == 10 and e["last_read_at"] == 0
    assert "CT 129: unreachable: ssh: connect refused" in e["reasons"] and "pve1" in e["message"]
    assert p.node_states()["pve1"]["up"] is False
    for t in (40, 50, 60):                   # the same outage: no second event
        assert p.observe_node("pve1", {129: (DOWN, "x")}, t) is None
    back = p.observe_node("pve1", {129: (OK, ""), 132: (FAIL, "module failed")}, 70)
    assert back["action"] == ew.ACTION_NODE_REACHABLE and back["failed_polls"] == 6 and back["unreachable_s"] == 40
    assert p.node_states()["pve1"] == {"up": True, "failed_polls": 0, "last_read_at": 70}
    assert p.observe_node("pve1", {129: (OK, "")}, 80) is None
    # A second outage is a second event.
    events = [p.observe_node("pve1", {129: (DOWN, "x")}, t) for t in (90, 100, 110)]
    assert [e and e["action"] for e in events] == [None, None, ew.ACTION_NODE_UNREACHABLE]


def test_a_node_with_one_container_read_is_read_and_polls_must_be_in_a_row():
    p = ew.Policy(ew.PolicySettings(unreachable_polls=2))
    for t in range(6):
        # one container's module failing is that container's trouble, logged by the source; its node answered
        assert p.observe_node("pve1", {129: (FAIL, "pct config failed"), 132: (OK, "")}, t) is None
    for t, outcome in enumerate([DOWN, OK, SLOW, OK, FAIL, OK]):
        assert p.observe_node("pve2", {140: (outcome, "")}, t) is None
    # Every container failing, for whatever reason, is the node not read.
    assert p.observe_node("pve2", {140: (FAIL, "")}, 10) is None
    assert p.observe_node("pve2", {140: (FAIL, "")}, 11)["action"] == ew.ACTION_NODE_UNREACHABLE
    assert p.node_states()["pve1"]["up"] is True and p.node_states()["pve2"]["up"] is False
    assert p.observe_node("pve3", {}, 0) is None and "pve3" not in p.node_states()
    with pytest.raises(ValueError, match="unknown read outcome"):
        p.observe_node("pve1", {129: ("maybe", "")}, 1)


def test_exhausted_budgets_are_listed():
    p = ew.Policy(ew.PolicySettings(debounce_s=0, cooldown_s=0, budget=1))
    stuck = diag(stuck=1)
    assert p.observe(W129, stuck, 0)["action"] == ew.ACTION_RECOVER and p.exhausted() == []
    assert p.observe(W129, stuck, 100)["action"] == ew.ACTION_ALERT and p.exhausted() == [129]


@pytest.mark.parametrize("n", [0, -1, True, 1.5, "3"])
def test_bad_unreachable_polls_refused(n):
    with pytest.raises(ValueError, match="unreachable_polls"):
        ew.PolicySettings(unreachable_polls=n)
