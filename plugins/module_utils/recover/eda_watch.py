# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Unattended recovery's decisions (Event-Driven Ansible), in one place: which containers are watched (the
inventory's, nothing else), which diagnosis of one container is a fault that needs the ladder (``faults``), and when a
fault becomes an event (``Policy``: debounce, one event per container until it is seen fixed or the cool-down ends,
a budget of recoveries per container per window, then one alert and no more events for that container), and when a
node the source cannot read becomes an event (``Policy.observe_node``: after ``unreachable_polls`` polls in a row in
which no container of the node was read, one ``node_unreachable`` event, and one ``node_reachable`` when a read of it
succeeds again).

The diagnosis is gpu_diagnose's result (verdict, reasons, findings, evidence decided by recover_gate.judge); this file
adds no second gate: it only says which of the gate's findings mean "a person would run recover.yml now" and which are
a server at work (a running service holding its GPUs is Not clean for the ladder, but it is not a fault).

No Ansible imports; unit-tested in tests/unit/plugins/module_utils/recover/test_eda_watch.py. Used by the event source
extensions/eda/plugins/event_source/gpu_watch.py (docs/recover.md, "Unattended recovery").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence

from ansible_collections.inferops.gpu_inference.plugins.module_utils.common import gpu_inventory

# Fault kinds, each with the gate's finding it comes from.
KIND_HELD_NO_PROCESS = "gpu_memory_held_without_process"
KIND_HOLDERS_WITHOUT_SERVICE = "gpu_held_outside_service"
KIND_STUCK = "stuck_processes"
KIND_REBOOT_SIGNAL = "reboot_signal"
KIND_RESET_ASKED = "gpu_reset_asked"
KIND_OOM_KILL = "cgroup_oom_kill"
KIND_SERVICE_FAILED = "service_failed"

ACTION_RECOVER = "recover"
ACTION_ALERT = "alert_budget_exhausted"
ACTION_NODE_UNREACHABLE = "node_unreachable"
ACTION_NODE_REACHABLE = "node_reachable"

# How one read of a container went (the event source decides it from ansible's result): a diagnosis; the node did not
# answer (ssh unreachable, or the read ran past its bound and was killed); the module ran and failed.
READ_OK = "ok"
READ_UNREACHABLE = "unreachable"
READ_TIMED_OUT = "timed_out"
READ_FAILED = "failed"
READ_OUTCOMES = (READ_OK, READ_UNREACHABLE, READ_TIMED_OUT, READ_FAILED)


@dataclass(frozen=True)
class Watched:
    """One container of the inventory: its inventory host, VMID, node, whether a recovery may relaunch it and
    whether its host adopts it untagged (pve_gpu_container_adopt: gpu_diagnose's owner check)."""

    host: str
    vmid: int
    node_host: str
    relaunch: bool = False
    adopt: bool = False


def watched_containers(inventory: Mapping[str, Any]) -> list[Watched]:
    """The containers of ``ansible-inventory --list`` output to watch: the inventory's GPU containers as
    module_utils/common/gpu_inventory.py builds and checks them for every playbook (VMID, node, pve_gpu_container_adopt), and
    ``gpu_recover_eda_relaunch: true`` on a container's host lets a recovery relaunch it. An inventory that model
    refuses is refused here too (gpu_inventory.InventoryError, a ValueError naming each host and what to set)."""
    groups, hostvars = gpu_inventory.groups_from_list(inventory)
    return [Watched(host=ct.host, vmid=ct.vmid, node_host=ct.node_host, relaunch=ct.eda_relaunch, adopt=ct.adopt)
            for ct in gpu_inventory.gpu_inventory(groups, hostvars).containers]


def declared(watched: Sequence[Watched]) -> list[dict[str, Any]]:
    """gpu_diagnose's ``declared`` option: every watched container, as recover.yml passes it."""
    return [{"host": w.host, "vmid": w.vmid, "node_host": w.node_host, "adopt": w.adopt} for w in watched]


def faults(diag: Mapping[str, Any], previous_oom: Optional[Mapping[str, Optional[int]]]) -> list[tuple[str, str]]:
    """The faults one diagnosis shows, as (kind, why) pairs, empty when the container needs no ladder.

    From gpu_diagnose's ``findings`` and ``evidence`` (recover_gate.judge decided them): GPU memory above the baseline
    with no process of the container; GPU holders of the container while its service is not active (escaped
    workers); processes stuck in every sample; a reboot signal (Xid 48/79/119/120/154, GPU lost, recovery action
    Reboot) or a GPU reset the driver asks for; an OOM kill in the container since the previous poll (``previous_oom``,
    the :func:`oom_mark` kept from the polls before; None: first poll, nothing to compare); the service failed
    (ActiveState failed). A running service with its GPUs in use is not a fault, nor a container without a baseline,
    nor a clean one."""
    f = diag.get("findings") or {}
    ev = diag.get("evidence") or {}
    reasons = "; ".join(diag.get("reasons") or []) or "no reason given"
    out: list[tuple[str, str]] = []
    if f.get("gpu_excess_without_process"):
        out.append((KIND_HELD_NO_PROCESS, "GPU memory held with no live process of the container: " + reasons))
    if (f.get("holders") or 0) > 0 and not f.get("service_active"):
        out.append((KIND_HOLDERS_WITHOUT_SERVICE, "%d process(es) of the container hold its GPUs while the service "
                    "is not active: %s" % (f["holders"], reasons)))
    if (f.get("stuck") or 0) > 0:
        out.append((KIND_STUCK, "%d process(es) stuck in every sample: %s" % (f["stuck"], reasons)))
    if f.get("reboot_signals"):
        out.append((KIND_REBOOT_SIGNAL, "reboot signal: %s" % "; ".join(f["reboot_signals"])))
    if f.get("recovery_reset"):
        out.append((KIND_RESET_ASKED, "the driver asks for a GPU reset (gpu_recovery_action): " + reasons))
    oom = new_oom_kills(previous_oom, oom_mark(diag))
    if oom:
        out.append((KIND_OOM_KILL, oom))
    service = ev.get("service") or {}
    if service.get("active_state") == "failed":
        out.append((KIND_SERVICE_FAILED, "%s failed (%s)" % (service.get("name", "the service"),
                                                             service.get("sub_state") or "failed")))
    return out


def oom_mark(diag: Mapping[str, Any]) -> dict[str, Optional[int]]:
    """Where a diagnosis leaves the container's OOM kills, from two sources that see the same kills and can each miss
    some: ``cgroup``, its memory cgroup's oom_kill counter (a v1 counter lives in the cgroup where the kill ran and is
    gone with it once a child cgroup is removed: recover_pve.oom_kills_under); ``kernel_seq``, the /dev/kmsg sequence
    number of the newest `oom-kill:` record naming its cgroup, -1 when the log was read and holds none. A count of the
    log's records would not do: the ring buffer drops its oldest records, so a new kill can leave the count as it was
    (seen in CI: 9 -> 9); a sequence number is never reused (Documentation/ABI/testing/dev-kmsg). None: not read."""
    ev = diag.get("evidence") or {}
    counter = ((ev.get("container") or {}).get("memory") or {}).get("oom_kills")
    log = ev.get("kernel_log") or {}
    seq = log.get("oom_kill_last_seq")
    return {"cgroup": counter if isinstance(counter, int) and not isinstance(counter, bool) else None,
            "kernel_seq": (seq if isinstance(seq, int) and not isinstance(seq, bool) else -1) if log.get("source") else None}


def merge_oom_mark(before: Optional[Mapping[str, Optional[int]]], now: Mapping[str, Optional[int]]) -> dict[str, Optional[int]]:
    """The mark to compare the next poll with: each source as this poll read it, as before where it was not read."""
    before = before or {}
    return {key: now.get(key) if now.get(key) is not None else before.get(key) for key in ("cgroup", "kernel_seq")}


def new_oom_kills(before: Optional[Mapping[str, Optional[int]]], now: Mapping[str, Optional[int]]) -> Optional[str]:
    """Why the container had an OOM kill since the mark ``before`` (None: nothing to compare), or None."""
    if not before:
        return None
    seen = []
    if now.get("cgroup") is not None and before.get("cgroup") is not None and now["cgroup"] > before["cgroup"]:
        seen.append("its memory cgroup counts %d more OOM kill(s)" % (now["cgroup"] - before["cgroup"]))
    if now.get("kernel_seq") is not None and before.get("kernel_seq") is not None and now["kernel_seq"] > before["kernel_seq"]:
        seen.append("the kernel logged an OOM kill in it (record %d)" % now["kernel_seq"])
    return ("the container had an OOM kill since the last poll: " + "; ".join(seen)) if seen else None


@dataclass
class _State:
    first_seen: Optional[float] = None       # when the current fault (its kinds) was first seen
    kinds: tuple = ()
    emitted_at: Optional[float] = None       # the last recover event, until the container is seen without a fault
    recoveries: list = field(default_factory=list)   # times of the recover events in the window
    exhausted: bool = False
    oom: Optional[dict] = None                # oom_mark of the polls so far (None before the first)


@dataclass(frozen=True)
class PolicySettings:
    """debounce_s: the same fault must be seen twice at least this far apart; cooldown_s: after a recover event, no
    other for that container until it is seen without a fault, or this long has passed (the ladder's own ceiling by
    default: docs/recover.md, 1615 s); budget: at most this many recover events per container in budget_window_s,
    then one alert and nothing more for that container until the rulebook is restarted; unreachable_polls: a node none
    of whose containers could be read in this many polls in a row is an event (one per outage: a poll that fails
    once, a dropped connection, is only logged)."""

    debounce_s: float = 30.0
    cooldown_s: float = 1800.0
    budget: int = 3
    budget_window_s: float = 3600.0
    unreachable_polls: int = 3

    def __post_init__(self) -> None:
        for name in ("debounce_s", "cooldown_s", "budget_window_s"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0:
                raise ValueError("%s must be a number of seconds >= 0, got %r" % (name, value))
        if not isinstance(self.budget, int) or isinstance(self.budget, bool) or self.budget < 1:
            raise ValueError("budget must be an integer >= 1 (recoveries per window), got %r" % (self.budget,))
        if (not isinstance(self.unreachable_polls, int) or isinstance(self.unreachable_polls, bool)
                or self.unreachable_polls < 1):
            raise ValueError("unreachable_polls must be an integer >= 1 (polls in a row a node is not read before its "
                             "event), got %r" % (self.unreachable_polls,))


@dataclass
class _NodeState:
    failed_polls: int = 0                     # polls in a row in which no container of the node was read
    first_failed_at: Optional[float] = None
    last_read_at: Optional[float] = None      # the last poll in which a container of the node was read
    unreachable_since: Optional[float] = None  # set when the node_unreachable event went out, until a read succeeds
    reasons: list = field(default_factory=list)


class Policy:
    """Turns the diagnoses of each watched container into events; holds no other state than this class's."""

    def __init__(self, settings: PolicySettings) -> None:
        self.settings = settings
        self._state: dict[int, _State] = {}
        self._nodes: dict[str, _NodeState] = {}

    def observe_node(self, node: str, reads: Mapping[int, tuple[str, str]], now: float) -> Optional[dict[str, Any]]:
        """One poll of ``node``: ``reads`` maps each of its containers to (outcome, why), outcome one of
        READ_OUTCOMES. The node is read when at least one container's diagnosis came back; a poll in which none did
        counts toward ``unreachable_polls``. Returns the node_unreachable event (once per outage, at the poll that
        reaches the count), the node_reachable event (the first read after that event), or None."""
        for vmid, (outcome, _why) in reads.items():
            if outcome not in READ_OUTCOMES:
                raise ValueError("CT %s on %s: unknown read outcome %r" % (vmid, node, outcome))
        if not reads:
            return None
        st = self._nodes.setdefault(node, _NodeState())
        base = {"inferops_gpu_watch": True, "node": node, "vmids": sorted(reads), "detected_at": now}
        if any(outcome == READ_OK for outcome, _why in reads.values()):
            back = st.unreachable_since
            failed = st.failed_polls
            st.failed_polls, st.first_failed_at, st.last_read_at, st.unreachable_since, st.reasons = 0, None, now, None, []
            if back is None:
                return None
            return dict(base, action=ACTION_NODE_REACHABLE, failed_polls=failed, unreachable_s=round(now - back, 3),
                        message="%s is read again after %d poll(s) in which it was not (the last %.0f s): the watch "
                                "of its containers goes on" % (node, failed, now - back))
        st.failed_polls += 1
        if st.first_failed_at is None:
            st.first_failed_at = now
        st.reasons = ["CT %d: %s: %s" % (vmid, outcome, why) for vmid, (outcome, why) in sorted(reads.items())]
        if st.unreachable_since is not None or st.failed_polls < self.settings.unreachable_polls:
            return None
        st.unreachable_since = now
        return dict(base, action=ACTION_NODE_UNREACHABLE, failed_polls=st.failed_polls,
                    first_failed_at=st.first_failed_at, last_read_at=st.last_read_at, reasons=list(st.reasons),
                    message=("%s could not be read in %d poll(s) in a row (since %.0f s ago): no fault of its "
                             "containers can be seen or recovered until it is; a person must look: %s"
                             % (node, st.failed_polls, now - st.first_failed_at, "; ".join(st.reasons))))

    def node_states(self) -> dict[str, dict[str, Any]]:
        """Each node polled so far: {"up" (False once its node_unreachable event went out, until a read), "failed_polls",
        "last_read_at"}; for the metrics file."""
        return {node: {"up": st.unreachable_since is None, "failed_polls": st.failed_polls,
                       "last_read_at": st.last_read_at} for node, st in sorted(self._nodes.items())}

    def exhausted(self) -> list[int]:
        """The containers whose budget is spent (the alert went out; no more events until the rulebook restarts)."""
        return sorted(vmid for vmid, st in self._state.items() if st.exhausted)

    def observe(self, watched: Watched, diag: Mapping[str, Any], now: float) -> Optional[dict[str, Any]]:
        """One diagnosis of ``watched`` at ``now`` (seconds): the event to emit, or None."""
        st = self._state.setdefault(watched.vmid, _State())
        found = faults(diag, st.oom)
        st.oom = merge_oom_mark(st.oom, oom_mark(diag))
        if not found:
            st.first_seen, st.kinds, st.emitted_at = None, (), None
            return None
        kinds = tuple(sorted({k for k, _why in found}))
        oom = KIND_OOM_KILL in kinds
        if kinds != st.kinds and not (oom and st.first_seen is not None):
            st.first_seen, st.kinds = now, kinds
        if st.exhausted:
            return None
        if st.emitted_at is not None and now - st.emitted_at < self.settings.cooldown_s:
            return None
        # An OOM kill is an event in the kernel's counter, seen once: it needs no second sighting.
        if not oom and (st.first_seen is None or now - st.first_seen < self.settings.debounce_s):
            return None
        st.recoveries = [t for t in st.recoveries if now - t < self.settings.budget_window_s]
        event = {
            "inferops_gpu_watch": True,
            "host": watched.host,
            "vmid": watched.vmid,
            "node": watched.node_host,
            "kinds": list(kinds),
            "reasons": [why for _kind, why in found],
            "verdict": diag.get("verdict"),
            "recommended_rung": diag.get("recommended_rung"),
            "recommended_rung_name": diag.get("recommended_rung_name"),
            "first_seen": st.first_seen,
            "detected_at": now,
        }
        if len(st.recoveries) >= self.settings.budget:
            st.exhausted = True
            event.update(action=ACTION_ALERT, relaunch=False, recoveries_in_window=len(st.recoveries),
                         message=("CT %d on %s: fault again after %d recover run(s) within %d s (budget %d): no more "
                                  "unattended recovery for it until the rulebook is restarted; a person must look: %s"
                                  % (watched.vmid, watched.node_host, len(st.recoveries),
                                     self.settings.budget_window_s, self.settings.budget, "; ".join(event["reasons"]))))
            return event
        st.recoveries.append(now)
        st.emitted_at = now
        event.update(action=ACTION_RECOVER, relaunch=watched.relaunch, recoveries_in_window=len(st.recoveries),
                     message="CT %d on %s needs recovery (%s): %s" % (watched.vmid, watched.node_host, ", ".join(kinds),
                                                                      "; ".join(event["reasons"])))
        return event
