# -*- coding: utf-8 -*-
# Copyright: inferops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""A run's report as it goes into an AWX artifact (set_stats): bounded in size.

AWX deletes a job's private data dir when the job ends (setting AWX_CLEANUP_PATHS, on by default), so a report written
there is gone; what AWX keeps is the job's ``artifacts`` (the aggregate set_stats of the playbook_on_stats event), in
its database, and hands them to the next workflow node as extra variables. The report goes there whole when its
JSON is at most ``max_bytes``; else the largest parts (``evidence``, ``memory``, ``processes``, ``action``, ``plan``)
are dropped, deepest first, until it fits, and what was dropped is named. No Ansible imports.
"""
from __future__ import annotations

import json
from typing import Any, Dict, List, Mapping
from ansible_collections.inferops.gpu_inference.plugins.module_utils.common.errors import InferopsError

#: The most bytes of report JSON one artifact keeps (AWX stores artifacts in its database, and a workflow passes them
#: on as extra variables to every later node).
ARTIFACT_REPORT_MAX_BYTES = 16384
#: Keys dropped, in this order, from wherever they are in the report, until it fits.
BULKY_KEYS = ("evidence", "processes", "memory", "action", "picture", "explain", "plan", "verify", "rungs")


class ReportArtifactError(InferopsError):
    """The report is not a JSON-serialisable mapping, or the bound is not a positive integer."""


def _size(value: Any) -> int:
    return len(json.dumps(value, sort_keys=True).encode("utf-8"))


def _without(value: Any, key: str) -> Any:
    if isinstance(value, Mapping):
        return {k: _without(v, key) for k, v in value.items() if k != key}
    if isinstance(value, list):
        return [_without(v, key) for v in value]
    return value


def bounded(report: Any, max_bytes: Any = ARTIFACT_REPORT_MAX_BYTES) -> Dict[str, Any]:
    """``{"report": <the report or its reduction>, "report_bytes": <its full size>, "report_complete": bool,
    "report_dropped": [keys]}``; the reduction is at most ``max_bytes`` of JSON."""
    if not isinstance(report, Mapping):
        raise ReportArtifactError("the report must be a mapping, got %s" % type(report).__name__)
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 256:
        raise ReportArtifactError("max_bytes must be a whole number of bytes >= 256, got %r" % (max_bytes,))
    try:
        full = _size(report)
    except (TypeError, ValueError) as exc:
        raise ReportArtifactError("the report is not JSON: %s" % exc) from exc
    kept: Any = dict(report)
    dropped: List[str] = []
    for key in BULKY_KEYS:
        if _size(kept) <= max_bytes:
            break
        reduced = _without(kept, key)
        if reduced != kept:
            dropped.append(key)
        kept = reduced
    if _size(kept) > max_bytes:
        # Still too large: only the top level's scalars.
        kept = {k: v for k, v in kept.items() if isinstance(v, (str, int, float, bool)) or v is None}
        dropped.append("every nested value")
        while _size(kept) > max_bytes and kept:
            kept.pop(max(kept, key=lambda k: _size(kept[k])))
    return {"report": kept, "report_bytes": full, "report_complete": not dropped, "report_dropped": dropped}
