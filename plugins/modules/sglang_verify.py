#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: inferops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# The work is done by the action plugin of the same name (plugins/action/sglang_verify.py) on the controller.
from __future__ import annotations

DOCUMENTATION = r"""
module: sglang_verify
short_description: Compare the running SGLang server with its launch
version_added: "0.1.0"
author:
  - inferops team (@inferops)
description:
  - What runs (the server's own arguments on node rank 0, the memory its ranks pinned, the unit's memory) compared with
    the launch (C(module_utils/deploy/sglang_deploy.py) C(verify)), and the overhead the server shows next to what the plan
    budgets.
options:
  launch:
    description: The C(launch) M(inferops.gpu_inference.sglang_launch) returned.
    type: dict
    required: true
  running:
    description: The server's own arguments (C(/server_info)), or null on node ranks above 0.
    type: dict
  measure:
    description: The memory measurement of the unit (C(sglang_memory.py verify)).
    type: dict
    required: true
  node_rank:
    description: This container's node rank.
    type: int
    default: 0
  tolerance:
    description: The fraction measured memory may differ from the plan.
    type: float
    default: 0.1
extends_documentation_fragment:
  - inferops.gpu_inference.attributes
  - inferops.gpu_inference.deploy_stage
"""

EXAMPLES = r"""
- name: Compare what runs with the plan
  inferops.gpu_inference.sglang_verify:
    launch: "{{ __sglang_server_launch_result.launch }}"
    running: null
    measure: {rank_count: 1, ranks_held_bytes: 0, unit_held_bytes: 0}
  register: __sglang_server_verify
"""

RETURN = r"""
verify:
  description: C(ok), C(mismatches), the figures compared, C(memory_text) (the report's memory line), C(overhead_seen).
  type: dict
  returned: success
"""
