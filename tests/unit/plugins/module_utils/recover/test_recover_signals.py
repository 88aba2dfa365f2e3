# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

import signal
import subprocess

from ansible_collections.inferops.gpu_inference.plugins.module_utils.recover import recover_procs as procs
from ansible_collections.inferops.gpu_inference.plugins.module_utils.recover import recover_signals as rsig
from ansible_collections.inferops.gpu_inference.tests.unit.plugins.module_utils.real_procs import children  # noqa: F401  # pylint: disable=unused-import

VMID = 999999999  # no node has it: no real container process is ever attributed to it


def P(pid, pgid, vmid=131, nspid=None, starttime=1):
    return {"pid": pid, "pgid": pgid, "vmid": vmid, "nspid": nspid or [pid, pid - 1000], "starttime": starttime}


def test_pids_to_signal_scoped_to_the_container():
    init = P(5000, 5000, nspid=[5000, 1])
    rank0, rank1, main = P(5101, 5100), P(5102, 5100), P(5100, 5100)
    escaped = P(5200, 5200)
    mixed_member_host = P(5301, 5300, vmid=None)
    mixed = P(5300, 5300)
    outside = P(6000, 6000, vmid=130)
    procs = [init, rank0, rank1, main, escaped, mixed_member_host, mixed, outside]
    plan = rsig.pids_to_signal([rank0, rank1, escaped, mixed, outside, init], procs, 131, 5000)
    assert plan["groups"] == [5100, 5200]  # whole process groups, all members in CT 131
    assert plan["pids"] == [5300]  # its group has a host member: only the PID itself
    assert {s["pid"] for s in plan["skipped"]} == {6000, 5000}


def test_pids_to_signal_never_the_init_group():
    init = P(5000, 5000, nspid=[5000, 1])
    child = P(5001, 5000)  # in the init's process group
    plan = rsig.pids_to_signal([child], [init, child], 131, 5000)
    assert (plan["groups"], plan["pids"], plan["starttimes"], plan["skipped"]) == ([], [5001], {5001: 1}, [])


def test_wait_until():
    ticks = iter(range(100))
    values = iter([False, False, True])
    assert rsig.wait_until(lambda: next(values), 10, 1, sleep=lambda s: None, clock=lambda: next(ticks))
    assert not rsig.wait_until(lambda: False, 2, 1, sleep=lambda s: None, clock=lambda: next(ticks))


# --------------------------------------------------------------------------- signalling a planned PID (real processes)

def _child():
    proc = subprocess.Popen(["sleep", "60"])
    st = procs.read_stat(proc.pid)
    return proc, st["starttime"]


def test_signal_pid_hits_the_planned_process():
    proc, start = _child()
    try:
        assert rsig.signal_pid(proc.pid, start, signal.SIGKILL) == "sent"
        assert proc.wait(timeout=5) == -signal.SIGKILL
    finally:
        proc.kill()


def test_signal_pid_never_hits_a_reused_pid():
    proc, start = _child()
    try:
        # The plan saw another process (another start time) under this PID: the one there now is not signalled.
        assert rsig.signal_pid(proc.pid, start + 1, signal.SIGKILL) == "reused"
        assert proc.poll() is None
        out = rsig.send_signal({"vmid": VMID, "groups": [], "pids": [proc.pid], "starttimes": {proc.pid: start + 1}},
                               signal.SIGKILL)
        assert out["refused"] == [{"pid": proc.pid, "why": rsig.REFUSALS["reused"]}] and proc.poll() is None
        # Planned with its real start time (and no judged cgroup: only a process wholly in the container passes).
        assert rsig.signal_pid(proc.pid, start, signal.SIGKILL, scope=(VMID, None)) == "moved" and proc.poll() is None
        out = rsig.send_signal({"vmid": VMID, "groups": [], "pids": [proc.pid], "starttimes": {proc.pid: start},
                                "cgroups": {proc.pid: procs.read_process(proc.pid)["cgroup"]}}, signal.SIGKILL)
        assert out == {"groups": [], "pids": [proc.pid], "refused": [], "errors": []}
        assert proc.wait(timeout=5) == -signal.SIGKILL
    finally:
        proc.kill()
    proc.wait()
    assert rsig.signal_pid(proc.pid, start, signal.SIGKILL) == "gone"


def test_pids_to_signal_carries_the_start_times():
    procs = [{"pid": 10, "pgid": 1, "vmid": 129, "nspid": [10, 5], "starttime": 777}]
    plan = rsig.pids_to_signal(procs, procs, 129, None)
    assert plan["pids"] == [10] and plan["starttimes"] == {10: 777}


# --------------------------------------------------------------------------- real processes, real signals
#
# The plan is made from the real /proc (read_process), with only the container attribution given by the test: the
# unit tests cannot put a process into a container's cgroup (tests/lab/test_hostile_signals.py moves cgroups for
# real). What is judged at the moment of sending (start time, cgroup, the group's members now) is the real one.

def test_a_planned_group_is_signalled_whole(children):
    leader = children(process_group=0)
    member = children(process_group=leader.pid)
    plan = rsig.pids_to_signal([leader.record(VMID)], [leader.record(VMID), member.record(VMID)], VMID, None)
    assert plan["groups"] == [leader.pid] and plan["members"][leader.pid] == {
        leader.pid: procs.read_stat(leader.pid)["starttime"], member.pid: procs.read_stat(member.pid)["starttime"]}
    out = rsig.send_signal(plan, signal.SIGTERM)
    assert out == {"groups": [leader.pid], "pids": [], "refused": [], "errors": []}
    assert leader.gone() and member.gone() and leader.got_term() and member.got_term()


def test_a_group_whose_leader_exited_is_signalled_by_its_number(children):
    leader = children(process_group=0)
    member = children(process_group=leader.pid, on_term="stay")
    plan = rsig.pids_to_signal([member.record(VMID)], [leader.record(VMID), member.record(VMID)], VMID, None)
    leader.stop()  # reaped: no pidfd for the leader any more; the member keeps the group's number
    out = rsig.send_signal(plan, signal.SIGKILL)
    assert out["groups"] == [leader.pid] and member.gone()


def test_a_process_that_joined_the_group_from_outside_splits_it(children):
    """A process joins the planned group after the plan, from outside the container (here: the host): the group is
    not signalled, so it survives; the planned members are signalled one by one."""
    leader = children(process_group=0)
    member = children(process_group=leader.pid)
    plan = rsig.pids_to_signal([member.record(VMID)], [leader.record(VMID), member.record(VMID)], VMID, None)
    assert plan["groups"] == [leader.pid]
    intruder = children(process_group=leader.pid)
    out = rsig.send_signal(plan, signal.SIGTERM)
    assert out["groups"] == [] and sorted(out["pids"]) == sorted([leader.pid, member.pid])
    assert out["refused"][0]["pgid"] == leader.pid and "%d/" % intruder.pid in out["refused"][0]["why"]
    assert leader.gone() and member.gone()
    assert intruder.alive() and not intruder.got_term()


def test_a_member_planned_outside_the_container_keeps_the_group_from_being_planned(children):
    leader = children(process_group=0)
    member = children(process_group=leader.pid)
    host = children(process_group=leader.pid)
    plan = rsig.pids_to_signal([member.record(VMID)], [leader.record(VMID), member.record(VMID), host.record(vmid=None)], VMID, None)
    assert plan["groups"] == [] and plan["pids"] == [member.pid]
    out = rsig.send_signal(plan, signal.SIGKILL)
    assert out["pids"] == [member.pid] and member.gone()
    assert leader.alive() and host.alive()


def test_a_group_member_whose_pid_was_reused_is_not_signalled(children):
    """The plan saw another process under a member's PID (another start time): at the moment of sending that PID's
    process is not the judged one, so the group is split and it is left alone; the other members are signalled."""
    leader = children(process_group=0)
    member = children(process_group=leader.pid)
    reused = children(process_group=leader.pid)
    seen = dict(reused.record(VMID), starttime=reused.record(VMID)["starttime"] - 1)
    plan = rsig.pids_to_signal([leader.record(VMID)], [leader.record(VMID), member.record(VMID), seen], VMID, None)
    assert plan["groups"] == [leader.pid]
    out = rsig.send_signal(plan, signal.SIGKILL)
    assert out["groups"] == [] and sorted(out["pids"]) == sorted([leader.pid, member.pid])
    assert {"pid": reused.pid, "why": rsig.REFUSALS["reused"]} in out["refused"]
    assert leader.gone() and member.gone() and reused.alive()


def test_a_group_with_no_planned_member_left_is_not_signalled(children):
    leader = children(process_group=0)
    other = children(process_group=leader.pid)
    plan = rsig.pids_to_signal([leader.record(VMID)], [leader.record(VMID), other.record(VMID)], VMID, None)
    plan["members"][leader.pid] = {leader.pid: plan["members"][leader.pid][leader.pid] + 1,
                                   other.pid: plan["members"][leader.pid][other.pid] + 1}  # both PIDs reused since
    out = rsig.send_signal(plan, signal.SIGKILL)
    assert out["groups"] == [] and out["pids"] == []
    assert leader.alive() and other.alive()


def test_a_pid_without_a_planned_start_time_is_never_signalled(children):
    """Rung 3 used to drop the start times from its plan, and a PID without one got a bare kill(2)."""
    target = children()
    no_start = dict(target.record(VMID), starttime=None)
    plan = rsig.pids_to_signal([no_start], [no_start], VMID, None, by_group=False)
    assert plan["pids"] == [] and "no start time" in plan["skipped"][0]["why"]
    plan = {"vmid": VMID, "groups": [], "pids": [target.pid], "starttimes": {}}
    out = rsig.send_signal(plan, signal.SIGKILL)
    assert out["pids"] == [] and out["refused"] == [{"pid": target.pid, "why": rsig.REFUSALS["unplanned"]}]
    assert target.alive()


def test_rung_3s_plan_is_the_stuck_pids_with_their_start_times(children):
    leader = children(process_group=0)
    stuck = children(process_group=leader.pid)
    plan = rsig.pids_to_signal([stuck.record(VMID)], [leader.record(VMID), stuck.record(VMID)], VMID, None, by_group=False)
    assert plan["groups"] == [] and plan["pids"] == [stuck.pid]
    assert plan["starttimes"] == {stuck.pid: procs.read_stat(stuck.pid)["starttime"]}
    out = rsig.send_signal(plan, signal.SIGKILL)
    assert out["pids"] == [stuck.pid] and stuck.gone() and leader.alive()


def test_a_pid_that_left_its_judged_cgroup_is_not_signalled(children):
    """The plan judged it in a cgroup it is not in now, and it is not wholly in the container: not signalled. (The
    unit test cannot move a process, so the plan says it was judged elsewhere; the lab moves one for real.)"""
    target = children(process_group=0)
    rec = dict(target.record(VMID), cgroup={"": "/lxc/%d/ns/system.slice/sglang.service" % VMID})
    plan = rsig.pids_to_signal([rec], [rec], VMID, None)
    out = rsig.send_signal(plan, signal.SIGKILL)
    assert plan["groups"] == [target.pid] and out["groups"] == [] and out["pids"] == []
    assert {"pid": target.pid, "why": rsig.REFUSALS["moved"]} in out["refused"]
    assert "%d/%s" % (target.pid, procs.read_stat(target.pid)["comm"]) in out["refused"][0]["why"]  # the group: its one member is not where judged
    assert target.alive()


def test_wholly_in_container():
    assert procs.wholly_in_container({"": "/lxc/129/ns/init.scope", "memory": "/lxc/129/ns"}, 129)
    assert procs.wholly_in_container({"": "/lxc.payload.129/system.slice"}, 129)
    assert not procs.wholly_in_container({"": "/", "memory": "/lxc/129/ns"}, 129)  # moved out in one hierarchy
    assert not procs.wholly_in_container({"": "/lxc/130/ns"}, 129)
    assert not procs.wholly_in_container({"": "/lxc.monitor/129"}, 129)
    assert not procs.wholly_in_container({}, 129)
