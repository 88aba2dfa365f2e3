#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: inferops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# The work is done by the action plugin of the same name (plugins/action/sglang_restart_plan.py) on the controller.
from __future__ import annotations

DOCUMENTATION = r"""
module: sglang_restart_plan
short_description: Decide whether SGLang restarts (what runs differs, or another part of the server restarts)
version_added: "0.1.0"
author:
  - inferops team (@inferops)
description:
  - From the memory tool's comparison of what the running server was started with and what is installed now
    (C(sglang_memory.py contract --compare)); any difference is a reason to restart. A server over several containers
    restarts whole - when another of its containers in this run restarts, so does this one (C(module_utils/deploy/sglang_deploy.py)
    C(server_restart)). The other containers' comparisons are read from the run's results of the task named by
    O(members_register).
options:
  compare:
    description: This container's comparison (the command's stdout, one JSON object).
    type: raw
    required: true
  nnodes:
    description: The number of containers the server spans.
    type: int
    default: 1
  members:
    description: The inventory hosts of the server's containers (the cluster group); those not in this run are left out.
    type: list
    elements: str
    default: []
  members_register:
    description: The name the comparison task registered its result under, read for each other member.
    type: str
extends_documentation_fragment:
  - inferops.gpu_inference.attributes
  - inferops.gpu_inference.deploy_stage
"""

EXAMPLES = r"""
- name: Decide whether SGLang restarts
  inferops.gpu_inference.sglang_restart_plan:
    compare: "{{ __sglang_server_contract_raw.stdout }}"
    nnodes: 2
    members: "{{ groups['sglang_pair'] }}"
    members_register: __sglang_server_contract_raw
  register: __sglang_server_restart
"""

RETURN = r"""
restart:
  description: Whether SGLang restarts.
  type: bool
  returned: success
reasons:
  description: Why (empty when it does not restart).
  type: list
  elements: str
  returned: success
"""
