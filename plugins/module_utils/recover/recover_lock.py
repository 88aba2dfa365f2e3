# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The node's recover locks: one ladder per container, one GPU reset per node at a time.

A lock is an flock(2) on a file under /run/inferops/locks (root's, mode 0700): the kernel holds it for the process
that took it and drops it when that process ends, however it ends, so a lock is never stale by itself. The file's
content (who holds it: pid, its start time, playbook, VMID, controller) is written by the holder for the message a
second run prints, and for nothing else: whether a lock is held is the kernel's answer (flock), and whether the named
holder is alive is read from the process table (pid and start time, together: a reused pid has another start time).

The ladder's lock is held across many module calls, so a small holder process takes it (module gpu_recover_lock)
and keeps it until it is released (the ladder's end), its lease runs out (the ladder's whole budget), or the
connection it came from ends (a controller killed mid-ladder leaves no lock behind for longer than its connection).
Rung 5's node lock is held by the reset itself (gpu_recover_action), for the reset only.

No Ansible imports; unit-tested in tests/unit/plugins/module_utils/recover/test_recover_lock.py.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import time
from typing import Any, Callable, Mapping, Optional

from ansible_collections.inferops.gpu_inference.plugins.module_utils.common.errors import InferopsError
from ansible_collections.inferops.gpu_inference.plugins.module_utils.common.gpu_inventory import vmid_problem

LOCK_DIR = "/run/inferops/locks"
# Seconds between two tries of a lock that is held (the second run waits its budget, trying this often).
RETRY_S = 0.5
# The most of the holder's file a message quotes.
_RECORD_MAX = 4096


class LockError(InferopsError):
    """A lock request that is not what this module expects (a bad name, a negative wait)."""


def ladder_path(vmid: int, lock_dir: str = LOCK_DIR) -> str:
    """The lock of one container's ladder."""
    if vmid_problem(vmid):
        raise LockError("vmid %s" % vmid_problem(vmid))
    return os.path.join(lock_dir, "recover-ct-%d.lock" % int(vmid))


def reset_path(lock_dir: str = LOCK_DIR) -> str:
    """The node's GPU reset lock (rung 5)."""
    return os.path.join(lock_dir, "gpu-reset.lock")


def holder_record(pid: int, start_ticks: Optional[int], what: str, vmid: int, playbook: str = "",
                  controller: str = "", user: str = "", lease_until: Optional[float] = None,
                  now: Optional[float] = None, run: Optional[Mapping[str, Any]] = None) -> dict[str, Any]:
    """What the holder writes into the lock file: for the message of a second run, and (``run``: the controller's
    ansible-playbook process, pid and start time, on the controller ``controller``) for a second run on the same
    controller to tell that the run which took the lock is gone (stale_run)."""
    run = run or {}
    return {"pid": int(pid), "start_ticks": start_ticks, "what": str(what)[:64], "vmid": int(vmid),
            "playbook": str(playbook)[:256], "controller": str(controller)[:128], "user": str(user)[:64],
            "since": round(time.time() if now is None else now, 1),
            "lease_until": None if lease_until is None else round(float(lease_until), 1),
            "run_pid": run.get("pid"), "run_start_ticks": run.get("start_ticks")}


def stale_run(record: Optional[Mapping[str, Any]], controller: str, alive: Callable[[Any, Any], bool]) -> bool:
    """Whether the run that took a lock is gone, as a run on the same controller can tell: the record names this
    controller (``controller``: user, host and boot) and its ansible-playbook process (pid and start time) is not
    alive there (``alive``, the controller's own process table). A record from another controller, or without the
    run, is never judged stale: its holder ends with its lease or its connection. The record only points at the run;
    the holder a stale run leaves is then checked with the kernel (flock_holders) before it is ended."""
    if not record or not controller or record.get("controller") != controller:
        return False
    pid, ticks = record.get("run_pid"), record.get("run_start_ticks")
    if not isinstance(pid, int) or not isinstance(ticks, int):
        return False
    return not alive(pid, ticks)


def flock_holders(path: str, proc_locks: str) -> set[int]:
    """The pids that hold an flock on ``path``, from /proc/locks (proc(5)): the kernel's record, by the file's device
    and inode; a waiter ("->") holds nothing."""
    try:
        st = os.stat(path)
    except OSError:
        return set()
    ident = "%02x:%02x:%d" % (os.major(st.st_dev), os.minor(st.st_dev), st.st_ino)
    out = set()
    for line in proc_locks.splitlines():
        fields = line.split()
        if len(fields) >= 6 and "->" not in fields and fields[1] == "FLOCK" and fields[5] == ident:
            try:
                out.add(int(fields[4]))
            except ValueError:
                pass
    return out


def render(record: Mapping[str, Any]) -> str:
    return json.dumps(dict(record), sort_keys=True) + "\n"


def parse(text: str) -> Optional[dict[str, Any]]:
    """The holder's record from the file's text, None when it is not one (empty, torn, not ours)."""
    try:
        data = json.loads((text or "")[:_RECORD_MAX])
    except ValueError:
        return None
    if not isinstance(data, dict) or not isinstance(data.get("pid"), int):
        return None
    return data


def start_ticks(pid: int, proc: str = "/proc") -> Optional[int]:
    """The process's start time (clock ticks since boot, proc(5) /proc/pid/stat field 22), None when it is gone.
    The comm field may hold spaces and parentheses: the fields are counted after its last ')'."""
    try:
        with open(os.path.join(proc, str(int(pid)), "stat"), "r", encoding="ascii", errors="replace") as handle:
            text = handle.read()
    except (OSError, ValueError):
        return None
    fields = text.rpartition(")")[2].split()
    try:
        return int(fields[19])
    except (IndexError, ValueError):
        return None


def parent_pid(pid: int, proc: str = "/proc") -> Optional[int]:
    """The parent of ``pid`` (proc(5) /proc/pid/stat field 4), None when it is gone."""
    try:
        with open(os.path.join(proc, str(int(pid)), "stat"), "r", encoding="ascii", errors="replace") as handle:
            fields = handle.read().rpartition(")")[2].split()
        return int(fields[1])
    except (OSError, ValueError, IndexError):
        return None


def same_process(pid: Optional[int], ticks: Optional[int], proc: str = "/proc") -> bool:
    """Whether ``pid`` is still the process that started at ``ticks`` (a pid alone may have been reused)."""
    return pid is not None and ticks is not None and start_ticks(pid, proc) == ticks


def connection_process(proc: str = "/proc") -> Optional[tuple[int, int]]:
    """The process of the connection the current module call came through: the parent of this process's session
    leader (sshd runs each command of a connection in a new session, under the connection's own sshd process), with
    its start time; None when there is none to follow (a session led by init, or already gone)."""
    leader = os.getsid(0)
    ppid = parent_pid(leader, proc)
    if not ppid or ppid <= 1:
        return None
    ticks = start_ticks(ppid, proc)
    return (ppid, ticks) if ticks is not None else None


def controller_id(boot_id_path: str = "/proc/sys/kernel/random/boot_id") -> str:
    """This controller as a lock's record names it: user, host and boot (pids and start times are per boot)."""
    try:
        with open(boot_id_path, "r", encoding="ascii", errors="replace") as handle:
            boot = handle.read().strip()[:36]
    except OSError:
        boot = ""
    user = os.environ.get("USER") or str(os.getuid())
    return "%s@%s%s" % (user, os.uname()[1], (" boot " + boot) if boot else "")


def describe(record: Optional[Mapping[str, Any]], holder_alive: bool, path: str, now: float) -> str:
    """Who holds the lock at ``path``, for the message of a run that waits or is refused. ``holder_alive``: whether
    the recorded pid is still the process that started at the recorded time (same_process). The record only names
    the holder; that the lock is held is the kernel's answer."""
    if not record:
        return "%s is held by a process that wrote no record (flock held)" % path
    since = record.get("since")
    age = (" for %.0f s" % (now - float(since))) if isinstance(since, (int, float)) else ""
    who = "pid %s (%s of CT %s%s%s%s)" % (
        record.get("pid"), record.get("what") or "lock", record.get("vmid"),
        ", playbook %s" % record["playbook"] if record.get("playbook") else "",
        ", controller %s" % record["controller"] if record.get("controller") else "",
        ", user %s" % record["user"] if record.get("user") else "")
    lease = record.get("lease_until")
    until = (", until %.0f s from now at the latest" % max(float(lease) - now, 0)) if isinstance(lease, (int, float)) else ""
    if holder_alive:
        return "%s is held by %s%s%s" % (path, who, age, until)
    return ("%s is held, but its recorded holder %s is gone (the lock was passed on or its record is stale); "
            "the kernel still holds it for a live process" % (path, who))


def decide(acquired: bool, elapsed_s: float, wait_s: float) -> str:
    """``acquired``, ``wait`` (try again at most RETRY_S later) or ``refuse`` (the run's wait budget is spent)."""
    if wait_s < 0:
        raise LockError("the wait for a lock must be 0 or more seconds, got %r" % (wait_s,))
    if acquired:
        return "acquired"
    return "wait" if elapsed_s < wait_s else "refuse"


def try_flock(fd: int) -> bool:
    """One non-blocking try of an exclusive flock on ``fd``."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except OSError as exc:
        if exc.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
            return False
        raise


def open_lock(path: str) -> int:
    """Open (create) the lock file in its root-only directory; never follows a link."""
    directory = os.path.dirname(path)
    os.makedirs(directory, mode=0o700, exist_ok=True)
    return os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)


def read_record(fd: int) -> Optional[dict[str, Any]]:
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        return parse(os.read(fd, _RECORD_MAX).decode("utf-8", "replace"))
    except OSError:
        return None


def write_record(fd: int, record: Mapping[str, Any]) -> None:
    data = render(record).encode("utf-8")
    os.ftruncate(fd, 0)
    os.pwrite(fd, data, 0)
    os.fsync(fd)


def acquire(path: str, wait_s: float, clock: Callable[[], float] = time.monotonic,
            sleep: Callable[[float], None] = time.sleep, proc: str = "/proc") -> tuple[Optional[int], dict[str, Any]]:
    """Take the lock at ``path`` for this process, waiting up to ``wait_s`` (decide). Returns (fd, info): fd is None
    when refused, with info["msg"] saying who holds it; info["waited_s"] how long it waited."""
    fd = open_lock(path)
    t0 = clock()
    held_by = None
    while True:
        got = try_flock(fd)
        elapsed = clock() - t0
        verdict = decide(got, elapsed, wait_s)
        if verdict == "acquired":
            return fd, {"waited_s": round(elapsed, 1), "waited_for": held_by}
        record = read_record(fd)
        held_by = describe(record, same_process((record or {}).get("pid"), (record or {}).get("start_ticks"), proc),
                           path, time.time())
        if verdict == "refuse":
            os.close(fd)
            return None, {"waited_s": round(elapsed, 1), "msg": held_by, "holder": record}
        sleep(min(RETRY_S, max(wait_s - elapsed, 0.01)))
