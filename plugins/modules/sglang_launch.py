#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: inferops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# The work is done by the action plugin of the same name (plugins/action/sglang_launch.py) on the controller.
from __future__ import annotations

DOCUMENTATION = r"""
module: sglang_launch
short_description: Launch the size the node issued for one container, checked in the container's own view
version_added: "0.1.0"
author:
  - inferops team (@inferops)
description:
  - The plan for the value actually launched (C(module_utils/deploy/sglang_deploy.py) C(launch)) - the per-rank size the
    node's gate issued (C(node_state.node_plan)), checked against the container's memory as it sees it, which may lower
    that size but never raise it (its view does not see the node's other tenants), the node's GPUs, the exact argv of
    the unit, what the start guard must see, the bounds verify checks,
    the memory tool's C(verify) arguments (the server's info path by release, C(module_utils/sizing/hicache_releases.py)); the
    install steps preflight's read calls for, and where the software comes from (C(module_utils/deploy/supply_chain.py)).
options:
  request:
    description: The C(request) M(inferops.gpu_inference.sglang_request) returned.
    type: dict
    required: true
  node_state:
    description: What the node play found and planned for the container (driver version, GPUs, memory limit, and
      C(node_plan), the gate's plan whose C(per_rank_gb) is the size issued; without it the launch is refused).
    type: dict
    required: true
  container:
    description: The container's own facts (memory, device paths, addresses, listeners, the unit's PIDs, the model).
    type: dict
    required: true
  paths:
    description: Paths in the container (python, launcher, launch.json, API key file, nvidia-smi; for the launch
      contract the unit's name and file, the environment file, the virtualenv and the contract's state file).
    type: dict
    required: true
  installed:
    description: What preflight read in the container (C(venv_pip_present), C(sglang_installed_version),
      C(user_as_wanted)) and the extra pip packages asked (C(pip_extra_packages)). Not given, every install step runs.
    type: dict
  supply:
    description: Where the software comes from (C(installer_sha256), C(installer_url), C(pip_index_url),
      C(pip_find_links), C(pip_allow_http), C(pip_hashes)); a plain-HTTP pip source not allowed by name, or an NVIDIA
      installer to run without a sha256 from the inventory, is refused.
    type: dict
extends_documentation_fragment:
  - inferops.gpu_inference.attributes
  - inferops.gpu_inference.deploy_stage
"""

EXAMPLES = r"""
- name: Plan the launch
  inferops.gpu_inference.sglang_launch:
    request: "{{ __sglang_server_request }}"
    node_state: "{{ __sglang_server_node_state }}"
    container: {mem_total_bytes: 100000000000, mem_available_bytes: 90000000000, device_paths: [/dev/nvidia0]}
    paths: {python: /opt/sglang/venv/bin/python3, launcher: /usr/local/libexec/inferops/sglang-launch}
  register: __sglang_server_launch_result
"""

RETURN = r"""
launch:
  description: C(hicache_size_gb), C(ranks), C(argv), C(guard), C(expected_running), C(bounds), C(plan), C(health_url),
    C(contract_args) (the memory tool's C(contract) arguments), C(verify_args) (its C(verify) arguments).
  type: dict
  returned: success
launch_record:
  description: What /etc/sglang/launch.json holds.
  type: dict
  returned: success
install:
  description: Which install steps run, each a bool; C(remake_venv), C(pip), C(user).
  type: dict
  returned: success
supply:
  description: C(installer) (C(needed), C(file), C(sha256), C(source) C(url) or C(node)) and C(pip) (C(requirements)).
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
