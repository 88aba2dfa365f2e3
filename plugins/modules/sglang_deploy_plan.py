#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: inferops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# The work is done by the action plugin of the same name (plugins/action/sglang_deploy_plan.py) on the controller.
from __future__ import annotations

DOCUMENTATION = r"""
module: sglang_deploy_plan
short_description: The calculator of playbooks/plan.yml for one host (a HiCache plan touching no host)
version_added: "0.1.0"
author:
  - inferops team (@inferops)
description:
  - Runs on the controller and contacts nothing. A plan from O(plan_input), or the offline plan of one inventory host
    from its O(request) and O(container); every decision in C(module_utils/) (C(deploy/sglang_deploy.py)
    C(calculate), C(host/node_facts.py) and the sizing model C(sizing/hicache.py)). The plan of a node's containers
    together (C(playbooks/plan.yml -e plan_node)) is M(inferops.gpu_inference.sglang_plan_node).
  - The deploy's stages are their own actions, on the same code - M(inferops.gpu_inference.sglang_request),
    M(inferops.gpu_inference.sglang_node_gate), M(inferops.gpu_inference.sglang_launch),
    M(inferops.gpu_inference.sglang_verify), M(inferops.gpu_inference.sglang_installer_check),
    M(inferops.gpu_inference.sglang_restart_plan); a C(stage) other than C(calculate) is refused with the name of the
    action that took it over.
  - Refuses extra variables (C(-e), survey answers) that the run's entry playbook does not document (the allow-list of
    M(inferops.gpu_inference.extra_vars_check)), and private names of the roles' or playbooks' form
    (C(__sglang_server_*), C(__pve_gpu_container_*), ...) set in the inventory for the host.
options:
  stage:
    description: C(calculate), the only stage (kept for the playbooks that name it).
    type: str
    default: calculate
    choices: [calculate]
  plan_input:
    description: hicache_plan keys; with O(request), only the node's facts C(mem_total_bytes), C(mem_available_bytes),
      C(gpu_memory_mib) (otherwise the container's declared memory limit is planned against).
    type: dict
  requested_gb:
    description: A per-rank size to ask for, as an operator or a survey gives it; blank or 0 lets the plan choose.
    type: raw
  request:
    description: The C(request) M(inferops.gpu_inference.sglang_request) returned for the host planned.
    type: dict
  container:
    description: The declared spec of the host's container.
    type: dict
  host:
    description: The inventory name of the host planned with O(request), for the messages.
    type: str
  node_host:
    description: The inventory host of the planned node, whose O(node_declared) hardware is taken as the node's facts,
      each overridden by a key of O(plan_input).
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
- name: Plan from the layout and facts given
  inferops.gpu_inference.sglang_deploy_plan:
    plan_input: {sglang_version: "0.5.21", model_preset: kimi-k2, tp_size: 8, gpu_count: 8, gpu_memory_mib: 97887,
                 mem_total_bytes: 1081000000000, mem_available_bytes: 1000000000000}
  register: __plan_calculation
"""

RETURN = r"""
calculation:
  description: C(plan) (the hicache_plan result) and C(notes) (what the plan was made against).
  type: dict
  returned: success
msg_lines:
  description: >-
    When the task fails with a message of several lines (a plan or the node's table that does not fit, with its
    arithmetic): the lines after the first, one a line; C(msg) is the first line.
  type: list
  elements: str
  returned: failure with a message of several lines
"""
