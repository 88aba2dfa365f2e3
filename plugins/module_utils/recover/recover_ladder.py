# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The ladder's state machine: the recover run's one dict, stepped in Python, and the report built from it.

The rungs, the verdict and the rung each diagnosis recommends are recover_gate's (``judge``); this module only
follows them from one step of the run to the next. The run keeps one dict, made by ``start`` and stepped by ``step``
with what happened: the first diagnosis, each rung's action result, each verification's diagnosis, clock readings.
What the run does next (``next_call``: climb a rung, verify it, record the baseline, start the container again,
report a reboot), the budgets of each rung, the module options of each call and the record of each rung are decided
here; the action plugin gpu_recover_ladder only runs the calls named. The durations, the rung that cleared the host,
the verdict, the report written to disk, the workflow artifact and the lines printed at the end are computed by
``build``.

No Ansible imports; unit-tested in tests/unit/plugins/module_utils/recover/test_recover_ladder_*.py and through the action
plugin in tests/unit/plugins/action/test_gpu_recover_ladder.py.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

from ansible_collections.inferops.gpu_inference.plugins.module_utils.recover import recover_gate as gate
from ansible_collections.inferops.gpu_inference.plugins.module_utils.common import report_artifact
from ansible_collections.inferops.gpu_inference.plugins.module_utils.common.gpu_inventory import vmid_problem
from ansible_collections.inferops.gpu_inference.plugins.module_utils.common.errors import InferopsError


class LadderError(InferopsError):
    """A raw record the role passed is not what this module expects."""


def _num(value: Any, what: str) -> float:
    try:
        return float(value)
    except (TypeError, ValueError) as exc:
        raise LadderError("%s must be a number (a clock reading), got %r" % (what, value)) from exc


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
        raise LadderError("a rung record needs an integer 'rung', got %r" % (raw,)) from exc
    if rung not in gate.RUNG_NAMES:
        raise LadderError("rung %d is not one of %s" % (rung, sorted(gate.RUNG_NAMES)))
    t0 = _num(raw.get("t0"), "t0")
    t_end = _num(raw.get("t_end"), "t_end")
    t1 = _num(raw["t1"], "t1") if raw.get("t1") is not None else t_end
    poll = raw.get("poll")
    settled_reason = None
    if poll is None:
        verdict, cleared, reasons, next_rung, next_reason = "Not clean", False, [], rung, ""
    else:
        settled_reason = poll.get("settled_reason")
        verdict = poll.get("verdict") or "Not clean"
        cleared = bool(poll.get("clean"))
        reasons = list(poll.get("reasons") or ([] if cleared else [poll.get("msg") or "diagnosis failed"]))
        next_rung = int(poll.get("recommended_rung", gate.RUNG_REBOOT))
        next_reason = poll.get("rung_reason") or ""
    return {"rung": rung, "name": raw.get("name") or gate.RUNG_NAMES[rung],
            "seconds": round(t_end - t0, 1), "action_seconds": round(t1 - t0, 1),
            "verdict": verdict, "cleared": cleared, "action": dict(raw.get("action") or {}),
            "reasons_after": reasons, "next_rung": next_rung, "next_reason": next_reason,
            # Why its verification stopped polling (recover_gate.settled): the gate passed, a grace ran out, ...
            "settled_reason": settled_reason}


# What each acting rung does to the container's service and to the container (gpu_recover_action): the report says it
# when the run could not read the state it left (it stopped before its end).
_DISABLES = {gate.RUNG_STOP_SERVICE: "disables and stops", gate.RUNG_KILL_HOLDERS: "disables (when enabled)",
             gate.RUNG_STOP_CONTAINER: "disables (when the container runs)",
             gate.RUNG_RESET_GPUS: "disables and stops (when the container runs)"}
_PHASES = ("action", "verification")


def stopped_at(raw: Mapping[str, Any], finished: bool) -> Optional[dict[str, Any]]:
    """Where the run stopped before its end, None when it ended. Two cases: a report written before the end (
    ``finished`` false: written before and after each rung's action, so a run that is killed or loses its connection
    leaves one), and a ladder that failed (``interrupted``: the failed task and its message, from the role's rescue)."""
    failure = raw.get("interrupted")
    progress = raw.get("in_progress")
    if finished and not failure:
        return None
    rung = name = phase = None
    if progress:
        rung, name = int(progress["rung"]), progress.get("name") or gate.RUNG_NAMES.get(int(progress["rung"]), "")
        phase = progress.get("phase") if progress.get("phase") in _PHASES else "action"
    where = ("during %s %s's %s" % ("step" if progress.get("name") else "rung %d" % rung, name, phase)
             if progress else "between rungs")
    if failure:
        msg = "%s: %s" % (failure.get("task") or "a task", failure.get("msg") or "failed")
        summary = "Interrupted %s: %s" % (where, msg)
    else:
        msg = None
        summary = ("Not finished: this report was written %s; if no later report replaced it, the run stopped "
                   "there (killed, its connection lost)" % where)
    return {"rung": rung, "name": name, "phase": phase, "msg": msg, "summary": summary}


def seen_by_diagnosis(diag: Optional[Mapping[str, Any]]) -> Optional[dict[str, Any]]:
    """The container and its service as a diagnosis read them (gpu_diagnose's evidence: ``pct status``, and
    ``systemctl show`` of the service through ``pct exec`` when the container runs), None when it did not read both."""
    evidence = (diag or {}).get("evidence") or {}
    status = (evidence.get("container") or {}).get("status")
    service = evidence.get("service") or {}
    if status not in ("running", "stopped") or (status == "running" and not service.get("checked")):
        return None
    running = status == "running"
    return {"container": status, "enabled": (service.get("unit_file_state") or None) if running else None,
            "active": (service.get("active_state") or None) if running else None}


def _left_read(read: Optional[Mapping[str, Any]]) -> Optional[dict[str, Any]]:
    """The container and its service as the run's last read saw them (``pct status``; ``systemctl show`` of the
    service through ``pct exec``), None when not read."""
    if not read:
        return None
    if read.get("seen"):
        return dict(read["seen"])
    status = read.get("pct_status") or {}
    text = str(status.get("stdout") or "")
    container = ("running" if "status: running" in text else "stopped" if "status: stopped" in text else "unknown")
    props: dict[str, str] = {}
    show = read.get("service_show") or {}
    if container == "running" and show.get("rc") == 0:
        for line in str(show.get("stdout") or "").splitlines():
            key, sep, value = line.partition("=")
            if sep:
                props[key.strip()] = value.strip()
    return {"container": container, "enabled": props.get("UnitFileState") or None,
            "active": props.get("ActiveState") or None}


def left_state(raw: Mapping[str, Any], finished: bool, stopped: Optional[Mapping[str, Any]]) -> dict[str, Any]:
    """The state the run leaves the container and its service in, and how to restore it.

    What the run read at its end (``left_read``) when it has it; else (a report written before the end) what the rungs
    that ran, and the one running, do to them. ``restore`` lists the steps, in order."""
    vmid = int(raw["vmid"])
    service = str(raw.get("service") or "sglang.service")
    rungs = [r for r in raw.get("rungs") or [] if not r.get("name") and int(r["rung"]) in _DISABLES]
    progress = raw.get("in_progress") or {}
    running_rung = int(progress["rung"]) if progress and not progress.get("name") else None
    started_again = any(r.get("name") == "start_container" for r in raw.get("rungs") or [])
    ct_stopped_by_us = bool(raw.get("ct_stopped_by_us")) and not started_again
    read = _left_read(raw.get("left_read"))
    changed_by = sorted({int(r["rung"]) for r in rungs} | ({running_rung} if running_rung in _DISABLES else set()))
    out: dict[str, Any] = {"service": service, "container": None, "enabled": None, "active": None,
                           "read": read is not None, "changed_by_rungs": changed_by, "summary": "", "restore": []}
    if read:
        out.update(read)
        out["summary"] = "CT %d is %s%s." % (vmid, read["container"], (
            "; %s is %s and %s" % (service, read["enabled"] or "unreadable", read["active"] or "unreadable"))
            if read["container"] == "running" else "")
        ct_down = read["container"] != "running"
        service_down = ct_down or read["enabled"] != "enabled" or read["active"] != "active"
    else:
        parts = ["rung %d (%s) %s %s" % (r, gate.RUNG_NAMES[r], _DISABLES[r], service)
                 for r in changed_by if r != running_rung]
        if running_rung in _DISABLES:
            parts.append("rung %d (%s), running when this was written, %s %s"
                         % (running_rung, gate.RUNG_NAMES[running_rung], _DISABLES[running_rung], service))
        if ct_stopped_by_us or running_rung == gate.RUNG_STOP_CONTAINER:
            parts.append("CT %d was stopped by rung %d (stop_container) and not started again"
                         % (vmid, gate.RUNG_STOP_CONTAINER) if ct_stopped_by_us
                         else "rung %d (stop_container) stops CT %d" % (gate.RUNG_STOP_CONTAINER, vmid))
        why = "Not read" if finished else "Not read (the run did not reach its end)"
        out["summary"] = ("%s: %s." % (why, "; ".join(parts))) if parts else (
            "" if finished else "%s: no rung had acted on CT %d yet." % (why, vmid))
        ct_down = ct_stopped_by_us or running_rung == gate.RUNG_STOP_CONTAINER
        service_down = bool(changed_by)
    restore: list[str] = []
    if stopped is not None:
        restore.append("run recover.yml again for CT %d (ansible-playbook playbooks/recover.yml -e recover_vmid=%d): it "
                       "diagnoses from the start and climbs only the rungs still needed" % (vmid, vmid))
    if ct_down and (read is None or read["container"] == "stopped"):
        restore.append("once the verdict is Clean, start the container: pct start %d (recover does it itself when the "
                       "container ran before, gpu_recover_start_container)" % vmid)
    if service_down:
        restore.append("once the verdict is Clean, bring the server back with playbooks/deploy.yml (or recover.yml -e "
                       "recover_relaunch=true), which enables and starts %s with the planned arguments; by hand: "
                       "pct exec %d -- systemctl enable --now %s" % (service, vmid, service))
    out["restore"] = restore
    return out


def build(raw: Mapping[str, Any]) -> dict[str, Any]:
    """The report, the workflow artifact and the summary lines of one run.

    raw: vmid, node, started_at (ISO text), t_start, t_end, check_mode, clean (the last gate), reboot_needed,
    rungs [raw rung records], before (rung 0's diagnosis), after (the last diagnosis), report_path.
    """
    if not isinstance(raw, Mapping):
        raise LadderError("the report needs the run's raw record (a dict), got %s" % type(raw).__name__)
    rows = [rung_row(r) for r in raw.get("rungs") or []]
    clean = bool(raw.get("clean"))
    cleared: Optional[int] = next((r["rung"] for r in rows if r["cleared"]), None)
    if cleared is None and clean and not rows:
        cleared = gate.RUNG_CLEAN
    before = raw.get("before") or {}
    after = raw.get("after") or {}
    seconds = round(_num(raw.get("t_end"), "t_end") - _num(raw.get("t_start"), "t_start"), 1)
    finished = _bool(raw.get("finished", True), "finished")
    stopped = stopped_at(raw, finished)
    if stopped is not None:
        # A run that did not reach its verdict is not Clean, whatever its last verification said.
        clean, cleared = False, None
    verdict = "Clean" if clean else "Not clean"
    left = left_state(raw, finished, stopped)
    report = {
        "vmid": int(raw["vmid"]), "node": raw.get("node"), "started_at": raw.get("started_at"), "seconds": seconds,
        "check_mode": bool(raw.get("check_mode")), "verdict": verdict, "cleared_by_rung": cleared,
        "reboot_needed": bool(raw.get("reboot_needed")), "finished": finished, "interrupted": stopped, "left": left,
        "rungs": rows,
        "before": {k: before.get(k) for k in ("verdict", "reasons", "recommended_rung", "rung_reason", "notes",
                                              "evidence")},
        "after": {"verdict": after.get("verdict") or "Not clean", "reasons": list(after.get("reasons") or []),
                  "notes": list(after.get("notes") or []), "evidence": after.get("evidence") or {}},
    }
    artifact = {"vmid": report["vmid"], "node": report["node"], "verdict": verdict, "cleared_by_rung": cleared,
                "reboot_needed": report["reboot_needed"], "rungs": [r["rung"] for r in rows], "seconds": seconds,
                "check_mode": report["check_mode"], "reasons": report["after"]["reasons"] if not clean else []}
    # AWX deletes the job's private data dir after the job: the report an operator keeps is the artifact's copy.
    artifact.update(report_artifact.bounded(report))
    lines = [verdict, after.get("summary") or "",
             "Rungs: %s" % (", ".join("%d %s: %s s" % (r["rung"], r["name"], r["seconds"]) for r in rows) or "none")]
    if stopped is not None:
        lines.append(stopped["summary"])
    if left["summary"]:
        lines.append("Left: " + left["summary"])
    lines += ["Restore: " + step_text for step_text in left["restore"]]
    if report["check_mode"]:
        lines.append("Check mode: nothing changed.")
    if raw.get("report_path"):
        lines.append("Report: %s" % raw["report_path"])
    return {"report": report, "artifact": artifact, "summary_lines": lines}


# --------------------------------------------------------------------------- the run's state

# The role's settings the state needs (gpu_recover_<key>): the rungs' budgets and what to do once clean.
SETTING_KEYS = ("service_stop_timeout", "service_poll_timeout", "term_grace", "kill_wait", "kill_poll_timeout",
                "stuck_timeout", "container_shutdown_timeout", "container_stop_timeout", "container_poll_timeout",
                "reset_timeout", "reset_poll_timeout", "diagnose_timeout", "poll_sample_interval",
                "record_baseline", "start_container", "allow_reboot")
_FLAGS = ("record_baseline", "start_container", "allow_reboot")
# Keys of a module result that are Ansible's bookkeeping, not what happened.
_NOISE = ("invocation", "changed", "_ansible_no_log", "attempts", "skipped", "skip_reason")


def _bool(value: Any, what: str) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "yes", "on", "1"):
        return True
    if text in ("false", "no", "off", "0", "", "none"):
        return False
    raise LadderError("%s must be true or false, got %r" % (what, value))


def _seconds(value: Any, what: str) -> int:
    what = what if what.endswith("_s") else what + "_s"   # the setting's name, with its unit
    try:
        out = int(float(value))
    except (TypeError, ValueError) as exc:
        raise LadderError("gpu_recover_%s must be a number of seconds, got %r" % (what, value)) from exc
    if out < 0:
        raise LadderError("gpu_recover_%s must be 0 or more seconds, got %r" % (what, value))
    return out


def _strip(result: Optional[Mapping[str, Any]], also: tuple[str, ...] = ()) -> dict[str, Any]:
    return {k: v for k, v in (result or {}).items() if k not in _NOISE + also}


def budgets(settings: Mapping[str, Any]) -> dict[str, dict[str, int]]:
    """Per rung (as text: the keys of a dict Ansible passes around): the action task's timeout (rung 5's for a
    container with one GPU; the state's action_timeout_s is the one for the container's GPUs), the verification's
    polling budget (gpu_diagnose polls in one call until a diagnosis settles or the budget has passed since the
    first began: recover_gate.poll_again), the most one diagnosis may take (two samples ``poll_sample_interval``
    apart) and the verification task's timeout (the budget and one more diagnosis)."""
    interval = settings["poll_sample_interval"]
    out: dict[str, dict[str, int]] = {}
    for rung, key in gate.POLL_BUDGET_SETTING.items():
        poll_s = settings[key]
        one = settings["diagnose_timeout"] + 2 * interval
        out[str(rung)] = {
            "action_timeout_s": gate.action_budget_s(rung, settings) if rung in gate.ACTING_RUNGS else 0,
            "poll_budget_s": poll_s,
            "poll_timeout_s": one,
            "verify_timeout_s": poll_s + one,
        }
    return out


def start(vmid: Any, node: str, started_at: str, t_start: Any, pct_status: str,
          settings: Mapping[str, Any], inputs: Optional[Mapping[str, Any]] = None) -> dict[str, Any]:
    """The state before rung 0: the target, the clock, whether the container runs (``pct status`` output), the
    role's settings (SETTING_KEYS, checked here; the other SECONDS_SETTINGS take their defaults when not given) and
    the ladder's other inputs (``inputs``: service, declared, allow_undeclared, baseline_dir, samples, tolerances,
    stop_host_daemons; what gpu_recover_ladder passes its modules)."""
    missing = [k for k in SETTING_KEYS if k not in settings]
    if missing:
        raise LadderError("settings lack %s" % ", ".join(missing))
    clean_settings: dict[str, Any] = {k: (_bool(settings[k], "gpu_recover_" + k) if k in _FLAGS
                                          else _seconds(settings[k], k)) for k in SETTING_KEYS}
    for key in SECONDS_SETTINGS:
        if key not in clean_settings:
            clean_settings[key] = _seconds(settings.get(key, DEFAULT_SECONDS[key]), key)
    if clean_settings["poll_sample_interval"] < 1:
        raise LadderError("gpu_recover_poll_sample_interval_s must be at least 1 second")
    problem = vmid_problem(vmid)
    if problem:
        raise LadderError("gpu_recover_vmid (recover_vmid) %s" % problem)
    vmid = int(vmid)
    reset_command_s = gate.reset_command_timeout_s(clean_settings)
    # gpu_recover_action's options for every acting rung (the module takes the ones its action uses).
    action_args = {"term_grace": clean_settings["term_grace"], "wait": clean_settings["kill_wait"],
                   "service_stop_timeout": clean_settings["service_stop_timeout"],
                   "stuck_timeout": clean_settings["stuck_timeout"],
                   "container_shutdown_timeout": clean_settings["container_shutdown_timeout"],
                   "container_stop_timeout": clean_settings["container_stop_timeout"],
                   "command_timeout": reset_command_s,
                   # Rung 5 waits this long for another reset on the node (its node lock) before refusing.
                   "reset_lock_wait": clean_settings["reset_timeout"]}
    given = dict(inputs or {})
    samples = given.get("samples", 2)
    if not isinstance(samples, int) or isinstance(samples, bool) or samples < 1:
        raise LadderError("gpu_recover_samples must be 1 or more, got %r" % (samples,))
    if clean_settings["sample_interval"] < 0:
        raise LadderError("gpu_recover_sample_interval_s must be 0 or more seconds")
    state_inputs = {"service": str(given.get("service") or "sglang.service"),
                    "declared": list(given.get("declared") or []),
                    "allow_undeclared": _bool(given.get("allow_undeclared", False), "gpu_recover_allow_undeclared"),
                    "baseline_dir": str(given.get("baseline_dir") or "/var/lib/inferops/baseline"),
                    "samples": samples, "tolerances": dict(given.get("tolerances") or {}),
                    "stop_host_daemons": _bool(given.get("stop_host_daemons", True), "gpu_recover_stop_host_daemons")}
    state = {"vmid": vmid, "node": node, "action_args": action_args, "inputs": state_inputs, "phase": "climb",
             "started_at": started_at, "t_start": _num(t_start, "t_start"),
             "ct_was_running": "status: running" in (pct_status or ""), "settings": clean_settings,
             "budgets": budgets(clean_settings), "rungs": [], "pending": None, "clean": False,
             "next": gate.RUNG_CLEAN, "last_rung": gate.RUNG_CLEAN, "ct_stopped_by_us": False,
             "reboot_needed": False, "baseline_recorded": False, "daemons_down": [], "before": None, "after": None,
             "in_progress": None, "interrupted": None, "left_read": None, "read_current": False}
    return _derive(state)


def _derive(state: dict[str, Any]) -> dict[str, Any]:
    """What the role does next, from the state (the role only reads these)."""
    after = state.get("after") or {}
    clean, nxt, flags = state["clean"], state["next"], state["settings"]
    diagnosed = state.get("before") is not None
    state["climb"] = diagnosed and not clean and nxt in gate.ACTING_RUNGS
    state["rung_name"] = gate.RUNG_NAMES.get(nxt, "")
    # The next action's task timeout: its steps' bounds summed, rung 5's for the container's GPUs (each may be its
    # own reset group), so that the timeout never cuts a step short.
    gpus = ((after.get("evidence") or {}).get("container") or {}).get("gpus") or []
    state["action_timeout_s"] = gate.action_budget_s(nxt, flags, len(gpus)) if nxt in gate.ACTING_RUNGS else 0
    # The ladder from the next rung on, as the check-mode plan prints it (each later rung only if still needed).
    state["ladder_ahead"] = [gate.RUNG_NAMES[r] for r in sorted(gate.RUNG_NAMES) if r >= max(nxt, 1)] if nxt else []
    state["record_baseline_now"] = bool(
        diagnosed and flags["record_baseline"] and not clean and nxt == gate.RUNG_CLEAN
        and not state["baseline_recorded"] and (after.get("findings") or {}).get("baseline_missing"))
    state["restore_container"] = bool(clean and state["ct_stopped_by_us"] and state["ct_was_running"]
                                      and flags["start_container"])
    state["reboot_now"] = diagnosed and not clean and nxt == gate.RUNG_REBOOT and not state["reboot_needed"]
    state["ignore_baseline"] = flags["record_baseline"] and not state["baseline_recorded"]
    # Rung 1's `systemctl stop` ran out of its timeout just before: systemd sent SIGTERM to every process of the unit
    # when that stop began (systemd.kill(5), KillMode=control-group), so rung 2 sends those only SIGKILL.
    last = (state.get("rungs") or [{}])[-1]
    state["unit_stop_timed_out"] = bool(state["climb"] and nxt == gate.RUNG_KILL_HOLDERS
                                        and last.get("rung") == gate.RUNG_STOP_SERVICE and last.get("stop_timed_out"))
    # The end need not read the container and its service again (report.yml) when the last diagnosis read both and
    # nothing acted since it.
    state["left_seen"] = bool(state.get("read_current") and not state.get("interrupted")
                              and seen_by_diagnosis(after) is not None)
    return state


def _node_time(state: Mapping[str, Any]) -> Optional[float]:
    after = state.get("after") or {}
    return after.get("node_time")


def step(state: Mapping[str, Any], event: str, result: Optional[Mapping[str, Any]] = None, t0: Any = None,
         t1: Any = None, name: Optional[str] = None) -> dict[str, Any]:
    """The state after ``event`` (clock readings ``t0``, ``t1`` in seconds since the epoch):

    - ``diagnosed``: ``result`` is rung 0's gpu_diagnose result;
    - ``acted``: the action of the rung the state names (``next``) ran from ``t0`` to ``t1``; ``result`` is
      gpu_recover_action's;
    - ``step``: a step that is not a rung (``name``: record_baseline, start_container) ran from ``t0`` to ``t1``
      after the last rung, ``result`` its outcome (a dict);
    - ``reboot``: rung 6 is reached at ``t0``; without gpu_recover_allow_reboot it is recorded as reported only;
      with it, the reboot (``t1``: when the node was back) is verified next;
    - ``verified``: ``result`` is the verification's gpu_diagnose result, ``t1`` when it ended;
    - ``acting``: the action of the rung the state names (``next``), or the step ``name`` (start_container, reboot),
      begins at ``t0`` (the report written next says so, in case the run stops there);
    - ``interrupted``: the ladder failed; ``result`` is {"task", "msg"} of the failed task (the role's rescue);
    - ``left``: ``result`` is the end's read of the container and its service ({"pct_status", "service_show"}: each
      a command's {"rc", "stdout"}).
    """
    new = dict(state)
    new["rungs"] = list(state.get("rungs") or [])
    progress = state.get("in_progress")
    if event != "left":
        # Whether the last diagnosis is still the latest read of the container and its service (nothing acted since).
        new["read_current"] = event in ("diagnosed", "verified")
    if event == "acting":
        if name not in (None, "record_baseline", "start_container", "reboot"):
            raise LadderError("unknown step %r (record_baseline, start_container, reboot)" % (name,))
        rung = (gate.RUNG_REBOOT if name == "reboot" else int(state["last_rung"]) if name else int(state["next"]))
        if not name and rung not in gate.ACTING_RUNGS:
            raise LadderError("no rung to act on (next is %r)" % (rung,))
        new["in_progress"] = {"rung": rung, "name": name if name != "reboot" else None, "t0": _num(t0, "t0"),
                              "phase": "action"}
        return _derive(new)
    if event == "interrupted":
        failure = dict(result or {})
        new["interrupted"] = {"task": str(failure.get("task") or ""), "msg": str(failure.get("msg") or "")[-1000:]}
        return _derive(new)
    if event == "left":
        if state.get("left_seen"):
            # Nothing acted since the last diagnosis, which read both with the same commands: that read is the end's.
            new["left_read"] = {"seen": seen_by_diagnosis(state.get("after"))}
            return _derive(new)
        read = dict(result or {})
        new["left_read"] = {k: {"rc": (read.get(k) or {}).get("rc"), "stdout": str((read.get(k) or {}).get("stdout") or "")[-2000:]}
                            for k in ("pct_status", "service_show")}
        return _derive(new)
    if event in ("acted", "step") or (event == "reboot" and state["settings"]["allow_reboot"]):
        new["in_progress"] = dict(progress, phase="verification") if progress else None
    elif event in ("verified", "reboot"):
        new["in_progress"] = None
    if event == "diagnosed":
        diag = _strip(result)
        new.update(before=diag, after=diag, clean=bool(diag.get("clean")),
                   next=int(diag.get("recommended_rung", gate.RUNG_REBOOT)))
    elif event == "acted":
        rung = int(state["next"])
        if rung not in gate.ACTING_RUNGS:
            raise LadderError("no rung to act on (next is %r)" % (rung,))
        action = _strip(result)
        new["pending"] = {"rung": rung, "name": None, "t0": _num(t0, "t0"), "t1": _num(t1, "t1"), "action": action,
                          "node_t0": action.get("started_at", _node_time(state)), "budget": state["budgets"][str(rung)],
                          # rung 1's stop ran out of its timeout (pct_command's timed_out): recover_gate.settled
                          "stop_timed_out": rung == gate.RUNG_STOP_SERVICE and any(
                              bool(c.get("timed_out")) for c in action.get("commands") or [])}
        if action.get("container_was_running"):
            new["ct_stopped_by_us"] = True
        new["daemons_down"] = sorted({d.get("name") for d in action.get("daemons") or []
                                      if d.get("stopped") and not d.get("restarted")} | set(state.get("daemons_down") or []))
    elif event == "step":
        if name not in ("record_baseline", "start_container"):
            raise LadderError("unknown step %r (record_baseline, start_container)" % (name,))
        new["pending"] = {"rung": int(state["last_rung"]), "name": name, "t0": _num(t0, "t0"), "t1": _num(t1, "t1"),
                          "action": _strip(result), "node_t0": _node_time(state),
                          "budget": state["budgets"][str(gate.RUNG_REBOOT)]}
        if name == "record_baseline":
            new["baseline_recorded"] = True
    elif event == "reboot":
        new["reboot_needed"] = True
        if state["settings"]["allow_reboot"]:
            # The verification's graces count from the node being back (t1).
            new["pending"] = {"rung": gate.RUNG_REBOOT, "name": None, "t0": _num(t0, "t0"), "t1": _num(t1, "t1"),
                              "action": {"reboot_allowed": True}, "node_t0": _num(t1, "t1"),
                              "budget": state["budgets"][str(gate.RUNG_REBOOT)]}
        else:
            now = _num(t0, "t0")
            new["rungs"].append({"rung": gate.RUNG_REBOOT, "name": None, "t0": now, "t1": None, "t_end": now,
                                 "action": {"reboot_allowed": False}, "poll": None})
    elif event == "verified":
        pending = state.get("pending")
        if not pending:
            raise LadderError("a verification with no rung or step before it")
        poll = _strip(result)
        record = {k: pending[k] for k in ("rung", "name", "t0", "t1", "action")}
        record["stop_timed_out"] = bool(pending.get("stop_timed_out"))
        record.update(t_end=_num(t1, "t1"), poll=_strip(poll, ("evidence",)))
        new["rungs"].append(record)
        new.update(pending=None, after=poll, clean=bool(poll.get("clean")), last_rung=int(pending["rung"]),
                   next=int(poll.get("recommended_rung", gate.RUNG_REBOOT)))
        label = ("%s (after rung %d)" % (pending["name"], pending["rung"]) if pending["name"]
                 else "rung %d (%s)" % (pending["rung"], gate.RUNG_NAMES[int(pending["rung"])]))
        new["verified_lines"] = [
            "%s after %s" % (poll.get("verdict") or "Not clean", label),
            poll.get("summary") or poll.get("msg") or "",
            "" if new["clean"] else "Next: rung %d (%s): %s" % (
                new["next"], gate.RUNG_NAMES.get(new["next"], "?"), poll.get("rung_reason") or "")]
    else:
        raise LadderError("unknown event %r (diagnosed, acting, acted, step, reboot, verified, interrupted, left)"
                          % (event,))
    return _derive(new)


# --------------------------------------------------------------------------- the ladder, one call after the other

# The role's settings in seconds, by their names before the unit suffix: gpu_recover_<key> is now gpu_recover_<key>_s;
# the old name is still accepted for one release, with a deprecation warning that names the new one.
SECONDS_SETTINGS = ("diagnose_timeout", "service_stop_timeout", "service_poll_timeout", "term_grace", "kill_wait",
                    "kill_poll_timeout", "stuck_grace", "stuck_timeout", "release_grace",
                    "container_shutdown_timeout", "container_stop_timeout", "container_poll_timeout",
                    "reset_timeout", "reset_poll_timeout", "reboot_timeout", "sample_interval",
                    "poll_sample_interval", "lock_wait")
# Their defaults (roles/gpu_recover/defaults/main.yml; a unit test keeps both the same).
DEFAULT_SECONDS: dict[str, int] = {
    "diagnose_timeout": 60, "service_stop_timeout": 90, "service_poll_timeout": 60, "term_grace": 10,
    "kill_wait": 60, "kill_poll_timeout": 60, "stuck_grace": 30, "stuck_timeout": 60, "release_grace": 60,
    "container_shutdown_timeout": 60, "container_stop_timeout": 90, "container_poll_timeout": 60,
    "reset_timeout": 180, "reset_poll_timeout": 60, "reboot_timeout": 900, "sample_interval": 5,
    "poll_sample_interval": 2, "lock_wait": 300}
# Settings new with the unit suffix: no old name to accept.
_NEW_SECONDS = ("lock_wait",)
DIAGNOSE_MODULE = "inferops.gpu_inference.gpu_diagnose"
ACTION_MODULE = "inferops.gpu_inference.gpu_recover_action"
BASELINE_MODULE = "inferops.gpu_inference.gpu_baseline"
# pct start of the container again after rung 4 or 5 (seconds).
START_CONTAINER_TIMEOUT_S = 120


def role_seconds(new: Mapping[str, Any], old: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The seconds settings by their short names, and the deprecation warnings.

    ``new``: {"<key>_s": value} as the role passes them (its defaults applied); ``old``: {"<key>": value} of the
    deprecated names this run sets. An old name set alone wins (with a warning); set together with its new name to
    another value than the new one's default and the old one's, it is an error (which one did the operator mean?)."""
    out: dict[str, Any] = {}
    warnings: list[str] = []
    unknown = sorted(k for k in old if k not in SECONDS_SETTINGS or k in _NEW_SECONDS)
    if unknown:
        raise LadderError("no deprecated setting gpu_recover_%s" % ", gpu_recover_".join(unknown))
    for key in SECONDS_SETTINGS:
        value = new.get(key + "_s", DEFAULT_SECONDS[key])
        if key in old and old[key] is not None:
            if _seconds(value, key + "_s") not in (DEFAULT_SECONDS[key], _seconds(old[key], key)):
                raise LadderError("gpu_recover_%s (deprecated) and gpu_recover_%s_s are both set, to %r and %r: set "
                                  "only gpu_recover_%s_s" % (key, key, old[key], value, key))
            warnings.append("gpu_recover_%s is deprecated and will be removed in the next release: use "
                            "gpu_recover_%s_s (seconds)" % (key, key))
            value = old[key]
        out[key] = _seconds(value, key + "_s")
    return out, warnings


def diagnose_timeout_s(settings: Mapping[str, Any], samples: int) -> int:
    """Rung 0's diagnosis may take its own timeout on top of its sampling time."""
    return int(settings["diagnose_timeout"]) + int(samples) * int(settings["sample_interval"])


def lease_s(state: Mapping[str, Any]) -> int:
    """How long the node's ladder lock may be held at most: rung 0's diagnosis, every acting rung's action and
    verification (each at most once: rungs only go up), a second rung-5 verification (after the container is started
    again or the baseline recorded) and the end's reads; a lock whose run lost its controller ends by then."""
    b = state["budgets"]
    rungs = sum(int(b[str(r)]["action_timeout_s"]) + int(b[str(r)]["verify_timeout_s"]) for r in gate.ACTING_RUNGS)
    return (diagnose_timeout_s(state["settings"], state["inputs"]["samples"]) + rungs
            + 2 * int(b[str(gate.RUNG_REBOOT)]["verify_timeout_s"]) + START_CONTAINER_TIMEOUT_S + 120)


def _diagnose_args(state: Mapping[str, Any]) -> dict[str, Any]:
    i = state["inputs"]
    args = {"vmid": state["vmid"], "service": i["service"], "node": state["node"], "declared": list(i["declared"]),
            "allow_undeclared": bool(i["allow_undeclared"]), "ignore_baseline": bool(state["ignore_baseline"]),
            "baseline_dir": i["baseline_dir"], "stop_when_decided": True}
    args.update({k: v for k, v in (i.get("tolerances") or {}).items() if v is not None})
    return args


def next_call(state: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """What the ladder does next, and the state with the phase it is in.

    The call: ``do`` (diagnose, act, verify, record_baseline, start_container, reboot, done) and, for a module,
    ``module``, ``args`` and ``timeout_s``; the event to step the state with once it ran (``event``, ``name``). The
    order is the ladder's: rung 0; while the diagnosis names an acting rung, that rung and its verification; then,
    as the state says, record the baseline (then verify), start the container again (then verify), rung 6."""
    new = dict(state)
    phase = state.get("phase") or "climb"
    if state.get("before") is None:
        args = dict(_diagnose_args(state), samples=int(state["inputs"]["samples"]),
                    sample_interval=state["settings"]["sample_interval"])
        return ({"do": "diagnose", "module": DIAGNOSE_MODULE, "args": args, "event": "diagnosed",
                 "timeout_s": diagnose_timeout_s(state["settings"], state["inputs"]["samples"])}, new)
    if state.get("interrupted"):
        return {"do": "done"}, new
    pending = state.get("pending")
    if pending:
        args = dict(_diagnose_args(state), samples=2, sample_interval=state["settings"]["poll_sample_interval"],
                    after_rung=int(pending["rung"]), kernel_since_seq=(state.get("before") or {}).get("kernel_cursor"),
                    rung_started_at=pending.get("node_t0"), stuck_grace=state["settings"]["stuck_grace"],
                    release_grace=state["settings"]["release_grace"],
                    stop_timed_out=bool(pending.get("stop_timed_out")),
                    poll_budget=pending["budget"]["poll_budget_s"], poll_delay=1)
        args = {k: v for k, v in args.items() if v is not None}
        return ({"do": "verify", "module": DIAGNOSE_MODULE, "args": args, "event": "verified",
                 "timeout_s": int(pending["budget"]["verify_timeout_s"])}, new)
    gpus = ((state.get("after") or {}).get("evidence") or {}).get("container", {}).get("gpus") or []
    if phase == "climb":
        if state["climb"]:
            a = state["action_args"]
            args = {"vmid": state["vmid"], "action": state["rung_name"], "service": state["inputs"]["service"],
                    "gpus": list(gpus), "term_grace": a["term_grace"], "wait": a["wait"],
                    "unit_stop_timed_out": bool(state.get("unit_stop_timed_out")),
                    "service_stop_timeout": a["service_stop_timeout"], "stuck_timeout": a["stuck_timeout"],
                    "container_shutdown_timeout": a["container_shutdown_timeout"],
                    "container_stop_timeout": a["container_stop_timeout"], "command_timeout": a["command_timeout"],
                    "stop_host_daemons": bool(state["inputs"]["stop_host_daemons"]),
                    "reset_lock_wait": a["reset_lock_wait"]}
            return ({"do": "act", "rung": int(state["next"]), "module": ACTION_MODULE, "args": args,
                     "event": "acted", "timeout_s": int(state["action_timeout_s"])}, new)
        phase = "record"
    if phase == "record":
        new["phase"] = "restore"
        if state["record_baseline_now"]:
            return ({"do": "record_baseline", "module": BASELINE_MODULE, "event": "step", "name": "record_baseline",
                     "args": {"vmid": state["vmid"], "gpus": list(gpus), "baseline_dir": state["inputs"]["baseline_dir"],
                              "service": state["inputs"]["service"],
                              "wait": state["settings"]["container_poll_timeout"]},
                     "timeout_s": int(state["settings"]["container_poll_timeout"]) + 120}, new)
        phase = "restore"
    if phase == "restore":
        new["phase"] = "reboot"
        if state["restore_container"]:
            return ({"do": "start_container", "event": "step", "name": "start_container",
                     "timeout_s": START_CONTAINER_TIMEOUT_S}, new)
        phase = "reboot"
    if phase == "reboot":
        new["phase"] = "end"
        if state["reboot_now"]:
            return ({"do": "reboot", "event": "reboot", "allowed": bool(state["settings"]["allow_reboot"]),
                     "reboot_timeout_s": int(state["settings"]["reboot_timeout"])}, new)
    new["phase"] = "end"
    return {"do": "done"}, new
