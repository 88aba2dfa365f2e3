#!/usr/bin/python3
"""The mount namespace of the lab's second PVE node (docs/lab.md, "GPUs of pve2").

pve1 is this machine's own node: its processes see the machine's /dev and /run/nvidia-lab. pve2's processes (its
sshd and so every session and `pct` there, its API daemon and task workers, hence the lxc-start of its CTs, and
its nvidia-persistenced) run in one mount namespace of their own, kept by a bind mount of its nsfs file on
/run/inferops-lab/pve2/mnt-ns, in which
  - /dev is a tmpfs with this machine's /dev minus every nvidia* entry, plus pve2's own NVIDIA nodes
    (/run/inferops-lab/pve2/dev/nvidia0.., nvidiactl, nvidia-uvm, nvidia-uvm-tools, bound at /dev/<name>);
  - /run/nvidia-lab is /run/inferops-lab/pve2/nvidia-lab (the socket directory of pve2's driver daemon);
  - /run/nvidia-persistenced is /run/inferops-lab/pve2/nvidia-persistenced.

    nodens.py ensure NODE            create the namespace when missing (or stale), then sync its NVIDIA nodes
    nodens.py sync NODE              bind the node's current NVIDIA nodes and directories (labgpu up runs it)
    nodens.py exec NODE -- CMD ...   run CMD in it
    nodens.py remove NODE            unmount it (it ends with its last process)

Stdlib only (ctypes for mount/setns); runs as root with /usr/bin/python3 (3.11) and util-linux's unshare.
"""
from __future__ import annotations

import ctypes
import os
import stat
import subprocess
import sys

RUN = "/run/inferops-lab"
NVIDIA_RUN = "/run/nvidia-lab"
PERSISTENCED_RUN = "/run/nvidia-persistenced"
LXCFS = "/var/lib/lxcfs"
CLONE_NEWNS = 0x00020000
MS_NOSUID, MS_BIND, MS_REC = 2, 4096, 16384
MNT_DETACH = 2

_libc = ctypes.CDLL(None, use_errno=True)


def node_root(node: str) -> str:
    return f"{RUN}/{node}"


def ns_file(node: str) -> str:
    return f"{node_root(node)}/mnt-ns"


def dev_dir(node: str) -> str:
    """The node's NVIDIA device nodes (labgpu makes them); its namespace shows them at /dev/<name>."""
    return f"{node_root(node)}/dev"


def binds(node: str) -> list[tuple[str, str]]:
    """(source, target) directories bound in the node's namespace."""
    return [(f"{node_root(node)}/nvidia-lab", NVIDIA_RUN), (f"{node_root(node)}/nvidia-persistenced", PERSISTENCED_RUN)]


def _ident(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino)


def _mount(src: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    enc = (lambda v: v.encode() if v is not None else None)
    if _libc.mount(enc(src), enc(target), enc(fstype), flags, enc(data)) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {src} on {target}: {os.strerror(err)}")


def _umount(target: str) -> bool:
    return _libc.umount2(target.encode(), MNT_DETACH) == 0


def is_created(node: str) -> bool:
    """The node's namespace file is a bound nsfs file (same filesystem as our own /proc/self/ns/mnt)."""
    try:
        return os.stat(ns_file(node)).st_dev == os.stat("/proc/self/ns/mnt").st_dev
    except OSError:
        return False


def inside(node: str) -> bool:
    """This process sees the node's /run/nvidia-lab: it is in the node's namespace (a process of pve1 sees the
    machine's own directory, never the node's)."""
    src, target = binds(node)[0]
    return _ident(src) is not None and _ident(src) == _ident(target)


def ns_of_pid(pid: int) -> int | None:
    ident = _ident(f"/proc/{pid}/ns/mnt")
    return ident[1] if ident else None


def current_ns(node: str) -> int | None:
    """The inode of the node's namespace (what /proc/PID/ns/mnt of its processes shows), None when not created."""
    return os.stat(ns_file(node)).st_ino if is_created(node) else None


def enter(node: str) -> None:
    """Move this (single-threaded) process into the node's namespace, unless it is there already."""
    if inside(node):
        return
    if not is_created(node):
        raise SystemExit(f"{node}'s mount namespace {ns_file(node)} is missing: run tests/lab/labctl up")
    try:
        cwd = os.getcwd()
    except OSError:
        cwd = "/"
    fd = os.open(ns_file(node), os.O_RDONLY)
    try:
        if _libc.setns(fd, CLONE_NEWNS) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns {ns_file(node)}: {os.strerror(err)}")
    finally:
        os.close(fd)
    try:
        os.chdir(cwd)
    except OSError:
        os.chdir("/")


def dev_plan(entries: list[tuple[str, int]]) -> list[tuple[str, str]]:
    """What the node's /dev gets for each (name, st_mode) of the machine's /dev: "symlink" (copied), "dir" (bound
    with its submounts: pts, shm, mqueue, ...), "node" (a char/block node made with the same numbers, as LXC's
    autodev does), "file" (anything else, bound); every nvidia* entry is left out (the node has its own)."""
    plan = []
    for name, mode in entries:
        if name.startswith("nvidia"):
            continue
        if stat.S_ISLNK(mode):
            plan.append((name, "symlink"))
        elif stat.S_ISDIR(mode):
            plan.append((name, "dir"))
        elif stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
            plan.append((name, "node"))
        else:
            plan.append((name, "file"))
    return plan


def build(node: str) -> None:
    """Run inside the fresh namespace (`unshare --mount=FILE --propagation slave`): the node's /dev, then sync."""
    os.umask(0)
    names = sorted(os.listdir("/dev"))
    old = os.open("/dev", os.O_PATH | os.O_DIRECTORY)
    src = f"/proc/self/fd/{old}"  # the machine's /dev, still reachable once the tmpfs covers it
    entries = [(n, os.lstat(f"{src}/{n}").st_mode) for n in names]
    _mount("tmpfs", "/dev", "tmpfs", MS_NOSUID, "mode=755")
    for name, kind in dev_plan(entries):
        s, d = f"{src}/{name}", f"/dev/{name}"
        st = os.lstat(s)
        if kind == "symlink":
            os.symlink(os.readlink(s), d)
        elif kind == "dir":
            os.mkdir(d, stat.S_IMODE(st.st_mode))
            _mount(s, d, None, MS_BIND | MS_REC)
        elif kind == "node":
            os.mknod(d, st.st_mode, st.st_rdev)
            os.chown(d, st.st_uid, st.st_gid)
        else:
            open(d, "w").close()
            _mount(s, d, None, MS_BIND)
    os.close(old)
    sync(node)


def sync(node: str) -> None:
    """Inside the namespace: /dev/nvidia* are exactly the node's nodes (the same files, bound: the driver tells GPUs
    apart by the node file), /run/nvidia-lab and /run/nvidia-persistenced the node's directories."""
    os.umask(0o022)
    want = {}
    if os.path.isdir(dev_dir(node)):
        want = {n: f"{dev_dir(node)}/{n}" for n in os.listdir(dev_dir(node)) if n.startswith("nvidia")}
    for name in os.listdir("/dev"):
        path = f"/dev/{name}"
        if name.startswith("nvidia") and (name not in want or _ident(path) != _ident(want[name])):
            _umount(path)
            os.unlink(path)
    for name, source in sorted(want.items()):
        path = f"/dev/{name}"
        if not os.path.lexists(path):
            open(path, "w").close()
            _mount(source, path, None, MS_BIND)
    for source, target in binds(node):
        os.makedirs(source, exist_ok=True)
        if _ident(target) != _ident(source):
            _umount(target)
            _mount(source, target, None, MS_BIND)


def _run_inside(node: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, os.path.abspath(__file__), "exec", node, "--", *args],
                          capture_output=True, text=True, timeout=60)


def stale(node: str) -> str | None:
    """Why the node's namespace no longer fits this machine (a mount made after it, not propagated here), or None."""
    host = _ident(LXCFS)
    r = _run_inside(node, "stat", "-c", "%d %i", LXCFS)
    if host is not None and (r.returncode != 0 or r.stdout.split() != [str(host[0]), str(host[1])]):
        return f"{LXCFS} was mounted again after it was made"
    return None


def _shared(path: str) -> bool:
    """Whether the mount holding `path` propagates (shared): a namespace file cannot be bound there."""
    best, shared = "", False
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left = line.split(" - ")[0].split()
            mp = left[4]
            if (path == mp or path.startswith(mp.rstrip("/") + "/")) and len(mp) >= len(best):
                best, shared = mp, any(o.startswith("shared:") for o in left[6:])
    return shared


def create(node: str) -> None:
    root = node_root(node)
    for d in (root, dev_dir(node), NVIDIA_RUN, PERSISTENCED_RUN) + tuple(s for s, _ in binds(node)):
        os.makedirs(d, exist_ok=True)
    if _shared(root):  # e.g. / shared under systemd: the node's directory becomes a private mount of its own
        _mount(root, root, None, MS_BIND)
        _mount(None, root, None, 1 << 18)  # MS_PRIVATE
    open(ns_file(node), "a").close()
    r = subprocess.run(["unshare", f"--mount={ns_file(node)}", "--propagation", "slave", sys.executable,
                        os.path.abspath(__file__), "build", node], capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        remove(node)
        raise SystemExit(f"nodens: {node}'s mount namespace was not made: {(r.stderr or r.stdout).strip()}")


def ensure(node: str) -> str:
    """Create (or remake when stale) the node's namespace, and sync it; says what it did."""
    did = "kept"
    if is_created(node):
        why = stale(node)
        if why:
            remove(node)
            did = f"made again ({why})"
    if not is_created(node):
        create(node)
        did = "made" if did == "kept" else did
    r = subprocess.run([sys.executable, os.path.abspath(__file__), "sync", node], capture_output=True, text=True,
                       timeout=60)
    if r.returncode != 0:
        raise SystemExit(f"nodens: sync of {node}'s namespace failed: {(r.stderr or r.stdout).strip()}")
    return did


def remove(node: str) -> None:
    if is_created(node):
        _umount(ns_file(node))
    root = node_root(node)
    if os.path.ismount(root):
        _umount(root)
    if os.path.exists(ns_file(node)):
        os.unlink(ns_file(node))


def main(argv: list[str]) -> int:
    if os.geteuid() != 0:
        print("nodens: must run as root", file=sys.stderr)
        return 1
    if len(argv) >= 4 and argv[0] == "exec" and argv[2] == "--":
        enter(argv[1])
        os.execvp(argv[3], argv[3:])
    if len(argv) != 2 or argv[0] not in ("ensure", "sync", "build", "remove"):
        print("usage: nodens.py ensure|sync|remove NODE | exec NODE -- CMD ...", file=sys.stderr)
        return 2
    cmd, node = argv
    if cmd == "ensure":
        print(f"{node}'s mount namespace: {ensure(node)}")
    elif cmd == "sync":
        enter(node)
        sync(node)
    elif cmd == "build":
        build(node)
    else:
        remove(node)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
