# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The recover run's one result: built once, in Python, from the raw records the role keeps.

The role keeps, per rung it ran, only what happened (clock readings, the action module's result and the
verification's diagnosis); the durations, the rung that cleared the host, the verdict, the report written to disk,
the workflow artifact and the lines printed at the end are computed here (filter inferops.gpu_inference.recover_report).

No Ansible imports; unit-tested in tests/unit/plugins/filter/test_recover_report.py.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

from ansible_collections.inferops.gpu_inference.plugins.module_utils import recover_gate as gate


class ResultError(ValueError):
    """A raw record the role passed is not what this module expects."""


def _num(value: Any, what: str) -> float:
    try:
        return float(value)
    except (TypeError, ValueError) as exc:
        raise ResultError("%s must be a number (a clock reading), got %r" % (what, value)) from exc


def rung_row(raw: Mapping[str, Any]) -> dict[str, Any]:
    """One rung of the report from its raw record.

    raw: {"rung": int, "name": str or None (a step that is not a rung: record_baseline, start_container),
    "t0": rung start, "t1": action done (None: no action), "t_end": verification done, "action": dict,
    "poll": the verification's gpu_diagnose result (may be a failed one: {"msg": ...}) or None (rung 6 without a
    reboot: nothing verified)}.
    """
    try:
        rung = int(raw["rung"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ResultError("a rung record needs an integer 'rung', got %r" % (raw,)) from exc
    if rung not in gate.RUNG_NAMES:
        raise ResultError("rung %d is not one of %s" % (rung, sorted(gate.RUNG_NAMES)))
    t0 = _num(raw.get("t0"), "t0")
    t_end = _num(raw.get("t_end"), "t_end")
    t1 = _num(raw["t1"], "t1") if raw.get("t1") is not None else t_end
    poll = raw.get("poll")
    if poll is None:
        verdict, cleared, reasons, next_rung, next_reason = "Not clean", False, [], rung, ""
    else:
        verdict = poll.get("verdict") or "Not clean"
        cleared = bool(poll.get("clean"))
        reasons = list(poll.get("reasons") or ([] if cleared else [poll.get("msg") or "diagnosis failed"]))
        next_rung = int(poll.get("recommended_rung", gate.RUNG_REBOOT))
        next_reason = poll.get("rung_reason") or ""
    return {"rung": rung, "name": raw.get("name") or gate.RUNG_NAMES[rung],
            "seconds": round(t_end - t0, 1), "action_seconds": round(t1 - t0, 1),
            "verdict": verdict, "cleared": cleared, "action": dict(raw.get("action") or {}),
            "reasons_after": reasons, "next_rung": next_rung, "next_reason": next_reason}


def build(raw: Mapping[str, Any]) -> dict[str, Any]:
    """The report, the workflow artifact and the summary lines of one run.

    raw: vmid, node, started_at (ISO text), t_start, t_end, check_mode, clean (the last gate), reboot_needed,
    rungs [raw rung records], before (rung 0's diagnosis), after (the last diagnosis), report_path.
    """
    rows = [rung_row(r) for r in raw.get("rungs") or []]
    clean = bool(raw.get("clean"))
    cleared: Optional[int] = next((r["rung"] for r in rows if r["cleared"]), None)
    if cleared is None and clean and not rows:
        cleared = gate.RUNG_CLEAN
    before = raw.get("before") or {}
    after = raw.get("after") or {}
    seconds = round(_num(raw.get("t_end"), "t_end") - _num(raw.get("t_start"), "t_start"), 1)
    verdict = "Clean" if clean else "Not clean"
    report = {
        "vmid": int(raw["vmid"]), "node": raw.get("node"), "started_at": raw.get("started_at"), "seconds": seconds,
        "check_mode": bool(raw.get("check_mode")), "verdict": verdict, "cleared_by_rung": cleared,
        "reboot_needed": bool(raw.get("reboot_needed")), "rungs": rows,
        "before": {k: before.get(k) for k in ("verdict", "reasons", "recommended_rung", "rung_reason", "notes",
                                              "evidence")},
        "after": {"verdict": after.get("verdict") or "Not clean", "reasons": list(after.get("reasons") or []),
                  "notes": list(after.get("notes") or []), "evidence": after.get("evidence") or {}},
    }
    artifact = {"vmid": report["vmid"], "node": report["node"], "verdict": verdict, "cleared_by_rung": cleared,
                "reboot_needed": report["reboot_needed"], "rungs": [r["rung"] for r in rows], "seconds": seconds,
                "check_mode": report["check_mode"], "reasons": report["after"]["reasons"] if not clean else []}
    lines = [verdict, after.get("summary") or "",
             "Rungs: %s" % (", ".join("%d %s: %s s" % (r["rung"], r["name"], r["seconds"]) for r in rows) or "none")]
    if report["check_mode"]:
        lines.append("Check mode: nothing changed.")
    if raw.get("report_path"):
        lines.append("Report: %s" % raw["report_path"])
    return {"report": report, "artifact": artifact, "summary_lines": lines}
