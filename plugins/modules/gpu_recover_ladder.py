#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: inferops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# The work is done by the action plugin of the same name (plugins/action/gpu_recover_ladder.py) on the controller.
from __future__ import annotations

DOCUMENTATION = r"""
module: gpu_recover_ladder
short_description: Climb one container's recovery ladder in one task, from the Proxmox VE node
version_added: "0.1.0"
author:
  - inferops team (@inferops)
description:
  - The ladder of the P(inferops.gpu_inference.gpu_recover#role) role in one task, the way C(ansible.builtin.reboot)
    waits inside one task. Rung 0 diagnoses (M(inferops.gpu_inference.gpu_diagnose)); while the diagnosis is Not
    clean, the rung it asks for acts (M(inferops.gpu_inference.gpu_recover_action)) and a polling verification
    follows, each with its budget (module_utils C(recover_ladder.budgets)); then, as the state says, the baseline is
    recorded at idle (M(inferops.gpu_inference.gpu_baseline)), the container started again, rung 6 reported or
    performed. Every step is decided in Python (module_utils C(recover_ladder.next_call) and C(step), from
    C(recover_gate)'s verdicts); this action only runs what they name.
  - While it acts it holds the node's lock on the container's ladder (M(inferops.gpu_inference.gpu_recover_lock)),
    and a second run waits up to C(lock_wait_s) of O(seconds), then diagnoses again, or refuses, naming the run that holds it.
    A container that is clean at rung 0 takes no lock and is not changed.
  - The JSON report is written on the controller under O(report_dir) before and after each action and at the end;
    the metrics file on the node when the lock is taken and when it is released.
  - Used by the role P(inferops.gpu_inference.gpu_recover#role); not meant to be called by playbooks directly.
options:
  vmid:
    description: The container.
    type: int
    required: true
  service:
    description: The inference server's systemd unit inside the container.
    type: str
    default: sglang.service
  pct_status:
    description: The output of C(pct status) before the run (whether the container ran, for starting it again).
    type: str
    default: ""
  declared:
    description: The GPU containers the inventory declares (gpu_diagnose's O(inferops.gpu_inference.gpu_diagnose#module:declared)).
    type: list
    elements: dict
    default: []
  allow_undeclared:
    description: Recover a container the inventory does not declare on this node.
    type: bool
    default: false
  baseline_dir:
    description: Where deploy records the baseline on the node.
    type: str
    default: /var/lib/inferops/baseline
  report_dir:
    description: Controller directory of the reports (<dir>/<inventory_hostname>/recover-<vmid>.json).
    type: str
    required: true
  metrics_dir:
    description: node_exporter's textfile collector directory on the node; empty writes no metrics.
    type: str
    default: ""
  samples:
    description: Samples of the rung-0 diagnosis.
    type: int
    default: 2
  tolerances:
    description: The clean gate's tolerances, gpu_diagnose's options of the same names.
    type: dict
    default: {}
  seconds:
    description:
      - The role's settings in seconds, by their names without the C(gpu_recover_) prefix (C(term_grace_s), ...).
      - The role's deprecated names without C(_s) (C(gpu_recover_term_grace), ...) are read from the host's variables
        and still win for one release, with a deprecation warning.
    type: dict
    default: {}
  record_baseline:
    description: Judge without the baseline on disk and record it again at idle once everything else is clean.
    type: bool
    default: false
  start_container:
    description: Start the container again after rung 4 or 5, if it was running.
    type: bool
    default: true
  allow_reboot:
    description: Let rung 6 reboot the node (through C(ansible.builtin.reboot)).
    type: bool
    default: false
  stop_host_daemons:
    description: Let rung 5 stop a host nvidia-persistenced that holds the GPUs, and start it again.
    type: bool
    default: true
  fail_when_not_clean:
    description: Whether a final Not clean sets RV(fail_msg).
    type: bool
    default: true
extends_documentation_fragment:
  - inferops.gpu_inference.attributes
attributes:
  check_mode:
    support: full
    details: Diagnoses, and lets the first acting rung say what it would touch (its module in check mode); no lock,
      no metrics, the report as recover-<vmid>-check.json.
  diff_mode:
    support: none
seealso:
  - module: inferops.gpu_inference.gpu_diagnose
  - module: inferops.gpu_inference.gpu_recover_action
  - module: inferops.gpu_inference.gpu_recover_lock
"""

EXAMPLES = r"""
- name: The ladder of CT 129
  inferops.gpu_inference.gpu_recover_ladder:
    vmid: 129
    report_dir: /var/log/inferops
    seconds: {term_grace_s: 10, lock_wait_s: 300}
  register: __gpu_recover_result
"""

RETURN = r"""
report:
  description: The run's report (module_utils C(recover_ladder.build)), as written to disk.
  type: dict
  returned: success
artifact:
  description: The AWX workflow artifact (the report's summary and the report bounded to 16 KiB of JSON).
  type: dict
  returned: success
lines:
  description: What the run says, in order (each diagnosis and verification, the plan in check mode, the verdict).
  type: list
  elements: str
  returned: success
clean:
  description: Whether the last verdict is Clean.
  type: bool
  returned: success
fail_msg:
  description: Why the role fails the run (a host daemon not started again, a ladder stopped part way, Not clean), or null.
  type: str
  returned: success
lock:
  description: The node's lock on the ladder (path, holder_pid, holder_start_ticks, waited_s, waited_for), null when none was taken.
  type: dict
  returned: success
planned:
  description: In check mode, what the first acting rung would touch.
  type: dict
  returned: check mode
refused:
  description: The node's lock stayed held by another run past the wait (the message names it).
  type: bool
  returned: failure
"""
