"""The cluster: members (corosync.conf), the VMID list (pmxcfs' .vmlist), quorum.

Part of the simulated PVE node (tests/lab/pve/__init__.py).
"""
from __future__ import annotations

import contextlib
import json
import os
import re

from pve import pvenode


def cluster_nodes() -> list[dict]:
    """The nodelist of /etc/pve/corosync.conf (`node { name: ..  nodeid: ..  ring0_addr: .. }`), as pmxcfs reads
    it; [] without the file (a node without a cluster)."""
    try:
        with open(pvenode.COROSYNC_CONF) as f:
            text = f.read()
    except FileNotFoundError:
        return []
    nodes = []
    for block in re.findall(r"\bnode\s*\{([^}]*)\}", text):
        kv = dict(re.findall(r"^\s*([a-z0-9_]+):\s*(\S+)\s*$", block, re.M))
        if kv.get("name") in pvenode.NODE_ADDRESSES:
            nodes.append({"name": kv["name"], "nodeid": int(kv.get("nodeid", 0)), "ip": kv.get("ring0_addr", "")})
    return sorted(nodes, key=lambda n: n["nodeid"])


def api_pidfile(node: str) -> str:
    return f"{pvenode.RUN}/pve-api.pid" if node == "pve1" else f"{pvenode.RUN}/pve-api-{node}.pid"


def node_online(node: str) -> bool:
    """A lab node is online while its API daemon runs (the lab's stand-in for corosync membership)."""
    if node == pvenode.NODE:
        return True
    try:
        with open(api_pidfile(node)) as f:
            os.kill(int(f.read().split()[0]), 0)
        return True
    except (OSError, ValueError, IndexError):
        return False


def is_quorate() -> bool:
    """votequorum with one vote per node: quorate while more than half of the nodes are members."""
    nodes = cluster_nodes()
    if not nodes:
        return True
    return 2 * sum(1 for n in nodes if node_online(n["name"])) > len(nodes)


def check_cfs_quorum() -> None:
    # pve-cluster src/PVE/Cluster.pm check_cfs_quorum
    if not is_quorate():
        raise pvenode.PVEError("cluster not ready - no quorum?")


def vmlist() -> dict[int, str]:
    """The cluster's VMID list, {vmid: node}, from every node's config directory, as pmxcfs builds .vmlist."""
    res = {}
    nodes_dir = f"{pvenode.PVE_ETC}/nodes"
    for node in sorted(os.listdir(nodes_dir)) if os.path.isdir(nodes_dir) else []:
        d = f"{nodes_dir}/{node}/lxc"
        for n in os.listdir(d) if os.path.isdir(d) else []:
            if re.fullmatch(r"\d+\.conf", n):
                res.setdefault(int(n[:-5]), node)
    return res


def write_vmlist() -> None:
    """/etc/pve/.vmlist in pmxcfs' format (pve-cluster src/pmxcfs/status.c cfs_create_vmlist_msg)."""
    ids = {str(v): {"node": n, "type": "lxc", "version": 1} for v, n in sorted(vmlist().items())}
    text = json.dumps({"version": len(ids), "ids": ids}, indent=0) + "\n"
    with contextlib.suppress(OSError):
        tmp = f"{pvenode.VMLIST}.tmp.{os.getpid()}"
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, pvenode.VMLIST)


def check_vmid_unused(vmid: int) -> None:
    # pve-cluster src/PVE/Cluster.pm check_vmid_unused
    node = vmlist().get(int(vmid))
    if node is not None:
        raise pvenode.PVEError(f"CT {int(vmid)} already exists on node '{node}'")
