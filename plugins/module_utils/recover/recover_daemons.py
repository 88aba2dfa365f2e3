# -*- coding: utf-8 -*-
# Copyright (c) 2026, inferops
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Host daemons that hold the GPUs' device files and block a GPU reset (rung 5).

nvidia-persistenced keeps /dev/nvidia* open so the driver keeps the GPUs initialised (NVIDIA, Driver
Persistence); any open client makes ``nvidia-smi -r`` fail with "In use by another client"
(NVIDIA/gpu-operator#118: "nvidia-persistenced keeps a handle on the GPU and blocks --gpu-reset"). Reset
sequences stop it first and start it again afterwards (NVIDIA ai-cloud-validation PR #603, IBM/CAST#551).

The node is shared with host users, and what a process says about itself (its ``comm``, its command line, its
cgroup path as it names it) is theirs to choose: any user can call ``prctl(PR_SET_NAME, "nvidia-persistenced")``
and open ``/dev/nvidia0`` (mode 0666). So a holder is a daemon rung 5 may stop only when what root controls says
so: it is the ``MainPID`` that systemd reports for one of the units in STOPPABLE_UNITS, that unit is loaded and
active, its unit file (and every drop-in) and the binary of its ``ExecStart`` are owned by root and writable by
no one else, all the way up from ``/``, the unit file lies under one of UNIT_DIRS, the process's real uid is root's
or the user the unit itself names (``User=``, or ``--user`` of nvidia-persistenced), the kernel puts the process
in the unit's control group, and its start time is the one the scan saw. It is started again only through that
unit (``systemctl start``); nothing read from the process is ever run. Every other holder is a client: the
reset of its GPUs is refused and the holder named, with why it is not the daemon.

No Ansible imports: unit-tested in tests/unit/plugins/module_utils/recover/test_recover_daemons.py.
"""
from __future__ import annotations

import os
import pwd
import re
import stat
from typing import Any, Callable, Mapping, Optional, Sequence

from ansible_collections.inferops.gpu_inference.plugins.module_utils.host.procfs import read_text

# systemd unit -> the daemon it runs. Only these units are ever stopped or started.
STOPPABLE_UNITS: dict[str, str] = {"nvidia-persistenced.service": "nvidia-persistenced"}
# Where the system manager's unit files installed by root (packages, the NVIDIA installer, the administrator) lie.
UNIT_DIRS: tuple[str, ...] = ("/etc/systemd/system", "/lib/systemd/system", "/usr/lib/systemd/system")
# What ``systemctl show`` is asked for.
SHOW_PROPERTIES: tuple[str, ...] = ("Id", "LoadState", "ActiveState", "MainPID", "ControlGroup", "FragmentPath",
                                    "DropInPaths", "ExecStart", "User")

# Bounds of the steps rung 5 takes for each daemon (recover_gate.action_budget_s counts them): each systemctl call
# (under timeout(1), killed 5 s later), the wait for the stopped process to be gone, the wait for the unit's new
# main process to hold the GPUs again.
SYSTEMCTL_TIMEOUT_S = 30
STOP_WAIT_S = 30
START_WAIT_S = 30

# One command of ExecStart as systemctl show prints it: "{ path=/usr/bin/x ; argv[]=/usr/bin/x --user y ; ... }".
_EXEC_RE = re.compile(r"\{ path=(?P<path>[^;]*?) ; argv\[\]=(?P<argv>[^;]*?) ;")

StatFn = Callable[[str], os.stat_result]


def show_args(unit: str) -> list[str]:
    """systemctl's arguments that read what systemd knows of ``unit`` (one of STOPPABLE_UNITS)."""
    if unit not in STOPPABLE_UNITS:
        raise ValueError("%r is not a unit rung 5 may stop (%s)" % (unit, ", ".join(STOPPABLE_UNITS)))
    return ["show", "--property=" + ",".join(SHOW_PROPERTIES), unit]


def parse_show(text: Optional[str]) -> dict[str, str]:
    """``systemctl show`` output (KEY=VALUE lines) as a dict."""
    out: dict[str, str] = {}
    for line in (text or "").splitlines():
        key, sep, value = line.partition("=")
        if sep and key:
            out[key] = value
    return out


def parse_exec_start(value: Optional[str]) -> list[dict[str, Any]]:
    """The commands of an ExecStart property: [{"path", "argv"}]."""
    return [{"path": m.group("path").strip(), "argv": m.group("argv").split()}
            for m in _EXEC_RE.finditer(value or "")]


def unit_user(show: Mapping[str, str], execs: Sequence[Mapping[str, Any]]) -> Optional[str]:
    """The user the unit runs its daemon as: ``User=``, else nvidia-persistenced's own ``--user NAME``
    (``--user=NAME``, ``-u NAME``): NVIDIA's unit template starts it with ``--user``, and it drops to that user."""
    if show.get("User"):
        return show["User"]
    for e in execs:
        argv = list(e.get("argv") or [])
        for i, arg in enumerate(argv):
            if arg in ("--user", "-u") and i + 1 < len(argv):
                return argv[i + 1]
            if arg.startswith("--user="):
                return arg.split("=", 1)[1]
    return None


def _uid_of_user(name: str) -> Optional[int]:
    try:
        return pwd.getpwnam(name).pw_uid
    except (KeyError, TypeError):
        return None


def untrusted_path(path: str, stat_fn: StatFn = os.lstat, resolve: Callable[[str], str] = os.path.realpath
                   ) -> Optional[str]:
    """Why ``path`` is not root's alone, or None: it is absolute, and it and every directory above it (links
    resolved) are owned by root and writable by neither group nor others."""
    if not path or not path.startswith("/"):
        return "%r is not an absolute path" % (path,)
    real = resolve(path)
    parts = [p for p in real.split("/") if p]
    for i in range(len(parts), -1, -1):
        here = "/" + "/".join(parts[:i])
        try:
            st = stat_fn(here)
        except OSError as exc:
            return "%s cannot be read (%s)" % (here, exc.strerror or exc)
        if st.st_uid != 0:
            return "%s is owned by uid %d, not root" % (here, st.st_uid)
        if stat.S_IMODE(st.st_mode) & 0o022:
            return "%s is writable by %s (mode %04o)" % (
                here, "group and others" if stat.S_IMODE(st.st_mode) & 0o022 == 0o022 else
                "its group" if st.st_mode & 0o020 else "others", stat.S_IMODE(st.st_mode))
    return None


def unit_facts(unit: str, show_text: Optional[str], stat_fn: StatFn = os.lstat,
               resolve: Callable[[str], str] = os.path.realpath,
               uid_of_user: Callable[[str], Optional[int]] = _uid_of_user) -> dict[str, Any]:
    """What root controls about ``unit``, from ``systemctl show`` (show_args) and the files it names.

    Returns {"unit", "name", "main_pid", "active_state", "control_group", "fragment_path", "exec_paths",
    "user", "allowed_uids", "problems"}: problems lists why the unit cannot vouch for its main process (empty:
    it can)."""
    show = parse_show(show_text)
    execs = parse_exec_start(show.get("ExecStart"))
    problems: list[str] = []
    if show.get("LoadState") != "loaded":
        problems.append("%s is not loaded (LoadState=%s)" % (unit, show.get("LoadState") or "unknown"))
    fragment = show.get("FragmentPath") or ""
    if not fragment:
        problems.append("%s has no unit file" % unit)
    else:
        real = resolve(fragment)
        dirs = sorted({resolve(d) for d in UNIT_DIRS})
        if not any(real.startswith(d + "/") for d in dirs):
            problems.append("%s's unit file %s is not under %s" % (unit, fragment, " or ".join(UNIT_DIRS)))
        why = untrusted_path(fragment, stat_fn, resolve)
        if why:
            problems.append("%s's unit file: %s" % (unit, why))
    for dropin in (show.get("DropInPaths") or "").split():
        why = untrusted_path(dropin, stat_fn, resolve)
        if why:
            problems.append("%s's drop-in %s: %s" % (unit, dropin, why))
    if not execs:
        problems.append("%s has no ExecStart" % unit)
    for e in execs:
        why = untrusted_path(e["path"], stat_fn, resolve)
        if why:
            problems.append("%s's ExecStart binary: %s" % (unit, why))
    user = unit_user(show, execs)
    allowed = {0}
    if user:
        uid = uid_of_user(user)
        if uid is None:
            problems.append("%s runs its daemon as user %r, who does not exist" % (unit, user))
        else:
            allowed.add(uid)
    try:
        main_pid = int(show.get("MainPID") or 0)
    except ValueError:
        main_pid = 0
    return {"unit": unit, "name": STOPPABLE_UNITS.get(unit, unit), "main_pid": main_pid,
            "active_state": show.get("ActiveState"), "control_group": show.get("ControlGroup") or "",
            "fragment_path": fragment, "exec_paths": [e["path"] for e in execs], "user": user,
            "allowed_uids": sorted(allowed), "problems": problems}


def parse_real_uid(status_text: Optional[str]) -> Optional[int]:
    """The real uid of /proc/PID/status ("Uid:\\treal\\teffective\\tsaved\\tfs"), or None."""
    for line in (status_text or "").splitlines():
        if line.startswith("Uid:"):
            fields = line.split()[1:]
            if fields and fields[0].isdigit():
                return int(fields[0])
    return None


def read_real_uid(pid: int, root: str = "/") -> Optional[int]:
    return parse_real_uid(read_text(os.path.join(root, "proc/%d/status" % pid)))


def systemd_cgroup(cgroup: Mapping[str, str]) -> Optional[str]:
    """The process's path in the hierarchy systemd manages: ``name=systemd`` (cgroup v1, hybrid), else v2's."""
    if "name=systemd" in cgroup:
        return cgroup["name=systemd"]
    return cgroup.get("")


def judge_holder(holder: Mapping[str, Any], units: Mapping[str, Mapping[str, Any]], real_uid: Optional[int]
                 ) -> tuple[Optional[dict[str, Any]], str]:
    """(daemon, "") when ``holder`` (a recover_procs.read_process dict) is the main process of one of ``units``
    (unit_facts by unit) and that unit vouches for it; else (None, why it is a client). ``real_uid``: the
    process's real uid (read_real_uid)."""
    if holder.get("vmid") is not None:
        return None, "a process of CT %s" % holder["vmid"]
    pid = holder["pid"]
    for unit, facts in sorted(units.items()):
        if facts.get("main_pid") != pid:
            continue
        why = list(facts.get("problems") or [])
        if facts.get("active_state") != "active":
            why.append("%s is %s, not active" % (unit, facts.get("active_state") or "in an unknown state"))
        if real_uid is None or real_uid not in (facts.get("allowed_uids") or [0]):
            why.append("its real uid is %s, not root%s" % (
                "unknown" if real_uid is None else real_uid,
                " or %s's user %s" % (unit, facts["user"]) if facts.get("user") else ""))
        where = systemd_cgroup(holder.get("cgroup") or {})
        if not facts.get("control_group") or where != facts["control_group"]:
            why.append("the kernel puts it in cgroup %s, not %s's %s" % (
                where, unit, facts.get("control_group") or "(none)"))
        if holder.get("starttime") is None:
            why.append("its start time is unknown")
        if why:
            return None, "main process of %s, but %s" % (unit, "; ".join(why))
        return {"name": facts["name"], "unit": unit, "pid": pid, "starttime": holder["starttime"],
                "gpus": sorted(holder.get("gpu_fds") or []),
                "gpu_minors": sorted(holder.get("gpu_fd_minors", holder.get("gpu_fds")) or [])}, ""
    mains = ["%s's is %s" % (u, f.get("main_pid") or "none") for u, f in sorted(units.items())]
    return None, "not the main process of a host daemon's unit (%s)" % ("; ".join(mains) or "none known")


def split_host_holders(holders: Sequence[Mapping[str, Any]], gpus: Sequence[int], stop_daemons: bool,
                       units: Mapping[str, Mapping[str, Any]], uid_of_pid: Callable[[int], Optional[int]]
                       ) -> dict[str, list[dict[str, Any]]]:
    """Split the processes holding any of ``gpus`` into daemons rung 5 may stop and clients that block the reset.

    holders: recover_procs.read_process dicts (pid, comm, starttime, vmid, cgroup, gpu_fds). units: unit_facts of
    the STOPPABLE_UNITS (read through systemctl). uid_of_pid: the real uid of a PID (read_real_uid). A client
    carries ``held`` (the wanted GPUs it holds) and ``why`` (why it is not a daemon rung 5 may stop)."""
    wanted = set(gpus)
    daemons: list[dict[str, Any]] = []
    clients: list[dict[str, Any]] = []
    for h in holders:
        held = sorted(wanted & set(h.get("gpu_fds") or []))
        if not held:
            continue
        if stop_daemons:
            daemon, why = judge_holder(h, units, uid_of_pid(h["pid"]) if h.get("vmid") is None else None)
        else:
            daemon, why = None, "host daemons are not stopped (stop_host_daemons is false)"
        if daemon:
            daemons.append(daemon)
        else:
            clients.append(dict(h, held=held, why=why))
    return {"daemons": daemons, "clients": clients}


def still_main(daemon: Mapping[str, Any], facts: Mapping[str, Any], alive: bool) -> Optional[str]:
    """Why ``daemon`` may no longer be stopped through its unit (None: it may): right before the stop, systemd must
    still name the same process (its PID and start time) as the unit's active main process."""
    if facts.get("main_pid") != daemon["pid"] or not alive:
        return "%s's main process is no longer pid %d (now %s): nothing was stopped" % (
            daemon["unit"], daemon["pid"], facts.get("main_pid") or "none")
    if facts.get("problems") or facts.get("active_state") != "active":
        return "%s changed since it was judged (%s): nothing was stopped" % (
            daemon["unit"], "; ".join(facts.get("problems") or ["ActiveState=%s" % facts.get("active_state")]))
    return None


def restarted(daemon: Mapping[str, Any], facts: Mapping[str, Any], new_gpu_fds: Optional[Sequence[int]]
              ) -> tuple[bool, str]:
    """Whether the unit's new main process is up and holds the GPUs the stopped one held: (ok, what is missing).
    new_gpu_fds: the device minors the new main process holds open, compared with the daemon's gpu_minors."""
    main = facts.get("main_pid") or 0
    if facts.get("active_state") != "active" or not main:
        return False, "%s is %s with no main process" % (daemon["unit"], facts.get("active_state") or "unknown")
    if main == daemon["pid"]:
        return False, "%s's main process is still pid %d" % (daemon["unit"], main)
    missing = sorted(set(daemon.get("gpu_minors", daemon["gpus"])) - set(new_gpu_fds or []))
    if missing:
        return False, "%s's main process %d does not hold /dev/nvidia%s" % (
            daemon["unit"], main, ",".join(str(m) for m in missing))
    return True, ""


def describe(daemon: Mapping[str, Any]) -> str:
    return "%s (pid %s), the main process of %s: stopped and started again through that unit" % (
        daemon["name"], daemon["pid"], daemon["unit"])
