# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The recovery baseline of one container: recorded at idle, written and read by this code only.

No Ansible imports. deploy.yml records it (module gpu_baseline, on the node, right before SGLang starts) and
recover.yml reads it (module gpu_diagnose) or records it again (``recover_record_baseline``). The clean gate
compares against it (docs/recover.md, "Clean"), so it must hold the GPUs' idle figures, never leftovers: it is
recorded with the container running and SGLang stopped. ``build`` therefore refuses when one of the container's
GPUs is not idle.
"""

from __future__ import annotations

import json
import os
from typing import Any, Mapping, Optional, Sequence
from ansible_collections.inferops.gpu_inference.plugins.module_utils.common.errors import InferopsError

# The idle figure a GPU may show with no process on it: Meta GCM's gpu_mem_usage_threshold is 15 MiB
# (facebookresearch/gcm, gcm/health_checks/checks/check_nvidia_smi.py); SGLang PR #30110 cites ~4 MiB per idle H100.
IDLE_MAX_MIB = 16
FORMAT = 1
HOST_KEYS = ("mem_total_bytes", "mem_available_bytes", "shmem_bytes", "mlocked_bytes")


class BaselineError(InferopsError):
    """No baseline may be recorded now; the message says why and what to do."""


def path(directory: str, vmid: int) -> str:
    return os.path.join(directory, "%d.json" % int(vmid))


def build(vmid: int, gpus: Sequence[int], gpu_rows: Sequence[Mapping[str, Any]], apps: Sequence[Mapping[str, Any]],
          host_memory: Mapping[str, Any], container_memory_mib: Optional[int], recorded_at: str,
          idle_max_mib: int = IDLE_MAX_MIB, service: str = "sglang.service") -> dict[str, Any]:
    """The baseline record, or BaselineError when a GPU of the container is not idle.

    ``apps``: nvidia-smi compute apps, each with ``gpu_uuid``, ``used_memory_mib`` and ``owner`` (the VMID of the
    container the process belongs to, "host" or "gone"). Another container's apps on a shared GPU are not this
    container's doing: their memory is taken off, and what is left is the idle figure recorded.
    """
    by_index = {int(r["index"]): r for r in gpu_rows if r.get("index") is not None}
    record_gpus = []
    problems = []
    for index in sorted(set(int(g) for g in gpus)):
        row = by_index.get(index)
        if row is None:
            problems.append("GPU %d is not reported by nvidia-smi" % index)
            continue
        used = row.get("memory_used_mib")
        if used is None:
            problems.append("GPU %d has no memory.used figure ([N/A] or an error)" % index)
            continue
        on_gpu = [a for a in apps if a.get("gpu_uuid") == row.get("uuid")]
        own = [a for a in on_gpu if a.get("owner") in (vmid, "gone", "host")]
        foreign_mib = sum(int(a.get("used_memory_mib") or 0) for a in on_gpu if a not in own)
        idle = int(used) - foreign_mib
        if own:
            owners = ["CT %s" % a["owner"] if isinstance(a.get("owner"), int) else str(a.get("owner")) for a in own]
            problems.append("GPU %d has compute app(s) %s" % (index, ", ".join(
                "%s/%s (%s)" % (a.get("pid"), a.get("process_name"), who) for a, who in zip(own, owners))))
        elif idle > idle_max_mib:
            problems.append("GPU %d uses %d MiB with no process of its own (idle is at most %d MiB)"
                            % (index, idle, idle_max_mib))
        else:
            record_gpus.append({"index": index, "uuid": row.get("uuid"), "memory_used_mib": idle})
    if problems:
        raise BaselineError(
            "not recording a baseline for CT %d: %s. A baseline holds the GPUs' idle figures (the clean gate compares "
            "with it); recorded now it would call these leftovers clean. Bring the GPUs back to idle first "
            "(playbooks/recover.yml -e recover_vmid=%d), then record it again." % (vmid, "; ".join(problems), vmid))
    return {
        "format": FORMAT,
        "vmid": int(vmid),
        "recorded_at": recorded_at,
        "service": service,
        "gpus": record_gpus,
        "host": {k: host_memory.get(k) for k in HOST_KEYS},
        "container_memory_mib": container_memory_mib,
    }


def load(directory: str, vmid: int) -> tuple[str, Optional[dict[str, Any]], Optional[str]]:
    """(path, record or None, error or None). A missing file is (path, None, None)."""
    where = path(directory, vmid)
    try:
        with open(where, encoding="utf-8") as handle:
            data = json.load(handle)
    except FileNotFoundError:
        return where, None, None
    except (OSError, ValueError) as exc:
        return where, None, "unreadable baseline %s: %s" % (where, exc)
    if not isinstance(data, dict):
        return where, None, "baseline %s is not a JSON object" % where
    return where, data, None


def gpus_of(record: Optional[Mapping[str, Any]]) -> Optional[list[int]]:
    """The GPU indexes a baseline was recorded for (None without a record or without GPUs)."""
    if not record or not record.get("gpus"):
        return None
    return sorted(int(g["index"]) for g in record["gpus"] if g.get("index") is not None)


def write(directory: str, record: Mapping[str, Any]) -> str:
    """Write the record atomically (0644, root-owned directory 0755); returns the path."""
    os.makedirs(directory, mode=0o755, exist_ok=True)
    where = path(directory, int(record["vmid"]))
    tmp = where + ".tmp"
    with open(tmp, "w", encoding="utf-8") as handle:
        json.dump(record, handle, indent=2, sort_keys=True)
        handle.write("\n")
    os.chmod(tmp, 0o644)
    os.replace(tmp, where)
    return where
