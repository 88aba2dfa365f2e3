# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

import signal
import subprocess

from ansible_collections.inferops.gpu_inference.plugins.module_utils import recover_procs as procs
from ansible_collections.inferops.gpu_inference.plugins.module_utils import recover_signals as rsig


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
    assert plan == {"groups": [], "pids": [5001], "starttimes": {5001: 1}, "skipped": []}


def test_send_signal_uses_negative_pgid_and_ignores_esrch():
    calls = []

    def fake_kill(pid, sig):
        calls.append((pid, sig))
        if pid == 7:
            raise ProcessLookupError()
        if pid == 8:
            raise PermissionError("nope")

    errors = rsig.send_signal({"groups": [100], "pids": [7, 8]}, signal.SIGKILL, fake_kill)
    assert calls == [(-100, signal.SIGKILL), (7, signal.SIGKILL), (8, signal.SIGKILL)]
    assert len(errors) == 1 and "nope" in errors[0]


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
        errors = rsig.send_signal({"groups": [], "pids": [proc.pid], "starttimes": {proc.pid: start + 1}}, signal.SIGKILL)
        assert errors and "reused" in errors[0] and proc.poll() is None
        assert rsig.send_signal({"groups": [], "pids": [proc.pid], "starttimes": {proc.pid: start}}, signal.SIGKILL) == []
        assert proc.wait(timeout=5) == -signal.SIGKILL
    finally:
        proc.kill()
    proc.wait()
    assert rsig.signal_pid(proc.pid, start, signal.SIGKILL) == "gone"


def test_pids_to_signal_carries_the_start_times():
    procs = [{"pid": 10, "pgid": 1, "vmid": 129, "nspid": [10, 5], "starttime": 777}]
    plan = rsig.pids_to_signal(procs, procs, 129, None)
    assert plan["pids"] == [10] and plan["starttimes"] == {10: 777}
