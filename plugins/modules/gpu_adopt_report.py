#!/usr/bin/python
# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpu_adopt_report
short_description: Read a running, hand-made GPU container before taking it over, and say what the take-over does
version_added: 0.1.0
author:
  - inferops team (@inferops)
description:
  - Runs on the Proxmox VE node, as root; reads only (C(/proc) of the container's processes, the config given).
  - Finds the SGLang launchers running in the container (their argv from C(/proc/PID/cmdline), their process group,
    the ranks below them), judges each one's own C(--hicache-size) with the collection's sizing model, classifies the
    GPU passthrough (devN entries, raw C(lxc.mount.entry)/C(lxc.cgroup2.devices.allow) lines, or both) against the
    node's GPUs, compares the config key by key with what the roles would set, and lists the take-over's steps with
    those that interrupt the server.
  - The decisions are in C(plugins/module_utils/deploy/adopt.py). Nothing read from the container is executed.
options:
  vmid:
    description: The container.
    type: int
    required: true
  host:
    description: The container's inventory host, for the report.
    type: str
    required: true
  config:
    description: The container's config as M(inferops.gpu_inference.pve_lxc) V(query) returns it (with raw C(lxc) lines).
    type: dict
    required: true
  spec:
    description: The container's settings as the roles' C(container_spec) entry point describes them.
    type: dict
    required: true
  inventory_sets:
    description: The role variables (C(pve_gpu_container_hostname), ...) the inventory itself sets for the container.
    type: list
    elements: str
    default: []
  consent:
    description: C(pve_gpu_container_adopt_interrupt), the consent to the steps that interrupt the running server.
    type: bool
    default: false
  plan_base:
    description: The sizing model's input without facts (the request stage's C(plan_base)).
    type: dict
    required: true
  planned_gb:
    description: The size per rank the node's plan chose for the unit.
    type: int
  port:
    description: The port the unit will listen on (C(sglang_server_port)).
    type: int
    default: 30000
  unit:
    description: The unit the collection runs SGLang under inside the container.
    type: str
    default: sglang.service
  node_gpus:
    description: The node's GPUs as M(inferops.gpu_inference.gpu_host_facts) returns them.
    type: list
    elements: dict
    required: true
  mem_total_bytes:
    description: The node's MemTotal.
    type: int
    required: true
  mem_available_bytes:
    description: The node's MemAvailable.
    type: int
    required: true
  container_held_bytes:
    description: What the container's memory cgroup holds now (its server's memory).
    type: int
    default: 0
  baseline_present:
    description: Whether the container's recovery baseline file exists on the node.
    type: bool
    default: false
  stop_timeout_s:
    description: Seconds the consented stop gives a hand-run server to drain and exit after SIGTERM (for the report).
    type: int
    default: 120
extends_documentation_fragment:
  - inferops.gpu_inference.attributes
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
"""

EXAMPLES = r"""
- name: Read the container before taking it over
  inferops.gpu_inference.gpu_adopt_report:
    vmid: 129
    host: ct129
    config: "{{ query_result.config }}"
    spec: "{{ hostvars['ct129'].__pve_gpu_container_spec }}"
    plan_base: "{{ hostvars['ct129'].__sglang_server_request.plan_base }}"
    node_gpus: "{{ node_facts.gpus }}"
    mem_total_bytes: "{{ node_facts.memory.mem_total_bytes }}"
    mem_available_bytes: "{{ node_facts.memory.mem_available_bytes }}"
  register: adoption
"""

RETURN = r"""
lines:
  description: The adoption report, one line per item.
  type: list
  elements: str
  returned: always
refusal:
  description: Why the run stops before the first change (a passthrough it will not touch, or missing consent); null when it may go on.
  type: str
  returned: always
record_baseline_now:
  description: No baseline exists and the container's GPUs are idle with no server running - record it now.
  type: bool
  returned: always
interrupts:
  description: Whether the take-over interrupts the running server.
  type: bool
  returned: always
omit:
  description: The PVE keys the update leaves as the operator set them.
  type: list
  elements: str
  returned: always
manage_devn:
  description: Whether deploy manages the GPU devN entries (false where raw lxc lines are the passthrough).
  type: bool
  returned: always
servers:
  description: The SGLang launchers found (pid, pgid, argv, settings, children, unit).
  type: list
  elements: dict
  returned: always
hand_run:
  description: The host PIDs of the launchers not under the unit (the take-over stops them).
  type: list
  elements: int
  returned: always
hand_run_servers:
  description: Those launchers with their process group, start time and the PIDs inside the container of them and their ranks.
  type: list
  elements: dict
  returned: always
judged:
  description: Each server's size as the sizing model judges it (fits, verdict).
  type: list
  elements: dict
  returned: always
passthrough:
  description: How the GPUs are passed (method, paths, gpus, mapped_twice, raw_lines, problems).
  type: dict
  returned: always
"""

import json
import sys

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.inferops.gpu_inference.plugins.module_utils.deploy import adopt
from ansible_collections.inferops.gpu_inference.plugins.module_utils.host import bounded_command
from ansible_collections.inferops.gpu_inference.plugins.module_utils.host.procfs import join_root, read_text
from ansible_collections.inferops.gpu_inference.plugins.module_utils.pve.pve_config import build_desired_config
from ansible_collections.inferops.gpu_inference.plugins.module_utils.pve.pve_options import ConfigError
from ansible_collections.inferops.gpu_inference.plugins.module_utils.recover.recover_procs import (
    container_of_pid,
    in_unit,
    list_pids,
    parse_nspid,
    read_stat,
)


# Reads each PID's cmdline in a child bounded by bounded_command: reading /proc/PID/cmdline takes the task's mmap lock,
# which a process of the container stuck on FUSE may hold; the module never waits on it.
_READER = r"""
import json, sys
out = {}
for pid in sys.argv[1:]:
    try:
        with open("/proc/%s/cmdline" % pid, "rb") as f:
            data = f.read(65536)
        out[pid] = [p.decode("utf-8", "replace") for p in data.split(b"\0") if p]
    except OSError:
        out[pid] = None
    sys.stdout.write(json.dumps({pid: out[pid]}) + "\n")
    sys.stdout.flush()
"""
_READ_TIMEOUT_S = 10


def read_cmdlines(module, pids):
    """{pid: argv} for the PIDs whose cmdline could be read within the bound; the others are left out."""
    if not pids:
        return {}
    cmd = bounded_command.argv(sys.executable, _READ_TIMEOUT_S, [sys.executable, "-c", _READER] + [str(p) for p in pids])
    _rc, out, _err = module.run_command(cmd)
    found = {}
    for line in (out or "").splitlines():
        try:
            item = json.loads(line)
        except ValueError:
            continue
        for pid, argv in item.items():
            if isinstance(argv, list):
                found[int(pid)] = [str(a) for a in argv]
    return found


def container_procs(module, vmid, unit, root="/"):
    """The container's processes seen from the node: pid, ppid, pgid, starttime, argv, and the unit when in it."""
    procs = []
    for pid in list_pids(root):
        if container_of_pid(pid, root) != vmid:
            continue
        st = read_stat(pid, root)
        if st is None or st["state"] in ("Z", "X"):
            continue
        nspid = parse_nspid(read_text(join_root(root, "/proc/%d/status" % pid)))
        procs.append({"pid": pid, "ppid": st["ppid"], "pgid": st["pgid"], "starttime": st["starttime"], "argv": [],
                      "ct_pid": nspid[-1] if nspid else None,
                      "unit": unit if in_unit(read_text(join_root(root, "/proc/%d/cgroup" % pid)), unit) else ""})
    argvs = read_cmdlines(module, [p["pid"] for p in procs])
    for proc in procs:
        proc["argv"] = argvs.get(proc["pid"], [])
    return procs


def build(p, procs):
    """The report from the module's parameters and the processes read."""
    spec = p["spec"]
    try:
        declared, _delete = build_desired_config(
            hostname=spec.get("hostname"), cores=int(spec["cores"]) if spec.get("cores") not in (None, "") else None,
            memory_mib=int(spec["memory_mib"]) if spec.get("memory_mib") not in (None, "") else None,
            swap_mib=int(spec["swap_mib"]) if spec.get("swap_mib") not in (None, "") else None,
            rootfs=spec.get("rootfs") or None, features=spec.get("features") or None)
    except (ConfigError, ValueError) as exc:
        raise adopt.AdoptError("the container's settings: %s" % exc) from exc
    config = p["config"] or {}
    servers = adopt.find_servers(procs)
    passthrough = adopt.classify_passthrough(config, p["node_gpus"])
    wanted = [int(g) for g in spec.get("gpus") or []]
    decision = adopt.passthrough_decision(passthrough, wanted)
    rows = adopt.config_rows(config, declared, p["inventory_sets"], p["consent"])
    ct_gpus = [g for g in p["node_gpus"] if g.get("minor_number") in set(passthrough["minors"])]
    judged = []
    for server in servers:
        try:
            facts = adopt.facts_for_running(p["mem_total_bytes"], p["mem_available_bytes"], p["container_held_bytes"],
                                            int(config.get("memory") or spec.get("memory_mib") or 0), ct_gpus)
            judged.append(adopt.judge_running(p["plan_base"], server, facts))
        except adopt.AdoptError as exc:
            judged.append({"fits": None, "verdict": str(exc), "plan": None})
    steps = adopt.take_over(p["vmid"], servers, decision, rows, p["planned_gb"], p["unit"], p["consent"],
                            p["baseline_present"], adopt.gpus_busy(ct_gpus) or bool(servers), p["stop_timeout_s"])
    plan_line = "The plan for the unit: --hicache-size %s GB per rank (the node's plan, deploy's gate)." % (
        p["planned_gb"] if p["planned_gb"] is not None else "not computed")
    lines = adopt.report_lines(p["vmid"], p["host"], rows, passthrough, servers, judged, plan_line, steps,
                               adopt.port_owner(p["port"], servers, p["unit"]))
    return {"lines": lines, "refusal": steps["refusal"], "interrupts": steps["interrupts"], "omit": rows["omit"],
            "record_baseline_now": steps["record_baseline_now"],
            "manage_devn": decision["manage_devn"], "restart": decision["restart"],
            "servers": [s.as_dict() for s in servers], "hand_run": steps["hand_run"],
            "hand_run_servers": [{"pid": s.pid, "pgid": s.pgid, "starttime": s.starttime, "ct_pids": s.ct_pids}
                                 for s in servers if s.pid in steps["hand_run"]],
            "judged": [{"fits": j["fits"], "verdict": j["verdict"]} for j in judged], "passthrough": passthrough,
            "rows": rows["rows"], "steps": steps["steps"]}


def main():
    module = AnsibleModule(
        argument_spec=dict(
            vmid=dict(type="int", required=True),
            host=dict(type="str", required=True),
            config=dict(type="dict", required=True),
            spec=dict(type="dict", required=True),
            inventory_sets=dict(type="list", elements="str", default=[]),
            consent=dict(type="bool", default=False),
            plan_base=dict(type="dict", required=True),
            planned_gb=dict(type="int"),
            port=dict(type="int", default=30000),
            unit=dict(type="str", default="sglang.service"),
            node_gpus=dict(type="list", elements="dict", required=True),
            mem_total_bytes=dict(type="int", required=True),
            mem_available_bytes=dict(type="int", required=True),
            container_held_bytes=dict(type="int", default=0),
            baseline_present=dict(type="bool", default=False),
            stop_timeout_s=dict(type="int", default=120),
        ),
        supports_check_mode=True,
    )
    p = module.params
    try:
        result = build(p, container_procs(module, p["vmid"], p["unit"]))
    except adopt.AdoptError as exc:
        module.fail_json(msg="CT %d: %s. Nothing has been changed." % (p["vmid"], exc))
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
