# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""What the recovery ladder reads from nvidia-smi besides the GPU and compute-app queries of gpu_facts: the
driver's ``gpu_recovery_action`` per GPU (judged by recover_gate.recovery_action_class) and the NVLink topology
(``nvidia-smi topo -m``), whose peers rung 5 resets together.

No Ansible imports. Unit-tested in tests/unit/plugins/module_utils/test_recover_smi.py.
"""

from __future__ import annotations

import re
from typing import Any, Iterable, Mapping, Optional, Sequence

from ansible_collections.inferops.gpu_inference.plugins.module_utils.gpu_facts import na_to_none


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
