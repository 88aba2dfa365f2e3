"""The node this process acts as (its name: set_node; the paths that follow from it), the lab's fixed paths,
PVE's release, and the API's errors (PVEError).

Part of the simulated PVE node (tests/lab/pve/__init__.py).
"""
from __future__ import annotations

import os


# The lab's entry point, through which a task's worker runs (`labctl task-worker`).
LABCTL = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "labctl")

# The lab's cluster (docs/lab.md, "Two nodes"): each node's name and its address (API on <address>:8006, sshd on
# <address>:2222). Which of them form the cluster is what /etc/pve/corosync.conf lists (labctl up writes it; without
# it pve1 is a node without a cluster). The process's own node: INFEROPS_LAB_NODE (api.py --node sets it; pve2's sshd
# sets it for its sessions, so `pct` over SSH to pve2 is pve2's), else pve1.
NODE_ADDRESSES = {"pve1": "127.0.0.1", "pve2": "127.0.0.2"}
CLUSTER_NAME = "inferops-lab"
NODE = os.environ.get("INFEROPS_LAB_NODE") or "pve1"
if NODE not in NODE_ADDRESSES:
    raise SystemExit(f"INFEROPS_LAB_NODE={NODE!r}: the lab's nodes are {', '.join(NODE_ADDRESSES)}")
LAB = "/var/lib/inferops-lab"
RUN = "/run/inferops-lab"
PVE_ETC = "/etc/pve"
CONF_DIR = f"{PVE_ETC}/nodes/{NODE}/lxc"
COROSYNC_CONF = f"{PVE_ETC}/corosync.conf"
VMLIST = f"{PVE_ETC}/.vmlist"
LXC_DIR = "/var/lib/lxc"
VZ_DIR = "/var/lib/vz"
TMPL_DIR = f"{VZ_DIR}/template/cache"
TASK_DIR = f"{LAB}/tasks"
LOCK_DIR = "/run/lock/lxc"
BRIDGE = "vmbr0"
BRIDGE_ADDR = "10.77.0.1/24"
NVIDIA_RUN = "/run/nvidia-lab"
# pve-manager 9.1.9 (ee7bad0a, "bump version to 9.1.9", 2026-04-21): the release current when pve-docs dumped the
# schema the lab serves (apidata-slice.json, a8736b6 of 2026-04-30). PVE's repoid is the release commit's prefix.
PVE_VERSION = {"version": "9.1.9", "release": "9.1", "repoid": "ee7bad0a3d1546c9"}
MIB = 1024 * 1024
CLI_PATH = "/sbin:/bin:/usr/sbin:/usr/bin"
# Storages of the simulated node: both are plain directories (docs/lab.md, "Storage").
STORAGES = {
    "local": {"type": "dir", "path": VZ_DIR, "content": "vztmpl,iso,backup,rootdir,images"},
    "local-lvm": {"type": "lvmthin", "path": f"{VZ_DIR}/lab-lvm", "content": "rootdir,images"},
}
LOCK_VALUES = {"backup", "create", "destroyed", "disk", "fstrim", "migrate", "mounted", "rollback",
               "snapshot", "snapshot-delete"}


class PVEError(Exception):
    """An error as PVE reports it: HTTP code, message, optional per-parameter errors."""

    def __init__(self, msg: str, code: int = 500, errors: dict | None = None):
        super().__init__(msg)
        self.msg = msg
        self.code = code
        self.errors = errors


def param_error(errors: dict) -> PVEError:
    # PVE::Exception::raise_param_exc: code 400, "Parameter verification failed."
    return PVEError("Parameter verification failed.", 400, errors)


def perm_error(what: str) -> PVEError:
    # PVE::Exception::raise_perm_exc: code 403, "Permission check failed (<what>)"
    return PVEError(f"Permission check failed ({what})", 403)


def set_node(name: str) -> None:
    """Makes this process node `name` (api.py --node); its task workers inherit it through the environment."""
    global NODE, CONF_DIR
    if name not in NODE_ADDRESSES:
        raise ValueError(f"unknown lab node {name!r}")
    NODE = name
    CONF_DIR = f"{PVE_ETC}/nodes/{NODE}/lxc"
    os.environ["INFEROPS_LAB_NODE"] = name


def conf_dir(node: str | None = None) -> str:
    return CONF_DIR if node is None or node == NODE else f"{PVE_ETC}/nodes/{node}/lxc"


def conf_path(vmid: int, node: str | None = None) -> str:
    return f"{conf_dir(node)}/{int(vmid)}.conf"
