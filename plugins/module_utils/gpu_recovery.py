# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""What the recovery ladder reads on the node: parsers and read-only collectors (process scan, container
cgroup and memory, FUSE connections, /dev/shm leftovers). The Clean gate and the rung choice are in
recover_gate, the actions that change the system in recover_signals, the kernel log in recover_kernel.

No Ansible imports. Parsers take text; collectors take a ``root`` prefix (default ``/``) so
the unit tests can lay out a fake ``/proc`` and ``/sys``. Nothing here changes the system.

Sources for every rule are in docs/recover.md: host PIDs mapped to a container through /proc/PID/cgroup
(the driver reports host PIDs, NVIDIA/nvidia-docker#1483; PVE's lxc/<vmid> cgroup layout, pve-container
src/PVE/LXC.pm update_lxc_config), D state on FUSE vs in the NVIDIA driver (H Company, "VRAM Ghost Busting";
NVIDIA/open-gpu-kernel-modules#456), the clean gate and the ladder.
"""

from __future__ import annotations

import os
import re
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence

from ansible_collections.inferops.gpu_inference.plugins.module_utils.gpu_facts import _join, _read, list_nvidia_devices

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

# Kernel log lines worth keeping as evidence: Xids (NVIDIA's Xid catalogue), OOM kills, hung tasks.
KERNEL_LOG_RE = re.compile(
    r"NVRM: Xid|Out of memory|oom-kill|oom_reaper|Memory cgroup out of memory|blocked for more than|"
    r"fallen off the bus|GPU has fallen|hung_task",
    re.IGNORECASE,
)

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
    """The GPUs plus every GPU reachable over NVLink from them (reset them together: nvidia-smi(1), --gpu-reset)."""
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
    """Kernel log lines that matter here: Xid, OOM, hung tasks (last ``limit`` kept), and the container's OOM
    kills. Xids are judged by recover_kernel."""
    lines = [ln.rstrip() for ln in (text or "").splitlines() if KERNEL_LOG_RE.search(ln)]
    oom_ct = 0
    if vmid is not None:
        ct_re = re.compile(r"(?:/lxc/%d(?:/|\b)|lxc\.payload\.%d\b)" % (vmid, vmid))
        oom_ct = sum(1 for ln in lines if "oom-kill" in ln.lower() and ct_re.search(ln))
    return {"lines": lines[-limit:], "oom_kills_in_container": oom_ct}


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
    task's mmap lock, which a stuck task may hold (unconfirmed: a reader of a stuck task's state can hang too).
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
