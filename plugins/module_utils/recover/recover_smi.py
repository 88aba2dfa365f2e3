# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""What the recovery ladder reads from nvidia-smi besides the GPU and compute-app queries of gpu_facts: the
driver's ``gpu_recovery_action`` per GPU (judged by recover_gate.recovery_action_class) and the NVLink topology
(``nvidia-smi topo -m``), whose peers rung 5 resets together.

No Ansible imports. Unit-tested in tests/unit/plugins/module_utils/recover/test_recover_smi.py.
"""

from __future__ import annotations

import re
from typing import Any, Iterable, Mapping, Optional, Sequence

from ansible_collections.inferops.gpu_inference.plugins.module_utils.host.gpu_facts import na_to_none


def recovery_action_query_args(nvidia_smi: str) -> list[str]:
    return [nvidia_smi, "--query-gpu=index,gpu_recovery_action", "--format=csv,noheader"]


def parse_recovery_actions(rc: int, text: Optional[str], err: Optional[str] = None) -> dict[str, Any]:
    """``nvidia-smi --query-gpu=index,gpu_recovery_action --format=csv,noheader``.

    Returns {"supported": bool, "actions": {index: value or None}, "error": str or None}. A driver that does not
    know the field (older than the NVML call) says ``Field "gpu_recovery_action" is not a valid field to query``:
    supported is False (a note, not a reason). A value nvidia-smi cannot read ([N/A], [Unknown Error],
    [GPU is lost]) is None, which the gate counts as unknown, i.e. not clean.
    """
    out = (text or "") + "\n" + (err or "")
    if rc != 0:
        return {"supported": "not a valid field" not in out, "actions": {}, "error": out.strip() or "rc %d" % rc}
    actions: dict[int, Optional[str]] = {}
    for line in (text or "").splitlines():
        index, sep, value = line.partition(",")
        if not sep or not index.strip().isdigit():
            continue
        actions[int(index.strip())] = na_to_none(value)
    return {"supported": True, "actions": actions, "error": None}


def parse_topo_nvlink(text: Optional[str]) -> dict[int, list[int]]:
    """NVLink peers from ``nvidia-smi topo -m``: {gpu index: [peer indexes]} for cells ``NV<n>``.

    Returns {} when the matrix is absent (no NVLink, or a driver/lab without ``topo``).
    """
    lines = [ln for ln in (text or "").splitlines() if ln.strip()]
    if not lines:
        return {}
    header = lines[0].split()
    columns = [int(h[3:]) if re.fullmatch(r"GPU\d+", h) else None for h in header]
    peers: dict[int, list[int]] = {}
    for line in lines[1:]:
        cells = line.split()
        if not cells or not re.fullmatch(r"GPU\d+", cells[0]):
            continue
        row = int(cells[0][3:])
        for col, cell in zip(columns, cells[1:]):
            if col is not None and col != row and re.fullmatch(r"NV\d+", cell):
                peers.setdefault(row, []).append(col)
    return {gpu: sorted(set(p)) for gpu, p in peers.items()}


def nvlink_closure(gpus: Iterable[int], peers: Mapping[int, Sequence[int]]) -> list[int]:
    """The GPUs plus every GPU reachable over NVLink from them (reset them together: nvidia-smi(1), --gpu-reset)."""
    todo = list(gpus)
    seen: set[int] = set()
    while todo:
        gpu = todo.pop()
        if gpu in seen:
            continue
        seen.add(gpu)
        todo.extend(peers.get(gpu, ()))
    return sorted(seen)


# --------------------------------------------------------------------------- device minor <-> nvidia-smi index
#
# What the node shows as /dev/nvidiaN (PVE's devN entries, the device nodes processes hold open) is the driver's
# minor number N; what nvidia-smi, NVLink's topology, the driver's recovery action and ``nvidia-smi -r -i`` take
# is the nvidia-smi index. They are equal on most servers but not on all (NVML: the minor number is "such that the
# NVIDIA device node file for each GPU will have the form /dev/nvidia[minor number]"; the index is NVML's
# enumeration order). Both are tied to the GPU's PCI bus id by the driver: ``nvidia-smi -q`` prints, under each
# ``GPU <bus id>`` heading, the "Minor Number" (nvidia-smi(1), GPU ATTRIBUTES), and ``--query-gpu=index,pci.bus_id``
# the index of each bus id. A minor is turned into an index only through that; anything else is unknown.


def minor_query_args(nvidia_smi: str) -> list[str]:
    return [nvidia_smi, "-q"]


_BUS_RE = re.compile(r"^(?:([0-9A-Fa-f]{1,8}):)?([0-9A-Fa-f]{1,2}):([0-9A-Fa-f]{1,2})\.([0-7])$")


def norm_bus_id(text: Any) -> Optional[str]:
    """A PCI bus id in one spelling (nvidia-smi prints ``00000000:18:00.0``, the kernel ``0000:18:00.0``):
    ``dddd:bb:dd.f`` in lower case; None when it is not one."""
    match = _BUS_RE.match(str(text or "").strip())
    if not match:
        return None
    domain, bus, dev, fn = match.groups()
    return "%04x:%02x:%02x.%s" % (int(domain or "0", 16), int(bus, 16), int(dev, 16), fn)


def parse_q_minors(text: Optional[str]) -> dict[str, Optional[int]]:
    """{bus id (norm_bus_id): minor number or None} from ``nvidia-smi -q``: the ``GPU <bus id>`` headings and the
    "Minor Number" line of each section (``N/A`` or a missing line: None). Lines of other sections are ignored."""
    found: dict[str, Optional[int]] = {}
    current: Optional[str] = None
    for line in (text or "").splitlines():
        if line[:1] not in ("", " ", "\t"):
            head = line.strip()
            current = norm_bus_id(head[4:]) if head.startswith("GPU ") else None
            if current is not None:
                found.setdefault(current, None)
            continue
        if current is None:
            continue
        key, sep, value = line.partition(":")
        if sep and key.strip() == "Minor Number":
            value = value.strip()
            found[current] = int(value) if value.isdigit() else None
    return found


def gpu_numbering(rows: Sequence[Mapping[str, Any]], q_minors: Mapping[str, Optional[int]]) -> dict[str, Any]:
    """One mapping device minor <-> nvidia-smi index <-> PCI bus id, from the rows of ``--query-gpu`` (index,
    pci_bus_id) and parse_q_minors of ``nvidia-smi -q``.

    Returns {"index_of_minor": {minor: index}, "minor_of_index": {index: minor}, "bus_of_index": {index: bus id},
    "complete": bool, "problems": [str]}. A GPU whose bus id or minor is unreadable, or a minor or bus id given
    twice, is left out and named in problems; complete is True only when every GPU nvidia-smi lists is mapped.
    """
    problems: list[str] = []
    index_of_minor: dict[int, int] = {}
    minor_of_index: dict[int, int] = {}
    bus_of_index: dict[int, str] = {}
    seen_bus: dict[str, int] = {}
    for row in rows:
        if row.get("index") is None:
            problems.append("a GPU row of nvidia-smi --query-gpu has no index")
            continue
        index = int(row["index"])
        bus = norm_bus_id(row.get("pci_bus_id"))
        if bus is None:
            problems.append("GPU %d: nvidia-smi --query-gpu gives no readable PCI bus id (%r)" % (index, row.get("pci_bus_id")))
            continue
        if bus in seen_bus:
            problems.append("GPUs %d and %d: the same PCI bus id %s" % (seen_bus[bus], index, bus))
            continue
        seen_bus[bus] = index
        bus_of_index[index] = bus
        if bus not in q_minors:
            problems.append("GPU %d (%s): not in nvidia-smi -q" % (index, bus))
            continue
        minor = q_minors[bus]
        if minor is None:
            problems.append("GPU %d (%s): nvidia-smi -q gives no Minor Number" % (index, bus))
            continue
        if minor in index_of_minor:
            problems.append("GPUs %d and %d: the same Minor Number %d" % (index_of_minor[minor], index, minor))
            minor_of_index.pop(index_of_minor.pop(minor), None)
            continue
        index_of_minor[minor] = index
        minor_of_index[index] = minor
    return {"index_of_minor": index_of_minor, "minor_of_index": minor_of_index, "bus_of_index": bus_of_index,
            "complete": not problems, "problems": problems}


def indexes_of_minors(minors: Iterable[int], numbering: Optional[Mapping[str, Any]]) -> tuple[list[int], list[int]]:
    """(nvidia-smi indexes, minors that map to none) for device minors (/dev/nvidiaN), through gpu_numbering only."""
    table = (numbering or {}).get("index_of_minor") or {}
    found: set[int] = set()
    unknown: set[int] = set()
    for minor in minors:
        index = table.get(int(minor))
        if index is None:
            unknown.add(int(minor))
        else:
            found.add(int(index))
    return sorted(found), sorted(unknown)


def describe_unmapped(minors: Sequence[int], numbering: Optional[Mapping[str, Any]], error: Optional[str] = None) -> str:
    """Why /dev/nvidiaN minors could not be turned into nvidia-smi indexes (for a reason or a refusal)."""
    why = error or "; ".join((numbering or {}).get("problems") or []) or "no GPU nvidia-smi -q lists has that Minor Number"
    return ("/dev/nvidia%s: which GPU (nvidia-smi index) that device minor is cannot be read from the driver (%s); "
            "the minor number is not taken as the index" % (",".join(str(m) for m in minors), why))
