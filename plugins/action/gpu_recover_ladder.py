# -*- coding: utf-8 -*-
# Copyright: inferops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The recovery ladder of one container in one task, the way ansible.builtin.reboot waits inside one task.

Python decides every step (module_utils/recover/recover_ladder.next_call and step, from recover_gate's verdicts); this
plugin only runs what they name through _execute_module (gpu_diagnose, gpu_recover_action, gpu_baseline, the node's
lock), keeps the clock, writes the report on the controller before and after each action and at the end, and holds
the node's lock on the container's ladder while it acts (module gpu_recover_lock, which also writes the metrics).
"""
from __future__ import annotations

import json
import os
import signal
import time

from ansible.errors import AnsibleError
from ansible.module_utils.common.text.converters import to_text
from ansible.plugins.action import ActionBase

from ansible_collections.inferops.gpu_inference.plugins.module_utils.recover import recover_ladder as ladder
from ansible_collections.inferops.gpu_inference.plugins.module_utils.recover import recover_lock as rl
from ansible_collections.inferops.gpu_inference.plugins.module_utils.recover.metrics_textfile import MetricsError, recover_metrics

LOCK_MODULE = "inferops.gpu_inference.gpu_recover_lock"
PCT = "/usr/sbin/pct"
TIMEOUT_BIN = "timeout"


class StepTimeout(Exception):
    """A module call ran past its bound (the task timeout the role's tasks had per step)."""


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(("vmid", "service", "pct_status", "declared", "allow_undeclared", "baseline_dir",
                             "report_dir", "metrics_dir", "samples", "tolerances", "seconds", "record_baseline",
                             "start_container", "allow_reboot", "stop_host_daemons", "fail_when_not_clean"))

    # ------------------------------------------------------------------ running one step

    def _bounded(self, timeout_s, func, *args, **kwargs):
        """Run ``func`` under SIGALRM, as a task's ``timeout`` would (TaskExecutor does the same)."""
        def expired(signum, frame):
            raise StepTimeout("timed out after %d s" % timeout_s)
        previous = signal.signal(signal.SIGALRM, expired)
        signal.alarm(max(int(timeout_s), 1))
        try:
            return func(*args, **kwargs)
        finally:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, previous)

    def _module(self, name, args, task_vars, timeout_s=None):
        """One module on the node; its warnings and deprecations go to the task's result, the rest is data."""
        if timeout_s:
            res = self._bounded(timeout_s, self._execute_module, module_name=name, module_args=args,
                                task_vars=task_vars)
        else:
            res = self._execute_module(module_name=name, module_args=args, task_vars=task_vars)
        for key in ("warnings", "deprecations"):
            self._notes.setdefault(key, []).extend(res.get(key) or [])
        return {k: v for k, v in res.items() if k not in ("warnings", "deprecations") and not k.startswith("_ansible")}

    def _command(self, argv, task_vars, timeout_s):
        return self._module("ansible.legacy.command", {"argv": argv}, task_vars, timeout_s)

    # ------------------------------------------------------------------ the run's outputs

    def _report(self, state, finished):
        raw = dict(state, t_end=time.time(), check_mode=self._check, report_path=self._report_path,
                   service=state["inputs"]["service"], finished=finished)
        return ladder.build(raw)

    def _write_report(self, built):
        """The report on the controller, whole (a temporary file renamed into place)."""
        path = self._report_path
        os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
        tmp = "%s.%d.tmp" % (path, os.getpid())
        with open(tmp, "w", encoding="utf-8") as handle:
            handle.write(json.dumps(built["report"], indent=2, sort_keys=False) + "\n")
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)

    def _metrics(self, built):
        if not self._metrics_path or built.get("unbuilt"):
            return {}
        try:
            return {"metrics_path": self._metrics_path, "metrics_text": recover_metrics(built["report"], time.time())}
        except MetricsError as exc:
            raise AnsibleError("metrics of CT %s: %s" % (built["report"].get("vmid"), exc)) from exc

    def _say(self, lines):
        lines = [to_text(x) for x in lines if x]
        self._lines.extend(lines)
        for line in lines:
            self._display.v("%s: %s" % (self._host, line))

    # ------------------------------------------------------------------ the lock

    def _acquire(self, state, task_vars):
        """The node's lock on the container's ladder, with the in-progress metrics. Held by another run: a run of
        this controller that is gone (recover_lock.stale_run) has its holder ended; else this run waits up to
        gpu_recover_lock_wait_s. ``contended`` says another run held it (what it left is diagnosed again)."""
        progress = state.get("in_progress") or {"rung": 0, "phase": "action", "t0": time.time()}
        built = self._report(dict(state, in_progress=progress), finished=False)
        wait_s = state["settings"]["lock_wait"]
        base = dict(vmid=state["vmid"], state="acquired", lease_s=ladder.lease_s(state), playbook=self._playbook,
                    controller=self._controller, **self._metrics(built))
        if self._run_ticks is not None:
            base.update(run_pid=self._run_pid, run_start_ticks=self._run_ticks)
        res = self._module(LOCK_MODULE, dict(base, wait_s=0), task_vars, 60)
        contended = bool(res.get("failed"))
        if res.get("failed") and res.get("refused"):
            holder = res.get("holder")
            if rl.stale_run(holder, self._controller, rl.same_process):
                self._say(["The run that held the node's lock on CT %s is gone from this controller (pid %s): its "
                           "holder is ended." % (state["vmid"], holder.get("run_pid"))])
                res = self._module(LOCK_MODULE, dict(base, wait_s=wait_s, break_pid=holder["pid"],
                                                     break_start_ticks=holder["start_ticks"]), task_vars, wait_s + 60)
            elif wait_s > 0:
                self._say(["Waiting up to %d s for the node's lock: %s" % (wait_s, res.get("msg"))])
                res = self._module(LOCK_MODULE, dict(base, wait_s=wait_s), task_vars, wait_s + 60)
        if res.get("failed"):
            raise AnsibleError(res.get("msg") or "the node's lock on CT %s was not given" % state["vmid"])
        return dict(res, contended=contended)

    def _release(self, lock, built, task_vars):
        args = dict(vmid=built["report"]["vmid"], state="released", **self._metrics(built))
        if lock:
            args.update(holder_pid=lock["holder_pid"], holder_start_ticks=lock["holder_start_ticks"])
        if not lock and not self._metrics_path:
            return
        res = self._module(LOCK_MODULE, args, task_vars, 60)
        if res.get("failed"):
            self._display.warning("CT %s: the node's lock or metrics: %s" % (built["report"]["vmid"], res.get("msg")))

    # ------------------------------------------------------------------ the ladder

    def _start(self, args, task_vars):
        seconds, warnings = ladder.role_seconds(args.get("seconds") or {}, self._deprecated(task_vars))
        for text in warnings:
            self._display.deprecated(text, version="1.0.0", collection_name="inferops.gpu_inference")
        settings = dict(seconds, record_baseline=args.get("record_baseline", False),
                        start_container=args.get("start_container", True), allow_reboot=args.get("allow_reboot", False))
        inputs = {k: args[k] for k in ("service", "declared", "allow_undeclared", "baseline_dir", "samples",
                                       "tolerances", "stop_host_daemons") if k in args}
        return ladder.start(args.get("vmid"), self._host, time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                            time.time(), to_text(args.get("pct_status") or ""), settings, inputs)

    def _deprecated(self, task_vars):
        """The deprecated names of the seconds settings this run sets (gpu_recover_<key>, now <key>_s)."""
        old = {}
        for key in ladder.SECONDS_SETTINGS:
            name = "gpu_recover_" + key
            if name in task_vars and key not in ("lock_wait",):
                old[key] = self._templar.template(task_vars[name])
        return old

    def _step(self, state, call, task_vars):
        """Run one call the ladder named; the new state."""
        do = call["do"]
        t0 = time.time()
        if do in ("diagnose", "verify"):
            res = self._module(call["module"], call["args"], task_vars, call["timeout_s"])
            state = ladder.step(state, call["event"], result=res, t1=time.time())
            if do == "verify":
                self._say(state.get("verified_lines") or [])
            return state
        if do == "act":
            state = ladder.step(state, "acting", t0=t0)
            self._write_report(self._report(state, finished=False))
            res = self._module(call["module"], call["args"], task_vars, call["timeout_s"])
            self._changed |= bool(res.get("changed"))
            state = ladder.step(state, "acted", result=res, t0=t0, t1=time.time())
            self._write_report(self._report(state, finished=False))
            if res.get("failed"):
                self._say(["Rung %d (%s) failed: %s" % (call["rung"], call["args"]["action"], res.get("msg"))])
            daemons = (res.get("planned") or {}).get("stop_host_daemons") or []
            if daemons:
                self._say(["Host daemons stopped for the reset and started again: %s" % daemons])
            return state
        if do == "record_baseline":
            res = self._module(call["module"], call["args"], task_vars, call["timeout_s"])
            if res.get("failed"):
                return ladder.step(state, "interrupted", result={"task": "Record the baseline at idle",
                                                                 "msg": res.get("msg") or "failed"})
            self._changed |= bool(res.get("changed"))
            return ladder.step(state, "step", name="record_baseline", t0=t0, t1=time.time(),
                               result={"baseline": res.get("baseline"), "path": res.get("path")})
        if do == "start_container":
            state = ladder.step(state, "acting", t0=t0, name="start_container")
            self._write_report(self._report(state, finished=False))
            res = self._command([TIMEOUT_BIN, str(ladder.START_CONTAINER_TIMEOUT_S), PCT, "start", str(state["vmid"])],
                                task_vars, call["timeout_s"] + 10)
            rc = res.get("rc")
            self._changed |= rc == 0
            return ladder.step(state, "step", name="start_container", t0=t0, t1=time.time(),
                               result={"start": {"rc": rc, "output": (to_text(res.get("stdout") or "")
                                                                      + to_text(res.get("stderr") or ""))[-300:]}})
        if do == "reboot":
            after = state.get("after") or {}
            self._say(["%s needs a reboot: no lower rung can clear CT %s." % (self._host, state["vmid"]),
                       "Why: %s" % (after.get("rung_reason") or ""), "Evidence: %s" % (after.get("reasons") or []),
                       "Rebooting now (gpu_recover_allow_reboot=true)." if call["allowed"] else
                       "Not rebooting: set recover_allow_reboot=true (gpu_recover_allow_reboot) to let the playbook "
                       "reboot the node."])
            if call["allowed"]:
                state = ladder.step(state, "acting", t0=t0, name="reboot")
                self._write_report(self._report(state, finished=False))
                res = self._reboot(call["reboot_timeout_s"], state["vmid"], task_vars)
                if res.get("failed"):
                    return ladder.step(state, "interrupted", result={"task": "Rung 6, reboot the node",
                                                                     "msg": res.get("msg") or "failed"})
                self._changed = True
                # The node's lock lived in /run: take it again before the verification.
                self._lock = self._acquire(state, task_vars)
            return ladder.step(state, "reboot", t0=t0, t1=time.time())
        raise AnsibleError("gpu_recover_ladder: unknown step %r" % (do,))

    def _reboot(self, timeout_s, vmid, task_vars):
        task = self._task.copy()
        task.args = {"reboot_timeout": int(timeout_s),
                     "msg": "inferops gpu_recover: GPUs of CT %s could not be recovered without a reboot" % vmid}
        reboot = self._shared_loader_obj.action_loader.get(
            "ansible.legacy.reboot", task=task, connection=self._connection, play_context=self._play_context,
            loader=self._loader, templar=self._templar, shared_loader_obj=self._shared_loader_obj)
        return reboot.run(task_vars=task_vars)

    def _left(self, state, task_vars):
        """What the run leaves, read from the world unless the last diagnosis read it and nothing acted since."""
        if state.get("left_seen"):
            return ladder.step(state, "left")
        read = {}
        vmid = str(state["vmid"])
        for key, argv in (("pct_status", [TIMEOUT_BIN, "30", PCT, "status", vmid]),
                          ("service_show", [TIMEOUT_BIN, "30", PCT, "exec", vmid, "--", "systemctl", "show",
                                            "--property=UnitFileState", "--property=ActiveState",
                                            state["inputs"]["service"]])):
            try:
                res = self._command(argv, task_vars, 40)
                read[key] = {"rc": res.get("rc"), "stdout": to_text(res.get("stdout") or "")}
            except (AnsibleError, StepTimeout) as exc:
                read[key] = {"rc": None, "stdout": "", "error": to_text(exc)}
        return ladder.step(state, "left", result=read)

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        task_vars = task_vars or {}
        args = self._task.args
        self._host = task_vars.get("inventory_hostname")
        self._check = bool(self._task.check_mode)
        self._changed = False
        self._lines = []
        self._lock = None
        self._notes = {}
        self._playbook = to_text(task_vars.get("ansible_play_name") or "")
        # The controller (user, host, boot) and this run's ansible-playbook process (the worker's parent), recorded with
        # the lock so that a later run on this controller can tell this one is gone.
        self._controller = rl.controller_id()
        self._run_pid = os.getppid()
        self._run_ticks = rl.start_ticks(self._run_pid)
        vmid = args.get("vmid")
        report_dir = to_text(args.get("report_dir") or "")
        if not report_dir:
            return dict(result, failed=True, msg="gpu_recover_ladder: report_dir is required")
        try:
            state = self._start(args, task_vars)
        except ladder.LadderError as exc:
            return dict(result, failed=True, msg="gpu_recover: %s" % exc)
        vmid = state["vmid"]
        self._report_path = os.path.join(report_dir, self._host, "recover-%d%s.json" % (
            vmid, "-check" if self._check else ""))
        metrics_dir = to_text(args.get("metrics_dir") or "")
        self._metrics_path = (os.path.join(metrics_dir, "inferops_recover_%d.prom" % vmid)
                              if metrics_dir and not self._check else "")

        # Rung 0, read-only: a container it refuses (not declared, not ours) ends the run here, nothing written.
        fresh = state  # for a diagnosis again, after another run's ladder
        call, state = ladder.next_call(state)
        res = self._module(call["module"], call["args"], task_vars, call["timeout_s"])
        if res.get("failed"):
            return dict(result, failed=True, msg=res.get("msg") or "the diagnosis of CT %d failed" % vmid,
                        diagnosis=res)
        state = ladder.step(state, "diagnosed", result=res)
        self._rung0_lines(state, res)

        if self._check:
            return self._check_plan(result, state, task_vars)

        if state["climb"] or state["record_baseline_now"] or state["reboot_now"]:
            # Refused (another run holds the container's ladder past the wait): nothing written, nothing changed.
            try:
                self._lock = self._acquire(state, task_vars)
            except (AnsibleError, StepTimeout) as exc:
                return dict(result, failed=True, msg=to_text(exc), refused=True)
        built = None
        try:
            if self._lock:
                if self._lock.get("contended"):
                    # Another run climbed this container's ladder meanwhile: what it left is diagnosed again.
                    self._say(["Waited %.0f s for the node's lock (%s); diagnosing again."
                               % (self._lock.get("waited_s") or 0, self._lock.get("waited_for") or "released")])
                    state = fresh
                    call, state = ladder.next_call(state)
                    res = self._module(call["module"], call["args"], task_vars, call["timeout_s"])
                    if res.get("failed"):
                        state = ladder.step(state, "diagnosed", result=res)
                        state = ladder.step(state, "interrupted", result={"task": "Rung 0, diagnose again",
                                                                          "msg": res.get("msg") or "failed"})
                    else:
                        state = ladder.step(state, "diagnosed", result=res)
                        self._rung0_lines(state, res)
            while True:
                call, state = ladder.next_call(state)
                if call["do"] == "done":
                    break
                try:
                    state = self._step(state, call, task_vars)
                except (AnsibleError, StepTimeout) as exc:
                    state = ladder.step(state, "interrupted", result={"task": call["do"], "msg": to_text(exc)})
            state = self._left(state, task_vars)
            built = self._report(state, finished=True)
            self._write_report(built)
        finally:
            # Whatever happened, the lock is released (and the metrics written when the report can be built).
            if built is None:
                try:
                    built = self._report(state, finished=False)
                except Exception as exc:  # pylint: disable=broad-except
                    self._display.warning("CT %s: the report could not be built: %s" % (vmid, exc))
                    built = {"report": {"vmid": vmid}, "unbuilt": True}
            self._release(self._lock, built, task_vars)
        return self._result(result, state, built)

    def _rung0_lines(self, state, diag):
        self._say([diag.get("verdict"), diag.get("summary"),
                   "Already clean: nothing to do, nothing changed." if state["clean"] else
                   "Next: rung %s (%s): %s" % (state["next"], state["rung_name"], diag.get("rung_reason") or "")]
                  + list(diag.get("notes") or []))

    def _check_plan(self, result, state, task_vars):
        """Check mode: nothing changes; the ladder it would climb, and what the first acting rung would touch."""
        planned = None
        if not state["clean"]:
            after = state.get("after") or {}
            self._say(["Not clean: %s" % (after.get("reasons") or []),
                       ("Would start at rung %s (%s): %s" % (state["next"], state["rung_name"], after.get("rung_reason")))
                       if state["next"] > 0 else "No rung to climb: %s" % after.get("rung_reason"),
                       ("Then, while not clean, each later rung the new diagnosis asks for: "
                        + " -> ".join(state["ladder_ahead"])) if state["next"] > 0 else
                       ("With recover_record_baseline it would record the baseline at idle."
                        if state["settings"]["record_baseline"] else ""),
                       "Budgets (s): %s; reboot %s" % (state["budgets"], "allowed" if state["settings"]["allow_reboot"]
                                                       else "reported only")])
            if state["climb"]:
                call = ladder.next_call(state)[0]
                res = self._module(call["module"], call["args"], task_vars, call["timeout_s"])
                self._changed |= bool(res.get("changed"))
                planned = res.get("planned")
        state = self._left(state, task_vars)
        built = self._report(state, finished=True)
        self._write_report(built)
        out = self._result(result, state, built)
        out["planned"] = planned
        return out

    def _result(self, result, state, built):
        report = built["report"]
        fail_msg = None
        if state.get("daemons_down"):
            fail_msg = ("%s was stopped for the GPU reset and could not be started again on %s: start it by hand "
                        "(systemctl start nvidia-persistenced) before using the GPUs."
                        % (", ".join(state["daemons_down"]), self._host))
        elif state.get("interrupted") is not None:
            fail_msg = ("The ladder for CT %d on %s stopped before its end (%s). Left: %s Restore: %s" % (
                state["vmid"], self._host, report["interrupted"]["summary"], report["left"]["summary"],
                "; then ".join(report["left"]["restore"])))
        elif not state["clean"] and not self._check and self._task.args.get("fail_when_not_clean", True):
            fail_msg = "Not clean: CT %d on %s %s%s" % (state["vmid"], self._host, "(the node needs a reboot) "
                                                        if state.get("reboot_needed") else "",
                                                        (state.get("after") or {}).get("reasons") or [])
        for key, notes in self._notes.items():
            if notes:
                result[key] = list(result.get(key) or []) + notes
        return dict(result, changed=self._changed, report=report, artifact=built["artifact"],
                    lines=self._lines + built["summary_lines"], clean=bool(state["clean"]), fail_msg=fail_msg,
                    lock=self._lock)
