# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""What recover.yml may act on: which container, and which GPUs are that container's (docs/recover.md, "Scope").

No Ansible imports. Every function decides from data it is given (the inventory's declarations, the texts of
``pct list`` / ``pct config``, the baseline) and raises ScopeError, with what to do, when recovery must not start.

- The target must be a GPU container the inventory declares on this node (a host of sglang_containers whose
  VMID is the target and whose node is this one), or the operator names it with the explicit override.
- The container's GPUs are what ``pct config`` says now. A baseline that names other GPUs is stale (the
  container was reconfigured since deploy recorded it): judging or resetting by it could touch GPUs that are now
  another container's, so recovery refuses and says how to re-record it. A failing ``pct config`` means the
  GPUs are unknown, and unknown is not clean: refused as well.
- A GPU reset (rung 5) never includes a GPU that another running container has as ``devN``; an NVLink group
  that would pull one in is refused whole (nvidia-smi(1), --gpu-reset: NVLink peers are reset together).
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Optional, Sequence
from ansible_collections.inferops.gpu_inference.plugins.module_utils.common.errors import InferopsError

from ansible_collections.inferops.gpu_inference.plugins.module_utils.common.gpu_inventory import vmid_problem


class ScopeError(InferopsError):
    """Recovery must not start (or this action must not run); the message says why and what to do."""


def _vmid(value: Any) -> Optional[int]:
    """``value`` as a VMID (gpu_inventory's rule), None when it is not one."""
    return None if value is None or vmid_problem(value) else int(str(value).strip())


def declared_on_node(declared: Iterable[Mapping[str, Any]], node: str) -> dict[int, str]:
    """{VMID: inventory host} of the containers the inventory declares on ``node``.

    Each entry is {"host", "vmid", "node_host"} as recover.yml reads them from the inventory (the same
    variables deploy.yml uses: pve_gpu_container_vmid or proxmox_vmid, pve_gpu_container_node_host).
    """
    found: dict[int, str] = {}
    for entry in declared or []:
        vmid = _vmid(entry.get("vmid"))
        if vmid is not None and str(entry.get("node_host") or "") == node:
            found.setdefault(vmid, str(entry.get("host")))
    return found


def check_target(vmid: int, node: str, declared: Iterable[Mapping[str, Any]], allow_undeclared: bool) -> dict[str, Any]:
    """The target, or ScopeError when the inventory does not declare it on this node and no override names it."""
    mine = declared_on_node(declared, node)
    if vmid in mine:
        adopt = any(_vmid(e.get("vmid")) == vmid and str(e.get("node_host") or "") == node and str(e.get("host")) == mine[vmid]
                    and _bool(e.get("adopt")) for e in declared or [])
        return {"vmid": vmid, "declared_as": mine[vmid], "override": False, "adopt": adopt}
    if allow_undeclared:
        return {"vmid": vmid, "declared_as": None, "override": True, "adopt": False}
    listed = ", ".join("%d (%s)" % (v, h) for v, h in sorted(mine.items())) or "none"
    raise ScopeError(
        "CT %d is not a GPU container the inventory declares on %s (declared there: %s). recover.yml acts only on "
        "those, so that a mistyped VMID never stops, kills in or resets another tenant's container. If CT %d is "
        "yours and must be recovered although deploy.yml does not manage it, name it explicitly: "
        "-e recover_vmid=%d -e recover_allow_undeclared=true. Nothing has been changed." % (vmid, node, listed, vmid, vmid))


def _bool(value: Any) -> bool:
    return value is True or str(value).strip().lower() in ("true", "yes", "on", "1")


def check_owner(vmid: int, node: str, tags: Sequence[str], owner_tag: Optional[str], adopt: bool) -> dict[str, Any]:
    """The container carries ``owner_tag`` (deploy.yml puts it on every container it makes or adopts), or its
    inventory host opts in with pve_gpu_container_adopt (deploy.yml's own opt-in); ScopeError otherwise: a VMID
    destroyed and made again by someone else, with the same GPUs, must not be stopped, killed in or reset."""
    tags = [str(t) for t in tags]
    if not owner_tag or owner_tag in tags:
        return {"tag": owner_tag, "tagged": bool(owner_tag), "adopted": False}
    if adopt:
        return {"tag": owner_tag, "tagged": False, "adopted": True}
    raise ScopeError(
        "CT %d on %s does not carry the PVE tag %r that marks the containers this collection manages (its tags: %s): "
        "it may not be the container the inventory declares (a VMID destroyed and made again by someone else), and "
        "recovery would stop it, kill its processes and reset its GPUs. Check the VMID on the node (pct config %d). "
        "If it is yours, run deploy.yml for it (with pve_gpu_container_adopt=true for its host, which adds the tag), "
        "or set pve_gpu_container_adopt=true for its inventory host to recover it untagged. Nothing has been "
        "changed." % (vmid, node, owner_tag, ";".join(tags) or "none", vmid))


def container_gpus(vmid: int, config_rc: int, config_gpus: Sequence[int], config_error: str,
                   baseline_gpus: Optional[Sequence[int]], baseline_path: str) -> dict[str, Any]:
    """The container's GPUs from ``pct config`` now, checked against the baseline; ScopeError when unknown or stale."""
    if config_rc != 0:
        raise ScopeError(
            "pct config %d failed (%s): the container's GPUs are unknown, and unknown is not clean. Recovery needs "
            "them to judge and reset the right GPUs; fix what pct reports (a lock: `pct unlock %d` once no task "
            "runs; a missing container: check the VMID), then run recover again. Nothing has been changed."
            % (vmid, config_error.strip() or "rc %d" % config_rc, vmid))
    gpus = sorted(set(int(g) for g in config_gpus))
    if baseline_gpus is not None and baseline_gpus and sorted(set(int(g) for g in baseline_gpus)) != gpus:
        raise ScopeError(
            "the baseline %s is stale: it was recorded for GPUs %s, but pct config %d now passes GPUs %s. Judging or "
            "resetting by it could touch GPUs that are now another container's. Record it again for the GPUs it has "
            "now: add -e recover_record_baseline=true (recover judges without it and, once everything else is clean, "
            "records it at idle), or run playbooks/deploy.yml for this container. Nothing has been changed."
            % (baseline_path, sorted(set(int(g) for g in baseline_gpus)), vmid, gpus))
    return {"gpus": gpus, "from": "pct config devN"}


def reset_conflicts(groups: Sequence[Sequence[int]], vmid: int,
                    other_gpus: Mapping[int, Sequence[int]]) -> list[dict[str, Any]]:
    """For each reset group, the other running containers that have one of its GPUs as devN.

    ``other_gpus``: {VMID: [GPU index]} of the node's other running containers. Returns
    [{"gpus": group, "containers": {vmid: [gpu]}}] for the groups that must not be reset.
    """
    refused = []
    for group in groups:
        hit = {other: sorted(set(group) & set(gpus)) for other, gpus in sorted(other_gpus.items())
               if other != vmid and set(group) & set(gpus)}
        if hit:
            refused.append({"gpus": list(group), "containers": hit})
    return refused


def describe_conflict(conflict: Mapping[str, Any]) -> str:
    return "GPU(s) %s are passed to running %s: a reset would take them from under it" % (
        list(conflict["gpus"]), ", ".join("CT %d (GPU %s)" % (v, ", ".join(str(g) for g in gpus))
                                          for v, gpus in conflict["containers"].items()))


def recover_targets(containers: Iterable[Mapping[str, Any]], vmid: Any) -> dict[str, Any]:
    """The containers recover.yml acts on for ``recover_vmid``: that one, or every container of its multi-node server.

    ``containers`` are the inventory's GPU containers as module_utils/common/gpu_inventory.py builds and checks them (each
    {"host", "vmid", "node_host", "cluster_group", "cluster", ...}; ``cluster`` is the hosts of its
    sglang_server_cluster_group in inventory order, the node ranks, empty without one; VMIDs unique, every member a
    container). A server over several containers is one server (docs/recover.md, "A server on several nodes"):
    recovering one half leaves the other half's ranks blocked in a collective that never completes (or failing the
    server on their own), so every container of the group is recovered, each on its own node, and relaunched
    together. Returns {"group": name or None, "targets": [{"host", "vmid", "node_host", "node_rank"}],
    "vmid_by_node": {node_host: vmid}, "vmid_problem": why recover_vmid is not a VMID, or None}: no target when
    ``vmid`` is not a VMID (recover.yml's check then says what to pass) or the inventory does not declare it (the
    scope check of each node then decides, with the override).
    """
    problem = vmid_problem(vmid) if vmid is not None else "is required"
    if problem:
        return dict(_scope(None, []), vmid_problem="recover_vmid %s" % problem)
    wanted = _vmid(vmid)
    entries = [dict(e) for e in containers or []]
    by_host = {str(e.get("host")): e for e in entries}
    mine = [e for e in entries if _vmid(e.get("vmid")) == wanted]
    if not mine:
        return _scope(None, [])
    target = mine[0]
    members = [str(h) for h in target.get("cluster") or []]
    if len(members) <= 1:
        return _scope(None, [_target(target, 0)])
    group = str(target.get("cluster_group") or "")
    targets = [_target(by_host[host], rank) for rank, host in enumerate(members)]
    nodes: dict[str, str] = {}
    for t in targets:
        if t["node_host"] in nodes:
            raise ScopeError(
                "the server %s has two containers on node %s (%s and %s): recover.yml recovers one container per node "
                "in one run, and a server over several containers puts each on its own node (one container can have "
                "every GPU of a node). Recover each with -e recover_node=%s -e recover_vmid=<VMID>. Nothing has "
                "been changed." % (group, t["node_host"], nodes[t["node_host"]], t["host"], t["node_host"]))
        nodes[t["node_host"]] = t["host"]
    return _scope(group, targets)


def relaunch_hosts(plan: Mapping[str, Any], verdicts: Mapping[str, Any], relaunch: bool, one_node: bool,
                   check_mode: bool) -> list[str]:
    """The container hosts recover.yml hands to deploy.yml (recover_relaunch): none unless ``relaunch`` is asked,
    the run changes things (not ``check_mode``) and every node of the run has the verdict Clean (``verdicts``:
    {node host: its verdict, None when it has none: a node that failed or was unreachable}); a multi-node server
    comes back only whole. ``one_node``: recover_node named the node, so only its container (the first target)."""
    if not relaunch or check_mode or not verdicts:
        return []
    if any(v != "Clean" for v in verdicts.values()):
        return []
    hosts = [str(t["host"]) for t in plan.get("targets") or []]
    return hosts[:1] if one_node else hosts


def _scope(group: Optional[str], targets: list[dict[str, Any]]) -> dict[str, Any]:
    """recover_targets' result; ``vmid_by_node``: the container each node's play recovers (one per node)."""
    return {"group": group, "targets": targets,
            "vmid_by_node": {t["node_host"]: t["vmid"] for t in targets if t["node_host"]}, "vmid_problem": None}


def _target(entry: Mapping[str, Any], rank: int) -> dict[str, Any]:
    return {"host": str(entry.get("host")), "vmid": _vmid(entry.get("vmid")),
            "node_host": str(entry.get("node_host") or ""), "node_rank": rank}
