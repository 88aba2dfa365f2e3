# -*- coding: utf-8 -*-
# Copyright (c) 2026, inferops
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The kernel log part of the Clean gate: NVRM Xid lines read from /dev/kmsg with a cursor.

The gate must see "no new NVRM: Xid lines since recovery started" (NVIDIA, Xid Errors; docs/recover.md, "The
Clean gate"). /dev/kmsg gives every record a sequence number (Documentation/ABI/testing/dev-kmsg), so "since the
run started" is exact: the first diagnosis returns the last sequence number it saw (the cursor) and every later
diagnosis judges only records after it. Xids logged before the run are evidence, not verdicts: the state they
left is read live (nvidia-smi rc 15, gpu_recovery_action), and the ring buffer keeps them until the next boot,
so counting them would make a node that recovered long ago Not clean forever.

A new Xid on one of the container's GPUs (matched by PCI address), or on a GPU the line does not place, is:
- a reboot signal for the Xids that mean the GPU is gone or its state is lost (79 fallen off the bus, 48 DBE,
  119/120 GSP errors, 154 recovery action required);
- otherwise a reason the run is Not clean, which no rung of this container's ladder is known to fix: the operator
  reads the Xid in NVIDIA's catalogue.
A new Xid on a GPU of another container is a note. ``parse_kernel_log`` keeps the lines shown as evidence (Xid,
OOM, hung task) and counts the container's OOM kills, each attributed by the memory cgroup the kernel's
``oom-kill:`` record gives for the killed task (``parse_oom_kill``), never by a name in the line.

No Ansible imports: unit-tested in tests/unit/plugins/module_utils/recover/test_recover_kernel.py.
"""
from __future__ import annotations

import errno
import os
import re
from typing import Any, Iterable, Mapping, Optional, Sequence

KMSG_PATH = "/dev/kmsg"

# Xids that mean the GPU or the node needs a reset or a reboot (79 fallen off the bus, 48 DBE, 119/120 GSP, 154
# "GPU recovery action changed": NVIDIA Xid catalogue).
REBOOT_XIDS = frozenset({48, 79, 119, 120, 154})

_XID_RE = re.compile(r"NVRM: Xid \((?:PCI:)?([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2})[^)]*\): (\d+)")
_EVIDENCE_RE = re.compile(r"NVRM:|Out of memory|oom-kill|blocked for more than|fallen off the bus", re.IGNORECASE)
_RECORD_LIMIT = 200

# Kernel log lines kept as evidence in the report: Xids (NVIDIA's Xid catalogue), OOM kills, hung tasks.
KERNEL_LOG_RE = re.compile(
    r"NVRM: Xid|Out of memory|oom-kill|oom_reaper|Memory cgroup out of memory|blocked for more than|"
    r"fallen off the bus|GPU has fallen|hung_task",
    re.IGNORECASE,
)


def parse_record(raw: str) -> Optional[dict[str, Any]]:
    """One /dev/kmsg record ``"<prio>,<seq>,<usec>,<flags>[,...];<message>\\n[ KEY=value\\n...]"``.

    Returns {"seq", "usec", "level", "facility", "message"} or None for text that is not a record.
    """
    head, sep, rest = raw.partition(";")
    if not sep:
        return None
    fields = head.split(",")
    if len(fields) < 3 or not all(f.isdigit() for f in fields[:3]):
        return None
    prio = int(fields[0])
    message = rest.split("\n", 1)[0]
    return {"seq": int(fields[1]), "usec": int(fields[2]), "level": prio & 7, "facility": prio >> 3,
            "message": message}


def read_kmsg(path: str = KMSG_PATH) -> dict[str, Any]:
    """Every record the ring buffer still holds that is evidence here (NVRM, OOM, hung task), and the cursor.

    Returns {"records": [...], "cursor": last sequence number seen (any record) or None, "lost": records
    overwritten while reading, "error": str or None}. Reading needs CAP_SYSLOG (root on the node).
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        return {"records": [], "cursor": None, "lost": 0, "error": "%s: %s" % (path, exc.strerror)}
    records: list[dict[str, Any]] = []
    cursor: Optional[int] = None
    lost = 0
    try:
        while True:
            try:
                chunk = os.read(fd, 16384)
            except OSError as exc:
                if exc.errno == errno.EAGAIN:
                    break
                if exc.errno == errno.EPIPE:      # overwritten before we read it: the next read goes on
                    lost += 1
                    continue
                return {"records": records, "cursor": cursor, "lost": lost,
                        "error": "%s: %s" % (path, exc.strerror)}
            if not chunk:
                break
            rec = parse_record(chunk.decode("utf-8", "replace"))
            if rec is None:
                continue
            cursor = rec["seq"]
            if _EVIDENCE_RE.search(rec["message"]):
                records.append(rec)
    finally:
        os.close(fd)
    return {"records": records, "cursor": cursor, "lost": lost, "error": None}


def pci_key(bus_id: Optional[str]) -> Optional[tuple[int, int, int]]:
    """(domain, bus, device) of ``00000000:18:00.0`` (nvidia-smi) or ``0000:18:00`` (an Xid line)."""
    if not bus_id:
        return None
    m = re.fullmatch(r"([0-9A-Fa-f]{4,8}):([0-9A-Fa-f]{2}):([0-9A-Fa-f]{2})(?:\.[0-7])?", bus_id.strip())
    if not m:
        return None
    return int(m.group(1), 16), int(m.group(2), 16), int(m.group(3), 16)


def parse_xid(message: str) -> Optional[dict[str, Any]]:
    """{"xid": int, "pci": "0000:18:00", "text": message} for an ``NVRM: Xid (PCI:...): N, ...`` line."""
    m = _XID_RE.search(message)
    if not m:
        return None
    return {"xid": int(m.group(2)), "pci": m.group(1), "text": message.strip()}


def judge(records: Sequence[Mapping[str, Any]], since_seq: Optional[int],
          gpu_bus_ids: Mapping[int, Optional[str]], container_gpus: Iterable[int]) -> dict[str, Any]:
    """Judge the kernel records logged after ``since_seq`` (all of them are only evidence when it is None).

    gpu_bus_ids: {gpu index: pci.bus_id from nvidia-smi}. Returns {"new_xids": [...], "old_xids": [...],
    "reasons": [...], "reboot_signals": [...], "notes": [...], "lines": [...]} where each Xid entry is
    {"seq", "xid", "pci", "gpu" (index or None), "text"}.
    """
    ours = set(container_gpus)
    by_key = {pci_key(bus): idx for idx, bus in gpu_bus_ids.items() if pci_key(bus) is not None}
    new: list[dict[str, Any]] = []
    old: list[dict[str, Any]] = []
    other_new: list[str] = []
    for rec in records:
        fresh = since_seq is not None and rec["seq"] > since_seq
        xid = parse_xid(rec["message"])
        if xid is None:
            if fresh and "NVRM:" in rec["message"]:
                other_new.append(rec["message"].strip())
            continue
        entry = dict(xid, seq=rec["seq"], gpu=by_key.get(pci_key(xid["pci"])))
        (new if fresh else old).append(entry)
    reasons: list[str] = []
    signals: list[str] = []
    notes: list[str] = []
    for e in new:
        where = "GPU %d" % e["gpu"] if e["gpu"] is not None else "PCI %s (not a GPU nvidia-smi lists)" % e["pci"]
        if e["gpu"] is not None and e["gpu"] not in ours:
            notes.append("new Xid %d on %s, not a GPU of this container: %s" % (e["xid"], where, e["text"]))
        elif e["xid"] in REBOOT_XIDS:
            signals.append("kernel Xid %d on %s since the run started" % (e["xid"], where))
        else:
            reasons.append("kernel Xid %d on %s since the run started (%s): look it up in NVIDIA's Xid catalogue "
                           "before using the GPU again; no rung of this ladder is known to clear it"
                           % (e["xid"], where, e["text"]))
    if old:
        notes.append("Xid(s) logged before this run (evidence only; the live state is read from nvidia-smi): %s"
                     % ", ".join("%d on %s" % (e["xid"], "GPU %d" % e["gpu"] if e["gpu"] is not None else e["pci"])
                                 for e in old[-10:]))
    if other_new:
        notes.append("new NVRM line(s) since the run started: %s" % " | ".join(other_new[-5:]))
    return {"new_xids": new, "old_xids": old[-20:], "reasons": reasons, "reboot_signals": signals, "notes": notes,
            "lines": [r["message"] for r in records][-_RECORD_LIMIT:]}


# The kernel's one-line summary of an OOM kill (mm/oom_kill.c, dump_oom_victim, earlier dump_oom_summary; the
# cgroup part from mm/memcontrol.c, mem_cgroup_print_oom_context; cpuset_print_current_mems_allowed):
#   oom-kill:constraint=<C>,nodemask=<list|(null)>,cpuset=<path>,mems_allowed=<list>[,oom_memcg=<path>|,global_oom]
#   ,task_memcg=<path>,task=<comm>,pid=<n>,uid=<n>
# The paths are full cgroup paths from the hierarchy's root (pr_cont_cgroup_path); <comm> is the victim's own name,
# which any process sets (prctl PR_SET_NAME), and a tenant names the cgroups it creates below its own. Neither the
# comm nor a path is identity: a record is attributed by where its task_memcg path starts, and only when the line
# cannot be read another way.
_OOM_KILL_HEAD_RE = re.compile(r"^(?:\[[^\]]*\]\s*)*oom-kill:(?=constraint=)")
_OOM_KILL_TAIL_RE = re.compile(r",task=.*,pid=\d+,uid=\d+\s*")
_OOM_KILL_IDS_RE = re.compile(r",pid=(\d+),uid=(\d+)\s*$")
_TASK_MEMCG = ",task_memcg="
_TASK = ",task="
# The container's memory cgroup, from the root of the hierarchy: /lxc/<vmid> (PVE's lxc.cgroup.dir.container, the
# v1 hierarchies of a hybrid node and cgroup v2 alike; the container's own cgroups are below /lxc/<vmid>/ns), or
# plain LXC's /lxc.payload.<vmid> (/lxc.payload/<vmid> in some 4.x releases). /lxc.monitor/<vmid> is LXC's monitor
# process, not the container.
_CT_MEMCG_RE = re.compile(r"^/(?:lxc/|lxc\.payload[./])(\d+)(?:/|$)")


def parse_oom_kill(message: str) -> Optional[dict[str, Any]]:
    """The fields of the kernel's ``oom-kill:`` record, or None for any other line.

    Returns {"constraint", "task_memcg" (None when the line reads more than one way), "task_memcg_readings" (every
    way it reads), "task", "pid", "uid", "vmid" (the container whose memory cgroup ``task_memcg`` is, else None)}.
    A comm or a cgroup name may itself contain ``,task_memcg=`` or ``,task=``: every split of the line that fits the
    kernel's format is a reading, and the real one is always among them, so a record whose readings disagree is
    attributed to no container (the container's memory cgroup counter still counts the kill: recover_pve)."""
    head = _OOM_KILL_HEAD_RE.match(message or "")
    if head is None:
        return None
    body = message[head.end():].rstrip()
    starts = [m.end() for m in re.finditer(re.escape(_TASK_MEMCG), body)]
    ends = [m.start() for m in re.finditer(re.escape(_TASK), body)
            if _OOM_KILL_TAIL_RE.fullmatch(body, m.start()) is not None]
    readings = sorted({body[s:e] for s in starts for e in ends if e >= s})
    constraint = body.split(",", 1)[0].partition("=")[2]
    out: dict[str, Any] = {"constraint": constraint, "task_memcg": None, "task_memcg_readings": readings,
                           "task": None, "pid": None, "uid": None, "vmid": None}
    ids = _OOM_KILL_IDS_RE.search(body)
    if ids:
        out.update(pid=int(ids.group(1)), uid=int(ids.group(2)))
    if len(ends) == 1:
        out["task"] = body[ends[0] + len(_TASK):ids.start() if ids else len(body)]
    vmids = set()
    for path in readings:
        m = _CT_MEMCG_RE.match(path)
        vmids.add(int(m.group(1)) if m else None)
    if len(readings) == 1:
        out["task_memcg"] = readings[0]
    if len(vmids) == 1:
        out["vmid"] = vmids.pop()
    return out


def _container_oom_kill(vmid: int):
    """A test of a kernel log line: the kernel's ``oom-kill:`` record of a task whose memory cgroup is the
    container's (or one below it), by the record's task_memcg field only (parse_oom_kill)."""
    def is_kill(line: str) -> bool:
        rec = parse_oom_kill(line)
        return rec is not None and rec["vmid"] == vmid
    return is_kill


def parse_kernel_log(text: Optional[str], vmid: Optional[int] = None, limit: int = 50) -> dict[str, Any]:
    """Kernel log lines that matter here: Xid, OOM, hung tasks (last ``limit`` kept), the container's OOM kills (its
    ``oom-kill:`` records by their task_memcg field: parse_oom_kill) and the records that read more than one way
    (attributed to no container). Evidence only: the Xids are judged by ``judge``."""
    lines = [ln.rstrip() for ln in (text or "").splitlines() if KERNEL_LOG_RE.search(ln)]
    oom_ct = 0
    if vmid is not None:
        is_kill = _container_oom_kill(vmid)
        oom_ct = sum(1 for ln in lines if is_kill(ln))
    kills = [k for k in (parse_oom_kill(ln) for ln in lines) if k is not None]
    return {"lines": lines[-limit:], "oom_kills_in_container": oom_ct,
            "oom_kills_ambiguous": sum(1 for k in kills if len(k["task_memcg_readings"]) != 1)}


def last_oom_kill_seq(records: Iterable[Mapping[str, Any]], vmid: int) -> Optional[int]:
    """The sequence number of the newest record of an OOM kill in the container (None: the ring buffer holds none).
    Unlike a count of such records, it only grows: the buffer drops its oldest records, never a number."""
    is_kill = _container_oom_kill(vmid)
    seqs = [int(r["seq"]) for r in records if is_kill(str(r.get("message") or ""))]
    return max(seqs) if seqs else None
