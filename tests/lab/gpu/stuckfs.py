#!/usr/bin/python3
"""A FUSE filesystem that never answers a read -- the lab's "stuck" fault (gpu-recovery.md §1.2 b, Rung 3).

    stuckfs.py --target-pid PID --mountpoint /run/lab-stuckfs --status FILE [--stall-after-open]

Raw /dev/fuse protocol, stdlib only (ctypes for mount/setns).  The filesystem is mounted directly in the
mount namespace of PID (a container's init), so only that container sees it; the connection is owned by
this host process.  It holds one file, `blob`; every request is answered except READ, which is left
pending forever.  A task reading `blob` therefore waits in the kernel's fuse request_wait_answer(): once
it has caught a signal it waits killable (state D), and once SIGKILLed it waits uninterruptibly (still D)
until the request is answered or the connection is aborted from the host:

    echo 1 > /sys/fs/fuse/connections/<N>/abort        (N: see the status file or /proc/PID/mountinfo)

Killing this server (closing /dev/fuse) aborts the connection too.  After an abort the server lazily
unmounts the dead mount inside the container and exits.

--stall-after-open (opt-in; the hostile-neighbour test's server): attributes and entries are never cached (valid
0 s), and once it has answered one OPEN the server answers nothing more (LOOKUP, GETATTR, FLUSH ... are left
pending): a process that opened `blob` keeps its fd, and anything that then stats that file (through
/proc/PID/fd/N too) or looks a name up in the mount waits in request_wait_answer, unkillable once the request is
read, until the connection is aborted.  The status file gains "stalled": true once it has stopped answering.
"""
import argparse
import ctypes
import errno
import json
import os
import signal
import struct
import sys

libc = ctypes.CDLL(None, use_errno=True)
CLONE_NEWNS = 0x00020000
MS_NOSUID, MS_NODEV = 2, 4
MNT_DETACH = 2

IN_HDR = struct.Struct("<IIQQIIIHH")     # fuse_in_header (40 bytes)
OUT_HDR = struct.Struct("<IiQ")          # fuse_out_header (16 bytes)
ATTR = struct.Struct("<QQQQQQIIIIIIIIII")  # fuse_attr (88 bytes)

LOOKUP, FORGET, GETATTR, OPEN, READ, STATFS, RELEASE, FLUSH, INIT = 1, 2, 3, 14, 15, 17, 18, 25, 26
OPENDIR, READDIR, RELEASEDIR, INTERRUPT, DESTROY, BATCH_FORGET = 27, 28, 29, 36, 38, 42
FOPEN_DIRECT_IO = 1
ROOT, BLOB = 1, 2


def check(ret, what):
    if ret != 0:
        e = ctypes.get_errno()
        raise OSError(e, "%s: %s" % (what, os.strerror(e)))


def in_mntns(target_pid, func):
    """Run func() in a child that has joined target_pid's mount namespace; return its exit status."""
    pid = os.fork()
    if pid == 0:
        try:
            fd = os.open("/proc/%d/ns/mnt" % target_pid, os.O_RDONLY)
            check(libc.setns(fd, CLONE_NEWNS), "setns")
            func()
            os._exit(0)
        except BaseException as e:  # noqa: BLE001
            sys.stderr.write("stuckfs: %s\n" % e)
            os._exit(1)
    return os.waitpid(pid, 0)[1]


def attr(node):
    if node == ROOT:
        return ATTR.pack(ROOT, 0, 0, 0, 0, 0, 0, 0, 0, 0o040755, 2, 0, 0, 0, 4096, 0)
    return ATTR.pack(BLOB, 1 << 30, 1 << 21, 0, 0, 0, 0, 0, 0, 0o100444, 1, 0, 0, 0, 4096, 0)


def dirent(ino, off, name, typ):
    n = name.encode()
    ent = struct.pack("<QQII", ino, off, len(n), typ) + n
    return ent + b"\0" * (-len(ent) % 8)


def write_status(status):
    """Replace the status file in one rename: a reader never sees it empty or half written."""
    tmp = status["path"] + ".tmp"
    with open(tmp, "w") as f:
        json.dump({k: v for k, v in status.items() if k != "path"}, f)
    os.replace(tmp, status["path"])


def serve(fd, status, stall_after_open=False):
    pending = []
    valid = 0 if stall_after_open else 3600
    stalled = False
    while True:
        try:
            req = os.read(fd, 1 << 21)
        except OSError as e:
            if e.errno in (errno.EINTR, errno.EAGAIN):
                continue
            if e.errno == errno.ENOENT:  # request interrupted before we read it
                continue
            return e.errno  # ENODEV: aborted or unmounted
        ln, op, uniq, node, _uid, _gid, _pid, _x, _p = IN_HDR.unpack_from(req)
        body = req[IN_HDR.size:ln]
        err, data = 0, b""
        if stalled:
            if op not in (FORGET, BATCH_FORGET, INTERRUPT):
                pending.append(uniq)  # never answered
            continue
        if op == INIT:
            major, minor, ra, _flags = struct.unpack_from("<IIII", body)
            data = struct.pack("<IIIIHHIIHHI", 7, min(minor, 31), ra, 0, 16, 12, 131072, 1, 32, 0, 0)
            data += b"\0" * (64 - len(data))
        elif op == LOOKUP:
            name = body.split(b"\0")[0]
            if node == ROOT and name == b"blob":
                data = struct.pack("<QQQQII", BLOB, 0, valid, valid, 0, 0) + attr(BLOB)
            else:
                err = -errno.ENOENT
        elif op == GETATTR:
            data = struct.pack("<QII", valid, 0, 0) + attr(node)
        elif op in (OPEN, OPENDIR):
            data = struct.pack("<QII", 0, FOPEN_DIRECT_IO if op == OPEN else 0, 0)
        elif op == READ:
            pending.append(uniq)  # never answered
            status["pending_reads"] = len(pending)
            continue
        elif op == READDIR:
            off = struct.unpack_from("<QQI", body)[1]
            ents = [(ROOT, ".", 4), (ROOT, "..", 4), (BLOB, "blob", 8)]
            data = b"".join(dirent(i, k + 1, n, t) for k, (i, n, t) in enumerate(ents) if k >= off)
        elif op in (RELEASE, RELEASEDIR, FLUSH):
            pass
        elif op == STATFS:
            data = struct.pack("<QQQQQIIII", 0, 0, 0, 2, 0, 4096, 255, 4096, 0) + b"\0" * 24
        elif op in (FORGET, BATCH_FORGET, INTERRUPT):
            continue  # no reply; an INTERRUPT for a pending READ is ignored on purpose
        elif op == DESTROY:
            pass
        else:
            err = -errno.ENOSYS
        try:
            os.write(fd, OUT_HDR.pack(OUT_HDR.size + len(data), err, uniq) + data)
        except OSError:
            pass
        if stall_after_open and op == OPEN:
            stalled = True
            status["stalled"] = True
            write_status(status)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--target-pid", type=int, required=True)
    ap.add_argument("--mountpoint", required=True)
    ap.add_argument("--status", required=True)
    ap.add_argument("--stall-after-open", action="store_true",
                    help="answer nothing after the first OPEN; never cache attributes or entries")
    a = ap.parse_args()

    fd = os.open("/dev/fuse", os.O_RDWR)
    opts = "fd=%d,rootmode=40755,user_id=0,group_id=0,allow_other" % fd

    owner = os.stat("/proc/%d" % a.target_pid)

    def do_mount():
        # Create the mount point as the container's root (a host uid the container's filesystems map);
        # host uid 0 is unmapped there (EOVERFLOW).
        libc.setfsgid(owner.st_gid)
        libc.setfsuid(owner.st_uid)
        os.makedirs(a.mountpoint, exist_ok=True)
        check(libc.mount(b"lab-stuckfs", a.mountpoint.encode(), b"fuse.lab-stuckfs", MS_NOSUID | MS_NODEV,
                         opts.encode()), "mount")
    if in_mntns(a.target_pid, do_mount) != 0:
        return 1
    conn = None
    with open("/proc/%d/mountinfo" % a.target_pid) as f:
        for line in f:
            parts = line.split()
            if parts[4] == a.mountpoint and " - fuse.lab-stuckfs " in line:
                ma, mi = (int(x) for x in parts[2].split(":"))
                conn = (ma << 20) | mi
    status = {"pid": os.getpid(), "target_pid": a.target_pid, "mountpoint": a.mountpoint, "conn": conn,
              "abort": "/sys/fs/fuse/connections/%s/abort" % conn, "path": a.status}
    write_status(status)
    signal.signal(signal.SIGTERM, lambda *x: sys.exit(0))
    try:
        e = serve(fd, status, a.stall_after_open)
        sys.stderr.write("stuckfs: connection %s ended (%s)\n" % (conn, os.strerror(e)))
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        try:
            os.close(fd)
        except OSError:
            pass
        unmount(a.target_pid, a.mountpoint)
    return 0


def unmount(target_pid, mountpoint):
    """Lazily unmount the (dead) filesystem inside target_pid's mount namespace, if still there."""
    def mounted():
        try:
            with open("/proc/%d/mountinfo" % target_pid) as f:
                return any(ln.split()[4] == mountpoint and " - fuse.lab-stuckfs " in ln for ln in f)
        except OSError:
            return False

    def do():
        check(libc.umount2(mountpoint.encode(), MNT_DETACH), "umount2")
    if mounted():
        rc = in_mntns(target_pid, do)
        sys.stderr.write("stuckfs: unmounted %s in pid %d's mount namespace (rc %d)\n" % (mountpoint, target_pid, rc))


if __name__ == "__main__":
    sys.exit(main())
