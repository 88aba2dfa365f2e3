# -*- coding: utf-8 -*-
# Copyright: inferops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
name: recover_relaunch
short_description: The containers recover.yml hands to deploy.yml once its nodes are Clean (recover_relaunch)
version_added: "0.1.0"
author: inferops contributors
description:
  - Used by C(playbooks/recover.yml). None unless recover_relaunch is asked and the run is not in check mode, and
    only when every node of the run has the verdict C(Clean) (a node that failed or was unreachable has none), so a
    multi-node server comes back only whole (docs/recover.md, section "A server on several nodes").
  - The verdicts come from the role's private result (C(__gpu_recover_result)), never from the public
    C(gpu_recover_result), which a host's variables could carry.
options:
  _input:
    description: The plan of P(inferops.gpu_inference.recover_targets#filter) (its C(targets)).
    type: dict
    required: true
  hostvars:
    description: C(hostvars), where each node's result of this run is read (O(result_var)'s C(report.verdict)).
    type: dict
    required: true
  nodes:
    description: The nodes of the run (C(ansible_play_hosts_all)); one without a result has no verdict.
    type: list
    elements: str
    required: true
  relaunch:
    description: recover_relaunch.
    type: bool
    required: true
  one_node:
    description: recover_node names the node, so only its container (the plan's first target).
    type: bool
    required: true
  check_mode:
    description: ansible_check_mode.
    type: bool
    required: true
  result_var:
    description: The role's private result of this run on each node.
    type: str
    default: __gpu_recover_result
"""

EXAMPLES = r"""
- name: Hand the clean containers to deploy.yml
  ansible.builtin.add_host:
    name: "{{ item }}"
    groups: inferops_recover_relaunch
  loop: >-
    {{ __recover_plan | inferops.gpu_inference.recover_relaunch(hostvars, ansible_play_hosts_all,
         recover_relaunch | default(false), recover_node is defined, ansible_check_mode) }}
"""

RETURN = r"""
_value:
  description: The container hosts to relaunch (empty when none).
  type: list
  elements: str
"""

from collections.abc import Mapping

from ansible.errors import AnsibleFilterError
from ansible.module_utils.parsing.convert_bool import boolean

from ansible_collections.inferops.gpu_inference.plugins.module_utils.recover.recover_scope import relaunch_hosts


def _verdict(hostvars, node, result_var):
    """The verdict of ``node``'s result of this run, None when it has none (failed, unreachable, not run)."""
    try:
        result = hostvars[node].get(result_var) if isinstance(hostvars[node], Mapping) else None
    except KeyError:
        return None
    report = result.get("report") if isinstance(result, Mapping) else None
    return report.get("verdict") if isinstance(report, Mapping) else None


def recover_relaunch(plan, hostvars, nodes, relaunch, one_node, check_mode, result_var="__gpu_recover_result"):
    """Return the container hosts to relaunch."""
    if not isinstance(plan, Mapping) or not isinstance(hostvars, Mapping):
        raise AnsibleFilterError("recover_relaunch: the input must be recover_targets' plan and hostvars a dict, got %s and %s"
                                 % (type(plan).__name__, type(hostvars).__name__))
    try:
        verdicts = {str(node): _verdict(hostvars, node, result_var) for node in nodes}
        return relaunch_hosts(plan, verdicts, boolean(relaunch), boolean(one_node), boolean(check_mode))
    except (KeyError, TypeError) as exc:
        raise AnsibleFilterError("recover_relaunch: %s" % exc, orig_exc=exc) from exc


class FilterModule(object):
    def filters(self):
        return {"recover_relaunch": recover_relaunch}
