# -*- coding: utf-8 -*-
# Copyright: inferops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The process overheads a running server showed, offered for the next plan (pure Python, no Ansible imports).

The deploy's verify measures what the running SGLang processes hold beyond the planned pools (``overhead_seen`` in
sglang_deploy.verify); its report (``<report dir>/<host>/deploy.json``, on the controller) is the record, one per
container host. The next plan of that host (deploy's request stage, plan.yml -e plan_host) reads the record and
offers the figures as the settings to use. Nothing here changes a plan: an offer is printed, never applied; the
operator copies it into ``sglang_server_hicache_policy`` (docs/sizing.md, "Where the overheads come from").

The figure offered is the measurement plus a quarter, rounded up to a whole GiB: verify measures at start-up, idle,
and serving grows the processes (requests' state in the schedulers, the tokenizer's caches; sgl-project/sglang#6914
reports a scheduler growing far more under a leak, which no budget covers).
"""

from __future__ import annotations

import json
from typing import Any, Dict, Mapping, Optional

from ansible_collections.inferops.gpu_inference.plugins.module_utils.sizing.hicache_input import DEFAULT_POLICY
from ansible_collections.inferops.gpu_inference.plugins.module_utils.sizing.sizing_values import GIB_BYTES, fmt_gib

#: Keys of the policy an offer sets.
OFFER_KEYS = ("rank_overhead_bytes", "frontend_overhead_bytes")
#: The largest figure read from a record (a per-rank or front-end overhead above it is not a measurement: 1 TiB).
_MOST_BYTES = 1 << 40


def offered_bytes(measured_bytes: int) -> int:
    """A measured overhead as offered: plus a quarter, rounded up to a whole GiB (at least 1 GiB)."""
    grown = int(measured_bytes) + int(measured_bytes) // 4
    return max(1, -(-grown // GIB_BYTES)) * GIB_BYTES


def offer(per_rank_bytes: int, frontend_bytes: int, ranks: int) -> Dict[str, Any]:
    """The policy settings verify's measurement offers, and the line the report prints."""
    settings = {"rank_overhead_bytes": offered_bytes(per_rank_bytes), "frontend_overhead_bytes": offered_bytes(frontend_bytes)}
    return {
        "settings": settings if ranks > 0 else {},
        "text": ("for the next plan, to budget what ran: sglang_server_hicache_policy: {rank_overhead_bytes: %d, "
                 "frontend_overhead_bytes: %d} (%s and %s: the measurement plus a quarter, whole GiB; not applied "
                 "unless set)" % (settings["rank_overhead_bytes"], settings["frontend_overhead_bytes"],
                                  fmt_gib(settings["rank_overhead_bytes"]), fmt_gib(settings["frontend_overhead_bytes"])))
        if ranks > 0 else "no ranks were measured: nothing to offer",
    }


def _figure(value: Any) -> Optional[int]:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _MOST_BYTES:
        return None
    return value


def recorded_offer(record: Any) -> Optional[Dict[str, Any]]:
    """The offer in a host's last deploy report (deploy.json as text or as a dict), or None when there is none: no
    report, a report that does not parse, a verify that did not match the plan, or figures out of range."""
    if isinstance(record, (str, bytes)):
        if not record.strip():
            return None
        try:
            record = json.loads(record)
        except ValueError:
            return None
    if not isinstance(record, Mapping):
        return None
    verify = record.get("verify")
    if not isinstance(verify, Mapping) or verify.get("ok") is not True:
        return None
    seen = verify.get("overhead_seen")
    if not isinstance(seen, Mapping):
        return None
    per_rank, frontend = _figure(seen.get("per_rank_bytes")), _figure(seen.get("frontend_bytes"))
    ranks = _figure(verify.get("ranks_seen"))
    if per_rank is None or frontend is None or not ranks:
        return None
    reported = record.get("reported_at")
    version = record.get("sglang_version")
    return {
        "settings": offer(per_rank, frontend, ranks)["settings"],
        "per_rank_bytes": per_rank,
        "frontend_bytes": frontend,
        "ranks": ranks,
        "reported_at": reported if isinstance(reported, str) else "",
        "sglang_version": version if isinstance(version, str) else "",
    }


def offer_note(record: Any, policy: Mapping[str, Any], host: str) -> Optional[str]:
    """The line the next plan prints: the overheads the host's last verify measured, offered as the settings to use;
    None when there is no record, or the policy in effect already sets what is offered."""
    found = recorded_offer(record)
    if found is None:
        return None
    settings = found["settings"]
    in_effect = {key: _in_effect(policy, key) for key in OFFER_KEYS}
    if all(in_effect[key] == value for key, value in settings.items()):
        return None
    effect_text = ", ".join(
        "%s %s%s" % (key, fmt_gib(value) if value is not None else "unreadable", "" if key in policy else " (the default)")
        for key, value in in_effect.items())
    return ("measured overheads, offered and not applied: %s's last deploy%s%s measured %s per rank (%d ranks) and a "
            "front-end of %s beyond the pools; to plan with them, set sglang_server_hicache_policy: {rank_overhead_bytes: "
            "%d, frontend_overhead_bytes: %d} (the measurement plus a quarter, whole GiB; docs/sizing.md). In effect: %s."
            % (host, " (%s)" % found["reported_at"] if found["reported_at"] else "",
               ", SGLang %s," % found["sglang_version"] if found["sglang_version"] else "",
               fmt_gib(found["per_rank_bytes"]), found["ranks"], fmt_gib(found["frontend_bytes"]),
               settings["rank_overhead_bytes"], settings["frontend_overhead_bytes"], effect_text))


def _in_effect(policy: Mapping[str, Any], key: str) -> Optional[int]:
    """The policy's figure for key as the plan takes it (given, else the default); None when it is not a number (the
    plan refuses it on its own)."""
    value = policy.get(key, DEFAULT_POLICY[key])
    try:
        return int(str(value).strip()) if not isinstance(value, bool) else None
    except ValueError:
        return None


__all__ = ["OFFER_KEYS", "offered_bytes", "offer", "recorded_offer", "offer_note"]
