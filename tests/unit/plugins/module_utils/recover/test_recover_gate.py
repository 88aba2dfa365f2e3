# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

import pytest

from ansible_collections.inferops.gpu_inference.plugins.module_utils.host import gpu_facts as gf
from ansible_collections.inferops.gpu_inference.plugins.module_utils.recover import recover_gate as gate

GIB, MIB = gate.GIB, 1024**2

BASE = {"gpus": [{"index": 6, "uuid": "GPU-6", "memory_used_mib": 0}, {"index": 7, "uuid": "GPU-7", "memory_used_mib": 4}],
        "host": {"mem_total_bytes": 100 * GIB, "mem_available_bytes": 90 * GIB, "shmem_bytes": GIB,
                 "mlocked_bytes": 0}}
TOL = {"gpu_memory_mib": 16, "mem_available_bytes": None, "shmem_bytes": 2 * GIB, "mlocked_bytes": GIB,
       "min_available_pct": 10}


def sample(**kw):
    s = {"vmid": 131, "container_gpus": [6, 7],
         "gpus": [{"index": 6, "uuid": "GPU-6", "memory_used_mib": 0, "apps": []},
                  {"index": 7, "uuid": "GPU-7", "memory_used_mib": 10, "apps": []}],
         "ct_holders": [], "ct_stuck": [], "nvidia_smi_error": None, "nvidia_smi_hung": False,
         "host_memory": {"mem_total_bytes": 100 * GIB, "mem_available_bytes": 89 * GIB, "shmem_bytes": GIB,
                         "mlocked_bytes": 0}}
    s.update(kw)
    return s


def test_evaluate_clean_with_baseline():
    e = gate.evaluate_sample(sample(), BASE, TOL)
    assert e["clean"], e["reasons"]
    assert e["host"]["judged_against"] == "baseline"


def test_evaluate_driver_held_memory():
    s = sample(gpus=[{"index": 6, "uuid": "GPU-6", "memory_used_mib": 86140, "apps": []},
                     {"index": 7, "uuid": "GPU-7", "memory_used_mib": 4, "apps": []}])
    e = gate.evaluate_sample(s, BASE, TOL)
    assert not e["clean"]
    assert any("held by the driver" in r for r in e["reasons"])


@pytest.mark.parametrize("text", ["[N/A]", "[Unknown Error]", "[GPU is lost]"])
def test_evaluate_unknown_memory_is_not_clean(text):
    """A GPU whose memory.used nvidia-smi cannot tell is not clean (it used to count as 0 MiB)."""
    row = gf.parse_gpu_csv("7, NVIDIA RTX PRO 6000, 97887, %s, GPU-7, 00000000:BA:00.0, 580.95.05, Enabled, 0\n" % text)[0]
    assert row["memory_used_mib"] is None
    s = sample(gpus=[{"index": 6, "uuid": "GPU-6", "memory_used_mib": 0, "apps": []}, dict(row, apps=[])])
    e = gate.evaluate_sample(s, BASE, TOL)
    assert not e["clean"]
    assert [r for r in e["reasons"] if r.startswith("GPU 7")] == [
        "GPU 7: nvidia-smi reports no memory.used figure ([N/A], [Unknown Error] or [GPU is lost]): it cannot be judged clean"]


def test_evaluate_own_and_foreign_apps():
    apps = [{"pid": 1, "process_name": "sglang::scheduler_TP0", "used_memory_mib": 500, "owner": 131},
            {"pid": 2, "process_name": "other", "used_memory_mib": 1000, "owner": 130}]
    s = sample(gpus=[{"index": 6, "uuid": "GPU-6", "memory_used_mib": 1500, "apps": apps},
                     {"index": 7, "uuid": "GPU-7", "memory_used_mib": 1004,
                      "apps": [{"pid": 3, "process_name": "x", "used_memory_mib": 1000, "owner": 130}]}])
    e = gate.evaluate_sample(s, BASE, TOL)
    assert not e["clean"]
    assert any("compute app(s) of CT 131" in r for r in e["reasons"])
    assert not any(r.startswith("GPU 7") for r in e["reasons"])  # only CT 130 uses GPU 7: not ours
    assert any("CT 130" in n for n in e["notes"])


def test_evaluate_host_memory_with_and_without_baseline():
    s = sample(host_memory={"mem_total_bytes": 100 * GIB, "mem_available_bytes": 70 * GIB,
                            "shmem_bytes": 5 * GIB, "mlocked_bytes": 0}, ct_memory_usage_bytes=20 * GIB)
    e = gate.evaluate_sample(s, BASE, TOL)
    assert any("MemAvailable" in r for r in e["reasons"])
    assert any("Shmem" in r for r in e["reasons"])
    e2 = gate.evaluate_sample(s, None, TOL)
    assert e2["clean"]
    assert "no baseline" in e2["notes"][0]
    s3 = sample(host_memory={"mem_total_bytes": 100 * GIB, "mem_available_bytes": 5 * GIB},
                ct_memory_usage_bytes=50 * GIB)
    assert not gate.evaluate_sample(s3, None, TOL)["clean"]


def test_host_memory_used_by_another_tenant_is_only_a_note():
    # The node is shared: CT 129 grew by 11 GiB while CT 131 (80 MB, or stopped) is being recovered.
    for usage in (80 * MIB, None):
        s = sample(host_memory={"mem_total_bytes": 100 * GIB, "mem_available_bytes": 70 * GIB,
                                "shmem_bytes": GIB, "mlocked_bytes": 0}, ct_memory_usage_bytes=usage)
        e = gate.evaluate_sample(s, BASE, TOL)
        assert e["clean"], e["reasons"]
        assert any("not attributable to CT 131" in n for n in e["notes"])


def test_evaluate_hung_nvidia_smi():
    e = gate.evaluate_sample(sample(gpus=[], nvidia_smi_hung=True), BASE, TOL)
    assert not e["clean"]
    assert "nvidia-smi hung (timed out)" in e["reasons"]


def test_default_available_tolerance():
    assert gate.default_available_tolerance(449 * GIB) == int(449 * GIB * 0.02)
    assert gate.default_available_tolerance(24 * GIB) == 8 * GIB


def D(**kw):
    d = {"clean": False, "container_status": "running", "service_active": False, "ct_holders": [], "ct_stuck": [],
         "gpu_excess_without_process": False, "host_memory_only": False, "reboot_signals": []}
    d.update(kw)
    return d


@pytest.mark.parametrize(
    "diag,after,rung",
    [
        (D(clean=True), 0, 0),
        (D(service_active=True, ct_holders=[{"pid": 1}]), 0, 1),
        (D(ct_holders=[{"pid": 1}]), 0, 2),  # no service but escaped holders: straight to the scoped kill
        (D(service_active=True, ct_stuck=[{"pid": 1, "class": "stuck_fuse"}]), 0, 3),  # D on FUSE: abort it
        (D(ct_stuck=[{"pid": 1, "class": "stuck_nvidia"}]), 0, 6),  # D in nvidia: reboot report
        (D(gpu_excess_without_process=True), 0, 4),  # driver-held, no process: stop the container
        (D(gpu_excess_without_process=True, container_status="stopped"), 0, 5),
        (D(reboot_signals=["nvidia-smi hung"]), 0, 6),
        (D(ct_stuck=[{"pid": 1, "class": "stuck_unknown"}]), 0, 4),
        (D(host_memory_only=True), 0, 4),
        (D(host_memory_only=True, container_status="stopped"), 0, 6),
        # escalation: never at or below the rung already tried
        (D(service_active=True, ct_holders=[{"pid": 1}]), 1, 2),
        (D(ct_holders=[{"pid": 1}]), 2, 4),
        (D(ct_stuck=[{"pid": 1, "class": "stuck_fuse"}]), 3, 4),
        (D(gpu_excess_without_process=True), 4, 5),
        (D(gpu_excess_without_process=True, container_status="stopped"), 5, 6),
        (D(ct_stuck=[{"pid": 1, "class": "stuck_unknown"}], container_status="running"), 4, 6),
    ],
)
def test_choose_rung(diag, after, rung):
    got, why = gate.choose_rung(diag, after)
    assert got == rung, why
    assert got == 0 or got > after


@pytest.mark.parametrize("value,kind", [("None", "ok"), ("Reset", "reset"), ("Drain P2P", "reset"),
                                        ("Drain and Reset", "reset"), ("Node Reboot", "reboot"),
                                        ("System Reboot", "reboot"), (None, "unknown"), ("Recover IMEX Domain", "unknown")])
def test_recovery_action_class(value, kind):
    assert gate.recovery_action_class(value) == kind


def test_a_gpu_reset_asked_by_the_driver_goes_straight_to_the_reset_rung():
    # NVIDIA's flag names the action (terminate the GPU processes, nvidia-smi -r): rung 5 does both; rungs 1-4
    # cannot clear it, so none is taken first, whatever else the diagnosis shows (issue 27).
    diag = {"clean": False, "container_status": "running", "service_active": True, "recovery_reset": True,
            "ct_holders": [{"pid": 5}]}
    rung, why = gate.choose_rung(diag)
    assert rung == gate.RUNG_RESET_GPUS and "end the container's GPU processes" in why
    stopped = dict(diag, container_status="stopped", service_active=False, ct_holders=[])
    assert gate.choose_rung(stopped)[0] == gate.RUNG_RESET_GPUS
    assert gate.choose_rung(diag, after_rung=gate.RUNG_RESET_GPUS)[0] == gate.RUNG_REBOOT
    assert gate.choose_rung(stopped, after_rung=gate.RUNG_RESET_GPUS)[0] == gate.RUNG_REBOOT
    # A stuck process is not ended by a signal: the stuck path decides first.
    assert gate.choose_rung(dict(diag, ct_stuck=[{"pid": 7, "class": "stuck_fuse"}]))[0] == gate.RUNG_UNBLOCK_STUCK


def test_the_reset_rung_budget_covers_ending_the_processes_first():
    settings = {"service_stop_timeout": 90, "term_grace": 10, "kill_wait": 60, "reset_timeout": 180}
    assert gate.action_budget_s(gate.RUNG_RESET_GPUS, settings) >= 90 + 10 + 60 + 180 + 60


# --------------------------------------------------------------------------- the gate cannot be loosened

_SUPPORTED = {"supported": True, "error": None, "actions": {6: "None", 7: "None"}}


def _stub(kind):
    """One reading of an otherwise clean sample made unknown or bad; each alone must make it Not clean."""
    gpu6 = {"index": 6, "uuid": "GPU-6", "memory_used_mib": 0, "apps": []}
    gpu7 = {"index": 7, "uuid": "GPU-7", "memory_used_mib": 10, "apps": []}
    return {
        "memory.used [N/A]": sample(gpus=[gpu6, dict(gpu7, memory_used_mib=None)]),
        "GPU row missing": sample(gpus=[gpu6]),
        "nvidia-smi failed": sample(gpus=[], nvidia_smi_error="nvidia-smi exited 9: no driver"),
        "nvidia-smi hung": sample(gpus=[], nvidia_smi_hung=True),
        "recovery action unreadable": sample(recovery_actions=dict(_SUPPORTED, actions={6: "None", 7: None})),
        "recovery action query failed": sample(recovery_actions=dict(_SUPPORTED, actions={}, error="Unknown Error")),
        "recovery action Reset": sample(recovery_actions=dict(_SUPPORTED, actions={6: "Reset", 7: "None"})),
        "compute app listed but gone": sample(gpus=[gpu6, dict(gpu7, apps=[
            {"pid": 9, "owner": "gone", "used_memory_mib": 0}])]),
        "17 MiB above baseline": sample(gpus=[gpu6, dict(gpu7, memory_used_mib=10 + 17)]),
        "a holder in the container": sample(ct_holders=[{"pid": 5, "comm": "python3"}]),
        "a stuck process": sample(ct_stuck=[{"pid": 5, "comm": "python3", "class": "stuck_fuse"}]),
    }[kind]


def test_the_clean_sample_the_stubs_start_from_is_clean():
    assert gate.evaluate_sample(sample(recovery_actions=_SUPPORTED), BASE, TOL)["clean"]


@pytest.mark.parametrize("kind", ["memory.used [N/A]", "GPU row missing", "nvidia-smi failed", "nvidia-smi hung",
                                  "recovery action unreadable", "recovery action query failed",
                                  "recovery action Reset", "compute app listed but gone", "17 MiB above baseline",
                                  "a holder in the container", "a stuck process"])
def test_any_unknown_or_bad_reading_alone_is_not_clean(kind):
    e = gate.evaluate_sample(_stub(kind), BASE, TOL)
    assert not e["clean"] and e["reasons"], kind


# --------------------------------------------------------------------------- when a verification may stop polling

@pytest.mark.parametrize("rung,findings,elapsed,after,expect", [
    (0, {"holders": 3}, 0, 1, True),                                            # the gate passes
    (6, {"reboot_signals": ["kernel Xid 79"]}, 0, 1, True),                     # a reboot signal
    (4, {"recovery_reset": True, "container_status": "running"}, 0, 1, True),   # the driver asks for a reset
    (5, {"recovery_reset": True, "container_status": "stopped"}, 0, 5, False),  # ... the reset itself may clear it
    (3, {"stuck": 1, "container_status": "running"}, 29, 2, False),             # stuck, within the grace
    (3, {"stuck": 1, "container_status": "running"}, 30, 2, True),              # stuck past the grace
    (2, {"holders": 2, "container_status": "running"}, 14, 1, False),           # teardown may still be going on
    (2, {"holders": 2, "container_status": "running"}, 15, 1, True),            # not released past the grace
    (4, {"gpu_excess_without_process": True, "container_status": "running"}, 15, 2, True),
    (5, {"container_status": "stopped"}, 15, 4, True),
    (4, {"container_status": "running"}, 100, 2, False),                        # nothing the graces cover: budget
    # rung 1's stop ran out of its timeout and the holders are alive: they had SIGTERM that long (issue 27)
    (2, {"holders": 2, "container_status": "running", "stop_timed_out": True}, 1, 1, True),
    (2, {"holders": 0, "gpu_excess_without_process": True, "container_status": "running", "stop_timed_out": True},
     1, 1, False),                                                              # no holder: a teardown may be on
    (3, {"holders": 2, "stuck": 1, "container_status": "running", "stop_timed_out": True}, 1, 1, False),
    (3, {"holders": 2, "container_status": "running", "stop_timed_out": True}, 1, 2, False),  # only after rung 1
])
def test_settled(rung, findings, elapsed, after, expect):
    done, why = gate.settled(rung, findings, elapsed, after, 30, 15)
    assert done is expect, why


# --------------------------------------------------------------------------- judge: the one decision of a diagnosis

KMSG_OK = {"records": [], "since": 100, "error": None}
XID_GPU6 = "NVRM: Xid (PCI:0000:DB:00): %d, pid=1, name=python3, text"


_DEFAULT = object()  # judged() without baseline= or kernel= uses BASE / KMSG_OK; None means "none" there


def judged(samples=None, baseline=_DEFAULT, status="running", service=None, kernel=_DEFAULT, **kw):
    samples = samples if samples is not None else [sample(), sample()]
    baseline = BASE if baseline is _DEFAULT else baseline
    kernel = KMSG_OK if kernel is _DEFAULT else kernel
    return gate.judge(samples, baseline, TOL, baseline_path="/b/131.json", container_status=status,
                      service_state=service, kernel=kernel, **kw)


def with_bus(s):
    """A sample whose GPUs carry their PCI addresses (the kernel log's Xid lines are placed by them)."""
    return dict(s, gpus=[dict(g, pci_bus_id=bus) for g, bus in zip(s["gpus"], ("00000000:DB:00.0", "00000000:BA:00.0"))])


def test_judge_clean():
    j = judged()
    assert (j.verdict, j.clean, j.reasons, j.rung, j.why) == ("Clean", True, [], 0, "clean: nothing to do")
    assert (j.settled, j.settled_reason) == (True, "the gate passes")
    assert j.summary == ("Clean: CT 131 (running), GPUs [6, 7] at baseline with no compute apps, host memory within "
                         "tolerance of the baseline")
    assert j.findings == {"container_status": "running", "service_active": False, "holders": 0, "stuck": 0,
                          "gpu_excess_without_process": False, "gpu_busy_without_process": False, "host_memory_only": False, "reboot_signals": [],
                          "recovery_reset": False, "baseline_missing": False, "new_xids": [],
                          "only_unreadable": False, "stop_timed_out": False}


def test_judge_without_a_baseline_is_never_clean_and_asks_for_no_rung():
    j = judged(baseline=None)
    assert j.verdict == "Not clean" and not j.clean and j.rung == 0
    assert j.reasons[0].startswith("no baseline at /b/131.json") and "recover_record_baseline=true" in j.reasons[0]
    assert j.why.startswith("nothing a rung can change: no baseline at /b/131.json")
    assert j.findings["baseline_missing"] and j.settled
    assert "no baseline: host memory judged only by MemAvailable >= 10% of MemTotal" in j.notes


@pytest.mark.parametrize("kind", ["memory.used [N/A]", "GPU row missing", "nvidia-smi failed", "nvidia-smi hung",
                                  "recovery action unreadable", "recovery action query failed",
                                  "recovery action Reset", "compute app listed but gone", "17 MiB above baseline",
                                  "a holder in the container", "a stuck process"])
def test_judge_any_unknown_or_bad_reading_alone_is_not_clean(kind):
    """The same table as evaluate_sample's, through the one function the module calls."""
    bad = _stub(kind)
    j = judged([bad, bad])
    assert j.verdict == "Not clean" and not j.clean and j.reasons, kind


@pytest.mark.parametrize("kernel,reason", [
    ({"records": [], "since": None, "error": "/dev/kmsg: Permission denied"}, "kernel log not readable"),
    ({"records": [{"seq": 101, "message": XID_GPU6 % 13}], "since": 100, "error": None}, "kernel Xid 13 on GPU 6"),
])
def test_judge_a_kernel_reason_no_rung_can_change(kernel, reason):
    s = with_bus(sample())
    j = judged([s, s], kernel=kernel)
    assert j.verdict == "Not clean" and j.rung == 0 and any(reason in r for r in j.reasons), j.reasons
    assert j.why.startswith("nothing a rung can change: ")


def test_judge_a_new_reboot_xid_is_a_reboot_signal_and_an_old_one_evidence():
    s = with_bus(sample())
    new = judged([s, s], kernel={"records": [{"seq": 101, "message": XID_GPU6 % 79}], "since": 100, "error": None})
    assert new.verdict == "Not clean" and new.rung == gate.RUNG_REBOOT
    assert new.findings["reboot_signals"] == ["kernel Xid 79 on GPU 6 since the run started"]
    assert new.findings["new_xids"] == [79] and "kernel Xid 79 on GPU 6 since the run started" in new.reasons
    old = judged([s, s], kernel={"records": [{"seq": 90, "message": XID_GPU6 % 79}], "since": 100, "error": None})
    assert old.verdict == "Clean" and any("before this run" in n for n in old.notes)


def test_judge_without_the_kernel_log_notes_it():
    j = judged(kernel=None)
    assert j.verdict == "Clean"
    assert "kernel log not read (kernel_log=false): new Xid lines not checked" in j.notes


def test_judge_stuck_only_when_in_every_sample():
    d = {"pid": 5, "starttime": 9, "comm": "python3", "class": "stuck_fuse"}
    both = judged([sample(ct_stuck=[d]), sample(ct_stuck=[d])])
    assert both.findings["stuck"] == 1 and both.rung == gate.RUNG_UNBLOCK_STUCK and both.stuck == [d]
    once = judged([sample(), sample(ct_stuck=[d])])
    assert once.findings["stuck"] == 0 and once.stuck == [] and once.verdict == "Not clean"
    reused = judged([sample(ct_stuck=[dict(d, starttime=8)]), sample(ct_stuck=[d])])
    assert reused.findings["stuck"] == 0


def test_judge_unreadable_memory_alone_asks_for_no_rung_unless_something_else_is_wrong():
    bad = _stub("memory.used [N/A]")
    alone = judged([bad, bad])
    assert alone.rung == 0 and alone.findings["only_unreadable"] and alone.why.startswith("nothing a rung can change")
    served = judged([bad, bad], service="active")
    assert served.rung == gate.RUNG_STOP_SERVICE and not served.findings["only_unreadable"]


@pytest.mark.parametrize("s,status,rung,finding", [
    (sample(nvidia_smi_error="nvidia-smi exited 15: GPU is lost", gpus=[]), "running", 6, "reboot_signals"),
    (sample(nvidia_smi_hung=True, gpus=[]), "running", 6, "reboot_signals"),
    (sample(recovery_actions=dict(_SUPPORTED, actions={6: "Node Reboot", 7: "None"})), "running", 6, "reboot_signals"),
    (sample(recovery_actions=dict(_SUPPORTED, actions={6: "Reset", 7: "None"})), "running", 5, "recovery_reset"),
    (sample(recovery_actions=dict(_SUPPORTED, actions={6: "Reset", 7: "None"})), "stopped", 5, "recovery_reset"),
    (sample(gpus=[{"index": 6, "uuid": "GPU-6", "memory_used_mib": 86140, "apps": []},
                  {"index": 7, "uuid": "GPU-7", "memory_used_mib": 4, "apps": []}]), "running", 4,
     "gpu_excess_without_process"),
    (sample(gpus=[{"index": 6, "uuid": "GPU-6", "memory_used_mib": 86140, "apps": []},
                  {"index": 7, "uuid": "GPU-7", "memory_used_mib": 4, "apps": []}]), "stopped", 5,
     "gpu_excess_without_process"),
    (sample(ct_holders=[{"pid": 5, "comm": "python3"}]), "running", 2, "holders"),
    (sample(host_memory={"mem_total_bytes": 100 * GIB, "mem_available_bytes": 70 * GIB, "shmem_bytes": GIB,
                         "mlocked_bytes": 0}, ct_memory_usage_bytes=20 * GIB), "running", 4, "host_memory_only"),
])
def test_judge_chooses_the_rung_from_its_findings(s, status, rung, finding):
    j = judged([s, s], status=status)
    assert j.verdict == "Not clean" and j.rung == rung, (j.why, j.findings)
    assert j.findings[finding]
    assert j.reasons and j.summary.startswith("Not clean: CT 131 (%s), " % status)


def test_judge_an_active_service_is_rung_1_and_never_above_the_last_rung_tried():
    s = sample(ct_holders=[{"pid": 5, "comm": "python3"}])
    assert judged([s, s], service="active").rung == gate.RUNG_STOP_SERVICE
    assert judged([s, s], service="deactivating").findings["service_active"]
    assert judged([s, s], service="active", after_rung=gate.RUNG_STOP_SERVICE).rung == gate.RUNG_KILL_HOLDERS


@pytest.mark.parametrize("state", ["active", "activating", "deactivating", "reloading"])
def test_judge_a_service_that_runs_or_will_restart_is_not_settled_even_with_idle_gpus(state):
    # The half of a multi-node server whose ranks died keeps its launcher ("active"); a unit failed by its dead
    # peer waits RestartSec ("activating", sub-state auto-restart), then takes the GPUs again.
    j = judged(service=state)
    assert (j.verdict, j.rung) == ("Not clean", gate.RUNG_STOP_SERVICE), (j.why, j.reasons)
    assert any(("the service is %s" % state) in r for r in j.reasons)
    assert not j.settled


@pytest.mark.parametrize("state,status", [("inactive", "running"), ("failed", "running"), (None, "running"),
                                          ("active", "stopped")])
def test_judge_a_stopped_service_or_container_with_idle_gpus_is_clean(state, status):
    assert judged(service=state, status=status).verdict == "Clean"


def test_judge_settles_a_verification_by_the_graces():
    s = sample(ct_holders=[{"pid": 5, "comm": "python3"}])
    waiting = judged([s, s], after_rung=1, elapsed_s=14, release_grace_s=15)
    assert not waiting.settled and waiting.settled_reason.startswith("waiting")
    late = judged([s, s], after_rung=1, elapsed_s=15, release_grace_s=15)
    assert late.settled and late.settled_reason.startswith("not released after 15 s")
    assert (judged([s, s]).settled, judged([s, s]).settled_reason) == (False, "not clean")  # not a verification


def _unverified(pid, vmid):
    return {"pid": pid, "comm": "cat", "vmid": vmid, "holds_nvidia": False, "holds_unverified": True,
            "class": "running", "starttime": 5, "unverified_nvidia_fds": [
                {"fd": 3, "path": "/dev/nvidia-x/blob", "fstype": "fuse.x", "mount_point": "/dev/nvidia-x",
                 "mount_id": 900}]}


def test_an_unverified_holder_of_the_container_is_a_holder_never_clean():
    j = judged([sample(ct_holders=[_unverified(901, 131)])])
    assert j.verdict == "Not clean" and j.findings["holders"] == 1
    assert ("1 process(es) of CT 131 have a /dev/nvidia* path open on a filesystem that is not stat'ed (unverified "
            "holders): 901/cat (CT 131): fd 3 /dev/nvidia-x/blob on fuse.x") in j.reasons
    assert not any("hold /dev/nvidia*:" in r for r in j.reasons)
    assert j.rung == gate.RUNG_KILL_HOLDERS


def test_an_unverified_holder_outside_the_container_is_only_a_note():
    j = judged([sample(other_unverified_holders=[_unverified(902, 186)])])
    assert j.verdict == "Clean" and j.reasons == []
    assert ("unverified holder outside CT 131, not judged for it: 902/cat (CT 186): fd 3 /dev/nvidia-x/blob on "
            "fuse.x") in j.notes


HELD = [{"index": 6, "uuid": "GPU-6", "memory_used_mib": 86140, "apps": []},
        {"index": 7, "uuid": "GPU-7", "memory_used_mib": 4, "apps": []}]
STUCK = {"pid": 77, "comm": "python3", "class": "stuck_fuse", "starttime": 9, "state": "D", "wchan": "fuse_wait"}


def test_sampling_is_decided_by_a_sample_not_clean_with_no_odd_process():
    held = sample(gpus=HELD)
    assert gate.sampling_decided(gate.evaluate_sample(held, BASE, TOL), held)
    clean = sample()
    assert not gate.sampling_decided(gate.evaluate_sample(clean, BASE, TOL), clean)  # Clean needs every sample
    odd = sample(gpus=HELD, ct_stuck=[STUCK])
    assert not gate.sampling_decided(gate.evaluate_sample(odd, BASE, TOL), odd)  # stuck needs every sample


@pytest.mark.parametrize("later", [sample(), sample(ct_stuck=[STUCK]), sample(gpus=HELD, ct_stuck=[STUCK]),
                                   sample(ct_holders=[{"pid": 5, "comm": "python3"}])])
def test_a_decided_sample_fixes_the_verdict_and_the_stuck_processes_whatever_follows(later):
    """What sampling_decided claims, through judge: after a decided sample no later one makes the verdict Clean or a
    process stuck."""
    first = sample(gpus=HELD)
    assert gate.sampling_decided(gate.evaluate_sample(first, BASE, TOL), first)
    j = judged([first, later])
    assert j.verdict == "Not clean" and not j.clean
    assert j.stuck == [] and j.findings["stuck"] == 0


@pytest.mark.parametrize("settled_now, elapsed, budget, again", [
    (True, 0, 60, False),      # settled: the verification ends
    (False, 10, 60, True),     # waiting, within the budget: diagnose again
    (False, 60, 60, False),    # the budget has passed since the first diagnosis began
    (False, 0, 0, False),      # no budget: one diagnosis
])
def test_poll_again(settled_now, elapsed, budget, again):
    assert gate.poll_again(settled_now, elapsed, budget) is again


# --------------------------------------------------------------------------- busy with no process (PVE 9 nodes' drivers)

def test_busy_with_no_process_is_not_clean_and_named():
    """A GPU that nvidia-smi reports busy while no process is on it and its memory is at the baseline (Blackwell's
    latched busy counter, Datura-ai/lium-io PR #1142) is not clean; the reason names it; the rung is the reset (rung
    5 turns persistence mode off first), since stopping the container does not clear it."""
    s = sample(gpus=[{"index": 6, "uuid": "GPU-6", "memory_used_mib": 0, "apps": [], "utilization_gpu_pct": 100},
                     {"index": 7, "uuid": "GPU-7", "memory_used_mib": 10, "apps": [], "utilization_gpu_pct": 0}])
    e = gate.evaluate_sample(s, BASE, TOL)
    assert not e["clean"] and [g["clean"] for g in e["gpus"]] == [False, True]
    assert e["reasons"] == ["GPU 6: 100% utilisation with no process (busy without a process: the driver's busy "
                            "counter is latched, seen on Blackwell GPUs after a process died mid-kernel)"]
    j = judged([s, s])
    assert j.verdict == "Not clean" and j.findings["gpu_busy_without_process"] is True
    assert j.rung == gate.RUNG_RESET_GPUS and "busy with no process" in j.why
    j = judged([s, s], status="stopped")
    assert j.rung == gate.RUNG_RESET_GPUS
    # after a reset that did not clear it, the next rung is the reboot
    assert gate.choose_rung({"clean": False, "container_status": "running", "gpu_busy_without_process": True},
                            gate.RUNG_RESET_GPUS)[0] == gate.RUNG_REBOOT


def test_busy_with_a_process_or_unreported_is_not_this_reason():
    """Utilisation with a process on the GPU is that process's (judged as a process); a driver that does not report
    utilisation ([N/A]: None) leaves the gate as it was."""
    app = {"pid": 5, "process_name": "python3", "used_memory_mib": 20, "owner": "host"}
    s = sample(gpus=[{"index": 6, "uuid": "GPU-6", "memory_used_mib": 20, "apps": [app], "utilization_gpu_pct": 90},
                     {"index": 7, "uuid": "GPU-7", "memory_used_mib": 10, "apps": [], "utilization_gpu_pct": None}])
    e = gate.evaluate_sample(s, BASE, TOL)
    assert e["clean"], e["reasons"]
    assert not any("utilisation" in r for r in e["reasons"])
