# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The GPU containers of an inventory, built and checked once (docs/deploy.md, "The inventory").

Every reader of the inventory takes its containers from :func:`gpu_inventory`: plan.yml (a node's containers, the
node's name), deploy.yml (each container's VMID and node), recover.yml (the containers of a multi-node server),
gpu_recover's scope check (the containers declared on the node) and the event source (the containers it watches).
One place says how a container host becomes a container:

- its VMID: ``pve_gpu_container_vmid``, else ``proxmox_vmid`` (a blank value is not given; both given must be equal, since
  the connection enters ``proxmox_vmid``), an integer from 100 to
  999999999 (Proxmox VE's guest IDs: pve-container's ``pve-vmid`` format; below 100 are reserved);
- its node: ``pve_gpu_container_node_host``, else the first host of the group ``proxmox_nodes``; a host of the
  inventory; the node's PVE name is that host's ``pve_gpu_container_pve_node``, else its ``proxmox_node``, else its
  short name (the role pve_gpu_container's default);
- its server: ``sglang_server_cluster_group`` names an inventory group whose hosts, in inventory order, are the
  containers of one multi-node server (node rank = position); each must be a GPU container;
- ``pve_gpu_container_adopt`` (true: recover may act on it untagged) and ``gpu_recover_eda_relaunch`` (true: an
  unattended recovery may relaunch it), true or false.

A VMID declared by two hosts is refused too (VMIDs are unique in a Proxmox VE cluster). Every problem is reported
at once, each naming the host and the variable to set; nothing is changed before.

The GPU containers are the hosts of the group ``sglang_containers``; a run that names its own (deploy.yml's
``deploy_containers`` pattern, recover's relaunch) reads exactly those hosts (``containers``): each is checked, and a
server's other members need only be hosts of the group or of the run. :data:`INVENTORY_NAMES` declares every
inventory variable read here: the extra-variable allow-list and the inventory check (deploy/playbook_inputs.py) take
them from it.

No Ansible imports: the inputs are plain mappings, the way a filter gets ``groups`` and ``hostvars`` and the way
``ansible-inventory --list`` prints them (:func:`groups_from_list`). Unit-tested in
tests/unit/plugins/module_utils/common/test_gpu_inventory.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence

from ansible_collections.inferops.gpu_inference.plugins.module_utils.common.errors import InferopsError

CONTAINERS_GROUP = "sglang_containers"
NODES_GROUP = "proxmox_nodes"
# Proxmox VE's guest IDs (pve-container / qemu-server, format pve-vmid): 100 to 999999999.
VMID_MIN = 100
VMID_MAX = 999_999_999

#: The inventory variables the model reads (name: what it is), the one declaration: the extra-variable allow-list of
#: a playbook that reads the model, and the check of the inventory's names (deploy/playbook_inputs.py), take them
#: from here.
VMID_VARS = ("pve_gpu_container_vmid", "proxmox_vmid")
NODE_HOST_VAR = "pve_gpu_container_node_host"
NODE_NAME_VARS = ("pve_gpu_container_pve_node", "proxmox_node")
CLUSTER_VAR = "sglang_server_cluster_group"
ADOPT_VAR = "pve_gpu_container_adopt"
EDA_RELAUNCH_VAR = "gpu_recover_eda_relaunch"
INVENTORY_NAMES = {
    "pve_gpu_container_vmid": "a container's VMID (before proxmox_vmid)",
    "proxmox_vmid": "a container's VMID (when pve_gpu_container_vmid is not given)",
    NODE_HOST_VAR: "the inventory host of a container's node (default: the first host of proxmox_nodes)",
    "pve_gpu_container_pve_node": "a node's Proxmox VE name (before proxmox_node)",
    "proxmox_node": "a node's Proxmox VE name (when pve_gpu_container_pve_node is not given; default its short name)",
    CLUSTER_VAR: "the group of a multi-node server's containers",
    ADOPT_VAR: "true: the container may be taken over (and recovered) without the PVE tag",
    EDA_RELAUNCH_VAR: "true: an unattended recovery may relaunch the container",
}

_TRUE = ("true", "yes", "on", "1")
_FALSE = ("false", "no", "off", "0", "")


class InventoryError(InferopsError):
    """The inventory's GPU containers are not usable as declared; the message names each host and what to set."""


@dataclass(frozen=True)
class GpuContainer:
    """One GPU container of the inventory."""

    host: str
    vmid: int
    node_host: str
    node: str
    cluster_group: str = ""
    cluster: tuple = ()
    node_rank: int = 0
    adopt: bool = False
    eda_relaunch: bool = False

    @property
    def nnodes(self) -> int:
        return max(1, len(self.cluster))

    def as_dict(self) -> dict[str, Any]:
        return {"host": self.host, "vmid": self.vmid, "node_host": self.node_host, "node": self.node,
                "cluster_group": self.cluster_group, "cluster": list(self.cluster), "node_rank": self.node_rank,
                "nnodes": self.nnodes, "adopt": self.adopt, "eda_relaunch": self.eda_relaunch}


@dataclass(frozen=True)
class GpuInventory:
    """The inventory's GPU containers (inventory order) and their nodes ({node host: PVE node name})."""

    containers: tuple = ()
    nodes: Mapping[str, str] = field(default_factory=dict)

    def host(self, name: str) -> GpuContainer:
        for ct in self.containers:
            if ct.host == name:
                return ct
        raise InventoryError("%s is not a host of the group %s, so not a GPU container of the inventory: add it to the "
                             "group (with proxmox_vmid), or name one of %s." % (name, CONTAINERS_GROUP, _names(self.containers)))

    def on_node(self, node_host: str) -> list[GpuContainer]:
        return [ct for ct in self.containers if ct.node_host == node_host]

    def as_dict(self) -> dict[str, Any]:
        cts = [ct.as_dict() for ct in self.containers]
        return {"containers": cts, "by_host": {c["host"]: c for c in cts},
                "nodes": {host: {"name": name, "containers": [c["host"] for c in cts if c["node_host"] == host]}
                          for host, name in self.nodes.items()}}


def _names(containers: Sequence[GpuContainer]) -> str:
    return ", ".join(ct.host for ct in containers) or "none"


def _blank(value: Any) -> bool:
    return value is None or (isinstance(value, str) and not value.strip())


def vmid_problem(value: Any) -> Optional[str]:
    """Why ``value`` is not a Proxmox VE guest ID (None when it is one)."""
    if isinstance(value, bool) or isinstance(value, float) and not value.is_integer():
        return "must be an integer between %d and %d, got %r" % (VMID_MIN, VMID_MAX, value)
    try:
        number = int(str(value).strip()) if not isinstance(value, (int, float)) else int(value)
    except ValueError:
        return "must be an integer between %d and %d, got %r" % (VMID_MIN, VMID_MAX, value)
    if not VMID_MIN <= number <= VMID_MAX:
        return "must be between %d and %d (a Proxmox VE guest ID), got %d" % (VMID_MIN, VMID_MAX, number)
    return None


def vmid(value: Any, what: str = "VMID") -> int:
    """``value`` as a Proxmox VE guest ID; InventoryError naming ``what`` otherwise."""
    problem = vmid_problem(value)
    if problem:
        raise InventoryError("%s %s" % (what, problem))
    return int(str(value).strip()) if not isinstance(value, (int, float)) else int(value)


def _flag(host: str, name: str, value: Any, problems: list[str]) -> bool:
    if isinstance(value, bool):
        return value
    if value is None:
        return False
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text not in _FALSE:
        problems.append("%s: %s must be true or false, got %r" % (host, name, value))
    return False


def node_name(node_host: str, node_vars: Mapping[str, Any]) -> str:
    """The PVE name (/nodes/<node>) of the inventory's node ``node_host``: its pve_gpu_container_pve_node, else its
    proxmox_node, else its short name (the host name up to the first dot), as the role pve_gpu_container defaults it."""
    for key in NODE_NAME_VARS:
        value = node_vars.get(key)
        if not _blank(value):
            return str(value).strip()
    return str(node_host).split(".", maxsplit=1)[0]


def _vars(hostvars: Mapping[str, Any], host: str) -> Mapping[str, Any]:
    try:
        found = hostvars[host]
    except KeyError:
        return {}
    return found if isinstance(found, Mapping) else {}


def _given(host_vars: Mapping[str, Any], *names: str) -> tuple[Optional[str], Any]:
    """The first of ``names`` the host gives a non-blank value, and that value."""
    for name in names:
        value = host_vars.get(name)
        if not _blank(value):
            return name, value
    return None, None


def gpu_inventory(groups: Mapping[str, Sequence[str]], hostvars: Mapping[str, Any],
                  containers: Optional[Sequence[str]] = None) -> GpuInventory:
    """The GPU containers of the inventory ``groups`` ({group: [host]}, as Ansible's ``groups``; ``all`` lists every
    host) with ``hostvars`` ({host: {variable: value}}), checked; InventoryError listing every problem otherwise.

    ``containers``: the container hosts of a run (a deploy's own pattern), read instead of the group
    ``sglang_containers``; the members of their multi-node servers may then be hosts of either."""
    if not isinstance(groups, Mapping):
        raise InventoryError("the inventory's groups must be a mapping of group names to hosts, got %s" % type(groups).__name__)
    if containers is not None and (isinstance(containers, (str, bytes)) or not isinstance(containers, Sequence)):
        raise InventoryError("the run's containers must be a list of inventory hosts, got %s" % type(containers).__name__)
    all_hosts = set(_hosts(groups, "all")) | {h for g in groups.values() for h in (g or []) if isinstance(g, (list, tuple))}
    node_hosts = _hosts(groups, NODES_GROUP)
    hosts = _hosts(groups, CONTAINERS_GROUP) if containers is None else list(dict.fromkeys(str(h) for h in containers))
    known = set(hosts) | set(_hosts(groups, CONTAINERS_GROUP))
    problems: list[str] = []
    found: list[dict[str, Any]] = []
    for host in hosts:
        hv = _vars(hostvars, host)
        name, raw = _given(hv, *VMID_VARS)
        number = None
        if name is None:
            problems.append("%s: no VMID: set proxmox_vmid (or pve_gpu_container_vmid) to the container's ID, an integer "
                            "between %d and %d" % (host, VMID_MIN, VMID_MAX))
        else:
            problem = vmid_problem(raw)
            if problem:
                problems.append("%s: its VMID (%s) %s: set %s to the container's ID" % (host, name, problem, name))
            else:
                number = vmid(raw)
                # The connection (pct_remote) enters proxmox_vmid's container whatever the role configures.
                other = hv.get(VMID_VARS[1])
                if name == VMID_VARS[0] and not _blank(other) and not vmid_problem(other) and vmid(other) != number:
                    problems.append("%s: %s is %d but %s is %d: the node would configure CT %d while the connection "
                                    "(pct_remote) enters CT %d. Give one VMID: set %s alone, or both to the same ID"
                                    % (host, VMID_VARS[0], number, VMID_VARS[1], vmid(other), number, vmid(other),
                                       VMID_VARS[1]))
        node = _given(hv, NODE_HOST_VAR)[1]
        if node is None:
            node = node_hosts[0] if node_hosts else None
        if node is None:
            problems.append("%s: no node: set pve_gpu_container_node_host to the inventory name of the Proxmox VE node "
                            "that holds it, or put the node in the group %s" % (host, NODES_GROUP))
        elif str(node) not in all_hosts:
            problems.append("%s: pve_gpu_container_node_host %r is not a host of the inventory: name the node's inventory "
                            "host (nodes here: %s)" % (host, str(node), ", ".join(node_hosts) or "none"))
        group = _given(hv, CLUSTER_VAR)[1]
        found.append({"host": host, "vmid": number, "node_host": None if node is None else str(node),
                      "cluster_group": "" if group is None else str(group).strip(),
                      "adopt": _flag(host, ADOPT_VAR, hv.get(ADOPT_VAR), problems),
                      "eda_relaunch": _flag(host, EDA_RELAUNCH_VAR, hv.get(EDA_RELAUNCH_VAR), problems)})
    by_host = {f["host"]: f for f in found}
    by_vmid: dict[int, list[str]] = {}
    for f in found:
        if f["vmid"] is not None:
            by_vmid.setdefault(f["vmid"], []).append(f["host"])
    for number, hosts in sorted(by_vmid.items()):
        if len(hosts) > 1:
            problems.append("%s: VMID %d is declared by each of them; VMIDs are unique in a Proxmox VE cluster: give each "
                            "container its own proxmox_vmid" % (", ".join(hosts), number))
    for f in found:
        group = f["cluster_group"]
        if not group:
            f["cluster"] = ()
            continue
        if group not in groups:
            problems.append("%s: sglang_server_cluster_group %r is not a group of the inventory: name the group of the "
                            "server's containers, or unset it for a server in one container" % (f["host"], group))
            f["cluster"] = ()
            continue
        members = tuple(_hosts(groups, group))
        f["cluster"] = members
        if f["host"] not in members:
            problems.append("%s: it is not in its sglang_server_cluster_group %s (%s): add it to the group, or unset the "
                            "variable" % (f["host"], group, ", ".join(members) or "no host"))
        outside = [m for m in members if m not in known]
        if outside and f["host"] == next((m for m in members if m in by_host), None):
            problems.append("%s: the server %s has member(s) %s that are not GPU containers (hosts of %s with "
                            "proxmox_vmid): put them in %s, or take them out of %s"
                            % (f["host"], group, ", ".join(outside), CONTAINERS_GROUP, CONTAINERS_GROUP, group))
    if problems:
        raise InventoryError("the inventory's GPU containers are not usable: %s. Nothing has been changed."
                             % "; ".join(problems))
    nodes = {h: node_name(h, _vars(hostvars, h)) for h in node_hosts}
    for f in found:
        nodes.setdefault(f["node_host"], node_name(f["node_host"], _vars(hostvars, f["node_host"])))
    containers = tuple(GpuContainer(host=f["host"], vmid=f["vmid"], node_host=f["node_host"], node=nodes[f["node_host"]],
                                    cluster_group=f["cluster_group"], cluster=f["cluster"],
                                    node_rank=list(f["cluster"]).index(f["host"]) if f["cluster"] else 0,
                                    adopt=f["adopt"], eda_relaunch=f["eda_relaunch"]) for f in found)
    return GpuInventory(containers=containers, nodes=nodes)


def _hosts(groups: Mapping[str, Any], name: str) -> list[str]:
    hosts = groups.get(name) or []
    if isinstance(hosts, (str, bytes)) or not isinstance(hosts, Sequence):
        return []
    return [str(h) for h in hosts]


def groups_from_list(inventory: Mapping[str, Any]) -> tuple[dict[str, list[str]], dict[str, Any]]:
    """``ansible-inventory --list`` output as (groups, hostvars): each group's hosts with its children's, in order
    (as Ansible's ``groups``), ``all`` every host; hostvars from ``_meta``."""
    hostvars = dict((inventory.get("_meta") or {}).get("hostvars") or {})

    def members(group: str, seen: set) -> list[str]:
        if group in seen:
            return []
        seen.add(group)
        g = inventory.get(group) or {}
        out = [str(h) for h in g.get("hosts") or []]
        for child in g.get("children") or []:
            out += [h for h in members(child, seen) if h not in out]
        return out

    groups = {name: members(name, set()) for name in inventory if name != "_meta"}
    everyone = list(groups.get("all") or [])
    for hosts in list(groups.values()) + [list(hostvars)]:
        everyone += [h for h in hosts if h not in everyone]
    groups["all"] = everyone
    return groups, hostvars
