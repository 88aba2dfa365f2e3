# -*- coding: utf-8 -*-
# Copyright: inferops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
name: gpu_inventory
short_description: The inventory's GPU containers, built and checked once
version_added: "0.1.0"
author: inferops contributors
description:
  - The one reading of the inventory's GPU containers that the playbooks and roles use (plan.yml, deploy.yml,
    recover.yml, the scope check of P(inferops.gpu_inference.gpu_recover#role)); the event source reads the same
    function from C(ansible-inventory --list).
  - A container is a host of the group C(sglang_containers). Its VMID is its C(pve_gpu_container_vmid), else its
    C(proxmox_vmid) (blank is not given), an integer from 100 to 999999999; its node is its
    C(pve_gpu_container_node_host), else the first host of the group C(proxmox_nodes), a host of the inventory; the
    node's Proxmox VE name is that host's C(pve_gpu_container_pve_node), else its C(proxmox_node), else its short name.
    C(sglang_server_cluster_group) names the group of the containers of its multi-node server (node rank =
    position in the group, in inventory order); C(pve_gpu_container_adopt) and C(gpu_recover_eda_relaunch) are true
    or false.
  - Raises one error that lists every problem, each naming the host and what to set (no VMID, a VMID out of range or
    declared twice, no node, a node that is not an inventory host, a cluster group that is not a group or lists a host
    that is not a GPU container, a flag that is not true or false).
options:
  _input:
    description: C(hostvars).
    type: dict
    required: true
  groups:
    description: C(groups) (each group's hosts; C(all) every host).
    type: dict
    required: true
  containers:
    description:
      - The container hosts of a run (a list of inventory hosts), read instead of the group C(sglang_containers);
        playbooks/deploy.yml passes the hosts its C(deploy_containers) pattern matched. Each is checked, and the
        members of their multi-node servers may be hosts of either.
    type: list
    elements: str
"""

EXAMPLES = r"""
- name: This container's VMID and node
  ansible.builtin.debug:
    msg: "CT {{ _ct.vmid }} on {{ _ct.node_host }} (PVE node {{ _ct.node }})"
  vars:
    _ct: "{{ (hostvars | inferops.gpu_inference.gpu_inventory(groups)).by_host[inventory_hostname] }}"

- name: The VMIDs of the containers this play runs on, checked together
  ansible.builtin.debug:
    msg: "{{ (hostvars | inferops.gpu_inference.gpu_inventory(groups, containers=ansible_play_hosts_all)).containers | map(attribute='vmid') }}"
  run_once: true

- name: The containers the inventory places on node pve1
  ansible.builtin.debug:
    msg: "{{ (hostvars | inferops.gpu_inference.gpu_inventory(groups)).nodes['pve1'].containers }}"
"""

RETURN = r"""
_value:
  description:
    - C(containers), in inventory order, each with C(host), C(vmid) (an integer), C(node_host) (the node's inventory
      host), C(node) (its Proxmox VE name), C(cluster_group) (empty without one), C(cluster) (the hosts of that
      group in inventory order, empty without one), C(node_rank), C(nnodes), C(adopt) and C(eda_relaunch).
    - C(by_host), the same containers by inventory host.
    - C(nodes), by node inventory host (every host of C(proxmox_nodes) and every node a container names), each with
      C(name) (its Proxmox VE name) and C(containers) (the hosts of the containers on it).
  type: dict
"""

from collections.abc import Mapping

from ansible.errors import AnsibleFilterError

from ansible_collections.inferops.gpu_inference.plugins.module_utils.common.gpu_inventory import InventoryError
from ansible_collections.inferops.gpu_inference.plugins.module_utils.common.gpu_inventory import gpu_inventory as _gpu_inventory


def gpu_inventory(hostvars, groups, containers=None):
    """Return the inventory's GPU containers and nodes (GpuInventory.as_dict)."""
    if not isinstance(hostvars, Mapping):
        raise AnsibleFilterError("gpu_inventory: the input must be hostvars, got %s" % type(hostvars).__name__)
    try:
        if containers is not None and not isinstance(containers, (str, bytes, Mapping)):
            containers = list(containers)
        return _gpu_inventory(groups, hostvars, containers).as_dict()
    except InventoryError as exc:
        raise AnsibleFilterError(str(exc), orig_exc=exc) from exc


class FilterModule(object):
    def filters(self):
        return {"gpu_inventory": gpu_inventory}
