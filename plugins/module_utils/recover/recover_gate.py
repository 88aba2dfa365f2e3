# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The recovery ladder's decisions, in one place: the rungs (defined once: every module, filter and the role take
their names and numbers from here), and ``judge``, which alone turns a diagnosis's readings into the verdict
(Clean / Not clean) and its reasons, the rung to take next and whether a verification may stop polling. Its parts:
the Clean gate for one sample (``evaluate_sample``, ``judge_host_memory``), the kernel log (recover_kernel.judge),
the rung (``choose_rung``, ``next_rung_after``) and when to stop polling (``settled``). Sources: docs/recover.md
("The ladder", "Clean").

No Ansible imports; unit-tested in tests/unit/plugins/module_utils/recover/test_recover_gate.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence

from ansible_collections.inferops.gpu_inference.plugins.module_utils.recover import recover_daemons as rd
from ansible_collections.inferops.gpu_inference.plugins.module_utils.recover import recover_kernel
from ansible_collections.inferops.gpu_inference.plugins.module_utils.recover.recover_procs import describe_unverified

GIB = 1024**3

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

# The rungs whose action gpu_recover_action performs (its option action is the rung's name: ACTION_NAMES), and, per
# rung, the role setting (gpu_recover_<name>, seconds) that bounds the verification's polling after it.
ACTING_RUNGS: tuple[int, ...] = (RUNG_STOP_SERVICE, RUNG_KILL_HOLDERS, RUNG_UNBLOCK_STUCK, RUNG_STOP_CONTAINER,
                                 RUNG_RESET_GPUS)
ACTION_NAMES: tuple[str, ...] = tuple(RUNG_NAMES[r] for r in ACTING_RUNGS)
RUNG_OF_ACTION: dict[str, int] = {RUNG_NAMES[r]: r for r in ACTING_RUNGS}
POLL_BUDGET_SETTING: dict[int, str] = {
    RUNG_STOP_SERVICE: "service_poll_timeout",
    RUNG_KILL_HOLDERS: "kill_poll_timeout",
    RUNG_UNBLOCK_STUCK: "stuck_timeout",
    RUNG_STOP_CONTAINER: "container_poll_timeout",
    RUNG_RESET_GPUS: "reset_poll_timeout",
    RUNG_REBOOT: "container_poll_timeout",
}


# What a node command may take beyond its own timeout: gpu_recover_action runs each under the bounded supervisor
# (bounded_command: SIGKILL at the deadline, output relayed at most 1 s after the command's exit), plus its start.
COMMAND_SLACK_S = 5
# ``pct status`` (is the container running, its init PID) is given this long.
PCT_STATUS_TIMEOUT_S = 30


def reset_command_timeout_s(settings: Mapping[str, Any]) -> int:
    """Seconds each nvidia-smi call of rung 5 may take (``-r`` gets three times this): a third of reset_timeout."""
    return max(int(settings.get("reset_timeout", 180)) // 3, 1)


def other_containers_scan_s(command_timeout_s: int) -> int:
    """Seconds rung 5 may spend reading the other running containers' GPUs (``pct list`` and one ``pct config``
    each, however many there are); past it their GPUs are unknown and the reset is refused."""
    return 2 * command_timeout_s


def reset_step_bounds_s(settings: Mapping[str, Any], gpu_count: int = 1) -> dict[str, int]:
    """The most each step of rung 5 (gpu_recover_action, action reset_gpus) may take, in the order it runs them, for a
    container with ``gpu_count`` GPUs (each may be its own reset group). gpu_recover_action bounds every one of
    these steps itself; action_budget_s adds them up."""
    s = {k: int(v) for k, v in settings.items() if isinstance(v, (int, float, str)) and str(v).isdigit()}
    t = reset_command_timeout_s(s)
    smi = t + COMMAND_SLACK_S
    pct_status = PCT_STATUS_TIMEOUT_S + COMMAND_SLACK_S
    systemctl = rd.SYSTEMCTL_TIMEOUT_S + COMMAND_SLACK_S
    units = len(rd.STOPPABLE_UNITS)
    return {
        # Ending the container's GPU processes first (as rungs 1 and 2).
        "container_status": pct_status,
        "stop_service": s.get("service_stop_timeout", 90) + COMMAND_SLACK_S,
        "compute_apps_to_kill": smi,
        "container_init": smi,
        "term_grace": s.get("term_grace", 10),
        "kill_wait": s.get("kill_wait", 60),
        # What holds the GPUs, what the other containers have, who vouches for the host daemons.
        "query_gpus": smi,
        "nvlink_topology": smi,
        "gpu_numbering": smi,
        "container_config": smi,
        "host_daemon_units": units * systemctl,
        "compute_apps": smi,
        "other_containers": other_containers_scan_s(t),
        # The node's GPU reset lock: another ladder's reset on the node is waited for, at most reset_timeout.
        "reset_lock": s.get("reset_timeout", 180),
        # Each host daemon: checked and stopped through its unit, then gone; started again, then holding the GPUs.
        "daemons_stop": units * (2 * systemctl + rd.STOP_WAIT_S),
        # Each reset group: persistence mode off, nvidia-smi -r (3 x t), persistence mode on.
        "reset_groups": max(int(gpu_count), 1) * (5 * t + 3 * COMMAND_SLACK_S),
        "daemons_start": units * (2 * systemctl + rd.START_WAIT_S + systemctl),
    }


def action_budget_s(rung: int, settings: Mapping[str, Any], gpu_count: int = 1) -> int:
    """Seconds rung ``rung``'s action may take at most (every step's own limit, plus slack), from the role's settings
    (service_stop_timeout, term_grace, kill_wait, stuck_timeout, container_shutdown_timeout, container_stop_timeout,
    reset_timeout); rung 5's for a container with ``gpu_count`` GPUs (reset_step_bounds_s). gpu_recover_action
    bounds each step itself; this is the task's safety net, above the sum, so that it never cuts a step short (a
    host daemon stopped for a reset and not started again)."""
    s = {k: int(v) for k, v in settings.items() if isinstance(v, (int, float, str)) and str(v).isdigit()}
    disable = 35  # systemctl disable inside the container, 30 s + kill
    budgets = {
        RUNG_STOP_SERVICE: s.get("service_stop_timeout", 90) + 10,
        RUNG_KILL_HOLDERS: disable + s.get("term_grace", 10) + s.get("kill_wait", 60) + 30,
        RUNG_UNBLOCK_STUCK: s.get("stuck_timeout", 60) + s.get("kill_wait", 60) + 30,
        RUNG_STOP_CONTAINER: disable + s.get("container_shutdown_timeout", 60) + 35 + s.get("container_stop_timeout", 90) + 40,
        RUNG_RESET_GPUS: sum(reset_step_bounds_s(s, gpu_count).values()),
    }
    if rung not in budgets:
        raise ValueError("rung %r has no action (acting rungs: %s)" % (rung, list(ACTING_RUNGS)))
    return budgets[rung] + 60


# nvidia-smi --query-gpu=gpu_recovery_action (NVML nvmlDeviceGpuRecoveryAction_t): what the driver says must happen
# before the GPU can be used again (NVIDIA, "Error Recovery and Response Flags", A100 GPU memory error management).
RECOVERY_ACTION_NONE = "none"
RECOVERY_ACTIONS_REBOOT = ("reboot",)              # Node Reboot / System Reboot: the OS may be inconsistent
RECOVERY_ACTIONS_RESET = ("reset", "drain")        # GPU Reset, Drain P2P, Drain and Reset, Bus Reset


# systemd ActiveState values of a service that is (or is about to be) running: rung 1 stops it.
SERVICE_ACTIVE_STATES = ("active", "activating", "deactivating", "reloading")
# evaluate_sample's reason for a GPU whose memory.used nvidia-smi printed as [N/A] / [Unknown Error]: alone, no
# rung can make it readable.
UNREADABLE_REASON = "nvidia-smi reports no memory.used figure"
NOTHING_TO_CHANGE = "nothing a rung can change: "


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


def default_available_tolerance(mem_total_bytes: Optional[int]) -> int:
    """max(2 % of MemTotal, 8 GiB) (docs/recover.md, "Clean")."""
    return max(int((mem_total_bytes or 0) * 0.02), 8 * GIB)


def evaluate_sample(sample: Mapping[str, Any], baseline: Optional[Mapping[str, Any]],
                    tolerances: Mapping[str, Any]) -> dict[str, Any]:
    """Judge one sample against the baseline. Returns {"clean": bool, "reasons": [...], "gpus": [...],
    "host": {...}, "notes": [...]}.

    sample keys: vmid, container_gpus [int] (nvidia-smi indexes), container_gpus_unmapped [int] (device minors of the
    container that map to no index) with gpu_numbering_error (why), gpus (nvidia-smi rows + "apps": [{pid, used_memory_mib,
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
    if sample.get("container_gpus_unmapped"):
        # A /dev/nvidiaN of the container that no GPU of the driver's numbering has (recover_smi.gpu_numbering): its
        # GPU is not judged, and unknown is not clean (never read as nvidia-smi index N).
        reasons.append("GPU(s) of the container unknown: %s" % sample.get(
            "gpu_numbering_error", "/dev/nvidia%s" % ",".join(str(m) for m in sample["container_gpus_unmapped"])))
    for idx in sample.get("container_gpus", []):
        row = by_index.get(idx)
        if row is None:
            if not sample.get("nvidia_smi_error") and not sample.get("nvidia_smi_hung"):
                reasons.append("GPU %d of the container is not reported by nvidia-smi" % idx)
            continue
        apps = row.get("apps", [])
        if row.get("memory_used_mib") is None:
            # nvidia-smi printed [N/A], [Unknown Error] or [GPU is lost]: unknown is not clean (docs/recover.md).
            reasons.append("GPU %d: %s ([N/A], [Unknown Error] or [GPU is lost]): it cannot be judged clean"
                           % (idx, UNREADABLE_REASON))
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
        util = row.get("utilization_gpu_pct")
        if not apps and util is not None and util > 0:
            # Busy with no process on the GPU at all (none of this container's, none of another's): Blackwell GPUs
            # latch their "engine busy" counter when a process dies mid-kernel, with no memory and no process left,
            # and persistence mode keeps it (Datura-ai/lium-io PR #1142, PR #1140). Whatever holds it, such a GPU
            # is not idle as far as the driver says, so it is not clean.
            gpu_rows[-1].update(clean=False, busy_without_process=True)
            reasons.append("GPU %d: %d%% utilisation with no process (busy without a process: the driver's busy "
                           "counter is latched, seen on Blackwell GPUs after a process died mid-kernel)" % (idx, util))
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
    verified = [p for p in holders if p.get("holds_nvidia", True)]
    if verified:
        reasons.append("%d process(es) of CT %s hold /dev/nvidia*: %s" % (
            len(verified), vmid, ", ".join("%d/%s" % (p["pid"], p["comm"]) for p in verified[:8])))
    # A /dev/nvidia* path on a filesystem the scan never stats (FUSE, an overlay: recover_procs.nvidia_fds) may be
    # anything; in the container it is taken as a holder (never Clean), outside it only named: it cannot be one of
    # this container's GPUs (a user namespace's mounts open no device nodes, and a container opens only the devices
    # its configuration passes), and a neighbour must not be able to make this container's verdict Not clean.
    unverified = [p for p in holders if p.get("holds_unverified") and not p.get("holds_nvidia", True)]
    if unverified:
        reasons.append("%d process(es) of CT %s have a /dev/nvidia* path open on a filesystem that is not stat'ed "
                       "(unverified holders): %s" % (len(unverified), vmid, "; ".join(
                           describe_unverified(p) for p in unverified[:8])))
    for p in sample.get("other_unverified_holders", []):
        notes.append("unverified holder outside CT %s, not judged for it: %s" % (vmid, describe_unverified(p)))
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
    """Host memory against the baseline (docs/recover.md, "Clean"); without a baseline, against an absolute
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
    reboot_signals [str], recovery_reset (bool: the driver's gpu_recovery_action asks for a GPU reset on one of
    the container's GPUs), only_unreadable (bool: the only reasons are figures nvidia-smi cannot read, listed in
    reasons), unfixable [str] (reasons no rung can change: a missing baseline, a new Xid that is no reboot signal).
    Returns (rung, reason); rung 0 means nothing to do (clean, or nothing a rung can change).
    """
    if diag.get("clean"):
        unfixable = diag.get("unfixable") or []
        return RUNG_CLEAN, (NOTHING_TO_CHANGE + "; ".join(unfixable)) if unfixable else "clean: nothing to do"
    signals = list(diag.get("reboot_signals") or [])
    stuck = diag.get("ct_stuck") or []
    classes = {p.get("class") for p in stuck}
    if "stuck_nvidia" in classes:
        signals.append("process(es) in D state inside the NVIDIA driver: %s" % ", ".join(
            str(p["pid"]) for p in stuck if p.get("class") == "stuck_nvidia"))
    if signals:
        return RUNG_REBOOT, "; ".join(signals)
    if diag.get("only_unreadable"):
        # Figures nvidia-smi cannot read ([N/A], [Unknown Error]) are Not clean, and when nothing else is wrong no
        # rung can make them readable: stop and say so instead of stopping the container or resetting GPUs for nothing.
        return RUNG_CLEAN, NOTHING_TO_CHANGE + "; ".join(diag.get("reasons") or [])

    def pick(rung: int, reason: str) -> tuple[int, str]:
        if rung > after_rung:
            return rung, reason
        return next_rung_after(diag, after_rung)

    running = diag.get("container_status") == "running"
    if diag.get("recovery_reset") and not stuck:
        # NVIDIA ("Error Recovery and Response Flags"): "Terminate all GPU processes, reset the GPU using
        # nvidia-smi -r". Rung 5 does both: it ends the container's GPU processes (the service stopped as at rung 1,
        # the rest as at rung 2) and resets; no rung below it can clear the flag, and stopping the container
        # (rung 4) ends more than the GPU processes the driver names.
        if running:
            return pick(RUNG_RESET_GPUS, "the driver asks for a GPU reset: end the container's GPU processes, reset the GPUs")
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
    if diag.get("gpu_busy_without_process") and not diag.get("gpu_excess_without_process"):
        # The latch holds no memory and no process: stopping the container does not clear it (persistence mode keeps
        # the GPU initialised); a GPU reset with persistence mode off does (rung 5 turns it off, resets, turns it on).
        return pick(RUNG_RESET_GPUS, "GPU(s) busy with no process (a latched busy counter): reset the GPUs")
    if diag.get("host_memory_only"):
        if running:
            return pick(RUNG_STOP_CONTAINER, "only host memory is above baseline: stop the container to release it")
        return RUNG_REBOOT, "host memory above baseline with the container stopped: nothing left but a reboot"
    return pick(RUNG_STOP_CONTAINER, "not clean for a reason no lower rung addresses")


def settled(recommended_rung: int, findings: Mapping[str, Any], elapsed_s: float, after_rung: int,
            stuck_grace_s: float, release_grace_s: float) -> tuple[bool, str]:
    """Whether the verification after ``after_rung`` may stop polling, and why (the rest is the next rung's job).

    Stops when the gate passes (recommended rung 0: clean, or only the baseline is missing), on a reboot signal,
    when the driver asks for a GPU reset that no waiting brings (before rung 5), after rung 1 when its stop ran out
    of its timeout and holders are still alive (``stop_timed_out``: they had SIGTERM for that long), when processes are still stuck
    past ``stuck_grace_s``, or when, with none stuck, GPU memory is held with no process, holders remain or the
    container is down past ``release_grace_s`` (slow teardown: Lightning-AI/pytorch-lightning#15008; Slurm's
    UnkillableStepTimeout, slurm.conf(5)). ``elapsed_s`` counts from
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
    if (after_rung == RUNG_STOP_SERVICE and findings.get("stop_timed_out") and not stuck
            and int(findings.get("holders") or 0) > 0):
        # Rung 1's `systemctl stop` ran out of its whole stop timeout with the holders still there: systemd sent
        # them SIGTERM when the stop began (systemd.kill(5): KillMode=control-group, KillSignal=SIGTERM), so they
        # already had that long to end. Alive and holding the GPUs is no teardown in progress (a task in teardown
        # is exiting, proc(5)); the release grace would only add the same wait again (the sigterm-ignored fault).
        return True, "the service's stop ran out of its timeout and %d holder(s) are still alive after SIGTERM: " \
                     "waiting longer does not end them" % int(findings.get("holders") or 0)
    if stuck and elapsed_s >= stuck_grace_s:
        return True, "%d process(es) still stuck after %.0f s (grace %.0f s)" % (stuck, elapsed_s, stuck_grace_s)
    if not stuck and elapsed_s >= release_grace_s and (
            findings.get("gpu_excess_without_process") or findings.get("gpu_busy_without_process")
            or int(findings.get("holders") or 0) > 0
            or findings.get("container_status") != "running"):
        return True, "not released after %.0f s (release grace %.0f s)" % (elapsed_s, release_grace_s)
    return False, "waiting (%.0f s since the rung started)" % elapsed_s


def poll_again(settled_now: bool, elapsed_s: float, poll_budget_s: float) -> bool:
    """Whether a verification diagnoses again: its last diagnosis did not settle (``settled``) and less than
    ``poll_budget_s`` has passed since its first diagnosis began (so it ends at most one diagnosis past the budget)."""
    return not settled_now and elapsed_s < poll_budget_s


def sampling_decided(evaluation: Mapping[str, Any], sample: Mapping[str, Any]) -> bool:
    """Whether a diagnosis may take no more samples after ``sample`` (judged by ``evaluation``, evaluate_sample's):
    the sample is not clean and no process of the container is odd in it (``ct_stuck``: D state, a zombie with live
    threads). The verdict is Clean only when every sample is clean, so it is Not clean whatever later samples show;
    a process is stuck only when it is odd in every sample, so none can be. More samples would change neither, only
    read the evidence the first rung is chosen from a few seconds later, and every rung's verification diagnoses
    again. A clean sample, or one with an odd process, needs the next sample (a task briefly in D while it exits is
    not stuck)."""
    return not evaluation.get("clean") and not sample.get("ct_stuck")


def next_rung_after(diag: Mapping[str, Any], after_rung: int) -> tuple[int, str]:
    """The rung that follows ``after_rung`` when the preferred one was already tried."""
    running = diag.get("container_status") == "running"
    if after_rung < RUNG_STOP_CONTAINER and running:
        nxt = after_rung + 1
        if nxt == RUNG_UNBLOCK_STUCK and not diag.get("ct_stuck"):
            nxt = RUNG_STOP_CONTAINER
        return nxt, "rung %d did not clear it: escalate" % after_rung
    if after_rung < RUNG_RESET_GPUS and (diag.get("gpu_excess_without_process") or diag.get("recovery_reset")
                                         or diag.get("gpu_busy_without_process") or not running) \
            and not diag.get("ct_holders") and not diag.get("ct_stuck") and not diag.get("host_memory_only"):
        return RUNG_RESET_GPUS, "GPU memory still held with no process: reset the GPUs"
    return RUNG_REBOOT, "rung %d did not clear it and no lower rung applies: the node needs a reboot" % after_rung


# --------------------------------------------------------------------------- the one judgement of a diagnosis


@dataclass(frozen=True)
class Judgement:
    """What ``judge`` decided from one diagnosis's readings (gpu_diagnose returns these as they are)."""

    verdict: str                      # "Clean" or "Not clean"
    clean: bool
    reasons: list[str]                # why Not clean (empty when Clean)
    summary: str                      # the verdict, the container and the evidence in one line
    rung: int                         # the rung to take next (0: clean, or nothing a rung can change)
    why: str
    settled: bool                     # the verification after a rung may stop polling
    settled_reason: str
    findings: dict[str, Any]          # the facts the rung was chosen from
    notes: list[str]                  # facts that do not decide the verdict
    stuck: list[Mapping[str, Any]]    # processes stuck in every sample
    evaluations: list[dict[str, Any]]  # evaluate_sample of each sample
    kernel: dict[str, Any]            # recover_kernel.judge of the records since the run's cursor


def _stuck_in_every_sample(samples: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The last sample's odd processes that were odd in every sample (a task briefly in D while exiting is not
    stuck); a process is the same one when its PID and start time are."""
    keys = None
    for sample in samples:
        now = {(p["pid"], p.get("starttime")) for p in sample.get("ct_stuck") or []}
        keys = now if keys is None else keys & now
    return [p for p in samples[-1].get("ct_stuck") or [] if (p["pid"], p.get("starttime")) in (keys or set())]


def _judge_kernel(kernel: Optional[Mapping[str, Any]], last: Mapping[str, Any]) -> dict[str, Any]:
    """recover_kernel.judge of the records read after the run's cursor; an unreadable log is a reason (unknown is
    not clean), an unread one (kernel_log=false) a note."""
    verdict: dict[str, Any] = {"reasons": [], "reboot_signals": [], "notes": [], "new_xids": [], "old_xids": []}
    if kernel is None:
        verdict["notes"].append("kernel log not read (kernel_log=false): new Xid lines not checked")
    elif kernel.get("error"):
        verdict["reasons"].append("kernel log not readable (%s): the gate cannot check for new NVRM Xid lines; run as "
                                  "root on the node" % kernel["error"])
    else:
        verdict = recover_kernel.judge(kernel.get("records") or [], kernel.get("since"),
                                       {g["index"]: g.get("pci_bus_id") for g in last.get("gpus") or []},
                                       last.get("container_gpus") or [])
    return verdict


def _recovery_classes(last: Mapping[str, Any]) -> dict[int, str]:
    """recovery_action_class of each of the container's GPUs, when the driver's field was read."""
    recovery = last.get("recovery_actions") or {}
    if not recovery.get("supported") or recovery.get("error"):
        return {}
    return {g: recovery_action_class(recovery["actions"].get(g)) for g in last.get("container_gpus") or []}


def _reboot_signals(last: Mapping[str, Any], recovery: Mapping[int, str], kernel_signals: Sequence[str]) -> list[str]:
    signals = []
    if last.get("nvidia_smi_hung"):
        signals.append("nvidia-smi hung")
    if last.get("nvidia_smi_error") and "exited 15" in last["nvidia_smi_error"]:
        signals.append("a GPU has fallen off the bus (nvidia-smi rc 15)")
    asks_reboot = sorted(g for g, kind in recovery.items() if kind == "reboot")
    if asks_reboot:
        signals.append("the driver's recovery action for GPU(s) %s is a reboot" % asks_reboot)
    return signals + list(kernel_signals)


def judge(samples: Sequence[Mapping[str, Any]], baseline: Optional[Mapping[str, Any]], tolerances: Mapping[str, Any],
          *, baseline_path: str, container_status: Optional[str], service_state: Optional[str],
          kernel: Optional[Mapping[str, Any]] = None, after_rung: int = RUNG_CLEAN, elapsed_s: Optional[float] = None,
          stuck_grace_s: float = 30, release_grace_s: float = 60, stop_timed_out: bool = False) -> Judgement:
    """The verdict, its reasons, the rung to take next and whether polling may stop, from one diagnosis's readings.

    samples: gpu_diagnose's samples, oldest first (evaluate_sample's keys, plus ct_processes with pid and
    starttime, recovery_actions); the verdict is Clean only when every sample passes the gate, and a process is
    stuck only when it is in every sample. baseline: the record (None: none, or set aside), at ``baseline_path``.
    Without one the verdict is never Clean (the GPUs' idle figures are unknown) but no rung is asked for.
    container_status: ``pct status`` ("running", "stopped", None). service_state: the service's systemd
    ActiveState (None: not read). kernel: None when the kernel log was not read, else {"records": recover_kernel
    records, "since": the run's cursor, "error": why it could not be read, or None}. after_rung: the last rung
    tried; elapsed_s: seconds since it started (None: not a verification, it settles only when clean).
    stop_timed_out: that rung was rung 1 and its `systemctl stop` ran out of the stop timeout (recover_ladder).
    """
    evaluations = [evaluate_sample(s, baseline, tolerances) for s in samples]
    last, last_eval = samples[-1], evaluations[-1]
    vmid = last["vmid"]
    stuck = _stuck_in_every_sample(samples)
    clean = all(e["clean"] for e in evaluations)
    failing = list(next((e for e in reversed(evaluations) if not e["clean"]), last_eval)["reasons"])
    kern = _judge_kernel(kernel, last)
    if kern["reboot_signals"]:
        clean = False
        failing += kern["reboot_signals"]
    recovery = _recovery_classes(last)
    signals = _reboot_signals(last, recovery, kern["reboot_signals"])
    service_active = service_state in SERVICE_ACTIVE_STATES
    if clean and service_active and container_status == "running":
        # A server that runs, starts or waits to restart (systemd's auto-restart is ActiveState "activating") may take
        # the GPUs again at any moment, so its container is not settled even when its GPUs are idle now: the half of a
        # multi-node server whose ranks died keeps its launcher, and a unit failed by its dead peer restarts after
        # RestartSec (docs/recover.md, "A server on several nodes"). Rung 1 stops it.
        clean = False
        failing.append("the service is %s (systemd ActiveState) with no GPU memory of its own: a server that runs, "
                       "starts or is about to restart is not a settled state" % service_state)
    holders = last.get("ct_holders") or []
    gpu_tol = int(tolerances.get("gpu_memory_mib", 16))
    excess_no_proc = any((g.get("excess_mib") or 0) > gpu_tol and not any(
        a.get("owner") == vmid for a in g["compute_apps"]) for g in last_eval["gpus"]) and not holders
    busy_no_proc = any(g.get("busy_without_process") for g in last_eval["gpus"]) and not holders
    host_only = (not clean and all(g["clean"] for g in last_eval["gpus"]) and not holders and not stuck
                 and bool(last_eval["host"]["reasons"]) and not last.get("nvidia_smi_error"))
    only_unreadable = (not clean and bool(failing) and not signals and not service_active and not holders
                       and not stuck and all(UNREADABLE_REASON in r for r in failing))
    # Reasons no rung of this container's ladder can change: a missing baseline, a new Xid that is not a reboot
    # signal, an unreadable kernel log. They make the verdict Not clean; alone they ask for no rung.
    missing_baseline = ("no baseline at %s: without the GPUs' idle figures the gate cannot say Clean; record it at "
                        "idle with -e recover_record_baseline=true (or run deploy.yml for this container)"
                        % baseline_path) if baseline is None else None
    unfixable = ([missing_baseline] if missing_baseline else []) + kern["reasons"]
    diag = {"clean": clean, "container_status": container_status, "service_active": service_active,
            "ct_holders": holders, "ct_stuck": stuck, "gpu_excess_without_process": excess_no_proc,
            "gpu_busy_without_process": busy_no_proc, "host_memory_only": host_only, "reboot_signals": signals,
            "recovery_reset": any(kind == "reset" for kind in recovery.values()),
            "only_unreadable": only_unreadable, "reasons": failing, "unfixable": unfixable}
    rung, why = choose_rung(diag, after_rung)
    findings = {
        "container_status": container_status, "service_active": service_active, "holders": len(holders),
        "stuck": len(stuck), "gpu_excess_without_process": excess_no_proc,
        "gpu_busy_without_process": busy_no_proc, "host_memory_only": host_only,
        "reboot_signals": signals, "recovery_reset": diag["recovery_reset"],
        "baseline_missing": missing_baseline is not None, "new_xids": [x["xid"] for x in kern["new_xids"]],
        "only_unreadable": only_unreadable, "stop_timed_out": bool(stop_timed_out),
    }
    if elapsed_s is not None:
        done, done_why = settled(rung, findings, elapsed_s, after_rung, stuck_grace_s, release_grace_s)
    else:
        done, done_why = rung == RUNG_CLEAN, "the gate passes" if rung == RUNG_CLEAN else "not clean"
    reasons = ([] if clean else failing) + unfixable
    verdict = "Not clean" if reasons or not clean else "Clean"
    summary = "%s: CT %d (%s), %s" % (verdict, vmid, container_status, "; ".join(reasons) if reasons else (
        "GPUs %s at baseline with no compute apps, host memory %s" % (
            last.get("container_gpus"), "within tolerance of the baseline" if baseline else "above the no-baseline floor")))
    notes = list(kern["notes"])
    for note in (n for e in evaluations for n in e["notes"]):
        if note not in notes:
            notes.append(note)
    return Judgement(verdict=verdict, clean=verdict == "Clean", reasons=reasons, summary=summary, rung=rung, why=why,
                     settled=done, settled_reason=done_why, findings=findings, notes=notes, stuck=stuck,
                     evaluations=evaluations, kernel=kern)
