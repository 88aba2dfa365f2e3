# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The ladder's action plugin, run: ActionModule.run with a node that answers each module call from a script.

Nothing of the plugin or of the decisions it follows (recover_ladder.next_call/step, recover_gate's budgets) is
stubbed: only _execute_module, the node. Each test reads what the run left on the controller (the report file, also
as it stood while an action ran) and the calls the node received, with their options.
"""
from __future__ import annotations

import json
import os
from unittest import mock

import pytest

from ansible.errors import AnsibleConnectionFailure

from ansible_collections.inferops.gpu_inference.plugins.action import gpu_recover_ladder as plugin
from ansible_collections.inferops.gpu_inference.plugins.module_utils.recover import recover_ladder as ladder
from ansible_collections.inferops.gpu_inference.plugins.module_utils.recover import recover_lock as rl

DIAG = "inferops.gpu_inference.gpu_diagnose"
ACT = "inferops.gpu_inference.gpu_recover_action"
LOCK = "inferops.gpu_inference.gpu_recover_lock"
CMD = "ansible.legacy.command"
VMID = 129


def role_args(report_dir, **over):
    args = {"vmid": VMID, "service": "sglang.service", "pct_status": "status: running\n",
            "declared": [{"host": "ct129", "vmid": VMID, "node_host": "pve1", "adopt": False}],
            "allow_undeclared": False, "baseline_dir": "/var/lib/inferops/baseline", "report_dir": str(report_dir),
            "metrics_dir": "/var/lib/prometheus/node-exporter", "samples": 2,
            "tolerances": {"gpu_memory_tolerance_mib": 16, "mem_available_tolerance_bytes": None},
            "seconds": {k + "_s": v for k, v in ladder.DEFAULT_SECONDS.items()},
            "record_baseline": False, "start_container": True, "allow_reboot": False, "stop_host_daemons": True,
            "fail_when_not_clean": True}
    args.update(over)
    return args


def diag(clean, rung, gpus=(0, 1), **extra):
    out = {"changed": False, "clean": clean, "verdict": "Clean" if clean else "Not clean", "recommended_rung": rung,
           "rung_reason": "why %d" % rung, "reasons": [] if clean else ["GPU 0 holds 900 MiB"], "summary": "s",
           "notes": [], "node_time": 1000.0, "kernel_cursor": 7, "findings": {},
           "evidence": {"container": {"status": "running", "gpus": list(gpus)},
                        "service": {"checked": True, "unit_file_state": "disabled", "active_state": "inactive"}}}
    out.update(extra)
    return out


class Node:
    """Answers each module call with the next scripted answer for that module; records every call."""

    def __init__(self, answers, report_path=None):
        self.answers = {k: list(v) for k, v in answers.items()}
        self.calls = []
        self.report_path = report_path
        self.report_during = {}

    def __call__(self, module_name=None, module_args=None, task_vars=None, **kwargs):
        self.calls.append((module_name, dict(module_args or {})))
        if module_name == ACT and self.report_path:
            with open(self.report_path) as handle:
                self.report_during[module_args["action"]] = json.load(handle)
        answer = self.answers[module_name].pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer(module_args) if callable(answer) else answer

    def modules(self):
        return [(m, a.get("state") or a.get("action") or a.get("after_rung")) for m, a in self.calls]


class Shown:
    def __init__(self):
        self.deprecations, self.warnings, self.lines = [], [], []

    def deprecated(self, msg, **kwargs):
        self.deprecations.append(msg)

    def warning(self, msg, **kwargs):
        self.warnings.append(msg)

    def v(self, msg, **kwargs):
        self.lines.append(msg)

    display = vvv = v


def run_plugin(args, node, check=False, task_vars=None):
    task = mock.MagicMock()
    task.args = args
    task.check_mode = check
    task.async_val = 0
    templar = mock.MagicMock()
    templar.template.side_effect = lambda value: value
    am = plugin.ActionModule(task, mock.MagicMock(), mock.MagicMock(), None, templar, None)
    am._execute_module = node
    am._display = Shown()
    out = am.run(task_vars=dict({"inventory_hostname": "pve1", "ansible_play_name": "Recover"}, **(task_vars or {})))
    return out, am._display


LOCKED = {"changed": False, "path": "/run/inferops/locks/recover-ct-129.lock", "holder_pid": 4242,
          "holder_start_ticks": 99, "waited_s": 0.0, "waited_for": None}
RELEASED = {"changed": False, "released": True}


def report_of(tmp_path, suffix=""):
    with open(os.path.join(str(tmp_path), "pve1", "recover-%d%s.json" % (VMID, suffix))) as handle:
        return json.load(handle)


def test_a_clean_container_takes_no_lock_and_changes_nothing(tmp_path):
    node = Node({DIAG: [diag(True, 0)], LOCK: [RELEASED]})
    out = run_plugin(role_args(tmp_path), node)[0]
    assert node.modules() == [(DIAG, None), (LOCK, "released")]
    # The release writes the metrics only: no holder was taken.
    assert "holder_pid" not in node.calls[1][1] and "inferops_recover_last_clean" in node.calls[1][1]["metrics_text"]
    assert out["changed"] is False and out["clean"] is True and out["fail_msg"] is None and out["lock"] is None
    assert report_of(tmp_path)["verdict"] == "Clean" and report_of(tmp_path)["cleared_by_rung"] == 0
    assert "Already clean: nothing to do, nothing changed." in out["lines"]


def test_rung_1_acts_once_under_the_lock_with_its_options_and_the_report_says_so_while_it_runs(tmp_path):
    path = os.path.join(str(tmp_path), "pve1", "recover-%d.json" % VMID)
    node = Node({DIAG: [diag(False, 1), diag(True, 0)], LOCK: [LOCKED, RELEASED],
                 ACT: [{"changed": True, "commands": [], "started_at": 1001.0, "planned": {}}]}, path)
    out = run_plugin(role_args(tmp_path), node)[0]
    assert node.modules() == [(DIAG, None), (LOCK, "acquired"), (ACT, "stop_service"), (DIAG, 1), (LOCK, "released")]
    acquire = node.calls[1][1]
    # Not contended: one call, no wait; the record names this run's ansible-playbook process (the worker's parent).
    assert acquire["wait_s"] == 0 and acquire["run_pid"] == os.getppid() and acquire["lease_s"] == ladder.lease_s(ladder.start(
        VMID, "pve1", "", 0, "", dict(ladder.DEFAULT_SECONDS, record_baseline=False,
                                      start_container=True, allow_reboot=False), {"samples": 2}))
    # The in-progress metrics go with the lock, the final ones with its release, to the holder it named.
    assert acquire["metrics_text"].strip().endswith("1") and "in_progress" in acquire["metrics_text"]
    release = node.calls[-1][1]
    assert (release["holder_pid"], release["holder_start_ticks"]) == (4242, 99)
    act = node.calls[2][1]
    assert act["service_stop_timeout"] == 90 and act["gpus"] == [0, 1] and act["reset_lock_wait"] == 180
    verify = node.calls[3][1]
    assert verify["after_rung"] == 1 and verify["poll_budget"] == 60 and verify["rung_started_at"] == 1001.0
    assert verify["kernel_since_seq"] == 7 and "mem_available_tolerance_bytes" not in verify
    during = node.report_during["stop_service"]
    assert during["finished"] is False and during["interrupted"]["rung"] == 1
    final = report_of(tmp_path)
    assert final["finished"] is True and final["verdict"] == "Clean" and final["cleared_by_rung"] == 1
    assert [r["rung"] for r in final["rungs"]] == [1] and final["left"]["read"] is True
    assert out["changed"] is True and out["fail_msg"] is None


OTHER = {"pid": 77, "start_ticks": 5, "controller": "ops@laptop boot x", "run_pid": 1234, "run_start_ticks": 9}


def refused(holder=None):
    return {"failed": True, "refused": True, "holder": holder or OTHER,
            "msg": "Another recover run holds the ladder of CT 129 on this node: "
                   "/run/inferops/locks/recover-ct-129.lock is held by pid 77 (recover ladder of CT 129, playbook Recover)"}


def test_a_lock_held_by_another_run_refuses_saying_who_and_writes_nothing(tmp_path):
    node = Node({DIAG: [diag(False, 2)], LOCK: [refused(), refused()]})
    out = run_plugin(role_args(tmp_path), node)[0]
    assert out["failed"] is True and out["refused"] is True and "held by pid 77" in out["msg"]
    # A try, then the wait of gpu_recover_lock_wait_s; nothing acted, nothing written.
    assert node.modules() == [(DIAG, None), (LOCK, "acquired"), (LOCK, "acquired")]
    assert [a["wait_s"] for _m, a in node.calls[1:]] == [0, 300] and "break_pid" not in node.calls[2][1]
    assert not os.path.exists(os.path.join(str(tmp_path), "pve1"))


def test_a_run_that_waited_diagnoses_again_and_finds_what_the_other_left(tmp_path):
    waited = dict(LOCKED, waited_s=12.5, waited_for="held by pid 77")
    node = Node({DIAG: [diag(False, 2), diag(True, 0)], LOCK: [refused(), waited, RELEASED]})
    out, shown = run_plugin(role_args(tmp_path), node)
    assert node.modules() == [(DIAG, None), (LOCK, "acquired"), (LOCK, "acquired"), (DIAG, None), (LOCK, "released")]
    assert out["changed"] is False and out["clean"] is True and report_of(tmp_path)["rungs"] == []
    assert any("Waited 12 s" in line for line in out["lines"])


def test_the_holder_of_a_run_gone_from_this_controller_is_ended_and_the_lock_taken(tmp_path):
    # A run of this controller that was killed: its ansible-playbook pid is no live process here.
    gone = dict(OTHER, controller=rl.controller_id(), run_pid=2 ** 22 + 7, run_start_ticks=1)
    node = Node({DIAG: [diag(False, 1), diag(False, 1), diag(True, 0)], LOCK: [refused(gone), LOCKED, RELEASED],
                 ACT: [{"changed": True, "commands": [], "started_at": 1001.0, "planned": {}}]})
    out = run_plugin(role_args(tmp_path), node)[0]
    assert (node.calls[2][1]["break_pid"], node.calls[2][1]["break_start_ticks"]) == (77, 5)
    assert node.modules()[3:] == [(DIAG, None), (ACT, "stop_service"), (DIAG, 1), (LOCK, "released")]
    assert out["clean"] is True and out["fail_msg"] is None


def test_the_deprecated_name_is_used_with_a_warning_naming_the_new_one(tmp_path):
    node = Node({DIAG: [diag(False, 2), diag(True, 0)], LOCK: [LOCKED, RELEASED],
                 ACT: [{"changed": True, "commands": [], "started_at": 1001.0, "planned": {}}]})
    out, shown = run_plugin(role_args(tmp_path), node, task_vars={"gpu_recover_term_grace": 3})
    assert node.calls[2][1]["action"] == "kill_holders" and node.calls[2][1]["term_grace"] == 3
    assert shown.deprecations == ["gpu_recover_term_grace is deprecated and will be removed in the next release: use "
                                  "gpu_recover_term_grace_s (seconds)"]


def test_both_names_set_differently_is_an_error_before_anything_runs(tmp_path):
    node = Node({})
    seconds = dict(role_args(tmp_path)["seconds"], term_grace_s=20)
    out = run_plugin(role_args(tmp_path, seconds=seconds), node, task_vars={"gpu_recover_term_grace": 3})[0]
    assert out["failed"] is True and "set only gpu_recover_term_grace_s" in out["msg"] and node.calls == []


def test_check_mode_plans_the_first_rung_takes_no_lock_and_writes_the_check_report(tmp_path):
    node = Node({DIAG: [diag(False, 1)],
                 ACT: [{"changed": True, "planned": {"commands": ["systemctl disable --now -- sglang.service"]}}]})
    out = run_plugin(role_args(tmp_path), node, check=True)[0]
    assert node.modules() == [(DIAG, None), (ACT, "stop_service")]
    assert out["changed"] is True and out["planned"] == {"commands": ["systemctl disable --now -- sglang.service"]}
    assert any(line.startswith("Would start at rung 1 (stop_service)") for line in out["lines"])
    assert report_of(tmp_path, "-check")["check_mode"] is True and out["fail_msg"] is None


def test_a_connection_lost_during_an_action_leaves_an_interrupted_report_and_releases_the_lock(tmp_path):
    node = Node({DIAG: [diag(False, 4)], LOCK: [LOCKED, RELEASED],
                 ACT: [AnsibleConnectionFailure("ssh: connection reset")],
                 CMD: [{"rc": 0, "stdout": "status: stopped\n"}, {"rc": 255, "stdout": ""}]})
    out = run_plugin(role_args(tmp_path), node)[0]
    assert node.modules()[-1] == (LOCK, "released") and node.calls[-1][1]["holder_pid"] == 4242
    final = report_of(tmp_path)
    assert final["verdict"] == "Not clean" and final["interrupted"]["msg"].endswith("ssh: connection reset")
    assert final["left"]["container"] == "stopped"
    assert "stopped before its end" in out["fail_msg"]


def test_rungs_climb_up_to_the_reset_and_the_container_is_started_again(tmp_path):
    node = Node({DIAG: [diag(False, 4), diag(False, 5, evidence={"container": {"status": "stopped", "gpus": [0, 1]}}),
                        diag(True, 0, evidence={"container": {"status": "stopped", "gpus": [0, 1]}}), diag(True, 0)],
                 LOCK: [LOCKED, RELEASED],
                 ACT: [{"changed": True, "container_was_running": True, "commands": [], "started_at": 1.0},
                       {"changed": True, "commands": [], "started_at": 2.0, "reset": [{"gpus": [0], "ok": True}]}],
                 CMD: [{"rc": 0, "stdout": "", "stderr": ""}]})
    out = run_plugin(role_args(tmp_path), node)[0]
    assert node.modules() == [(DIAG, None), (LOCK, "acquired"), (ACT, "stop_container"), (DIAG, 4),
                              (ACT, "reset_gpus"), (DIAG, 5), (CMD, None), (DIAG, 5), (LOCK, "released")]
    assert node.calls[6][1]["argv"][-2:] == ["start", str(VMID)]
    final = report_of(tmp_path)
    assert [(r["rung"], r["name"]) for r in final["rungs"]] == [(4, "stop_container"), (5, "reset_gpus"),
                                                                (5, "start_container")]
    assert final["verdict"] == "Clean" and final["cleared_by_rung"] == 5


@pytest.mark.parametrize("bad, message", [
    ({"seconds": {"term_grace_s": "ten"}}, "gpu_recover_term_grace_s must be a number of seconds"),
    ({"samples": 0}, "gpu_recover_samples must be 1 or more"),
])
def test_bad_settings_are_refused_before_any_call(tmp_path, bad, message):
    node = Node({})
    out = run_plugin(role_args(tmp_path, **bad), node)[0]
    assert out["failed"] is True and message in out["msg"] and node.calls == []
