# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The recovery ladder's actions that change the system: the scoped kill plan (``pids_to_signal``), signals
sent through pidfds with start-time checks (``signal_pid``, ``send_signal``), aborting a FUSE connection, and
waiting. Only gpu_recover_action calls them, outside check mode.

No Ansible imports; unit-tested in tests/unit/plugins/module_utils/test_recover_signals.py and (the call site)
test_gpu_recover_action.py.
"""

from __future__ import annotations

import os
import signal as _signal
import time
from typing import Any, Callable, Mapping, Optional, Sequence

from ansible_collections.inferops.gpu_inference.plugins.module_utils.procfs import join_root
from ansible_collections.inferops.gpu_inference.plugins.module_utils.recover_procs import read_stat


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
        st = read_stat(pid, root)
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
    with open(join_root(root, "/sys/fs/fuse/connections/%d/abort" % int(conn)), "w") as handle:
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
