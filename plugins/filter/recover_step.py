# -*- coding: utf-8 -*-
# Copyright: inferops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
name: recover_step
short_description: The gpu_recover role's one state, stepped with what happened
version_added: "0.1.0"
author: inferops contributors
description:
  - Used by the P(inferops.gpu_inference.gpu_recover#role) role. The role keeps one dict; this filter makes it
    (O(event=start)) and steps it with the first diagnosis, each rung's action, each verification, the record of the
    baseline and the container's start; C(acting) marks a rung or step about to act (the report written next says so,
    in case the run stops there), C(interrupted) a ladder that failed (the failed task and message), C(left) the end's
    read of the container and its service. The new state says what the role does next (C(climb) with C(next) and
    C(rung_name), C(record_baseline_now), C(restore_container), C(reboot_now)), the budgets of each rung
    (C(budgets)), the next action's task timeout (C(action_timeout_s)) and the record of every rung (C(rungs)),
    which P(inferops.gpu_inference.recover_report#filter) turns into the report.
  - Raises an error that names the bad value (a setting that is not a number of seconds, an unknown event).
options:
  _input:
    description: The state (for O(event=start), a dict with C(vmid), C(node), C(started_at), C(t_start),
      C(pct_status) (the output of C(pct status)) and C(settings) (the role's gpu_recover_* settings, without the prefix)).
    type: dict
    required: true
  event:
    description: What happened.
    type: str
    choices: [start, diagnosed, acting, acted, step, reboot, verified, interrupted, left]
    required: true
  result:
    description: The module result of that event (gpu_diagnose, gpu_recover_action, gpu_baseline, or a dict).
    type: dict
  t0:
    description: When the action or step started (seconds since the epoch).
    type: float
  t1:
    description: When it ended (for O(event=verified), when the verification ended).
    type: float
  name:
    description: >-
      The step's name for O(event=step) (C(record_baseline), C(start_container)) and O(event=acting) (also
      C(reboot); none: the rung the state names).
    type: str
"""

EXAMPLES = r"""
- name: Keep what rung 2 did
  ansible.builtin.set_fact:
    __gpu_recover: "{{ __gpu_recover | inferops.gpu_inference.recover_step('acted', result=_kill, t0=_t0, t1=now().timestamp()) }}"
"""

RETURN = r"""
_value:
  description: The new state (vmid, node, clean, next, rung_name, climb, record_baseline_now, restore_container,
    reboot_now, ignore_baseline, budgets, action_timeout_s, pending, rungs, before, after, ct_was_running,
    ct_stopped_by_us, reboot_needed, baseline_recorded, daemons_down, settings, in_progress, interrupted, left_read).
  type: dict
"""

from collections.abc import Mapping

from ansible.errors import AnsibleFilterError

from ansible_collections.inferops.gpu_inference.plugins.module_utils.recover.recover_ladder import LadderError, start, step


def recover_step(state, event, result=None, t0=None, t1=None, name=None):
    """Return the gpu_recover state after ``event``."""
    if not isinstance(state, Mapping):
        raise AnsibleFilterError("recover_step: the input must be the recover state (a dict), got %s" % type(state).__name__)
    try:
        if event == "start":
            return start(state.get("vmid"), state.get("node"), state.get("started_at"), state.get("t_start"),
                         state.get("pct_status") or "", state.get("settings") or {})
        return step(state, event, result=result, t0=t0, t1=t1, name=name)
    except (LadderError, KeyError, TypeError, ValueError) as exc:
        raise AnsibleFilterError("recover_step(%s): %s" % (event, exc), orig_exc=exc) from exc


class FilterModule(object):
    def filters(self):
        return {"recover_step": recover_step}
