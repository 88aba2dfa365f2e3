# -*- coding: utf-8 -*-
# Copyright: inferops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
name: recover_targets
short_description: The containers recover.yml acts on for one VMID (that one, or every container of its server)
version_added: "0.1.0"
author: inferops contributors
description:
  - Used by C(playbooks/recover.yml). A container of a multi-node server (a host of an sglang_server_cluster_group
    of several containers) is one part of one server, so recovering it recovers every container of that server, each
    on its own node, and relaunches them together (docs/recover.md, "A server on several nodes").
  - Raises an error that says what to do when the server has two containers on one node (recover.yml recovers one
    container per node in one run). The inventory itself is checked once, by
    P(inferops.gpu_inference.gpu_inventory#filter).
options:
  _input:
    description: The inventory's GPU containers, the C(containers) of P(inferops.gpu_inference.gpu_inventory#filter)
      (each with C(host), C(vmid), C(node_host), C(cluster_group) and C(cluster), the hosts of its
      sglang_server_cluster_group in inventory order, empty without one).
    type: list
    elements: dict
    required: true
  vmid:
    description: recover_vmid (null when not given).
    type: raw
    required: true
"""

EXAMPLES = r"""
- name: What to recover
  ansible.builtin.set_fact:
    __recover_plan: >-
      {{ (hostvars | inferops.gpu_inference.gpu_inventory(groups)).containers
         | inferops.gpu_inference.recover_targets(recover_vmid | default(none)) }}
"""

RETURN = r"""
_value:
  description: C(group) (the server's group, or null for a single container), C(targets), each with C(host),
    C(vmid), C(node_host) and C(node_rank), and C(vmid_by_node) (node host -> the VMID its play recovers); no
    target when the inventory does not declare the VMID; and C(vmid_problem), why recover_vmid is not a VMID
    (then no target), or null.
  type: dict
"""

from collections.abc import Sequence

from ansible.errors import AnsibleFilterError

from ansible_collections.inferops.gpu_inference.plugins.module_utils.recover.recover_scope import ScopeError, recover_targets as _recover_targets


def recover_targets(containers, vmid):
    """Return {group, targets} for recover_vmid ``vmid``."""
    if not isinstance(containers, Sequence) or isinstance(containers, (str, bytes)):
        raise AnsibleFilterError("recover_targets: the input must be the list of containers, got %s" % type(containers).__name__)
    try:
        return _recover_targets(containers, vmid)
    except (ScopeError, AttributeError, KeyError, TypeError) as exc:
        raise AnsibleFilterError("recover.yml: %s" % exc, orig_exc=exc) from exc


class FilterModule(object):
    def filters(self):
        return {"recover_targets": recover_targets}
