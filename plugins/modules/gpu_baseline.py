#!/usr/bin/python
# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpu_baseline
short_description: Record one container's recovery baseline on the Proxmox VE node, at idle only
version_added: 0.1.0
author:
  - inferops team (@inferops)
description:
  - Runs on the Proxmox VE node, as root. Records C(<baseline_dir>/<vmid>.json), what the clean gate of
    M(inferops.gpu_inference.gpu_diagnose) compares with - each of the container's GPUs' idle C(memory.used) and
    the host's MemAvailable, Shmem and Mlocked (C(docs/recover.md), "Clean").
  - A baseline is the GPUs' idle figure, never leftovers. The module waits up to O(wait) seconds for every GPU in
    O(gpus) to be idle (no compute app of this container, of the host or of a process that is gone, and at most
    O(idle_max_mib) MiB used besides other containers' apps), and fails without writing anything when one is not.
  - Another container's compute apps on a shared GPU are taken off that GPU's figure.
options:
  vmid:
    description: The container.
    type: int
    required: true
  gpus:
    description: Its GPUs as nvidia-smi indexes (what C(pct config) passes as C(devN), through the driver's numbering;
      gpu_diagnose's C(evidence.container.gpus)).
    type: list
    elements: int
    required: true
  baseline_dir:
    description: Where the baseline lives on the node.
    type: path
    default: /var/lib/inferops/baseline
  container_memory_mib:
    description: The container's memory limit, kept in the record for the report.
    type: int
  service:
    description: The inference server's unit inside the container, kept in the record.
    type: str
    default: sglang.service
  idle_max_mib:
    description: The most MiB an idle GPU may use (GCM's threshold is 15 MiB).
    type: int
    default: 16
  wait:
    description: Seconds to wait for the GPUs to become idle (a process's memory can take a while to be released).
    type: int
    default: 60
  nvidia_smi_path:
    description: Path to C(nvidia-smi); looked up in E(PATH) by default.
    type: path
extends_documentation_fragment:
  - inferops.gpu_inference.attributes
attributes:
  check_mode:
    support: full
    details: In check mode the record is built and checked but not written.
  diff_mode:
    support: none
seealso:
  - module: inferops.gpu_inference.gpu_diagnose
"""

EXAMPLES = r"""
- name: Record CT 129's baseline before SGLang starts
  inferops.gpu_inference.gpu_baseline:
    vmid: 129
    gpus: [0, 1]
    container_memory_mib: 14336
"""

RETURN = r"""
baseline:
  description: The record (format, vmid, recorded_at, service, gpus [index, uuid, memory_used_mib], host, container_memory_mib).
  returned: success
  type: dict
path:
  description: Where it is (or, in check mode, would be) written.
  returned: always
  type: str
waited:
  description: Seconds spent waiting for the GPUs to be idle.
  returned: always
  type: float
"""

import sys
import time

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.inferops.gpu_inference.plugins.module_utils.common.gpu_inventory import vmid_problem
from ansible_collections.inferops.gpu_inference.plugins.module_utils.host import bounded_command
from ansible_collections.inferops.gpu_inference.plugins.module_utils.host import gpu_facts
from ansible_collections.inferops.gpu_inference.plugins.module_utils.recover import recover_baseline as rb
from ansible_collections.inferops.gpu_inference.plugins.module_utils.recover import recover_procs as procs

# Seconds each nvidia-smi call may take: then it and every process of its session are killed (bounded_command).
COMMAND_TIMEOUT_S = 30


def read_state(module, smi):
    """(gpu rows, compute apps with their owners) from nvidia-smi; fails the module when nvidia-smi does."""
    rc, out, err = module.run_command(bounded_command.argv(sys.executable, COMMAND_TIMEOUT_S, gpu_facts.gpu_query_args(smi)),
                                      environ_update={"LC_ALL": "C"})
    if rc != 0:
        module.fail_json(msg="nvidia-smi --query-gpu failed (rc %d): %s" % (rc, (err or out).strip()))
    rows = gpu_facts.parse_gpu_csv(out)
    rc, out, err = module.run_command(bounded_command.argv(sys.executable, COMMAND_TIMEOUT_S,
                                                           gpu_facts.compute_apps_query_args(smi)),
                                      environ_update={"LC_ALL": "C"})
    if rc != 0:
        module.fail_json(msg="nvidia-smi --query-compute-apps failed (rc %d): %s" % (rc, (err or out).strip()))
    apps = [dict(app, owner=procs.container_of_pid(app["pid"]) if app.get("pid") else "gone")
            for app in gpu_facts.parse_compute_apps_csv(out)]
    return rows, apps


def main():
    module = AnsibleModule(
        argument_spec=dict(
            vmid=dict(type="int", required=True),
            gpus=dict(type="list", elements="int", required=True),
            baseline_dir=dict(type="path", default="/var/lib/inferops/baseline"),
            container_memory_mib=dict(type="int"),
            service=dict(type="str", default="sglang.service"),
            idle_max_mib=dict(type="int", default=rb.IDLE_MAX_MIB),
            wait=dict(type="int", default=60),
            nvidia_smi_path=dict(type="path"),
        ),
        supports_check_mode=True,
    )
    p = module.params
    if vmid_problem(p["vmid"]):
        module.fail_json(msg="vmid %s" % vmid_problem(p["vmid"]))
    smi = p["nvidia_smi_path"] or module.get_bin_path("nvidia-smi", opt_dirs=["/usr/bin", "/usr/local/bin"])
    if not smi:
        module.fail_json(msg="nvidia-smi not found: gpu_baseline runs on the Proxmox VE node")
    where = rb.path(p["baseline_dir"], p["vmid"])
    start = time.monotonic()
    while True:
        rows, apps = read_state(module, smi)
        try:
            host = gpu_facts.read_host_memory("/")
        except gpu_facts.ParseError as exc:
            module.fail_json(msg="cannot read the host's memory: %s" % exc, path=where)
        try:
            record = rb.build(p["vmid"], p["gpus"], rows, apps, host, p["container_memory_mib"],
                              time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), p["idle_max_mib"], p["service"])
            break
        except rb.BaselineError as exc:
            if time.monotonic() - start >= p["wait"]:
                module.fail_json(msg=str(exc), path=where, waited=round(time.monotonic() - start, 1))
            time.sleep(2)
    if not module.check_mode:
        rb.write(p["baseline_dir"], record)
    module.exit_json(changed=True, baseline=record, path=where, waited=round(time.monotonic() - start, 1))


if __name__ == "__main__":
    main()
