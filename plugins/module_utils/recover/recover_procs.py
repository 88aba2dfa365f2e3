# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The node's processes as the recovery ladder reads them (read-only): the /proc parsers (stat, status, mountinfo,
fdinfo, devices), which container a process belongs to (its /proc/PID/cgroup), what it holds (/dev/nvidia* by
device kind), where a task in D state sleeps (FUSE, NFS, the NVIDIA driver), the host-wide process scan, FUSE
connections and leftover /dev/shm segments. What pct and systemd say is in recover_pve, the actions that change
the system in recover_signals.

No Ansible imports. Collectors take a ``root`` prefix (default ``/``) so the unit tests can lay out a fake
``/proc``; unit-tested in tests/unit/plugins/module_utils/recover/test_recover_procs.py.

Sources are in docs/recover.md: host PIDs mapped to a container through /proc/PID/cgroup (the driver reports host
PIDs, NVIDIA/nvidia-docker#1483; PVE's lxc/<vmid> cgroup layout, pve-container src/PVE/LXC.pm
update_lxc_config), D state on FUSE vs in the NVIDIA driver (H Company, "VRAM Ghost Busting";
NVIDIA/open-gpu-kernel-modules#456).
"""

from __future__ import annotations

import os
import re
import stat
from typing import Any, Iterable, Iterator, Mapping, Optional, Sequence, Union

from ansible_collections.inferops.gpu_inference.plugins.module_utils.host.gpu_facts import NVIDIA_MAJOR, list_nvidia_devices
from ansible_collections.inferops.gpu_inference.plugins.module_utils.host.procfs import join_root, parse_proc_cgroup, read_text

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
# Anchored at the hierarchy's root, where only root on the node makes cgroups (PVE: lxc/<vmid>, plain LXC:
# lxc.payload.<vmid>); a host user's delegated subtree (/user.slice/.../lxc/129) or a tenant's own nested cgroups
# (/lxc/130/ns/lxc/129) name no other container.
_CT_CGROUP_RES = (
    re.compile(r"^/lxc/(\d+)(?:/|$)"),
    re.compile(r"^/lxc\.payload[./](\d+)(?:/|$)"),
)

SHM_LEFTOVER_RE = re.compile(r"^(?:nccl-|psm_|sgl_|sglang|torch_)")

# What a holder's fd must say before it is examined: a node path under /dev (any name there: a tenant can rename or
# hard-link its passed-through node inside its own /dev tmpfs). The text is a path in the holder's mount namespace,
# chosen by whoever mounted there; it decides nothing but whether the fd is looked at.
DEV_PATH_PREFIX = "/dev/"
NVIDIA_PATH_PREFIX = "/dev/nvidia"
# Filesystems whose inodes the host kernel describes by itself: a stat (getattr) there never waits on a server that
# a tenant or a host user runs (FUSE, or an overlay over it, waits for its server's answer, uninterruptibly once the
# server has read the request: fs/fuse/dev.c request_wait_answer). Device nodes live on these in a PVE container
# (its /dev is a tmpfs; passed-through nodes are made there or bind-mounted from the host's devtmpfs) and on the host.
STAT_SAFE_FSTYPES = frozenset({"devtmpfs", "tmpfs"})
# Where a path may be walked (lookup, readdir) on a container's behalf: the same, and the local disk filesystems a
# PVE container's root lives on. Anything else (fuse.*, overlay, nfs, 9p ...) may wait on a server.
WALK_SAFE_FSTYPES = STAT_SAFE_FSTYPES | frozenset({"ext2", "ext3", "ext4", "xfs", "btrfs", "zfs"})
# Held fds examined at once (each is an O_PATH reference, pinning its mount while the mount table is read).
_FD_BATCH = 256


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


def wholly_in_container(cgroup: Mapping[str, str], vmid: int) -> bool:
    """Whether every hierarchy of a parsed /proc/PID/cgroup (``parse_proc_cgroup``) names container ``vmid``: the
    strict reading a signal needs. ``container_of_cgroup`` attributes a process by any line that names a container;
    a process that root moved out of the container in one hierarchy (its v2 cgroup at the host's root, its v1
    ones still the container's) is attributed to the container there, but is not wholly in it."""
    if not cgroup:
        return False
    for path in cgroup.values():
        found = None
        for regex in _CT_CGROUP_RES:
            match = regex.search(path)
            if match:
                found = int(match.group(1))
                break
        if found != vmid:
            return False
    return True


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


def fuse_connection_number(major: int, minor: int) -> int:
    """The name of a FUSE connection under /sys/fs/fuse/connections: the superblock's device number as the kernel
    holds it, ``(major << 20) | minor`` (fs/fuse/control.c names the directory ``"%u", fc->dev``, and fc->dev is
    sb->s_dev, a kernel dev_t: MINORBITS 20). A plain FUSE mount has major 0 (an anonymous device), so it is its
    minor; a fuseblk mount has its block device's major."""
    return (int(major) << 20) | int(minor)


# --------------------------------------------------------------------------- held fds, examined without blocking


def _own_fd_mnt_id(fd: int) -> Optional[int]:
    """The mount id of one of this process's own fds (/proc/self/fdinfo; an O_PATH file has no show_fdinfo of its own,
    so the kernel answers from the file's mount alone)."""
    return parse_fdinfo_mnt_id(read_text("/proc/self/fdinfo/%d" % fd))


def _mounts_by_id(pid: int, root: str) -> dict[int, dict[str, Any]]:
    return {m["mount_id"]: m for m in parse_mountinfo(read_text(join_root(root, "/proc/%d/mountinfo" % pid)))}


def held_files(pid: int, root: str = "/", want: Optional[str] = DEV_PATH_PREFIX) -> Iterator[dict[str, Any]]:
    """The files a process has open whose fd link text starts with ``want`` (every path when None), each with the
    mount it is on, found without one call that a filesystem's server answers.

    Each fd is opened with O_PATH through /proc/PID/fd/N (the magic link is followed by the kernel, no lookup and no
    open of the file's own filesystem is made), so this process holds a reference of its own: the fd cannot be swapped
    under it, and the file's mount stays pinned. Its mount id comes from /proc/self/fdinfo (Linux 3.15 and later), and
    its filesystem from the process's /proc/PID/mountinfo read after the fds are held (a mount id is reused once its
    mount is freed, never while one is held). A mount the process's table does not show (another namespace, lazily
    unmounted) is None. Yields {"fd", "path", "mount", "stat"}: "stat" is the fstat of the file when its mount's
    filesystem is in STAT_SAFE_FSTYPES, else None (never asked for)."""
    fd_dir = join_root(root, "/proc/%d/fd" % pid)
    try:
        names = sorted((n for n in os.listdir(fd_dir) if n.isdigit()), key=int)
    except OSError:
        return
    chosen = []
    for name in names:
        target = _readlink(os.path.join(fd_dir, name))
        if target is not None and (want is None or target.startswith(want)):
            chosen.append(name)
    for start in range(0, len(chosen), _FD_BATCH):
        held: list[tuple[str, int]] = []
        try:
            for name in chosen[start:start + _FD_BATCH]:
                try:
                    held.append((name, os.open(os.path.join(fd_dir, name), os.O_PATH | os.O_CLOEXEC)))
                except OSError:
                    continue  # closed meanwhile, or the process is gone
            if not held:
                continue
            mounts = _mounts_by_id(pid, root)
            for name, own in held:
                path = _readlink("/proc/self/fd/%d" % own)
                if path is None or (want is not None and not path.startswith(want)):
                    continue  # the fd now names another file: judged by what it is now, or not at all
                mount = mounts.get(_own_fd_mnt_id(own))
                st = None
                if mount is not None and mount["fstype"] in STAT_SAFE_FSTYPES:
                    try:
                        st = os.fstat(own)
                    except OSError:
                        st = None
                yield {"fd": int(name), "path": path, "mount": mount, "stat": st}
        finally:
            for _name, own in held:
                os.close(own)


def _describe_mount(mount: Optional[dict[str, Any]]) -> dict[str, Any]:
    if mount is None:
        return {"fstype": None, "mount_point": None, "mount_id": None}
    return {"fstype": mount["fstype"], "mount_point": mount["mount_point"], "mount_id": mount["mount_id"]}


def nvidia_fds(pid: int, root: str = "/", uvm_majors: Iterable[int] = (),
               claim_prefix: str = NVIDIA_PATH_PREFIX) -> dict[str, Any]:
    """What a process holds of the NVIDIA devices, from its fd table (held_files).

    A file under /dev on a devtmpfs or tmpfs is stat'ed and judged by its device number, whatever its name. A file
    whose path claims /dev/nvidia* on any other filesystem (a FUSE mount at /dev/nvidia-x, an overlay, a mount this
    process's table does not show) is never stat'ed, since that could wait forever on the filesystem's server: it is
    an unverified holder, reported with its path and filesystem. It cannot be an open NVIDIA device unless that
    filesystem was mounted by root of the host (a mount made in a user namespace never opens device nodes,
    SB_I_NODEV), so it decides nothing for the GPUs of another container; see recover_gate for what it does decide.

    Returns {"gpus": [minor], "kinds": ["gpu", "ctl", "modeset", "uvm"], "unverified": [{"fd", "path", "fstype",
    "mount_point", "mount_id"}]}. ``claim_prefix``: the paths that claim a device (tests use another)."""
    majors = set(uvm_majors)
    gpus: set[int] = set()
    kinds: set[str] = set()
    unverified: list[dict[str, Any]] = []
    for held in held_files(pid, root, DEV_PATH_PREFIX if claim_prefix.startswith(DEV_PATH_PREFIX) else "/"):
        st = held["stat"]
        if st is not None:
            if stat.S_ISCHR(st.st_mode):
                kind = nvidia_device_kind(os.major(st.st_rdev), os.minor(st.st_rdev), majors)
                if kind is not None:
                    kinds.add(kind)
                    if kind == "gpu":
                        gpus.add(os.minor(st.st_rdev))
            continue
        if held["path"].startswith(claim_prefix):
            unverified.append(dict({"fd": held["fd"], "path": held["path"]}, **_describe_mount(held["mount"])))
    return {"gpus": sorted(gpus), "kinds": sorted(kinds), "unverified": unverified}


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


def read_process(pid: int, root: str = "/", uvm_majors: Iterable[int] = (), deep: bool = True) -> Optional[dict[str, Any]]:
    """Everything recovery needs about one host PID, or None if it is gone.

    GPU holding is judged from the fd table only (nvidia_fds: a file is stat'ed only on a devtmpfs or tmpfs, never
    on a filesystem a server answers for, such as FUSE). /proc/PID/maps, cmdline and environ are not read: reading
    them takes the task's mmap lock and may fault in a page of a file the process mapped, from FUSE too.
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
    held = nvidia_fds(pid, root, uvm_majors)
    proc["gpu_fds"] = held["gpus"]
    proc["nvidia_fd_kinds"] = held["kinds"]
    proc["holds_nvidia"] = bool(held["kinds"])
    proc["unverified_nvidia_fds"] = held["unverified"]
    proc["holds_unverified"] = bool(held["unverified"])
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


def scan_processes(vmid: int, root: str = "/", uvm_majors: Iterable[int] = ()) -> dict[str, Any]:
    """Host-wide scan: the container's processes and every process (any owner) holding /dev/nvidia*.

    Returns {"container": [procs of vmid], "nvidia_holders": [procs holding nvidia fds, any owner],
    "unverified_holders": [procs with a /dev/nvidia* path on a filesystem not stat'ed, any owner (nvidia_fds)],
    "all": [every process on the host]} ("all" is what ``pids_to_signal`` must judge process groups by).
    """
    container: list[dict[str, Any]] = []
    holders: list[dict[str, Any]] = []
    unverified: list[dict[str, Any]] = []
    everyone: list[dict[str, Any]] = []
    for pid in list_pids(root):
        proc = read_process(pid, root, uvm_majors, deep=True)
        if proc is None:
            continue
        everyone.append(proc)
        if proc["vmid"] == vmid:
            container.append(proc)
        if proc["holds_nvidia"]:
            holders.append(proc)
        if proc["holds_unverified"]:
            unverified.append(proc)
    return {"container": container, "nvidia_holders": holders, "unverified_holders": unverified, "all": everyone}


def describe_unverified(proc: dict[str, Any]) -> str:
    """One line naming an unverified holder: PID/comm (CT or host), each fd's path and filesystem."""
    owner = "CT %s" % proc["vmid"] if proc.get("vmid") is not None else "host"
    fds = ", ".join("fd %d %s on %s" % (u["fd"], u["path"], u["fstype"] or "a mount outside its mount table")
                    for u in proc.get("unverified_nvidia_fds") or [])
    return "%d/%s (%s): %s" % (proc["pid"], proc["comm"], owner, fds)


def _is_fuse(fstype: str) -> bool:
    return fstype in ("fuse", "fuseblk") or fstype.startswith("fuse.")


def fuse_connections_of(pid: int, root: str = "/") -> list[dict[str, Any]]:
    """FUSE connections a process has files open on, found without touching the files (held_files: each fd held with
    O_PATH, its mount from /proc/self/fdinfo and the process's mountinfo; the process's own /proc/PID/fdinfo is not
    read, since an epoll fd's fdinfo takes the epoll's mutex, which a thread waiting on FUSE in epoll_ctl holds).
    ``conn`` is the number under /sys/fs/fuse/connections (fuse_connection_number), ``device`` the ``major:minor``
    of the mount."""
    found: dict[int, dict[str, Any]] = {}
    for held in held_files(pid, root, "/"):
        mount = held["mount"]
        if mount and _is_fuse(mount["fstype"]):
            conn = fuse_connection_number(mount["major"], mount["minor"])
            found[conn] = {
                "conn": conn,
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


def _walk_safe(pid: int, parts: Sequence[str], root: str) -> tuple[Optional[int], Optional[str]]:
    """An fd (O_PATH) of the directory ``parts`` below the root of process ``pid``, reached one component at a time,
    each looked up only in a directory whose filesystem is in WALK_SAFE_FSTYPES (checked on the held fd against the
    process's mount table read after it is held), no symlink followed. Returns (fd, None) or (None, why)."""
    flags = os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC
    try:
        fd = os.open(join_root(root, "/proc/%d/root" % pid), flags)
    except OSError as exc:
        return None, "its root cannot be opened (%s)" % exc.strerror
    where = "/"
    for i in range(len(parts) + 1):
        mount = _mounts_by_id(pid, root).get(_own_fd_mnt_id(fd))
        if mount is None or mount["fstype"] not in WALK_SAFE_FSTYPES:
            os.close(fd)
            return None, "%s is on %s, which is not walked (its server could make the walk wait forever)" % (
                where, mount["fstype"] if mount else "a mount outside its mount table")
        if i == len(parts):
            return fd, None
        try:
            nxt = os.open(parts[i], flags | os.O_NOFOLLOW, dir_fd=fd)
        except OSError as exc:
            os.close(fd)
            return None, "%s/%s cannot be opened as a directory (%s)" % (where.rstrip("/"), parts[i], exc.strerror)
        os.close(fd)
        fd, where = nxt, where.rstrip("/") + "/" + parts[i]
    return None, "unreachable"


def shm_listing(init_pid: Optional[int], root: str = "/") -> tuple[list[str], Optional[str]]:
    """The names in the container's /dev/shm, read from the host through /proc/<init>/root without a lookup or a
    readdir on a filesystem a server answers for (_walk_safe), and why it was not read (None when it was)."""
    if not init_pid:
        return [], None
    fd, why = _walk_safe(init_pid, ("dev", "shm"), root)
    if fd is None:
        return [], "/dev/shm of the container not listed: %s" % why
    try:
        dirfd = os.open("/proc/self/fd/%d" % fd, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        return [], "/dev/shm of the container not listed: %s" % exc.strerror
    finally:
        os.close(fd)
    try:
        return sorted(os.listdir(dirfd)), None
    except OSError as exc:
        return [], "/dev/shm of the container not listed: %s" % exc.strerror
    finally:
        os.close(dirfd)


def shm_leftovers(init_pid: Optional[int], root: str = "/") -> list[str]:
    """Typical leaked segments (nccl-*, psm_*, sgl_*) in the container's /dev/shm (shm_listing)."""
    return [n for n in shm_listing(init_pid, root)[0] if SHM_LEFTOVER_RE.match(n)]
