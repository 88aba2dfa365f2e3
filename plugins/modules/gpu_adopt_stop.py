#!/usr/bin/python
# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpu_adopt_stop
short_description: Stop the SGLang a person started by hand in a container being taken over, with consent
version_added: 0.1.0
author:
  - inferops team (@inferops)
description:
  - Runs on the Proxmox VE node, as root, in the take-over's consented window (C(pve_gpu_container_adopt_interrupt)).
  - Signals each launcher M(inferops.gpu_inference.gpu_adopt_report) found, only if it is still the same process (its
    start time) in the same container, with its descendants (the ranks), by process group where every member of the
    group is in the container (the recovery ladder's scoped signal, C(plugins/module_utils/recover/recover_signals.py)) -
    SIGTERM, up to O(timeout_s) for SGLang to drain and exit, then SIGKILL.
  - A process that outlives SIGKILL (a task stuck in the driver or on FUSE) is named in RV(survived). With
    O(fail_on_survivors) (the default) the module then fails; the role sets it false and climbs the recovery
    ladder (role C(gpu_recover)) scoped to the container, inside the same window.
options:
  vmid:
    description: The container.
    type: int
    required: true
  servers:
    description: The launchers to stop (C(hand_run_servers) of gpu_adopt_report), each C({pid, starttime}).
    type: list
    elements: dict
    required: true
  timeout_s:
    description: Seconds after SIGTERM before SIGKILL.
    type: int
    default: 120
  fail_on_survivors:
    description:
      - Fail when a targeted process is still there C(15) s after SIGKILL. False returns them in RV(survived), for the
        caller to take the recovery ladder's next rungs.
    type: bool
    default: true
extends_documentation_fragment:
  - inferops.gpu_inference.attributes
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
"""

EXAMPLES = r"""
- name: Stop the hand-run server in the consented window
  inferops.gpu_inference.gpu_adopt_stop:
    vmid: 129
    servers: "{{ adoption.hand_run_servers }}"
"""

RETURN = r"""
signalled:
  description: The process groups and PIDs sent SIGTERM (and SIGKILL when it was needed).
  type: dict
  returned: always
stopped_after_s:
  description: Seconds from SIGTERM until every targeted process had exited.
  type: float
  returned: when it stopped
killed:
  description: Whether SIGKILL was needed.
  type: bool
  returned: always
left_ct_pids:
  description: PIDs inside the container of the server's processes still running (in check mode, all of them).
  type: list
  elements: int
  returned: always
survived:
  description: Host PIDs of the targeted processes still there 15 s after SIGKILL (stuck in the driver or on FUSE).
  type: list
  elements: int
  returned: always
skipped:
  description: Launchers not signalled (exited, or another process now), with why.
  type: list
  elements: str
  returned: always
"""

import signal
import time

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.inferops.gpu_inference.plugins.module_utils.deploy import adopt
from ansible_collections.inferops.gpu_inference.plugins.module_utils.recover.recover_procs import is_alive, scan_processes
from ansible_collections.inferops.gpu_inference.plugins.module_utils.recover.recover_signals import (
    pids_to_signal,
    send_signal,
    wait_until,
)

_KILL_WAIT_S = 15


def main():
    module = AnsibleModule(
        argument_spec=dict(
            vmid=dict(type="int", required=True),
            servers=dict(type="list", elements="dict", required=True),
            timeout_s=dict(type="int", default=120),
            fail_on_survivors=dict(type="bool", default=True),
        ),
        supports_check_mode=True,
    )
    p = module.params
    vmid = p["vmid"]
    scan = scan_processes(vmid)
    chosen = adopt.stop_targets(p["servers"], scan["container"], vmid)
    targets = chosen["targets"]
    result = {"changed": False, "signalled": {}, "killed": False, "skipped": chosen["skipped"],
              "targets": [int(t["pid"]) for t in targets], "left_ct_pids": [], "survived": []}
    if not targets or module.check_mode:
        result["changed"] = bool(targets)
        result["left_ct_pids"] = [int(t["nspid"][-1]) for t in targets if t.get("nspid")]
        module.exit_json(**result)
    init = [q for q in scan["container"] if q.get("nspid") and q["nspid"][-1] == 1]
    plan = pids_to_signal(targets, scan["all"], vmid, int(init[0]["pid"]) if init else None,
                          by_group=adopt.whole_groups(targets, scan["all"]))

    def gone():
        return not any(is_alive(int(t["pid"]), t["starttime"]) for t in targets)

    started = time.monotonic()
    result["changed"] = True
    result["signalled"]["SIGTERM"] = send_signal(plan, signal.SIGTERM)
    if not wait_until(gone, p["timeout_s"]):
        result["killed"] = True
        result["signalled"]["SIGKILL"] = send_signal(plan, signal.SIGKILL)
        if not wait_until(gone, _KILL_WAIT_S):
            alive = [t for t in targets if is_alive(int(t["pid"]), t["starttime"])]
            result["survived"] = [int(t["pid"]) for t in alive]
            if p["fail_on_survivors"]:
                module.fail_json(msg="CT %d: the hand-run SGLang's processes %s are still there %d s after SIGKILL "
                                     "(stuck in the driver or on FUSE): run recover.yml for this container (its "
                                     "ladder), then deploy again." % (vmid, result["survived"], _KILL_WAIT_S), **result)
            module.exit_json(**result)
    result["stopped_after_s"] = round(time.monotonic() - started, 1)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
