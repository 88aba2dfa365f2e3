# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The node's processes as the recovery ladder reads them (read-only): the /proc parsers (stat, status, mountinfo,
fdinfo, devices), which container a process belongs to (its /proc/PID/cgroup), what it holds (/dev/nvidia* by
device kind), where a task in D state sleeps (FUSE, NFS, the NVIDIA driver), the host-wide process scan, FUSE
connections and leftover /dev/shm segments. What pct and systemd say is in recover_pve, the actions that change
the system in recover_signals.

No Ansible imports. Collectors take a ``root`` prefix (default ``/``) so the unit tests can lay out a fake
``/proc``; unit-tested in tests/unit/plugins/module_utils/test_recover_procs.py.

Sources are in docs/recover.md: host PIDs mapped to a container through /proc/PID/cgroup (the driver reports host
PIDs, NVIDIA/nvidia-docker#1483; PVE's lxc/<vmid> cgroup layout, pve-container src/PVE/LXC.pm
update_lxc_config), D state on FUSE vs in the NVIDIA driver (H Company, "VRAM Ghost Busting";
NVIDIA/open-gpu-kernel-modules#456).
"""

from __future__ import annotations

import os
import re
from typing import Any, Callable, Iterable, Optional, Sequence, Union

from ansible_collections.inferops.gpu_inference.plugins.module_utils.gpu_facts import NVIDIA_MAJOR, list_nvidia_devices
from ansible_collections.inferops.gpu_inference.plugins.module_utils.procfs import join_root, parse_proc_cgroup, read_text

NVIDIACTL_MINOR = 255
NVIDIA_MODESET_MINOR = 254

# Kernel symbols that put a task in the NVIDIA driver or in FUSE (wchan or a /proc/PID/stack frame).
_NVIDIA_SYMBOL_RE = re.compile(r"(?:^|[\s\]])(?:nv_|nvidia|uvm_|_nv\d|os_acquire|rm_)", re.IGNORECASE)
_NVIDIA_MODULE_RE = re.compile(r"\[(?:nvidia|nvidia_uvm|nvidia_modeset|nvidia_drm|nvidia_peermem)\]")
_FUSE_SYMBOL_RE = re.compile(r"(?:^|[\s\]])(?:fuse_|request_wait_answer|__fuse_)|\[fuse\]")
_NFS_SYMBOL_RE = re.compile(r"(?:^|[\s\]])(?:nfs_|nfs4_|rpc_wait_bit_killable|__rpc_)")

# cgroup path components that name an LXC container: PVE (lxc.cgroup.dir.container = lxc/<vmid>),
# LXC's own default (lxc.payload.<name>, and lxc.payload/<name> in some 4.x releases), and the
# legacy v1 layout /lxc/<name>. "lxc.monitor/<vmid>" is the monitor, not the container.
_CT_CGROUP_RES = (
    re.compile(r"(?:^|/)lxc/(\d+)(?:/|$)"),
    re.compile(r"(?:^|/)lxc\.payload[./](\d+)(?:/|$)"),
)

SHM_LEFTOVER_RE = re.compile(r"^(?:nccl-|psm_|sgl_|sglang|torch_)")


# --------------------------------------------------------------------------- which container, which process


def _readlink(path: str) -> Optional[str]:
    try:
        return os.readlink(path)
    except OSError:
        return None


def list_pids(root: str = "/") -> list[int]:
    try:
        names = os.listdir(join_root(root, "/proc"))
    except OSError:
        return []
    return sorted(int(n) for n in names if n.isdigit())


def container_of_cgroup(text: Optional[str]) -> Optional[int]:
    """VMID of the LXC container a /proc/PID/cgroup text belongs to, or None for a host process.

    Works for cgroup v2 (``0::/lxc/129/ns/system.slice/x.service``), the v1 hierarchies of a hybrid host
    (``4:memory:/lxc/129/ns``) and LXC's ``lxc.payload.<vmid>`` naming, on any line. A process whose lines name two
    different containers is reported as None (it is not safely attributable).
    """
    vmids = set()
    for path in parse_proc_cgroup(text).values():
        for regex in _CT_CGROUP_RES:
            match = regex.search(path)
            if match:
                vmids.add(int(match.group(1)))
                break
    return vmids.pop() if len(vmids) == 1 else None


def in_unit(text: Optional[str], unit: str) -> bool:
    """Whether a /proc/PID/cgroup text puts the process in the systemd unit ``unit`` (its cgroup, or one below it:
    ``.../system.slice/sglang.service`` or ``.../sglang.service/...``), on the v2 line or the v1 ``name=systemd`` one."""
    if not unit:
        return False
    for path in parse_proc_cgroup(text).values():
        parts = path.strip("/").split("/")
        if unit in parts:
            return True
    return False


def container_of_pid(pid: int, root: str = "/") -> Union[int, str]:
    """Who a host PID (an nvidia-smi compute app) belongs to: the VMID of its container, "host", or "gone" when its
    /proc/PID/cgroup cannot be read (the process has exited)."""
    text = read_text(join_root(root, "/proc/%d/cgroup" % pid))
    if text is None:
        return "gone"
    vmid = container_of_cgroup(text)
    return vmid if vmid is not None else "host"


def parse_stat(text: Optional[str]) -> Optional[dict[str, Any]]:
    """/proc/PID/stat: pid, comm, state, ppid, pgid, sid, starttime (clock ticks since boot)."""
    if not text:
        return None
    left, sep, right = text.rpartition(")")
    if not sep:
        return None
    pid_s, _sp, comm = left.partition(" (")
    fields = right.split()
    if len(fields) < 20:
        return None
    try:
        return {
            "pid": int(pid_s),
            "comm": comm,
            "state": fields[0],
            "ppid": int(fields[1]),
            "pgid": int(fields[2]),
            "sid": int(fields[3]),
            "starttime": int(fields[19]),
        }
    except ValueError:
        return None


def read_stat(pid: int, root: str = "/") -> Optional[dict[str, Any]]:
    """``parse_stat`` of /proc/PID/stat, or None when the process is gone."""
    return parse_stat(read_text(join_root(root, "/proc/%d/stat" % pid)))


def is_alive(pid: int, starttime: Optional[int], root: str = "/") -> Optional[dict[str, Any]]:
    """The stat of ``pid`` when it is still the process that started at ``starttime`` (any, when None) and not a
    zombie; else None (gone, or the PID was reused)."""
    st = read_stat(pid, root)
    if st is None or st["state"] in ("Z", "X") or (starttime is not None and st["starttime"] != starttime):
        return None
    return st


def parse_nspid(status_text: Optional[str]) -> list[int]:
    """The NSpid line of /proc/PID/status (outermost first; the last one is the in-container PID)."""
    for line in (status_text or "").splitlines():
        if line.startswith("NSpid:"):
            try:
                return [int(x) for x in line.split()[1:]]
            except ValueError:
                return []
    return []


def parse_mountinfo(text: Optional[str]) -> list[dict[str, Any]]:
    """/proc/PID/mountinfo lines: mount_id, major, minor, mount_point, fstype, source, super_options."""
    mounts: list[dict[str, Any]] = []
    for line in (text or "").splitlines():
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        lf = left.split()
        rf = right.split()
        if len(lf) < 5 or len(rf) < 2:
            continue
        try:
            major_s, minor_s = lf[2].split(":")
            mounts.append(
                {
                    "mount_id": int(lf[0]),
                    "major": int(major_s),
                    "minor": int(minor_s),
                    "mount_point": lf[4],
                    "fstype": rf[0],
                    "source": rf[1],
                    "super_options": rf[2] if len(rf) > 2 else "",
                }
            )
        except ValueError:
            continue
    return mounts


def parse_fdinfo_mnt_id(text: Optional[str]) -> Optional[int]:
    for line in (text or "").splitlines():
        if line.startswith("mnt_id:"):
            try:
                return int(line.split()[1])
            except (IndexError, ValueError):
                return None
    return None


# --------------------------------------------------------------------------- process classification


def classify_stack(wchan: Optional[str], stack: Optional[str]) -> str:
    """Where a task in D state sleeps: "fuse", "nfs", "nvidia" or "unknown"."""
    text = " ".join(x for x in (wchan or "", stack or "") if x)
    if _FUSE_SYMBOL_RE.search(text):
        return "fuse"
    if _NVIDIA_MODULE_RE.search(text) or _NVIDIA_SYMBOL_RE.search(text):
        return "nvidia"
    if _NFS_SYMBOL_RE.search(text):
        return "nfs"
    return "unknown"


def classify_process(state: str, task_states: Sequence[str] = (), wchan: Optional[str] = None,
                     stack: Optional[str] = None) -> str:
    """One word for a process: ``running``, ``zombie``, ``zombie_with_threads`` (a defunct leader whose
    other threads live: it can hold GPU memory, apache/mxnet#4242), ``stuck_fuse``, ``stuck_nfs``,
    ``stuck_nvidia``, ``stuck_unknown`` (leader or any thread in D state)."""
    states = [state] + [s for s in task_states if s]
    if "D" in states:
        return "stuck_" + classify_stack(wchan, stack)
    if state in ("Z", "X"):
        live = [s for s in task_states if s not in ("Z", "X")]
        return "zombie_with_threads" if live else "zombie"
    return "running"


def nvidia_device_kind(major: int, minor: int, uvm_majors: Iterable[int] = ()) -> Optional[str]:
    """"gpu" for /dev/nvidiaN, "ctl", "modeset", "uvm" for the others, None for non-NVIDIA devices."""
    if major == NVIDIA_MAJOR:
        if minor == NVIDIACTL_MINOR:
            return "ctl"
        if minor == NVIDIA_MODESET_MINOR:
            return "modeset"
        return "gpu"
    if major in set(uvm_majors):
        return "uvm"
    return None


def parse_proc_devices(text: Optional[str]) -> list[int]:
    """Majors of the nvidia-uvm (and nvidia-caps etc.) character devices from /proc/devices."""
    majors: list[int] = []
    in_char = False
    for line in (text or "").splitlines():
        if line.startswith("Character devices"):
            in_char = True
            continue
        if line.startswith("Block devices"):
            in_char = False
            continue
        parts = line.split()
        if in_char and len(parts) == 2 and parts[0].isdigit() and parts[1].startswith("nvidia"):
            if int(parts[0]) != NVIDIA_MAJOR:
                majors.append(int(parts[0]))
    return majors


def uvm_majors(root: str = "/") -> list[int]:
    """Majors of the dynamic NVIDIA character devices (nvidia-uvm, nvidia-caps, ...): those /proc/devices
    names, plus the majors of the /dev/nvidia* nodes that exist (the nodes are what holders open)."""
    majors = set(parse_proc_devices(read_text(join_root(root, "/proc/devices"))))
    for node in list_nvidia_devices(root):
        if node["type"] == "char" and node["major"] is not None and node["major"] != NVIDIA_MAJOR:
            majors.add(node["major"])
    return sorted(majors)


# --------------------------------------------------------------------------- collectors (read-only)


def read_process(pid: int, root: str = "/", uvm_majors: Iterable[int] = (), deep: bool = True,
                 stat_fn: Callable[[str], os.stat_result] = os.stat) -> Optional[dict[str, Any]]:
    """Everything recovery needs about one host PID, or None if it is gone.

    GPU holding is judged from the fd table only (readlink first; only ``/dev/nvidia*`` targets are
    stat'ed, so a hung FUSE file is never touched). /proc/PID/maps is not read: reading it takes the
    task's mmap lock, which a stuck task may hold (unconfirmed: a reader of a stuck task's state can hang too).
    """
    base = join_root(root, "/proc/%d" % pid)
    st = read_stat(pid, root)
    if st is None:
        return None
    cgroup_text = read_text(base + "/cgroup")
    proc: dict[str, Any] = dict(st)
    proc["vmid"] = container_of_cgroup(cgroup_text)
    proc["cgroup"] = parse_proc_cgroup(cgroup_text)
    proc["nspid"] = parse_nspid(read_text(base + "/status"))
    gpus: set[int] = set()
    kinds: set[str] = set()
    fd_dir = base + "/fd"
    try:
        fds = os.listdir(fd_dir)
    except OSError:
        fds = []
    for fd in fds:
        target = _readlink(os.path.join(fd_dir, fd))
        if not target or not target.startswith("/dev/nvidia"):
            continue
        try:
            fst = stat_fn(os.path.join(fd_dir, fd))
        except OSError:
            continue
        kind = nvidia_device_kind(os.major(fst.st_rdev), os.minor(fst.st_rdev), uvm_majors)
        if kind is None:
            continue
        kinds.add(kind)
        if kind == "gpu":
            gpus.add(os.minor(fst.st_rdev))
    proc["gpu_fds"] = sorted(gpus)
    proc["nvidia_fd_kinds"] = sorted(kinds)
    proc["holds_nvidia"] = bool(kinds)
    task_states: list[str] = []
    try:
        tids = [t for t in os.listdir(base + "/task") if t.isdigit() and int(t) != pid]
    except OSError:
        tids = []
    d_tid: Optional[int] = None
    for tid in tids:
        tst = parse_stat(read_text(base + "/task/%s/stat" % tid))
        if tst:
            task_states.append(tst["state"])
            if tst["state"] == "D" and d_tid is None:
                d_tid = int(tid)
    proc["threads"] = 1 + len(tids)
    proc["task_states"] = sorted(set(task_states))
    wchan = stack = None
    if deep and (st["state"] == "D" or d_tid is not None):
        where = base if st["state"] == "D" else base + "/task/%d" % d_tid
        wchan = (read_text(where + "/wchan") or "").strip() or None
        stack = read_text(where + "/stack")
    proc["wchan"] = wchan
    proc["stack"] = [ln.strip() for ln in (stack or "").splitlines()][:16]
    proc["class"] = classify_process(st["state"], task_states, wchan, stack)
    return proc


def scan_processes(vmid: int, root: str = "/", uvm_majors: Iterable[int] = (),
                   stat_fn: Callable[[str], os.stat_result] = os.stat) -> dict[str, Any]:
    """Host-wide scan: the container's processes and every process (any owner) holding /dev/nvidia*.

    Returns {"container": [procs of vmid], "nvidia_holders": [procs holding nvidia fds, any owner],
    "all": [every process on the host]} ("all" is what ``pids_to_signal`` must judge process groups by).
    """
    container: list[dict[str, Any]] = []
    holders: list[dict[str, Any]] = []
    everyone: list[dict[str, Any]] = []
    for pid in list_pids(root):
        proc = read_process(pid, root, uvm_majors, deep=True, stat_fn=stat_fn)
        if proc is None:
            continue
        everyone.append(proc)
        if proc["vmid"] == vmid:
            container.append(proc)
        if proc["holds_nvidia"]:
            holders.append(proc)
    return {"container": container, "nvidia_holders": holders, "all": everyone}


def _is_fuse(fstype: str) -> bool:
    return fstype in ("fuse", "fuseblk") or fstype.startswith("fuse.")


def fuse_connections_of(pid: int, root: str = "/") -> list[dict[str, Any]]:
    """FUSE connections a process has files open on, found without touching the files:
    /proc/PID/fdinfo/N gives the mount id, /proc/PID/mountinfo gives that mount's fstype and
    device (``0:N``: N is the connection number under /sys/fs/fuse/connections)."""
    base = join_root(root, "/proc/%d" % pid)
    mounts = {m["mount_id"]: m for m in parse_mountinfo(read_text(base + "/mountinfo"))}
    found: dict[int, dict[str, Any]] = {}
    try:
        fds = os.listdir(base + "/fdinfo")
    except OSError:
        fds = []
    for fd in fds:
        mnt_id = parse_fdinfo_mnt_id(read_text(base + "/fdinfo/" + fd))
        mount = mounts.get(mnt_id) if mnt_id is not None else None
        if mount and _is_fuse(mount["fstype"]):
            found[mount["minor"]] = {
                "conn": mount["minor"],
                "device": "%d:%d" % (mount["major"], mount["minor"]),
                "mount_point": mount["mount_point"],
                "fstype": mount["fstype"],
                "source": mount["source"],
            }
    return [found[k] for k in sorted(found)]


def host_fuse_devices(root: str = "/") -> set[str]:
    """Devices (``major:minor``) of FUSE mounts in the host's mount namespace (PID 1's): such a
    connection is shared with the host (lxcfs is one) and must never be aborted for one container."""
    return {
        "%d:%d" % (m["major"], m["minor"])
        for m in parse_mountinfo(read_text(join_root(root, "/proc/1/mountinfo")))
        if _is_fuse(m["fstype"])
    }


def shm_leftovers(init_pid: Optional[int], root: str = "/") -> list[str]:
    """Typical leaked segments (nccl-*, psm_*, sgl_*) in the container's /dev/shm, read from the host
    through /proc/<init>/root."""
    if not init_pid:
        return []
    try:
        names = os.listdir(join_root(root, "/proc/%d/root/dev/shm" % init_pid))
    except OSError:
        return []
    return sorted(n for n in names if SHM_LEFTOVER_RE.match(n))
