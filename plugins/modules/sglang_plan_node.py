#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: inferops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# The work is done by the action plugin of the same name (plugins/action/sglang_plan_node.py) on the controller.
from __future__ import annotations

DOCUMENTATION = r"""
module: sglang_plan_node
short_description: Plan every container the inventory places on a node together, touching no host
version_added: "0.1.0"
author:
  - inferops team (@inferops)
description:
  - The calculator of C(playbooks/plan.yml -e plan_node) - the containers of one node planned together against the
    node's facts (O(plan_input), over the hardware its inventory declares) as the deploy's gate
    (M(inferops.gpu_inference.sglang_node_gate)) plans them, without reading the node (C(module_utils/sizing/node_plan.py)
    C(calculate_node)).
  - Runs on the controller and contacts nothing. Refuses extra variables (C(-e), survey answers) the run's entry
    playbook does not document and private names of the roles' or playbooks' form set in the inventory for the host.
options:
  plan_input:
    description: The node's facts (C(mem_total_bytes), C(mem_available_bytes), C(gpu_memory_mib)), each over the
      hardware O(node_declared) gives.
    type: dict
  requested_gb:
    description: A per-rank size to ask for every container, as an operator or a survey gives it; blank or 0 lets each
      plan choose.
    type: raw
  requests:
    description: Inventory host name -> the C(request) M(inferops.gpu_inference.sglang_request) returned for it.
    type: dict
    required: true
  containers:
    description: The declared specs of the containers the inventory places on the node (host, vmid, memory_mib, gpus).
    type: list
    elements: dict
    required: true
  node_name:
    description: The node's name, for the messages.
    type: str
  node_reserve_bytes:
    description: RAM the node keeps for itself. Not given, the documented default of the role C(pve_gpu_container)'s
      C(pve_gpu_container_node_reserve_bytes).
    type: int
  node_host:
    description: The node's inventory host, whose O(node_declared) hardware is taken as its facts.
    type: str
  node_declared:
    description: The node's hardware its inventory declares (C(pve_gpu_container_node_gpu_model),
      C(pve_gpu_container_node_gpu_memory_mib), C(pve_gpu_container_node_gpu_count),
      C(pve_gpu_container_node_mem_total_bytes); null is not declared), merged under O(plan_input).
    type: dict
extends_documentation_fragment:
  - inferops.gpu_inference.attributes
  - inferops.gpu_inference.attributes.compute
"""

EXAMPLES = r"""
- name: Compute the node's plan
  inferops.gpu_inference.sglang_plan_node:
    plan_input: {mem_total_bytes: 540000000000, mem_available_bytes: 520000000000, gpu_memory_mib: 97887}
    requests: "{{ __plan_requests }}"
    containers: "{{ __plan_containers }}"
    node_name: pve1
  register: __plan_node_calculation
"""

RETURN = r"""
calculation:
  description: C(node_plan) (as M(inferops.gpu_inference.sglang_node_gate) returns it) and C(notes) (what the plan was
    made against).
  type: dict
  returned: success
msg_lines:
  description: >-
    When the task fails with a message of several lines (the node's table that does not fit, with its arithmetic):
    the lines after the first, one a line; C(msg) is the first line.
  type: list
  elements: str
  returned: failure with a message of several lines
"""
