# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

import json

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


BEFORE = {"verdict": "Not clean", "reasons": ["GPU 0: 1 compute app(s)"], "recommended_rung": 1,
          "rung_reason": "the service is active", "notes": [], "evidence": {"x": 1}, "kernel_cursor": 7}


def poll(clean, rung=0, reasons=()):
    return {"verdict": "Clean" if clean else "Not clean", "clean": clean, "reasons": list(reasons),
            "recommended_rung": rung, "rung_reason": "why %d" % rung, "summary": "summary %s" % clean,
            "notes": ["n"], "evidence": {"after": True}}


def run(rungs, clean, **extra):
    raw = {"vmid": "129", "node": "pve1", "started_at": "2026-12-01T18:00:00Z", "t_start": 100.0, "t_end": 160.25,
           "check_mode": False, "clean": clean, "reboot_needed": False, "rungs": rungs, "before": BEFORE,
           "after": rungs[-1]["poll"] if rungs and rungs[-1].get("poll") else BEFORE, "report_path": "/r/x.json"}
    raw.update(extra)
    return recover_report(raw)


def test_a_climb_that_clears_at_rung_2():
    res = run([{"rung": 1, "name": None, "t0": 101, "t1": 131, "t_end": 140.04, "action": {"rc": 0},
                "poll": poll(False, 2, ["holders"])},
               {"rung": 2, "name": None, "t0": 140.04, "t1": 151.5, "t_end": 158.0, "action": {"signalled": [1]},
                "poll": poll(True)}], clean=True)
    rep = res["report"]
    assert rep["verdict"] == "Clean" and rep["cleared_by_rung"] == 2 and rep["seconds"] == 60.2 and rep["vmid"] == 129
    assert [(r["rung"], r["name"], r["seconds"], r["action_seconds"], r["cleared"]) for r in rep["rungs"]] == [
        (1, "stop_service", 39.0, 30.0, False), (2, "kill_holders", 18.0, 11.5, True)]
    assert rep["rungs"][0]["next_rung"] == 2 and rep["rungs"][0]["reasons_after"] == ["holders"]
    assert res["artifact"] == {"vmid": 129, "node": "pve1", "verdict": "Clean", "cleared_by_rung": 2,
                               "reboot_needed": False, "rungs": [1, 2], "seconds": 60.2, "check_mode": False,
                               "reasons": [], "report": rep, "report_bytes": len(json.dumps(rep, sort_keys=True)),
                               "report_complete": True, "report_dropped": []}
    assert res["summary_lines"] == [
        "Clean", "summary True", "Rungs: 1 stop_service: 39.0 s, 2 kill_holders: 18.0 s",
        "Left: Not read: rung 1 (stop_service) disables and stops sglang.service; rung 2 (kill_holders) disables (when "
        "enabled) sglang.service.",
        "Restore: once the verdict is Clean, bring the server back with playbooks/deploy.yml (or recover.yml -e "
        "recover_relaunch=true), which enables and starts sglang.service with the planned arguments; by hand: pct exec "
        "129 -- systemctl enable --now sglang.service",
        "Report: /r/x.json"]
    assert rep["finished"] is True and rep["interrupted"] is None and rep["left"]["changed_by_rungs"] == [1, 2]


def test_already_clean_is_rung_0_and_not_clean_has_no_clearing_rung():
    assert run([], clean=True)["report"]["cleared_by_rung"] == 0
    res = run([{"rung": 6, "name": None, "t0": 150, "t1": None, "t_end": 150, "action": {"reboot_allowed": False},
                "poll": None}], clean=False, reboot_needed=True)
    assert res["report"]["cleared_by_rung"] is None and res["report"]["verdict"] == "Not clean"
    assert res["report"]["rungs"][0]["name"] == "reboot_report" and res["report"]["rungs"][0]["seconds"] == 0.0
    assert res["artifact"]["reboot_needed"] is True and res["artifact"]["reasons"] == BEFORE["reasons"]


def test_a_failed_verification_keeps_its_message_and_a_named_step_its_name():
    res = run([{"rung": 4, "name": "start_container", "t0": 1, "t1": 2, "t_end": 3, "action": {},
                "poll": {"msg": "pct status timed out"}}], clean=False)
    row = res["report"]["rungs"][0]
    assert row["name"] == "start_container" and row["verdict"] == "Not clean"
    assert row["reasons_after"] == ["pct status timed out"] and row["next_rung"] == 6


@pytest.mark.parametrize("raw, message", [
    ([], "the run's raw record"),
    ({"vmid": 129, "t_start": 1, "t_end": 2, "rungs": [{"rung": 9, "t0": 1, "t_end": 2}]}, "rung 9 is not one of"),
    ({"vmid": 129, "t_start": 1, "t_end": 2, "rungs": [{"rung": 1, "t0": "x", "t_end": 2}]}, "t0 must be a number"),
    ({"t_start": 1, "t_end": 2, "rungs": []}, "vmid"),
])
def test_bad_records_are_named(raw, message):
    with pytest.raises((LadderError, KeyError, TypeError, ValueError), match=message):
        recover_report(raw)
