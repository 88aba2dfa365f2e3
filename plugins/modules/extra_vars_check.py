#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: inferops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# The work is done by the action plugin of the same name (plugins/action/extra_vars_check.py) on the controller.
from __future__ import annotations

DOCUMENTATION = r"""
module: extra_vars_check
short_description: Refuse every extra variable an entry playbook of the collection does not document
version_added: "0.1.0"
author:
  - inferops team (@inferops)
description:
  - Runs on the controller and contacts nothing. Extra variables (C(-e), C(-e @file), AWX survey answers) outrank
    every other variable, C(set_fact) and C(register) included, so each entry playbook accepts only the names it
    documents and refuses every other one, naming it with the closest documented name.
  - The accepted names are computed in C(module_utils/deploy/playbook_inputs.py) from the options of the role entry points
    the playbook runs (their C(meta/argument_specs.yml)) and the playbook's own inputs, less every name the playbook
    itself sets; AWX's job variables (C(awx_*), C(tower_*)) are accepted. docs/safety.md lists them.
  - The first task of each play of C(deploy.yml), C(recover.yml) and C(plan.yml); when C(recover.yml) imports
    C(deploy.yml), recover.yml's list applies.
  - With O(inventory_hosts) (the first play of each entry playbook), it also reads the inventory variables of those
    hosts (host_vars, group_vars, the inventory files; not the extra vars) and reports each one in the collection's
    namespace that nothing documents (a role prefix such as C(sglang_server_), C(plan_), C(recover_), C(inferops_), a
    misspelling of one such as C(sglang_sever_), or a name within two edits of a documented one) with the closest
    documented name; refused, or only warned about where the host's C(inferops_unknown_variables) is C(warn).
options:
  playbook:
    description: The entry playbook the task is in (its file name under C(playbooks/)).
    type: str
    required: true
    choices: [deploy.yml, plan.yml, recover.yml]
  inventory_hosts:
    description:
      - The inventory hosts whose inventory variables are checked. Names not in the inventory are skipped. Not checked
        when the entry playbook is another one (C(recover.yml) importing C(deploy.yml) checked them in its first play).
    type: list
    elements: str
    default: []
extends_documentation_fragment:
  - inferops.gpu_inference.attributes
attributes:
  check_mode:
    support: full
    details: The action only reads; it never changes anything.
  diff_mode:
    support: none
"""

EXAMPLES = r"""
- name: Refuse extra variables plan.yml does not document
  inferops.gpu_inference.extra_vars_check:
    playbook: plan.yml
  run_once: true

- name: Refuse extra variables deploy.yml does not document, and unknown inventory variables of its hosts
  inferops.gpu_inference.extra_vars_check:
    playbook: deploy.yml
    inventory_hosts: "{{ ansible_play_hosts_all }}"
  run_once: true
"""

RETURN = r"""
accepted:
  description: How many names the playbook accepts (AWX's job variables aside).
  type: int
  returned: always
checked:
  description: How many extra variables were given.
  type: int
  returned: always
inventory_checked:
  description: How many inventory variables of O(inventory_hosts) were read.
  type: int
  returned: always
"""
