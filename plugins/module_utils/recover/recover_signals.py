# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The recovery ladder's actions that change the system: the scoped kill plan (``pids_to_signal``), signals
sent only to what was judged (``send_signal``: each PID through a pidfd with its planned start time and cgroup,
``signal_pid``; each process group judged again, member by member, when it is signalled, ``signal_group``),
aborting a FUSE connection, and waiting. Only gpu_recover_action calls them, outside check mode.

No Ansible imports; unit-tested in tests/unit/plugins/module_utils/recover/test_recover_signals.py and (the call site)
test_gpu_recover_action.py.
"""

from __future__ import annotations

import errno
import os
import signal as _signal
import time
from typing import Any, Callable, Mapping, Optional, Sequence

from ansible_collections.inferops.gpu_inference.plugins.module_utils.host.procfs import join_root, parse_proc_cgroup, read_text
from ansible_collections.inferops.gpu_inference.plugins.module_utils.recover.recover_procs import (
    list_pids, parse_nspid, read_stat, wholly_in_container)


def _judged(p: Mapping[str, Any]) -> Optional[dict[str, str]]:
    """The cgroup a process was judged in (``read_process``'s parsed /proc/PID/cgroup), or None when not read."""
    cg = p.get("cgroup")
    return dict(cg) if isinstance(cg, Mapping) else None


def _starttime(p: Mapping[str, Any]) -> Optional[int]:
    st = p.get("starttime")
    return st if isinstance(st, int) and not isinstance(st, bool) else None


def pids_to_signal(targets: Sequence[Mapping[str, Any]], all_procs: Sequence[Mapping[str, Any]], vmid: int,
                   init_pid: Optional[int], by_group: bool = True) -> dict[str, Any]:
    """Plan a scoped kill: for each target (a process of the container), its whole process group when every
    member of that group is in the container and the group is not the container init's; else the PID alone.
    With ``by_group`` false, only the targets themselves (rung 3's stuck processes: their groups may hold
    unrelated processes of the container).

    Never the container's init (NSpid ending in 1, or ``init_pid``), never a PID outside the container, never a
    process without a start time (it could not be told from a process that reuses its PID).
    ``all_procs`` must be every process on the host (``scan_processes(...)["all"]``), not only the
    container's: a process started by a non-interactive ``pct exec`` keeps the host caller's process
    group, and only the host's members of that group tell that ``kill(-pgid)`` would reach the host.

    Returns {"vmid", "init_pid", "groups": [pgid], "members": {pgid: {pid: starttime}} (what each group was judged
    by), "pids": [pid], "starttimes": {pid: starttime}, "cgroups": {pid: parsed /proc/PID/cgroup} (the cgroup each
    member and PID was judged in, when the scan read it), "skipped": [{pid, why}]}. ``send_signal`` judges each
    group and PID again at the moment it signals them.
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
        if _starttime(t) is None:
            skipped.append({"pid": pid, "why": "no start time read: it could not be told from a process that "
                                               "reuses its PID, so it is not signalled"})
            continue
        pgid = int(t["pgid"])
        members = by_pgid.get(pgid, [])
        if (by_group and pgid > 1 and pgid != init_pgid and members
                and all(m.get("vmid") == vmid and _starttime(m) is not None for m in members)
                and not any(is_init(m) for m in members)):
            groups.add(pgid)
        else:
            pids.add(pid)
    judged = {int(t["pid"]): t for t in targets}
    members_of = {g: {int(m["pid"]): _starttime(m) for m in by_pgid.get(g, [])} for g in sorted(groups)}
    for g in members_of:
        judged.update({int(m["pid"]): m for m in by_pgid.get(g, [])})
    in_groups = {pid for g in members_of.values() for pid in g}
    left = sorted(pids - in_groups)
    cgroups = {pid: _judged(judged[pid]) for pid in sorted(in_groups | set(left)) if _judged(judged[pid]) is not None}
    return {"vmid": vmid, "init_pid": init_pid, "groups": sorted(groups), "members": members_of, "pids": left,
            "starttimes": {p: _starttime(judged[p]) for p in left}, "cgroups": cgroups, "skipped": skipped}


def _cgroup_now(pid: int, root: str = "/") -> Optional[dict[str, str]]:
    text = read_text(join_root(root, "/proc/%d/cgroup" % pid))
    return parse_proc_cgroup(text) if text is not None else None


def still_in_scope(pid: int, judged_cgroup: Optional[Mapping[str, str]], vmid: int,
                   root: str = "/") -> tuple[bool, str]:
    """Whether ``pid`` is, now, where it was judged: its cgroup the one it was judged in, or else every hierarchy of
    it in container ``vmid`` (a move inside the container). (ok, what its cgroup is now)."""
    now = _cgroup_now(pid, root)
    if now is None:
        return False, "its cgroup cannot be read"
    if judged_cgroup is not None and now == dict(judged_cgroup):
        return True, "unchanged"
    if wholly_in_container(now, vmid):
        return True, "moved inside CT %d" % vmid
    return False, "cgroup now %s" % ", ".join("%s:%s" % (k or "v2", v) for k, v in sorted(now.items()))


def signal_pid(pid: int, starttime: Optional[int], sig: int, root: str = "/",
               scope: Optional[tuple[int, Optional[Mapping[str, str]]]] = None) -> str:
    """Signal one process only if it is still the planned one: "sent", "gone", "reused", "moved" or "unplanned".

    A pidfd (pidfd_open, Linux 5.3) pins the process it was opened for; its start time read after opening tells
    whether that is the process that was planned (same PID and start time) or a new one that reused the PID, so a
    reused PID is never hit: the signal goes through the pidfd, to the process opened, which the check was about.
    Without pidfds (older kernel or Python) the start time is checked right before kill(2).
    ``starttime`` None is "unplanned": never signalled (a bare kill could hit whoever holds the PID now).
    ``scope`` (vmid, the cgroup it was judged in): also "moved" when it left that cgroup and is not wholly in the
    container any more (root moved it out since the plan).
    """
    if starttime is None:
        return "unplanned"
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
        if st["starttime"] != starttime:
            return "reused"
        if scope is not None and not still_in_scope(pid, scope[1], scope[0], root)[0]:
            return "moved"
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


# include/uapi/linux/pidfd.h (Linux 6.9): pidfd_send_signal() to the process group whose leader the pidfd is.
PIDFD_SIGNAL_PROCESS_GROUP = 1 << 2


def _group_now(pgid: int, root: str = "/") -> list[dict[str, Any]]:
    """The processes whose process group is ``pgid`` now (zombies left out: a signal does nothing to them)."""
    found = []
    for pid in list_pids(root):
        st = read_stat(pid, root)
        if st is not None and st["pgid"] == pgid and st["state"] not in ("Z", "X"):
            found.append(st)
    return found


def judge_group(pgid: int, members: Mapping[int, Optional[int]], cgroups: Mapping[int, Mapping[str, str]],
                vmid: int, init_pid: Optional[int], root: str = "/") -> dict[str, Any]:
    """Judge a planned process group again, as it is now: {"verdict": "group"|"split"|"gone", "why", "outside"}.

    "group" when a member planned with its start time is still in it (so ``pgid`` is still the planned group) and
    every process in it now is where it may be signalled: a planned member (same start time) still in the cgroup
    it was judged in or wholly in the container, or a process that joined since (a child forked by a member)
    wholly in the container and not its init. "split" when any is not (root moved a member to another cgroup, a
    process of the host or of another container is in the group): the group is not signalled, its planned
    members are, one by one. "gone" when nothing is left in it, "replaced" when only processes that were not
    planned are (the number may be another group's now): not signalled.
    """
    now = _group_now(pgid, root)
    planned_here = [p for p in now if members.get(p["pid"]) is not None and members[p["pid"]] == p["starttime"]]
    if not now:
        return {"verdict": "gone", "why": "process group %d has ended" % pgid, "outside": []}
    if not planned_here:
        return {"verdict": "replaced", "outside": [], "why": "no planned member is left in process group %d (%s now: "
                "other processes, other start times): not signalled" % (
                    pgid, ", ".join("%d/%s" % (p["pid"], p["comm"]) for p in now))}
    outside = []
    for p in now:
        pid = p["pid"]
        planned = members.get(pid) is not None and members[pid] == p["starttime"]
        if planned:
            ok, where = still_in_scope(pid, cgroups.get(pid), vmid, root)
        else:
            now_cg = _cgroup_now(pid, root)
            nspid = parse_nspid(read_text(join_root(root, "/proc/%d/status" % pid)))
            if (init_pid and pid == int(init_pid)) or (nspid and nspid[-1] == 1):
                ok, where = False, "the container's init"
            elif now_cg is not None and wholly_in_container(now_cg, vmid):
                ok, where = True, "joined since the plan, in CT %d" % vmid
            else:
                ok, where = False, ("joined since the plan, " + (
                    "cgroup %s" % ", ".join("%s:%s" % (k or "v2", v) for k, v in sorted(now_cg.items()))
                    if now_cg is not None else "cgroup unreadable"))
        if not ok:
            outside.append({"pid": pid, "comm": p["comm"], "where": where})
    if outside:
        return {"verdict": "split", "outside": outside,
                "why": "process group %d holds %s, outside CT %d: the group is not signalled, its planned members "
                       "one by one" % (pgid, "; ".join("%d/%s (%s)" % (o["pid"], o["comm"], o["where"])
                                                       for o in outside), vmid)}
    return {"verdict": "group", "why": "every member in CT %d" % vmid, "outside": []}


def signal_group(pgid: int, members: Mapping[int, Optional[int]], cgroups: Mapping[int, Mapping[str, str]],
                 vmid: int, init_pid: Optional[int], sig: int, root: str = "/") -> dict[str, Any]:
    """Signal a planned process group if ``judge_group`` still finds it whole in the container: {"verdict", "why",
    "outside", "sent": bool}.

    When its leader (PID = PGID) is a planned member that still runs, the signal goes through the leader's pidfd
    with PIDFD_SIGNAL_PROCESS_GROUP (Linux 6.9): to the group that leader made, never to a later group that reused
    the number; else (leader gone, older kernel) ``kill(-pgid)``, whose number cannot be reused while the planned
    member just seen in it lives. What stays between the judgement and the signal is a process joining or leaving
    in that instant (only root, or a process of the same session, can).
    """
    fd = None
    if members.get(pgid) is not None:
        try:
            fd = os.pidfd_open(pgid)
            st = read_stat(pgid, root)
            if st is None or st["starttime"] != members[pgid]:
                os.close(fd)
                fd = None
        except (AttributeError, OSError):
            fd = None
    try:
        verdict = judge_group(pgid, members, cgroups, vmid, init_pid, root)
        verdict["sent"] = False
        if verdict["verdict"] != "group":
            return verdict
        try:
            if fd is not None:
                try:
                    _signal.pidfd_send_signal(fd, sig, None, PIDFD_SIGNAL_PROCESS_GROUP)
                except OSError as exc:
                    if exc.errno != errno.EINVAL:
                        raise
                    os.killpg(pgid, sig)  # a kernel before 6.9: flags unknown
            else:
                os.killpg(pgid, sig)
            verdict["sent"] = True
        except ProcessLookupError:
            verdict.update(verdict="gone", why="process group %d ended before the signal" % pgid)
        return verdict
    finally:
        if fd is not None:
            os.close(fd)


def send_signal(plan: Mapping[str, Any], sig: int) -> dict[str, Any]:
    """Send ``sig`` to the planned process groups and PIDs, each judged again at the moment it is signalled.

    A group through ``signal_group`` (every member still in the container, the group still the planned one; else
    its planned members one by one); a PID through ``signal_pid`` with its planned start time and the cgroup it
    was judged in (never a process that reused the PID or that left the container since; never one without a
    planned start time). Returns {"groups": [signalled], "pids": [signalled], "refused": [{pid or pgid, why}],
    "errors": [text]}.
    """
    out: dict[str, Any] = {"groups": [], "pids": [], "refused": [], "errors": []}
    vmid = plan["vmid"]
    starts = plan.get("starttimes") or {}
    cgroups = plan.get("cgroups") or {}
    one_by_one: list[tuple[int, Optional[int]]] = []
    for pgid in plan.get("groups", []):
        members = (plan.get("members") or {}).get(pgid) or {}
        try:
            verdict = signal_group(int(pgid), members, cgroups, vmid, plan.get("init_pid"), sig)
        except OSError as exc:
            out["errors"].append("signal to process group %s (%s): %s" % (pgid, sig, exc))
            continue
        if verdict["sent"]:
            out["groups"].append(int(pgid))
        elif verdict["verdict"] in ("split", "replaced"):
            out["refused"].append({"pgid": int(pgid), "why": verdict["why"]})
        if verdict["verdict"] == "split":
            one_by_one.extend(sorted(members.items()))
    for pid, start in [(int(p), starts.get(p)) for p in plan.get("pids", [])] + one_by_one:
        try:
            how = signal_pid(pid, start, sig, scope=(vmid, cgroups.get(pid)))
        except OSError as exc:
            out["errors"].append("signal to PID %s (%s): %s" % (pid, sig, exc))
            continue
        if how == "sent":
            out["pids"].append(pid)
        elif how in REFUSALS:
            out["refused"].append({"pid": pid, "why": REFUSALS[how]})
    return out


REFUSALS = {
    "reused": "the PID was reused by another process since the plan (another start time): not signalled",
    "moved": "it left the cgroup it was judged in and is not wholly in the container now: not signalled",
    "unplanned": "no start time was planned for it: not signalled (a bare kill could hit a process that reused "
                 "the PID)",
}


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
