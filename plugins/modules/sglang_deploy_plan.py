#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: inferops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# The work is done by the action plugin of the same name (plugins/action/sglang_deploy_plan.py) on the controller.
from __future__ import annotations

DOCUMENTATION = r"""
module: sglang_deploy_plan
short_description: The one deploy plan of an SGLang server (size, argv, start guard, verify bounds)
version_added: "0.1.0"
author:
  - inferops team (@inferops)
description:
  - Runs on the controller and contacts nothing. Every decision is made in C(module_utils/) (C(sglang_request.py),
    C(sglang_deploy.py), C(playbook_inputs.py), C(sglang_extra_vars.py) and the sizing model C(hicache.py)), the same code for the node's gate
    before any change, the container's launch and the verification of what runs.
  - Refuses, at every stage, extra variables (C(-e), survey answers) that the run's entry playbook does not document
    (the allow-list of M(inferops.gpu_inference.extra_vars_check)), because Ansible lets extra variables outrank
    computed facts; in an operator's own playbook, those of the roles' form that no role entry point documents
    (for example C(sglang_server_hicache_size)); and, at every stage, private names of the roles' or playbooks' form
    (C(__sglang_server_*), C(__pve_gpu_container_*), C(_sglang_server_*), ...) set in the inventory for the host.
  - Used by the roles C(sglang_server) and C(pve_gpu_container); not meant to be called by playbooks directly.
options:
  stage:
    description: C(request) checks the operator's settings; C(node) is the gate on the PVE node (every container of the
      node planned together, module_utils C(node_plan.py)); C(launch) plans the
      value actually launched; C(verify) compares the running server with the launch; C(calculate) is the calculator of
      C(playbooks/plan.yml) (a plan from O(plan_input), or the offline plan of an inventory host from its O(request) and
      O(container)), which touches no host; C(installer) refuses an NVIDIA installer whose sha256 is not the one the
      inventory gives (module_utils C(supply_chain.py)).
    type: str
    required: true
    choices: [request, node, launch, verify, calculate, installer]
  settings:
    description: (request) The role's settings, see the role's argument specs.
    type: dict
  request:
    description: (launch, calculate) The C(request) returned by the request stage.
    type: dict
  requests:
    description: (node, and calculate with O(containers)) Inventory host name -> the C(request) the request stage returned for it.
    type: dict
  containers:
    description: (node) The declared specs of the containers the inventory places on the node (host, vmid, memory_mib, gpus);
      (calculate) given, the node's plan of C(playbooks/plan.yml -e plan_node), from O(plan_input)'s node facts.
    type: list
    elements: dict
  guests:
    description: (node) Every guest of the node from the PVE API (vmid, type, name, status, maxmem_bytes, mem_bytes, gpus),
      as M(inferops.gpu_inference.pve_lxc) O(inferops.gpu_inference.pve_lxc#module:state=query) returns it as C(node_guests).
    type: list
    elements: dict
  others_count:
    description: (node) How the node's guests the inventory does not manage are counted against its RAM; C(limit) (their
      memory limit) or C(measured) (what they use now; a stopped one counts nothing).
    type: str
    choices: [limit, measured]
    default: limit
  owner_tag:
    description: (node) The PVE tag of the collection's containers; a running guest with it that is not in this run counts
      by its use now.
    type: str
  node_name:
    description: (node, calculate) The node's name, for the messages.
    type: str
  plan_input:
    description: (calculate) hicache_plan keys; with O(request), only the node's facts C(mem_total_bytes),
      C(mem_available_bytes), C(gpu_memory_mib) (otherwise the container's declared memory limit is planned against).
    type: dict
  requested_gb:
    description: (calculate) A per-rank size to ask for, as an operator or a survey gives it; blank or 0 lets the plan choose.
    type: raw
  host:
    description: (calculate) The inventory name of the host planned with O(request), for the messages.
    type: str
  node:
    description: (node) The node's facts from M(inferops.gpu_inference.gpu_host_facts) (memory, gpus, device paths).
    type: dict
  container:
    description: (calculate) The container's declared spec; (launch) the container's own facts.
    type: dict
  node_host:
    description: (calculate) The inventory host of the planned node (O(container)'s node, or the node of plan_node), whose
      O(node_declared) hardware is taken as the node's facts, each overridden by a key of O(plan_input).
    type: str
  node_declared:
    description: (node, calculate) The node's hardware its inventory declares (C(pve_gpu_container_node_gpu_model),
      C(pve_gpu_container_node_gpu_memory_mib), C(pve_gpu_container_node_gpu_count),
      C(pve_gpu_container_node_mem_total_bytes); null is not declared). Calculate merges it under O(plan_input); node
      refuses a node whose facts read live differ.
    type: dict
  node_reserve_bytes:
    description: (node, calculate) RAM the node keeps for itself on top of the container limits and committed memory.
      Not given, the documented default of the pve_gpu_container role's C(pve_gpu_container_node_reserve_bytes).
    type: int
  node_state:
    description: (launch) What the node play found (driver version, GPUs, declared memory limit).
    type: dict
  paths:
    description: >-
      (launch) Paths in the container (python, launcher, launch.json, API key file, nvidia-smi; for the launch
      contract: the unit's name and file, the environment file, the virtualenv and the contract's state file).
    type: dict
  installed:
    description: >-
      (launch) What preflight read in the container (C(venv_pip_present), C(sglang_installed_version),
      C(user_as_wanted)) and the extra pip packages asked (C(pip_extra_packages)), from which RV(install) is decided.
      Not given, every install step runs.
    type: dict
  launch:
    description: (verify) The C(launch) returned by the launch stage.
    type: dict
  running:
    description: (verify) The server's C(/server_info), or null on node ranks above 0.
    type: dict
  measure:
    description: (verify) The memory measurement of the unit (C(sglang_memory.py measure)).
    type: dict
  node_rank:
    description: (verify) This container's node rank.
    type: int
  tolerance:
    description: (verify) The fraction measured memory may differ from the plan.
    type: float
  supply:
    description:
      - (launch) Where the container's software comes from (C(installer_sha256), C(pip_index_url), C(pip_find_links),
        C(pip_allow_http), C(pip_hashes)); a plain-HTTP pip source not allowed by name, or an NVIDIA installer to run
        without a sha256 from the inventory, is refused; RV(supply) says what install.yml does.
    type: dict
  expected_sha256:
    description: (installer) The sha256 the launch stage returned for the installer.
    type: str
  sha256:
    description: (installer) The installer's sha256 as read in the container.
    type: str
  path:
    description: (installer) The installer's path in the container.
    type: str
extends_documentation_fragment:
  - inferops.gpu_inference.attributes
attributes:
  check_mode:
    support: full
    details: The action only computes; it never changes anything.
  diff_mode:
    support: none
"""

EXAMPLES = r"""
- name: Check the settings
  inferops.gpu_inference.sglang_deploy_plan:
    stage: request
    settings: {version: "0.5.21", tp_size: 2, model_path: /opt/models/m, model_preset: kimi-k2, requested_gb: ""}
  register: __sglang_server_request
"""

RETURN = r"""
request:
  description: (request) The normalised settings and the plan's input without facts.
  type: dict
  returned: stage is request
node_plan:
  description: (node) The node's plan; C(gates) (host -> the container's plan on the node), C(table) (who commits what
    of the node's RAM), C(containers), C(others), C(committed_bytes), C(mem_total_bytes), C(declared_checked) (what of
    O(node_declared) matched the node). When it does not fit, the task fails with the table (in RV(msg_lines)).
  type: dict
  returned: stage is node
launch:
  description: >-
    (launch) hicache_size_gb, ranks, argv, guard, expected_running, bounds, plan, health_url, contract_args (the
    memory tool's C(contract) arguments: the unit's ExecStartPre records them, configure compares them).
  type: dict
  returned: stage is launch
launch_record:
  description: (launch) What /etc/sglang/launch.json holds.
  type: dict
  returned: stage is launch
install:
  description: >-
    (launch) Which install steps must run, each a bool; C(remake_venv) (the virtualenv has no pip), C(pip) (sglang
    is not the wanted version, pip is missing, or extra packages are asked) and C(user) (the service user is not as
    wanted).
  type: dict
  returned: stage is launch
supply:
  description: >-
    (launch) C(installer) (C(needed), C(file), C(sha256): the checksum the installer must have before it runs) and
    C(pip) (C(requirements): the --require-hashes requirements file from sglang_server_pip_hashes, empty without).
  type: dict
  returned: stage is launch
verify:
  description: (verify) ok, mismatches, the figures compared and C(memory_text) (the report's memory line).
  type: dict
  returned: stage is verify
calculation:
  description: (calculate) C(plan) (the hicache_plan result) and C(notes) (what the plan was made against); with
    O(containers), C(node_plan) (as the node stage returns it) and C(notes).
  type: dict
  returned: stage is calculate
msg_lines:
  description: >-
    When the task fails with a message of several lines (a plan or the node's table that does not fit, with its
    arithmetic): the lines after the first, one a line; C(msg) is the first line. A list, so that ansible-core's
    default callback prints it one line each (it prints a string's line breaks as \n).
  type: list
  elements: str
  returned: failure with a message of several lines
"""
