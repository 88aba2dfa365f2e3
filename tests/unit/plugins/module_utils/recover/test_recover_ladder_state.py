# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The gpu_recover role's one state: what comes next is decided here, from what happened."""
from __future__ import annotations

import pytest

from ansible_collections.inferops.gpu_inference.plugins.module_utils.recover.recover_ladder import LadderError, build, start, step


def recover_step(state, event, result=None, t0=None, t1=None, name=None):
    """The ladder's state after ``event`` (``start`` makes it), as gpu_recover_ladder steps it."""
    if event == "start":
        return start(state.get("vmid"), state.get("node"), state.get("started_at"), state.get("t_start"),
                     state.get("pct_status") or "", state.get("settings") or {})
    return step(state, event, result=result, t0=t0, t1=t1, name=name)


def recover_report(raw):
    return build(raw)


SETTINGS = {"service_stop_timeout": 90, "service_poll_timeout": 60, "term_grace": 10, "kill_wait": 60,
            "kill_poll_timeout": 60, "stuck_timeout": 60, "container_shutdown_timeout": 60,
            "container_stop_timeout": 90, "container_poll_timeout": 60, "reset_timeout": 180,
            "reset_poll_timeout": 60, "diagnose_timeout": 60, "poll_sample_interval": 2,
            "record_baseline": False, "start_container": True, "allow_reboot": False}


def begin(running=True, **settings):
    return recover_step({"vmid": "129", "node": "pve1", "started_at": "2026-12-02T06:00:00Z", "t_start": 100.0,
                         "pct_status": "status: running\n" if running else "status: stopped\n",
                         "settings": dict(SETTINGS, **settings)}, "start")


def diag(clean, rung, node_time=1000.0, **findings):
    return {"clean": clean, "verdict": "Clean" if clean else "Not clean", "recommended_rung": rung,
            "rung_reason": "why %d" % rung, "reasons": [] if clean else ["r"], "summary": "s", "notes": [],
            "node_time": node_time, "kernel_cursor": 5, "findings": findings,
            "evidence": {"container": {"gpus": [0, 1]}}, "invocation": {"module_args": {}}, "changed": False}


def test_the_state_says_which_rung_to_climb_and_its_budgets():
    s = recover_step(begin(), "diagnosed", result=diag(False, 2))
    assert s["climb"] and s["next"] == 2 and s["rung_name"] == "kill_holders"
    assert not s["record_baseline_now"] and not s["restore_container"] and not s["reboot_now"]
    # kill: 35 s disable + 10 grace + 60 wait + 30, + 60 slack; one poll: 60 s + 2 samples 2 s apart; the
    # verification: its 60 s budget and one more poll
    assert s["budgets"]["2"] == {"action_timeout_s": 195, "poll_budget_s": 60, "poll_timeout_s": 64, "verify_timeout_s": 124}
    assert s["ladder_ahead"] == ["kill_holders", "unblock_stuck", "stop_container", "reset_gpus", "reboot_report"]
    assert "invocation" not in s["before"]


def test_a_climb_to_clean_after_a_container_stop_starts_it_again():
    s = recover_step(begin(), "diagnosed", result=diag(False, 4))
    s = recover_step(s, "acted", result={"container_was_running": True, "started_at": 1001.5, "commands": []},
                     t0=110.0, t1=125.0)
    assert s["pending"]["node_t0"] == 1001.5 and s["pending"]["budget"]["poll_budget_s"] == 60
    assert s["ct_stopped_by_us"]
    s = recover_step(s, "verified", result=diag(True, 0, node_time=1030.0), t1=140.0)
    assert s["clean"] and not s["climb"] and s["restore_container"] and s["last_rung"] == 4
    assert s["verified_lines"][0] == "Clean after rung 4 (stop_container)"
    s = recover_step(s, "step", name="start_container", result={"start": {"rc": 0}}, t0=141.0, t1=150.0)
    assert s["pending"]["node_t0"] == 1030.0  # the last diagnosis's node clock
    s = recover_step(s, "verified", result=diag(True, 0), t1=160.0)
    rep = recover_report(dict(s, t_end=161.0, check_mode=False, report_path=None))["report"]
    assert rep["verdict"] == "Clean" and rep["cleared_by_rung"] == 4
    assert [(r["rung"], r["name"], r["seconds"], r["action_seconds"]) for r in rep["rungs"]] == [
        (4, "stop_container", 30.0, 15.0), (4, "start_container", 19.0, 9.0)]


@pytest.mark.parametrize("rung,commands,expect", [
    (1, [{"command": "pct exec 129 -- systemctl disable --now sglang", "rc": 124, "timed_out": True}], True),
    (1, [{"command": "pct exec 129 -- systemctl disable --now sglang", "rc": 0, "timed_out": False}], False),
    (1, [], False),  # check mode: nothing ran
    (2, [{"command": "pct exec 129 -- systemctl disable sglang", "rc": 124, "timed_out": True}], False),
])
def test_the_verification_is_told_when_rung_1s_stop_ran_out_of_its_timeout(rung, commands, expect):
    s = recover_step(begin(), "diagnosed", result=diag(False, rung))
    s = recover_step(s, "acted", result={"commands": commands}, t0=1, t1=2)
    assert s["pending"]["stop_timed_out"] is expect
    # Rung 2, when it follows, is told the unit's processes had their SIGTERM (issue 27); no later rung is.
    s = recover_step(s, "verified", result=diag(False, 2), t1=3)
    assert s["next"] == 2 and s["unit_stop_timed_out"] is (expect and rung == 1)
    s = recover_step(recover_step(s, "acted", result={"commands": []}, t0=4, t1=5), "verified", result=diag(False, 4), t1=6)
    assert s["unit_stop_timed_out"] is False


def test_a_container_that_was_stopped_before_recovery_stays_stopped():
    s = recover_step(begin(running=False), "diagnosed", result=diag(False, 4))
    s = recover_step(s, "acted", result={"container_was_running": True}, t0=1, t1=2)
    s = recover_step(s, "verified", result=diag(True, 0), t1=3)
    assert s["clean"] and not s["restore_container"]


def test_rungs_only_climb_and_a_verification_needs_a_rung():
    s = recover_step(begin(), "diagnosed", result=diag(True, 0))
    assert not s["climb"]
    with pytest.raises((LadderError, KeyError, TypeError, ValueError), match="no rung to act on"):
        recover_step(s, "acted", result={}, t0=1, t1=2)
    with pytest.raises((LadderError, KeyError, TypeError, ValueError), match="no rung or step before it"):
        recover_step(s, "verified", result=diag(True, 0), t1=2)


def test_reboot_without_permission_is_recorded_as_reported_only():
    s = recover_step(begin(), "diagnosed", result=diag(False, 6))
    assert s["reboot_now"] and not s["climb"]
    s = recover_step(s, "reboot", t0=200.0, t1=200.0)
    assert s["reboot_needed"] and not s["reboot_now"] and s["pending"] is None
    assert s["rungs"] == [{"rung": 6, "name": None, "t0": 200.0, "t1": None, "t_end": 200.0,
                           "action": {"reboot_allowed": False}, "poll": None}]


def test_reboot_allowed_is_verified_from_when_the_node_is_back():
    s = recover_step(begin(allow_reboot=True), "diagnosed", result=diag(False, 6))
    s = recover_step(s, "reboot", t0=200.0, t1=500.0)
    assert s["pending"]["node_t0"] == 500.0 and s["pending"]["rung"] == 6


def test_the_baseline_is_recorded_once_when_it_is_all_that_is_missing():
    s = begin(record_baseline=True)
    assert s["ignore_baseline"]
    s = recover_step(s, "diagnosed", result=diag(False, 0, baseline_missing=True))
    assert s["record_baseline_now"] and not s["climb"]
    s = recover_step(s, "step", name="record_baseline", result={"path": "/b"}, t0=1, t1=2)
    assert not s["ignore_baseline"] and not s["record_baseline_now"]
    s = recover_step(s, "verified", result=diag(False, 0, baseline_missing=True), t1=3)
    assert not s["record_baseline_now"]  # never twice


def test_a_daemon_left_down_by_the_reset_is_kept_until_the_report():
    s = recover_step(begin(), "diagnosed", result=diag(False, 5))
    s = recover_step(s, "acted", result={"daemons": [{"name": "nvidia-persistenced", "stopped": True, "restarted": False}],
                                         "failed": True, "msg": "could not be started"}, t0=1, t1=2)
    assert s["daemons_down"] == ["nvidia-persistenced"]
    assert s["pending"]["action"]["failed"] and s["pending"]["action"]["msg"] == "could not be started"


@pytest.mark.parametrize("bad, match", [
    ({"kill_wait": "soon"}, "gpu_recover_kill_wait_s must be a number of seconds"),
    ({"term_grace": -1}, "gpu_recover_term_grace_s must be 0 or more"),
    ({"allow_reboot": "maybe"}, "gpu_recover_allow_reboot must be true or false"),
    ({"poll_sample_interval": 0}, "poll_sample_interval_s must be at least 1"),
])
def test_bad_settings_are_named(bad, match):
    with pytest.raises((LadderError, KeyError, TypeError, ValueError), match=match):
        begin(**bad)


@pytest.mark.parametrize("vmid", ["99", 0, "abc", 1000000000, True, None])
def test_a_vmid_outside_the_proxmox_range_is_refused_before_anything(vmid):
    with pytest.raises(LadderError, match=r"gpu_recover_vmid \(recover_vmid\) must be"):
        start(vmid, "pve1", "2026-12-02T06:00:00Z", 100.0, "status: running\n", SETTINGS)


def test_an_unknown_event_is_refused():
    with pytest.raises((LadderError, KeyError, TypeError, ValueError), match="unknown event"):
        recover_step(begin(), "jump")


# --- A ladder that stops before its end (killed, connection lost, a failed task) --------------------------------


def report_of(s, **extra):
    return recover_report(dict(s, t_end=200.0, check_mode=False, report_path="/r/x.json", service="sglang.service",
                               **extra))


def test_a_report_written_before_a_rung_acts_says_what_runs_and_what_it_leaves():
    s = recover_step(begin(), "diagnosed", result=diag(False, 1))
    s = recover_step(s, "acting", t0=110.0)
    assert s["in_progress"] == {"rung": 1, "name": None, "t0": 110.0, "phase": "action"}
    rep = report_of(s, finished=False)["report"]
    assert rep["finished"] is False and rep["verdict"] == "Not clean" and rep["cleared_by_rung"] is None
    assert rep["interrupted"]["rung"] == 1 and rep["interrupted"]["phase"] == "action" and rep["interrupted"]["msg"] is None
    assert rep["left"]["read"] is False and rep["left"]["changed_by_rungs"] == [1]
    assert "rung 1 (stop_service), running when this was written, disables and stops sglang.service" in rep["left"]["summary"]
    assert rep["left"]["restore"][0].startswith("run recover.yml again for CT 129")
    assert "pct exec 129 -- systemctl enable --now sglang.service" in rep["left"]["restore"][-1]


def test_after_the_action_and_across_rungs_the_report_follows_the_ladder():
    s = recover_step(begin(), "diagnosed", result=diag(False, 1))
    s = recover_step(s, "acting", t0=110.0)
    s = recover_step(s, "acted", result={"commands": []}, t0=110.0, t1=120.0)
    assert s["in_progress"]["phase"] == "verification"
    s = recover_step(s, "verified", result=diag(False, 4), t1=130.0)
    assert s["in_progress"] is None
    s = recover_step(s, "acting", t0=131.0)
    s = recover_step(s, "acted", result={"container_was_running": True, "commands": []}, t0=131.0, t1=150.0)
    rep = report_of(s, finished=False)["report"]
    assert [r["rung"] for r in rep["rungs"]] == [1]
    assert rep["interrupted"]["rung"] == 4 and rep["interrupted"]["phase"] == "verification"
    assert rep["left"]["changed_by_rungs"] == [1, 4]
    assert "stop_container" in rep["left"]["summary"] and any("pct start 129" in r for r in rep["left"]["restore"])


def test_a_failed_ladder_reports_the_task_and_the_state_read_at_the_end():
    s = recover_step(begin(), "diagnosed", result=diag(False, 2))
    s = recover_step(s, "acting", t0=110.0)
    s = recover_step(s, "interrupted", result={"task": "Rung action | kill_holders", "msg": "timed out"})
    s = recover_step(s, "left", result={"pct_status": {"rc": 0, "stdout": "status: running\n"},
                                        "service_show": {"rc": 0, "stdout": "UnitFileState=disabled\nActiveState=inactive\n"}})
    res = report_of(s)
    rep = res["report"]
    assert rep["finished"] is True and rep["verdict"] == "Not clean"
    assert rep["interrupted"]["msg"] == "Rung action | kill_holders: timed out" and rep["interrupted"]["rung"] == 2
    assert rep["left"] == dict(rep["left"], read=True, container="running", enabled="disabled", active="inactive")
    assert rep["left"]["summary"] == "CT 129 is running; sglang.service is disabled and inactive."
    assert any(line.startswith("Interrupted during rung 2 kill_holders's action: Rung action") for line in res["summary_lines"])
    assert len(rep["left"]["restore"]) == 2  # recover again, then deploy (the container runs)


def test_a_clean_end_with_the_service_running_needs_no_restore():
    s = recover_step(begin(), "diagnosed", result=diag(True, 0))
    s = recover_step(s, "left", result={"pct_status": {"rc": 0, "stdout": "status: running\n"},
                                        "service_show": {"rc": 0, "stdout": "UnitFileState=enabled\nActiveState=active\n"}})
    rep = report_of(s)["report"]
    assert rep["verdict"] == "Clean" and rep["interrupted"] is None and rep["left"]["restore"] == []
    s = recover_step(s, "left", result={"pct_status": {"rc": 0, "stdout": "status: stopped\n"},
                                        "service_show": {"rc": 255, "stdout": ""}})
    rep = report_of(s)["report"]
    assert rep["left"]["container"] == "stopped" and rep["left"]["enabled"] is None
    assert [r.split(":")[0] for r in rep["left"]["restore"]] == [
        "once the verdict is Clean, start the container", "once the verdict is Clean, bring the server back with "
        "playbooks/deploy.yml (or recover.yml -e recover_relaunch=true), which enables and starts sglang.service "
        "with the planned arguments; by hand"]


def test_acting_needs_a_rung_to_act_on():
    s = recover_step(begin(), "diagnosed", result=diag(True, 0))
    with pytest.raises((LadderError, KeyError, TypeError, ValueError), match="no rung to act on"):
        recover_step(s, "acting", t0=1.0)
    with pytest.raises((LadderError, KeyError, TypeError, ValueError), match="unknown step"):
        recover_step(s, "acting", t0=1.0, name="rm -rf")


def seen(status, unit_file_state="disabled", active_state="inactive", checked=True, rung=0):
    """A diagnosis that read the container's status and, when it runs, its service (gpu_diagnose's evidence)."""
    d = diag(rung == 0, rung)
    d["evidence"] = {"container": {"gpus": [0, 1], "status": status},
                     "service": {"name": "sglang.service", "checked": checked, "unit_file_state": unit_file_state,
                                 "active_state": active_state}}
    return d


def test_the_end_takes_the_last_diagnosis_read_when_nothing_acted_since():
    s = recover_step(begin(), "diagnosed", result=diag(False, 1))
    assert not s["left_seen"]  # this diagnosis did not read the container's status
    s = recover_step(s, "acting", t0=110.0)
    s = recover_step(s, "acted", result={"commands": []}, t0=110.0, t1=120.0)
    assert not s["left_seen"]
    s = recover_step(s, "verified", result=seen("running"), t1=130.0)
    assert s["left_seen"]
    # What the end's commands would say is not taken: the diagnosis read it with the same commands a moment before.
    s = recover_step(s, "left", result={"pct_status": {"rc": None, "stdout": ""}, "service_show": {"rc": None, "stdout": ""}})
    rep = report_of(s)["report"]
    assert (rep["left"]["read"], rep["left"]["container"], rep["left"]["enabled"], rep["left"]["active"]) == (
        True, "running", "disabled", "inactive")
    assert rep["left"]["summary"] == "CT 129 is running; sglang.service is disabled and inactive."


def test_the_end_reads_again_after_an_action_a_failure_or_an_unread_service():
    s = recover_step(begin(), "diagnosed", result=seen("running", rung=1))
    assert s["left_seen"]
    assert not recover_step(s, "acting", t0=110.0)["left_seen"]
    assert not recover_step(s, "interrupted", result={"task": "t", "msg": "m"})["left_seen"]
    assert not recover_step(begin(), "diagnosed", result=seen("running", checked=False))["left_seen"]
    stopped = recover_step(begin(), "diagnosed", result=seen("stopped", checked=False))
    assert stopped["left_seen"]
    rep = report_of(recover_step(stopped, "left", result={}))["report"]
    assert (rep["left"]["container"], rep["left"]["enabled"], rep["left"]["active"]) == ("stopped", None, None)
    s = recover_step(recover_step(s, "acting", t0=110.0), "left", result={
        "pct_status": {"rc": 0, "stdout": "status: stopped\n"}, "service_show": {"rc": 255, "stdout": ""}})
    assert report_of(s)["report"]["left"]["container"] == "stopped"
