#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: inferops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# The work is done by the action plugin of the same name (plugins/action/sglang_node_gate.py) on the controller.
from __future__ import annotations

DOCUMENTATION = r"""
module: sglang_node_gate
short_description: Plan every container of a PVE node together, before any change (the node's gate)
version_added: "0.1.0"
author:
  - inferops team (@inferops)
description:
  - The node's hardware as the inventory declares it against what was read on the node (C(module_utils/host/node_facts.py)),
    then every container the inventory places on the node planned together against its RAM and GPUs
    (C(module_utils/sizing/node_plan.py)). A node that does not fit is refused with the table of who commits what.
options:
  requests:
    description: Inventory host name -> the C(request) M(inferops.gpu_inference.sglang_request) returned for it.
    type: dict
    required: true
  containers:
    description: The declared specs of the containers the inventory places on the node (host, vmid, memory_mib, gpus).
    type: list
    elements: dict
    required: true
  node:
    description: The node's facts from M(inferops.gpu_inference.gpu_host_facts) (memory, gpus, device paths,
      containers_memory).
    type: dict
    required: true
  guests:
    description: Every guest of the node from the PVE API, as M(inferops.gpu_inference.pve_lxc)
      O(inferops.gpu_inference.pve_lxc#module:state=query) returns it as C(node_guests).
    type: list
    elements: dict
  others_count:
    description: How the node's guests the inventory does not manage count against its RAM; C(limit) (their memory
      limit) or C(measured) (what they use now).
    type: str
    choices: [limit, measured]
    default: limit
  owner_tag:
    description: The PVE tag of the collection's containers; a running guest with it that is not in this run counts by
      its use now.
    type: str
  node_name:
    description: The node's name, for the messages.
    type: str
  node_reserve_bytes:
    description: RAM the node keeps for itself on top of the container limits. Not given, the documented default of the
      role C(pve_gpu_container)'s C(pve_gpu_container_node_reserve_bytes).
    type: int
  node_declared:
    description: The node's hardware its inventory declares (C(pve_gpu_container_node_gpu_model),
      C(pve_gpu_container_node_gpu_memory_mib), C(pve_gpu_container_node_gpu_count),
      C(pve_gpu_container_node_mem_total_bytes); null is not declared); a node whose facts read live differ is refused.
    type: dict
extends_documentation_fragment:
  - inferops.gpu_inference.attributes
  - inferops.gpu_inference.deploy_stage
"""

EXAMPLES = r"""
- name: Plan the node's containers together
  inferops.gpu_inference.sglang_node_gate:
    requests: "{{ __pve_gpu_container_plan_requests }}"
    containers: "{{ __pve_gpu_container_specs }}"
    node: {mem_total_bytes: 540000000000, mem_available_bytes: 500000000000, gpus: [], device_paths: []}
  register: __pve_gpu_container_node_plan
"""

RETURN = r"""
node_plan:
  description: The node's plan; C(gates) (host -> the container's plan on the node), C(table) (who commits what of the
    node's RAM), C(containers), C(others), C(committed_bytes), C(mem_total_bytes), C(declared_checked) (what of
    O(node_declared) matched the node).
  type: dict
  returned: success
msg_lines:
  description: >-
    When the task fails with a message of several lines (a plan that does not fit, with its arithmetic): the lines
    after the first, one a line; C(msg) is the first line.
  type: list
  elements: str
  returned: failure with a message of several lines
"""
