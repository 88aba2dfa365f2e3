# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Pure logic of the GPU recovery ladder (modules gpu_diagnose and gpu_recover_action).

No Ansible imports. Parsers take text; collectors take a ``root`` prefix (default ``/``) so
the unit tests can lay out a fake ``/proc`` and ``/sys``. Nothing here changes the system
except the three functions whose names say so (``send_signal``, ``abort_fuse_connection``,
both only called by gpu_recover_action outside check mode).

Sources for every rule are in docs/recover.md and /work/shared/reference/gpu-recovery.md
(GR): host PIDs mapped to a container through /proc/PID/cgroup (GR §1.2 a/d, proxmox-lxc
§2.1), D state on FUSE vs in the NVIDIA driver (GR §1.2 b, Rung 3), the clean gate (GR §4.3)
and the ladder (GR §6).
"""

from __future__ import annotations

import os
import re
import signal as _signal
import time
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence

from ansible_collections.inferops.gpu_inference.plugins.module_utils.gpu_facts import _join, _read, list_nvidia_devices

# --------------------------------------------------------------------------- the ladder

RUNG_CLEAN = 0
RUNG_STOP_SERVICE = 1
RUNG_KILL_HOLDERS = 2
RUNG_UNBLOCK_STUCK = 3
RUNG_STOP_CONTAINER = 4
RUNG_RESET_GPUS = 5
RUNG_REBOOT = 6

RUNG_NAMES: dict[int, str] = {
    RUNG_CLEAN: "diagnose",
    RUNG_STOP_SERVICE: "stop_service",
    RUNG_KILL_HOLDERS: "kill_holders",
    RUNG_UNBLOCK_STUCK: "unblock_stuck",
    RUNG_STOP_CONTAINER: "stop_container",
    RUNG_RESET_GPUS: "reset_gpus",
    RUNG_REBOOT: "reboot_report",
}

NVIDIA_MAJOR = 195
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

# Kernel log lines worth keeping as evidence (GR Rung 0).
KERNEL_LOG_RE = re.compile(
    r"NVRM: Xid|Out of memory|oom-kill|oom_reaper|Memory cgroup out of memory|blocked for more than|"
    r"fallen off the bus|GPU has fallen|hung_task",
    re.IGNORECASE,
)
_XID_RE = re.compile(r"NVRM: Xid \([^)]*\): (\d+)")
# Xids that mean the GPU or node needs a reset or reboot (79 fallen off the bus, 48 DBE, 119/120 GSP, 154 recovery).
REBOOT_XIDS = frozenset({48, 79, 119, 120, 154})

SHM_LEFTOVER_RE = re.compile(r"^(?:nccl-|psm_|sgl_|sglang|torch_)")

GIB = 1024**3
MIB = 1024**2


class RecoveryError(ValueError):
    """Input that does not have the expected format."""


# --------------------------------------------------------------------------- small file helpers


def _readlink(path: str) -> Optional[str]:
    try:
        return os.readlink(path)
    except OSError:
        return None


def list_pids(root: str = "/") -> list[int]:
    try:
        names = os.listdir(_join(root, "/proc"))
    except OSError:
        return []
    return sorted(int(n) for n in names if n.isdigit())


# --------------------------------------------------------------------------- parsers


def container_of_cgroup(text: Optional[str]) -> Optional[int]:
    """VMID of the LXC container a /proc/PID/cgroup text belongs to, or None for a host process.

    Works for cgroup v2 (``0::/lxc/129/ns/system.slice/x.service``), the v1 hierarchies of a
    hybrid host (``4:memory:/lxc/129/ns``) and LXC's ``lxc.payload.<vmid>`` naming. The v2 line
    wins; otherwise the first v1 hierarchy that names a container. A process whose lines name two
    different containers is reported as None (it is not safely attributable).
    """
    if not text:
        return None
    found: list[tuple[bool, int]] = []
    for line in text.splitlines():
        parts = line.strip().split(":", 2)
        if len(parts) != 3:
            continue
        hierarchy, controllers, path = parts
        for regex in _CT_CGROUP_RES:
            match = regex.search(path)
            if match:
                found.append((hierarchy == "0" and controllers == "", int(match.group(1))))
                break
    if not found:
        return None
    vmids = {vmid for _v2, vmid in found}
    if len(vmids) != 1:
        return None
    return found[0][1]


def parse_proc_cgroup(text: Optional[str]) -> dict[str, str]:
    """/proc/PID/cgroup as {controller-list or "" for v2: path}."""
    result: dict[str, str] = {}
    for line in (text or "").splitlines():
        parts = line.strip().split(":", 2)
        if len(parts) == 3:
            result[parts[1]] = parts[2]
    return result


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


def parse_pct_status(text: Optional[str]) -> dict[str, Any]:
    """``pct status <vmid> --verbose`` (or without --verbose): status and init pid."""
    result: dict[str, Any] = {"status": None, "pid": None}
    for line in (text or "").splitlines():
        key, sep, value = line.partition(":")
        if not sep:
            continue
        key, value = key.strip(), value.strip()
        if key == "status":
            result["status"] = value
        elif key == "pid" and value.isdigit():
            result["pid"] = int(value)
    return result


_DEV_GPU_RE = re.compile(r"(?:^|[=,\s])/dev/nvidia(\d+)(?:[,\s]|$)")


def parse_pct_config_gpus(text: Optional[str]) -> list[int]:
    """GPU indexes passed to a container: ``devN: /dev/nvidiaX[,opts]`` or ``path=/dev/nvidiaX`` entries,
    and raw ``lxc.mount.entry: /dev/nvidiaX ...`` lines (the pre-devN way). Snapshot sections are ignored."""
    gpus: set[int] = set()
    for raw in (text or "").splitlines():
        line = raw.strip()
        if line.startswith("["):
            break  # a snapshot or [pending] section: not the current config
        key, sep, value = line.partition(":")
        if not sep:
            continue
        key = key.strip()
        if re.fullmatch(r"dev\d+", key) or key == "lxc.mount.entry":
            for match in _DEV_GPU_RE.finditer(" " + value.strip() + " "):
                gpus.add(int(match.group(1)))
    return sorted(gpus)


# nvidia-smi --query-gpu=gpu_recovery_action (NVML nvmlDeviceGpuRecoveryAction_t): what the driver says must happen
# before the GPU can be used again (NVIDIA, "Error Recovery and Response Flags", A100 GPU memory error management).
RECOVERY_ACTION_NONE = "none"
RECOVERY_ACTIONS_REBOOT = ("reboot",)              # Node Reboot / System Reboot: the OS may be inconsistent
RECOVERY_ACTIONS_RESET = ("reset", "drain")        # GPU Reset, Drain P2P, Drain and Reset, Bus Reset


def parse_recovery_actions(rc: int, text: Optional[str], err: Optional[str] = None) -> dict[str, Any]:
    """``nvidia-smi --query-gpu=index,gpu_recovery_action --format=csv,noheader``.

    Returns {"supported": bool, "actions": {index: value or None}, "error": str or None}. A driver that does not
    know the field (older than the NVML call) says ``Field "gpu_recovery_action" is not a valid field to query``:
    supported is False (a note, not a reason). A value nvidia-smi cannot read ([N/A], [Unknown Error],
    [GPU is lost]) is None, which the gate counts as unknown, i.e. not clean.
    """
    out = (text or "") + "\n" + (err or "")
    if rc != 0:
        return {"supported": "not a valid field" not in out, "actions": {}, "error": out.strip() or "rc %d" % rc}
    actions: dict[int, Optional[str]] = {}
    for line in (text or "").splitlines():
        index, sep, value = line.partition(",")
        if not sep or not index.strip().isdigit():
            continue
        value = value.strip()
        actions[int(index.strip())] = None if value.lower() in _UNREADABLE else value
    return {"supported": True, "actions": actions, "error": None}


_UNREADABLE = frozenset({"", "n/a", "[n/a]", "[unknown error]", "[gpu is lost]", "[not supported]", "not supported"})


def recovery_action_class(value: Optional[str]) -> str:
    """"ok", "reboot", "reset" or "unknown" for one GPU's gpu_recovery_action."""
    if value is None:
        return "unknown"
    low = value.strip().lower()
    if low == RECOVERY_ACTION_NONE:
        return "ok"
    if any(word in low for word in RECOVERY_ACTIONS_REBOOT):
        return "reboot"
    if any(word in low for word in RECOVERY_ACTIONS_RESET):
        return "reset"
    return "unknown"


def parse_systemctl_show(text: Optional[str]) -> dict[str, str]:
    result: dict[str, str] = {}
    for line in (text or "").splitlines():
        key, sep, value = line.partition("=")
        if sep:
            result[key.strip()] = value.strip()
    return result


def parse_topo_nvlink(text: Optional[str]) -> dict[int, list[int]]:
    """NVLink peers from ``nvidia-smi topo -m``: {gpu index: [peer indexes]} for cells ``NV<n>``.

    Returns {} when the matrix is absent (no NVLink, or a driver/lab without ``topo``).
    """
    lines = [ln for ln in (text or "").splitlines() if ln.strip()]
    if not lines:
        return {}
    header = lines[0].split()
    columns = [int(h[3:]) if re.fullmatch(r"GPU\d+", h) else None for h in header]
    peers: dict[int, list[int]] = {}
    for line in lines[1:]:
        cells = line.split()
        if not cells or not re.fullmatch(r"GPU\d+", cells[0]):
            continue
        row = int(cells[0][3:])
        for col, cell in zip(columns, cells[1:]):
            if col is not None and col != row and re.fullmatch(r"NV\d+", cell):
                peers.setdefault(row, []).append(col)
    return {gpu: sorted(set(p)) for gpu, p in peers.items()}


def nvlink_closure(gpus: Iterable[int], peers: Mapping[int, Sequence[int]]) -> list[int]:
    """The GPUs plus every GPU reachable over NVLink from them (reset them together, GR §2.1)."""
    todo = list(gpus)
    seen: set[int] = set()
    while todo:
        gpu = todo.pop()
        if gpu in seen:
            continue
        seen.add(gpu)
        todo.extend(peers.get(gpu, ()))
    return sorted(seen)


def parse_kernel_log(text: Optional[str], vmid: Optional[int] = None, limit: int = 50) -> dict[str, Any]:
    """Lines of dmesg/journal output that matter here: Xid, OOM, hung tasks (last ``limit`` kept)."""
    lines = [ln.rstrip() for ln in (text or "").splitlines() if KERNEL_LOG_RE.search(ln)]
    xids = sorted({int(m.group(1)) for ln in lines for m in [_XID_RE.search(ln)] if m})
    oom_ct = 0
    if vmid is not None:
        ct_re = re.compile(r"(?:/lxc/%d(?:/|\b)|lxc\.payload\.%d\b)" % (vmid, vmid))
        oom_ct = sum(1 for ln in lines if "oom-kill" in ln.lower() and ct_re.search(ln))
    return {"lines": lines[-limit:], "xids": xids, "oom_kills_in_container": oom_ct}


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
    other threads live: it can hold GPU memory, GR §1.2 c), ``stuck_fuse``, ``stuck_nfs``,
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
    majors = set(parse_proc_devices(_read(_join(root, "/proc/devices"))))
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
    task's mmap lock, which a stuck task may hold (unconfirmed; GR §1.2 b says to expect hangs).
    """
    base = _join(root, "/proc/%d" % pid)
    st = parse_stat(_read(base + "/stat"))
    if st is None:
        return None
    cgroup_text = _read(base + "/cgroup")
    proc: dict[str, Any] = dict(st)
    proc["vmid"] = container_of_cgroup(cgroup_text)
    proc["cgroup"] = parse_proc_cgroup(cgroup_text)
    proc["nspid"] = parse_nspid(_read(base + "/status"))
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
        tst = parse_stat(_read(base + "/task/%s/stat" % tid))
        if tst:
            task_states.append(tst["state"])
            if tst["state"] == "D" and d_tid is None:
                d_tid = int(tid)
    proc["threads"] = 1 + len(tids)
    proc["task_states"] = sorted(set(task_states))
    wchan = stack = None
    if deep and (st["state"] == "D" or d_tid is not None):
        where = base if st["state"] == "D" else base + "/task/%d" % d_tid
        wchan = (_read(where + "/wchan") or "").strip() or None
        stack = _read(where + "/stack")
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


def fuse_connections_of(pid: int, root: str = "/") -> list[dict[str, Any]]:
    """FUSE connections a process has files open on, found without touching the files:
    /proc/PID/fdinfo/N gives the mount id, /proc/PID/mountinfo gives that mount's fstype and
    device (``0:N``: N is the connection number under /sys/fs/fuse/connections)."""
    base = _join(root, "/proc/%d" % pid)
    mounts = {m["mount_id"]: m for m in parse_mountinfo(_read(base + "/mountinfo"))}
    found: dict[int, dict[str, Any]] = {}
    try:
        fds = os.listdir(base + "/fdinfo")
    except OSError:
        fds = []
    for fd in fds:
        mnt_id = parse_fdinfo_mnt_id(_read(base + "/fdinfo/" + fd))
        mount = mounts.get(mnt_id) if mnt_id is not None else None
        if mount and (mount["fstype"] == "fuse" or mount["fstype"].startswith("fuse.") or mount["fstype"] == "fuseblk"):
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
        for m in parse_mountinfo(_read(_join(root, "/proc/1/mountinfo")))
        if m["fstype"] == "fuse" or m["fstype"].startswith("fuse.") or m["fstype"] == "fuseblk"
    }


def shm_leftovers(init_pid: Optional[int], root: str = "/") -> list[str]:
    """Typical leaked segments (nccl-*, psm_*, sgl_*) in the container's /dev/shm, read from the host
    through /proc/<init>/root."""
    if not init_pid:
        return []
    try:
        names = os.listdir(_join(root, "/proc/%d/root/dev/shm" % init_pid))
    except OSError:
        return []
    return sorted(n for n in names if SHM_LEFTOVER_RE.match(n))


def _cgroup_mounts(root: str = "/") -> dict[str, str]:
    """{"" : v2 mount point, "memory": v1 memory mount point, ...} from /proc/self/mountinfo."""
    mounts: dict[str, str] = {}
    for m in parse_mountinfo(_read(_join(root, "/proc/self/mountinfo"))):
        if m["fstype"] == "cgroup2":
            mounts.setdefault("", m["mount_point"])
        elif m["fstype"] == "cgroup":
            for opt in m["super_options"].split(","):
                if opt in ("memory", "pids", "cpu", "cpuacct", "devices", "freezer") or opt.startswith("name="):
                    mounts.setdefault(opt, m["mount_point"])
    return mounts


def container_cgroup_dir(init_cgroup: Mapping[str, str], vmid: int, controller: str) -> Optional[str]:
    """The container's top cgroup path (``/lxc/<vmid>`` on PVE, ``/lxc.payload.<vmid>`` on plain LXC) in one
    hierarchy, cut from the init's cgroup path (so no layout is hard-coded)."""
    for ctrls, path in init_cgroup.items():
        names = ctrls.split(",") if ctrls else [""]
        if controller not in names:
            continue
        parts = path.split("/")
        for i, part in enumerate(parts):
            if part in ("lxc.payload.%d" % vmid,) or (part == str(vmid) and i > 0 and parts[i - 1] in ("lxc", "lxc.payload")):
                return "/".join(parts[: i + 1]) or "/"
    return None


def container_memory(vmid: int, init_pid: Optional[int], root: str = "/") -> dict[str, Any]:
    """Memory limit, usage and OOM-kill count of the container's cgroup (v2 or v1), None when stopped."""
    result: dict[str, Any] = {"cgroup_version": None, "path": None, "memory_limit_bytes": None,
                              "memory_usage_bytes": None, "oom_kills": None}
    if not init_pid:
        return result
    cg = parse_proc_cgroup(_read(_join(root, "/proc/%d/cgroup" % init_pid)))
    mounts = _cgroup_mounts(root)

    def num(text: Optional[str]) -> Optional[int]:
        value = (text or "").strip()
        if not value or value == "max":
            return None
        try:
            n = int(value)
        except ValueError:
            return None
        return None if n >= (1 << 62) else n

    # (version, controller, limit file, usage file, file with the oom_kill counter); v2 first, as on PVE 7+
    layouts = ((2, "", "memory.max", "memory.current", "memory.events"),
               (1, "memory", "memory.limit_in_bytes", "memory.usage_in_bytes", "memory.oom_control"))
    for version, controller, limit_file, usage_file, events_file in layouts:
        path = container_cgroup_dir(cg, vmid, controller)
        if not path or controller not in mounts:
            continue
        d = _join(root, mounts[controller] + path)
        if not os.path.exists(d + "/" + limit_file):
            continue
        m = re.search(r"^oom_kill (\d+)", _read(d + "/" + events_file) or "", re.M)
        result.update(cgroup_version=version, path=path, memory_limit_bytes=num(_read(d + "/" + limit_file)),
                      memory_usage_bytes=num(_read(d + "/" + usage_file)), oom_kills=int(m.group(1)) if m else None)
        break
    return result


# --------------------------------------------------------------------------- the clean gate


def default_available_tolerance(mem_total_bytes: Optional[int]) -> int:
    """max(2 % of MemTotal, 8 GiB) (GR §4.3, host clean)."""
    return max(int((mem_total_bytes or 0) * 0.02), 8 * GIB)


def evaluate_sample(sample: Mapping[str, Any], baseline: Optional[Mapping[str, Any]],
                    tolerances: Mapping[str, Any]) -> dict[str, Any]:
    """Judge one sample against the baseline. Returns {"clean": bool, "reasons": [...], "gpus": [...],
    "host": {...}, "notes": [...]}.

    sample keys: vmid, container_gpus [int], gpus (nvidia-smi rows + "apps": [{pid, used_memory_mib,
    owner}]), ct_holders [proc], ct_stuck [proc], host_memory {meminfo bytes}, nvidia_smi_error,
    nvidia_smi_hung. owner is the VMID (int) of a container, "host" or "gone".
    """
    reasons: list[str] = []
    notes: list[str] = []
    gpu_tol = int(tolerances.get("gpu_memory_mib", 16))
    base_gpus = {int(g["index"]): g for g in (baseline or {}).get("gpus", []) if g.get("index") is not None}
    vmid = sample["vmid"]
    gpu_rows: list[dict[str, Any]] = []
    if sample.get("nvidia_smi_hung"):
        reasons.append("nvidia-smi hung (timed out)")
    elif sample.get("nvidia_smi_error"):
        reasons.append("nvidia-smi failed: %s" % sample["nvidia_smi_error"])
    by_index = {int(g["index"]): g for g in sample.get("gpus", []) if g.get("index") is not None}
    for idx in sample.get("container_gpus", []):
        row = by_index.get(idx)
        if row is None:
            if not sample.get("nvidia_smi_error") and not sample.get("nvidia_smi_hung"):
                reasons.append("GPU %d of the container is not reported by nvidia-smi" % idx)
            continue
        apps = row.get("apps", [])
        if row.get("memory_used_mib") is None:
            # nvidia-smi printed [N/A], [Unknown Error] or [GPU is lost]: unknown is not clean (GR §4).
            reasons.append("GPU %d: nvidia-smi reports no memory.used figure ([N/A], [Unknown Error] or [GPU is lost]): "
                           "it cannot be judged clean" % idx)
            gpu_rows.append({"index": idx, "uuid": row.get("uuid"), "memory_used_mib": None, "compute_apps": apps,
                             "clean": False})
            continue
        own = [a for a in apps if a.get("owner") == vmid]
        foreign = [a for a in apps if a.get("owner") not in (vmid,)]
        foreign_mib = sum(int(a.get("used_memory_mib") or 0) for a in foreign if a.get("owner") != "gone")
        base_mib = int(base_gpus.get(idx, {}).get("memory_used_mib") or 0)
        used = int(row.get("memory_used_mib") or 0)
        excess = used - foreign_mib - base_mib
        ok = not own and not [a for a in foreign if a.get("owner") == "gone"] and excess <= gpu_tol
        gpu_rows.append({"index": idx, "uuid": row.get("uuid"), "memory_used_mib": used, "baseline_mib": base_mib,
                         "other_holders_mib": foreign_mib, "excess_mib": excess, "compute_apps": apps, "clean": ok})
        if own:
            reasons.append("GPU %d: %d compute app(s) of CT %s (%s)" % (
                idx, len(own), vmid, ", ".join("%s/%s" % (a["pid"], a.get("process_name")) for a in own)))
        ghosts = [a for a in apps if a.get("owner") == "gone"]
        if ghosts:
            reasons.append("GPU %d: compute app PID(s) %s listed but no longer exist" % (
                idx, ", ".join(str(a["pid"]) for a in ghosts)))
        if excess > gpu_tol:
            reasons.append("GPU %d: %d MiB used, %d MiB above baseline %d MiB (tolerance %d MiB)%s" % (
                idx, used, excess, base_mib, gpu_tol,
                "" if own or apps else " with no process: held by the driver"))
        if foreign:
            notes.append("GPU %d is also used by %s" % (idx, ", ".join(
                "%s (%s)" % (a["pid"], "CT %s" % a["owner"] if isinstance(a["owner"], int) else a["owner"]) for a in foreign)))
    recovery = sample.get("recovery_actions") or {"supported": False, "actions": {}, "error": None}
    if recovery.get("supported"):
        for idx in sample.get("container_gpus", []):
            if recovery.get("error"):
                reasons.append("GPU %d: nvidia-smi could not read gpu_recovery_action (%s): it cannot be judged clean"
                               % (idx, recovery["error"]))
                continue
            value = recovery["actions"].get(idx)
            kind = recovery_action_class(value)
            if kind != "ok":
                reasons.append("GPU %d: the driver's recovery action is %s%s" % (
                    idx, repr(value) if value is not None else "unreadable",
                    {"reboot": ": the node must be rebooted", "reset": ": the GPU must be reset (nvidia-smi -r) "
                     "with no process on it", "unknown": ": it cannot be judged clean"}[kind]))
    elif recovery.get("error"):
        notes.append("gpu_recovery_action not checked: %s" % recovery["error"].splitlines()[0])
    holders = sample.get("ct_holders", [])
    if holders:
        reasons.append("%d process(es) of CT %s hold /dev/nvidia*: %s" % (
            len(holders), vmid, ", ".join("%d/%s" % (p["pid"], p["comm"]) for p in holders[:8])))
    stuck = sample.get("ct_stuck", [])
    if stuck:
        reasons.append("%d process(es) of CT %s stuck: %s" % (
            len(stuck), vmid, ", ".join("%d/%s (%s)" % (p["pid"], p["comm"], p["class"]) for p in stuck[:8])))
    host = judge_host_memory(sample.get("host_memory") or {}, (baseline or {}).get("host"), tolerances,
                             sample.get("ct_memory_usage_bytes"), vmid)
    reasons.extend(host["reasons"])
    notes.extend(host["notes"])
    return {"clean": not reasons, "reasons": reasons, "gpus": gpu_rows, "host": host, "notes": notes}


def judge_host_memory(now: Mapping[str, Any], base: Optional[Mapping[str, Any]],
                      tolerances: Mapping[str, Any], ct_usage_bytes: Optional[int] = None,
                      vmid: Optional[int] = None) -> dict[str, Any]:
    """Host memory against the baseline (GR §4.3 host clean); without a baseline, against an absolute
    floor of MemAvailable (tolerances["min_available_pct"] % of MemTotal), and say so.

    The node is shared: a shortfall counts against this container only when it can be its doing, i.e. its
    cgroup uses more than tolerances["ct_attribution_bytes"] (default 2 GiB); otherwise (the container is
    stopped or small) the finding is a note, because no rung of this container's ladder can change it.
    """
    reasons: list[str] = []
    notes: list[str] = []
    total = now.get("mem_total_bytes")
    avail = now.get("mem_available_bytes")
    checks: dict[str, Any] = {}
    if base and base.get("mem_available_bytes") is not None:
        tol = tolerances.get("mem_available_bytes")
        tol = int(tol) if tol is not None else default_available_tolerance(total)
        floor = int(base["mem_available_bytes"]) - tol
        checks["mem_available"] = {"now": avail, "baseline": base["mem_available_bytes"], "min": floor}
        if avail is not None and avail < floor:
            reasons.append("host MemAvailable %.1f GiB below baseline %.1f GiB minus tolerance %.1f GiB" % (
                avail / GIB, base["mem_available_bytes"] / GIB, tol / GIB))
        for key, tkey, default in (("shmem_bytes", "shmem_bytes", 2 * GIB), ("mlocked_bytes", "mlocked_bytes", GIB)):
            if base.get(key) is None or now.get(key) is None:
                continue
            t = tolerances.get(tkey)
            t = int(t) if t is not None else default
            ceiling = int(base[key]) + t
            checks[key] = {"now": now[key], "baseline": base[key], "max": ceiling}
            if now[key] > ceiling:
                reasons.append("host %s %.2f GiB above baseline %.2f GiB plus tolerance %.2f GiB" % (
                    key.replace("_bytes", "").capitalize(), now[key] / GIB, base[key] / GIB, t / GIB))
        judged = "baseline"
    else:
        pct = float(tolerances.get("min_available_pct", 10))
        floor = int((total or 0) * pct / 100)
        checks["mem_available"] = {"now": avail, "baseline": None, "min": floor}
        notes.append("no baseline: host memory judged only by MemAvailable >= %g%% of MemTotal" % pct)
        if avail is not None and avail < floor:
            reasons.append("host MemAvailable %.1f GiB below %g%% of MemTotal (no baseline)" % (avail / GIB, pct))
        judged = "absolute floor (no baseline)"
    attribution = tolerances.get("ct_attribution_bytes")
    attribution = int(attribution) if attribution is not None else 2 * GIB
    if reasons and (ct_usage_bytes is None or ct_usage_bytes <= attribution):
        notes.extend("not attributable to CT %s (its cgroup uses %s): %s" % (
            vmid, "nothing, it is stopped" if ct_usage_bytes is None else "%.2f GiB" % (ct_usage_bytes / GIB), r)
            for r in reasons)
        reasons = []
    checks["container_usage_bytes"] = ct_usage_bytes
    return {"judged_against": judged, "checks": checks, "reasons": reasons, "notes": notes}


# --------------------------------------------------------------------------- choosing the rung


def choose_rung(diag: Mapping[str, Any], after_rung: int = 0) -> tuple[int, str]:
    """The first rung the evidence says is needed (jump, don't walk), never one at or below ``after_rung``.

    diag keys: clean, container_status ("running"/"stopped"/None), service_active (bool), ct_holders,
    ct_stuck (procs with "class"), gpu_excess_without_process (bool), host_memory_only (bool),
    reboot_signals [str], reset_refused (bool), recovery_reset (bool: the driver's gpu_recovery_action asks for a
    GPU reset on one of the container's GPUs).
    Returns (rung, reason); rung 0 means nothing to do.
    """
    if diag.get("clean"):
        return RUNG_CLEAN, "clean: nothing to do"
    signals = list(diag.get("reboot_signals") or [])
    stuck = diag.get("ct_stuck") or []
    classes = {p.get("class") for p in stuck}
    if "stuck_nvidia" in classes:
        signals.append("process(es) in D state inside the NVIDIA driver: %s" % ", ".join(
            str(p["pid"]) for p in stuck if p.get("class") == "stuck_nvidia"))
    if signals:
        return RUNG_REBOOT, "; ".join(signals)

    def pick(rung: int, reason: str) -> tuple[int, str]:
        if rung > after_rung:
            return rung, reason
        return next_rung_after(diag, after_rung)

    running = diag.get("container_status") == "running"
    if diag.get("recovery_reset") and not stuck:
        # NVIDIA: terminate all GPU processes, reset the GPU with nvidia-smi -r. Stopping the container ends every
        # client of its GPUs at once (rung 4); the reset follows (rung 5).
        if running:
            return pick(RUNG_STOP_CONTAINER, "the driver asks for a GPU reset: stop the container so no client is left")
        return pick(RUNG_RESET_GPUS, "the driver asks for a GPU reset and the container is stopped: reset the GPUs")
    if classes & {"stuck_fuse", "stuck_nfs"}:
        return pick(RUNG_UNBLOCK_STUCK, "process(es) in D state on FUSE/NFS: abort the connection")
    if classes & {"stuck_unknown", "zombie_with_threads"}:
        return pick(RUNG_STOP_CONTAINER, "stuck process(es) of unknown cause: stop the container")
    if running and diag.get("service_active"):
        return pick(RUNG_STOP_SERVICE, "the service is active: stop and disable it")
    if diag.get("ct_holders"):
        return pick(RUNG_KILL_HOLDERS, "the service is not active but processes of the container hold the GPUs")
    if diag.get("gpu_excess_without_process"):
        if running:
            return pick(RUNG_STOP_CONTAINER, "GPU memory held with no process (driver-held): stop the container")
        return pick(RUNG_RESET_GPUS, "GPU memory held with no process and the container stopped: reset the GPUs")
    if diag.get("host_memory_only"):
        if running:
            return pick(RUNG_STOP_CONTAINER, "only host memory is above baseline: stop the container to release it")
        return RUNG_REBOOT, "host memory above baseline with the container stopped: nothing left but a reboot"
    return pick(RUNG_STOP_CONTAINER, "not clean for a reason no lower rung addresses")


def settled(recommended_rung: int, findings: Mapping[str, Any], elapsed_s: float, after_rung: int,
            stuck_grace_s: float, release_grace_s: float) -> tuple[bool, str]:
    """Whether the verification after ``after_rung`` may stop polling, and why (the rest is the next rung's job).

    Stops when the gate passes (recommended rung 0: clean, or only the baseline is missing), on a reboot signal,
    when the driver asks for a GPU reset that no waiting brings (before rung 5), when processes are still stuck
    past ``stuck_grace_s``, or when, with none stuck, GPU memory is held with no process, holders remain or the
    container is down past ``release_grace_s`` (slow teardown, gpu-recovery.md §1.2 g). ``elapsed_s`` counts from
    the rung's start on the node's clock.
    """
    if recommended_rung == RUNG_CLEAN:
        return True, "the gate passes (or only the baseline is missing)"
    signals = findings.get("reboot_signals") or []
    if signals:
        return True, "reboot signal: %s" % "; ".join(signals)
    if findings.get("recovery_reset") and after_rung < RUNG_RESET_GPUS:
        return True, "the driver asks for a GPU reset: waiting does not clear it"
    stuck = int(findings.get("stuck") or 0)
    if stuck and elapsed_s >= stuck_grace_s:
        return True, "%d process(es) still stuck after %.0f s (grace %.0f s)" % (stuck, elapsed_s, stuck_grace_s)
    if not stuck and elapsed_s >= release_grace_s and (
            findings.get("gpu_excess_without_process") or int(findings.get("holders") or 0) > 0
            or findings.get("container_status") != "running"):
        return True, "not released after %.0f s (release grace %.0f s)" % (elapsed_s, release_grace_s)
    return False, "waiting (%.0f s since the rung started)" % elapsed_s


def next_rung_after(diag: Mapping[str, Any], after_rung: int) -> tuple[int, str]:
    """The rung that follows ``after_rung`` when the preferred one was already tried."""
    running = diag.get("container_status") == "running"
    if after_rung < RUNG_STOP_CONTAINER and running:
        nxt = after_rung + 1
        if nxt == RUNG_UNBLOCK_STUCK and not diag.get("ct_stuck"):
            nxt = RUNG_STOP_CONTAINER
        return nxt, "rung %d did not clear it: escalate" % after_rung
    if after_rung < RUNG_RESET_GPUS and (diag.get("gpu_excess_without_process") or diag.get("recovery_reset")
                                         or not running) \
            and not diag.get("ct_holders") and not diag.get("ct_stuck") and not diag.get("host_memory_only"):
        return RUNG_RESET_GPUS, "GPU memory still held with no process: reset the GPUs"
    return RUNG_REBOOT, "rung %d did not clear it and no lower rung applies: the node needs a reboot" % after_rung


# --------------------------------------------------------------------------- actions (change the system)


def pids_to_signal(targets: Sequence[Mapping[str, Any]], all_procs: Sequence[Mapping[str, Any]], vmid: int,
                   init_pid: Optional[int]) -> dict[str, Any]:
    """Plan a scoped kill: for each target (a process of the container), its whole process group when every
    member of that group is in the container and the group is not the container init's; else the PID alone.

    Never the container's init (NSpid ending in 1, or ``init_pid``), never a PID outside the container.
    ``all_procs`` must be every process on the host (``scan_processes(...)["all"]``), not only the
    container's: a process started by a non-interactive ``pct exec`` keeps the host caller's process
    group, and only the host's members of that group tell that ``kill(-pgid)`` would reach the host.
    Returns {"groups": [pgid], "pids": [pid], "starttimes": {pid: starttime}, "skipped": [{pid, why}]};
    ``send_signal`` signals each of ``pids`` only while its start time is still the planned one.
    """
    by_pgid: dict[int, list[Mapping[str, Any]]] = {}
    for p in all_procs:
        by_pgid.setdefault(int(p["pgid"]), []).append(p)
    init_pgid = None
    for p in all_procs:
        if init_pid and int(p["pid"]) == int(init_pid):
            init_pgid = int(p["pgid"])
    groups: set[int] = set()
    pids: set[int] = set()
    skipped: list[dict[str, Any]] = []

    def is_init(p: Mapping[str, Any]) -> bool:
        return bool((init_pid and int(p["pid"]) == int(init_pid)) or (p.get("nspid") and p["nspid"][-1] == 1))

    for t in targets:
        pid = int(t["pid"])
        if t.get("vmid") != vmid:
            skipped.append({"pid": pid, "why": "not in CT %d" % vmid})
            continue
        if is_init(t):
            skipped.append({"pid": pid, "why": "the container's init"})
            continue
        pgid = int(t["pgid"])
        members = by_pgid.get(pgid, [])
        if (pgid > 1 and pgid != init_pgid and members and all(m.get("vmid") == vmid for m in members)
                and not any(is_init(m) for m in members)):
            groups.add(pgid)
        else:
            pids.add(pid)
    in_groups = {int(m["pid"]) for g in groups for m in by_pgid.get(g, [])}
    starts = {int(t["pid"]): t.get("starttime") for t in targets}
    left = sorted(pids - in_groups)
    return {"groups": sorted(groups), "pids": left, "starttimes": {p: starts.get(p) for p in left},
            "skipped": skipped}


def signal_pid(pid: int, starttime: Optional[int], sig: int, root: str = "/") -> str:
    """Signal one process only if it is still the planned one: "sent", "gone" or "reused".

    A pidfd (pidfd_open, Linux 5.3) pins the process it was opened for; its start time read after opening tells
    whether that is the process that was planned (same PID and start time) or a new one that reused the PID, so a
    reused PID is never hit. Without pidfds (older kernel or Python) the start time is checked right before kill(2).
    """
    fd = None
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return "gone"
    except (AttributeError, OSError):
        fd = None
    try:
        st = parse_stat(_read(os.path.join(root, "proc/%d/stat" % pid)))
        if st is None or st["state"] in ("Z", "X"):
            return "gone"
        if starttime is not None and st["starttime"] != starttime:
            return "reused"
        if fd is not None:
            _signal.pidfd_send_signal(fd, sig)
        else:
            os.kill(pid, sig)
        return "sent"
    except ProcessLookupError:
        return "gone"
    finally:
        if fd is not None:
            os.close(fd)


def send_signal(plan: Mapping[str, Any], sig: int, kill_fn: Callable[[int, int], None] = os.kill) -> list[str]:
    """Send ``sig`` to the planned process groups (``kill(-pgid)``) and PIDs. Returns errors (ESRCH ignored).

    A PID with a planned start time (``plan["starttimes"]``) is signalled through ``signal_pid``: never a process
    that reused the PID since the plan; a reused one is reported as an error, not signalled.
    """
    errors: list[str] = []
    starts = plan.get("starttimes") or {}
    for pgid in plan.get("groups", []):
        try:
            kill_fn(-int(pgid), sig)
        except ProcessLookupError:
            pass
        except OSError as exc:
            errors.append("kill(-%s, %s): %s" % (pgid, sig, exc))
    for pid in plan.get("pids", []):
        if starts.get(pid) is not None:
            try:
                if signal_pid(int(pid), starts[pid], sig) == "reused":
                    errors.append("PID %s was reused by another process since the plan: not signalled" % pid)
            except OSError as exc:
                errors.append("pidfd_send_signal(%s, %s): %s" % (pid, sig, exc))
            continue
        try:
            kill_fn(int(pid), sig)
        except ProcessLookupError:
            pass
        except OSError as exc:
            errors.append("kill(%s, %s): %s" % (pid, sig, exc))
    return errors


def abort_fuse_connection(conn: int, root: str = "/") -> None:
    """``echo 1 > /sys/fs/fuse/connections/<conn>/abort`` (kernel commit 69a53bf)."""
    with open(_join(root, "/sys/fs/fuse/connections/%d/abort" % int(conn)), "w") as handle:
        handle.write("1")


def wait_until(predicate: Callable[[], bool], timeout: float, interval: float = 0.5,
               sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.monotonic) -> bool:
    deadline = clock() + timeout
    while True:
        if predicate():
            return True
        if clock() >= deadline:
            return False
        sleep(interval)


SIGNALS = {"TERM": _signal.SIGTERM, "KILL": _signal.SIGKILL}
