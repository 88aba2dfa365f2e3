# -*- coding: utf-8 -*-
# Copyright: inferops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The sizing model's input: one flat dict of facts and policy, checked and coerced into a
:class:`PlanInput` (pure Python, no Ansible imports).

Every key is documented in ``ansible-doc -t filter inferops.gpu_inference.hicache_plan``; the policy
defaults and their reasoning are in docs/sizing.md.  A value in the wrong unit, outside its plausible
range, or a layout SGLang refuses raises :class:`PlanError` with what to write instead.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace
from typing import Any, Dict, List, Mapping, Optional, Tuple

from ansible_collections.inferops.gpu_inference.plugins.module_utils.sizing.hicache_geometry import GEOMETRY_KEYS, kv_choices
from ansible_collections.inferops.gpu_inference.plugins.module_utils.sizing.hicache_pools import KvChoice, Placement, place_ranks
from ansible_collections.inferops.gpu_inference.plugins.module_utils.sizing.hicache_releases import (
    SGLANG_RESERVE_BYTES,
    Rules,
    SglangVersion,
    behaviour_releases,
    parse_version,
    rules_for,
)
from ansible_collections.inferops.gpu_inference.plugins.module_utils.sizing.sizing_values import (
    GB_BYTES,
    GIB_BYTES,
    PlanError,
    as_bool,
    as_float,
    as_int,
    fmt_gb,
    fmt_gib,
    looks_like_percent,
    memory_bytes,
    policy_bytes,
    ranged_int,
)

#: The OS reserve's margin over the host's idle use counted twice (docs/sizing.md, "The OS reserve"): jobs that come
#: and go on the host (an Ansible run's Python, a console, a backup's reads) and the kernel's own growth.
OS_RESERVE_MARGIN_BYTES = 4 * GIB_BYTES

#: Policy defaults, each documented in docs/sizing.md.
DEFAULT_POLICY: Dict[str, Any] = {
    # The OS reserve (hicache_model.budget_of): the largest of SGLang's own 10 GiB, what the host measurably needs
    # (its idle use again, this margin, and the page tables of the pools), and, off by default, a fraction of RAM
    # (0.10 is the rule before the reserve came from the node).
    "os_reserve_min_bytes": SGLANG_RESERVE_BYTES,
    "os_reserve_margin_bytes": OS_RESERVE_MARGIN_BYTES,
    "os_reserve_fraction": 0.0,
    # RSS of one scheduler process (CUDA context, torch, NCCL) and of the front-end
    # (HTTP server, tokenizer, detokenizer): 8 GiB each until measured (no published figure; docs/sizing.md).
    "rank_overhead_bytes": 8 * GIB_BYTES,
    "frontend_overhead_bytes": 8 * GIB_BYTES,
    # Memory already promised to something else on this host (other engines' pools, ...).
    "other_committed_bytes": 0,
    # Ranks of other engines that will pin pools of the same per-rank size on this host.
    "other_engine_ranks": 0,
    "page_size": 64,
}

_REQUIRED_KEYS = ("mem_total_bytes", "mem_available_bytes", "gpu_count", "gpu_memory_mib", "sglang_version")
_OPTIONAL_KEYS = (
    (
        "mem_limit_bytes",
        "tp_size",
        "pp_size",
        "dp_size",
        "enable_dp_attention",
        "attn_dp_size",
        "nnodes",
        "kv_bytes_per_token",
        "draft_kv_bytes_per_token",
        "model_preset",
        "kv_cache_dtype",
        "device_pool_tokens_per_rank",
        "requested_gb",
        "idle_used_bytes",
    )
    + tuple("model_" + k for k in GEOMETRY_KEYS)
    + tuple(DEFAULT_POLICY)
)
ALLOWED_KEYS = frozenset(_REQUIRED_KEYS + _OPTIONAL_KEYS)


@dataclass
class PlanInput:
    """Validated, unit-explicit inputs of a plan."""

    mem_total_bytes: int
    mem_available_bytes: int
    mem_limit_bytes: Optional[int]
    gpu_count: int
    gpu_memory_mib: int
    version: SglangVersion
    releases: List[Rules]
    placement: Placement
    tp_size: int = 1
    pp_size: int = 1
    dp_size: int = 1
    enable_dp_attention: bool = False
    nnodes: int = 1
    kv_choices: List[KvChoice] = field(default_factory=list)
    kv_source: str = ""
    dsa: bool = False
    device_pool_tokens_per_rank: Optional[int] = None
    requested_gb: Optional[int] = None
    attn_dp_size: int = 1  # as given (--attn-dp-size); dp_size / enable_dp_attention then carry it
    draft_kv_bytes_per_token: int = 0  # a sidecar draft model's KV bytes per token per rank (0: none)
    idle_used_bytes: Optional[int] = None  # what the host uses idle, as given (None: read from the memory facts)
    policy: Dict[str, Any] = field(default_factory=dict)
    warnings: List[str] = field(default_factory=list)

    @property
    def kv_bytes_per_token(self) -> int:
        return self.kv_choices[0].largest.kv_bytes_per_token


def validate(data: Mapping[str, Any]) -> PlanInput:
    """Check and coerce one flat dict of facts and policy; raise PlanError on any bad input."""
    _check_keys(data)
    version = parse_version(data["sglang_version"])
    release_keys, version_warning = behaviour_releases(version)
    warnings: List[str] = [version_warning] if version_warning else []
    releases = rules_for(version, release_keys)

    total, available, limit = _memory_facts(data, warnings)
    gpu_count = ranged_int("gpu_count", data["gpu_count"])
    gpu_memory_mib = _gpu_memory_mib(data["gpu_memory_mib"])

    def given(key: str, default: Any) -> Any:
        return default if data.get(key) is None else data[key]

    tp = ranged_int("tp_size", given("tp_size", 1))
    pp = ranged_int("pp_size", given("pp_size", 1))
    dp = ranged_int("dp_size", given("dp_size", 1))
    nnodes = ranged_int("nnodes", given("nnodes", 1))
    dp_attention = as_bool("enable_dp_attention", given("enable_dp_attention", False))
    if dp == 1:
        dp_attention = False  # SGLang turns it off with dp_size 1 (_handle_data_parallelism)
    attn_dp = _attn_dp_size(data.get("attn_dp_size"), releases, version, tp, dp)
    if attn_dp > 1:
        dp, dp_attention = attn_dp, True  # the same ranks as the deprecated --dp-size N --enable-dp-attention

    # SGLang's start-up checks, as the newest candidate release words them.
    placement = place_ranks(tp, pp, dp, dp_attention, nnodes, max(release_keys))
    if placement.nodes_launching_missing_stages:
        nodes = placement.nodes_launching_missing_stages
        warnings.append(
            "pp_size %d does not divide nnodes %d: SGLang's launcher makes node rank(s) %s start %d scheduler(s) each for "
            "a PP stage that does not exist; they cannot join the job, so those nodes are wasted. The plan still sizes "
            "every node for the %d ranks the launcher starts on it"
            % (pp, nnodes, ", ".join(str(n) for n in nodes), placement.ranks_per_node, placement.ranks_per_node)
        )

    choices, kv_source, dsa = kv_choices(data, tp, pp, dp, dp_attention)
    if dsa and all(r.dsa_indexer == "none" for r in releases):
        warnings.append(
            "SGLang %s has no DSA host pool (NSATokenToKVPoolHost arrived in 0.5.9): the KV cache of this DSA model is "
            "priced as plain MLA" % version
        )

    policy = _policy(data, total)
    warnings.extend(_overhead_warnings(policy))
    device_tokens = None
    if data.get("device_pool_tokens_per_rank") is not None:
        device_tokens = ranged_int("device_pool_tokens_per_rank", data["device_pool_tokens_per_rank"])

    draft = _draft_kv_bytes_per_token(data.get("draft_kv_bytes_per_token"))
    if draft:
        choices = [replace(choice, draft_kv_bytes_per_token=draft) for choice in choices]

    return PlanInput(
        mem_total_bytes=total,
        mem_available_bytes=available,
        mem_limit_bytes=limit,
        gpu_count=gpu_count,
        gpu_memory_mib=gpu_memory_mib,
        version=version,
        releases=releases,
        tp_size=tp,
        pp_size=pp,
        dp_size=dp,
        enable_dp_attention=dp_attention,
        nnodes=nnodes,
        placement=placement,
        kv_choices=choices,
        kv_source=kv_source,
        dsa=dsa,
        device_pool_tokens_per_rank=device_tokens,
        requested_gb=_requested_gb(data.get("requested_gb"), total),
        attn_dp_size=attn_dp,
        draft_kv_bytes_per_token=draft,
        idle_used_bytes=_idle_used_bytes(data.get("idle_used_bytes"), total),
        policy=policy,
        warnings=warnings,
    )


def _attn_dp_size(raw: Any, releases: List[Rules], version: SglangVersion, tp: int, dp: int) -> int:
    """--attn-dp-size (SGLang 0.5.22+, arg_groups/parallel_hook.py): attention DP groups over the TP ranks,
    no extra processes.  Refused as SGLang refuses it: with dp_size > 1, or tp_size not a multiple of it."""
    if raw is None:
        return 1
    attn_dp = as_int("attn_dp_size", raw, 1)
    if attn_dp > 1024:
        raise PlanError("attn_dp_size=%d is implausible (at most 1024): it is SGLang's --attn-dp-size, the attention DP groups" % attn_dp)
    if attn_dp == 1:
        return 1
    older = [str(r) for r in releases if not r.has_attn_dp_size]
    if older:
        raise PlanError(
            "attn_dp_size is SGLang 0.5.22's --attn-dp-size, which SGLang %s (as %s) does not have (its argparse exits): "
            "give dp_size %d with enable_dp_attention: true instead, the spelling every release takes"
            % (version, " / ".join(older), attn_dp)
        )
    if dp > 1:
        raise PlanError(
            "SGLang refuses --dp-size %d with --attn-dp-size %d: \"data-parallel replicas combined with attention data "
            "parallelism are not supported\" (arg_groups/parallel_hook.py handle_data_parallelism); give one of them"
            % (dp, attn_dp)
        )
    if tp % attn_dp:
        raise PlanError(
            "SGLang refuses --attn-dp-size %d with --tp-size %d: it asserts tp_size %% attn_dp_size == 0 (the attention DP "
            "groups split the TP ranks; arg_groups/parallel_hook.py handle_data_parallelism); use a tp_size it divides"
            % (attn_dp, tp)
        )
    return attn_dp


def _idle_used_bytes(raw: Any, total: int) -> Optional[int]:
    """What the host uses with no SGLang running (MemTotal - MemAvailable at idle, as a baseline or preflight reads
    it), given; None: the plan reads it from the memory facts."""
    if raw is None:
        return None
    value = policy_bytes("idle_used_bytes", raw, total)
    if value >= total:
        raise PlanError(
            "idle_used_bytes=%d bytes is all of the host's RAM (%s): it is what the host uses with no SGLang running "
            "(MemTotal - MemAvailable, free -b), a small part of it" % (value, fmt_gib(total))
        )
    return value


def _draft_kv_bytes_per_token(raw: Any) -> int:
    """A sidecar draft model's KV bytes per token on one rank (all its layers; EAGLE3 and similar): SGLang gives it
    a host pool of the target pool's token count, outside --hicache-size (hybrid_pool_assembler.build_full_draft_pools)."""
    if raw is None:
        return 0
    value = as_int("draft_kv_bytes_per_token", raw, 0)
    if value and not 64 <= value <= 64 * 2**20:
        raise PlanError(
            "draft_kv_bytes_per_token=%d is implausible: it is the draft model's KV bytes per token on one rank "
            "(for example 1 layer x 2 x 8 KV heads x 128 x 2 bytes = 4096), between 64 B and 64 MiB; 0 for no draft pool" % value
        )
    return value


def _check_keys(data: Mapping[str, Any]) -> None:
    """A dict, with no unknown key (a memory key in another unit is named) and every required one."""
    if not isinstance(data, Mapping):
        raise PlanError("the plan input must be a dict of facts and policy, got %s" % type(data).__name__)
    unknown = sorted(str(k)[:60] for k in data if k not in ALLOWED_KEYS)
    if unknown:
        hints = []
        for key in unknown:
            stem = re.sub(r"_(gb|gib|mb|mib|kb|kib)$", "", key)
            if stem != key and stem + "_bytes" in ALLOWED_KEYS:
                hints.append("%s: memory inputs are in bytes, use %s_bytes" % (key, stem))
        raise PlanError(
            "unknown key(s) %s%s. Known keys: %s"
            % (", ".join(unknown[:10]), (" (" + "; ".join(hints) + ")") if hints else "", ", ".join(sorted(ALLOWED_KEYS)))
        )
    missing = [k for k in _REQUIRED_KEYS if data.get(k) is None]
    if missing:
        raise PlanError(
            "missing required key(s): %s. mem_*_bytes come from /proc/meminfo or the gpu_host_facts module (bytes), "
            "gpu_count and gpu_memory_mib from nvidia-smi, sglang_version from the installed sglang package" % ", ".join(missing)
        )


def _memory_facts(data: Mapping[str, Any], warnings: List[str]) -> Tuple[int, int, Optional[int]]:
    """MemTotal, MemAvailable and the container limit (None: none), in bytes."""
    total = memory_bytes("mem_total_bytes", data["mem_total_bytes"])
    available = memory_bytes("mem_available_bytes", data["mem_available_bytes"])
    if available > total:
        raise PlanError(
            "mem_available_bytes (%s) is larger than mem_total_bytes (%s): MemAvailable cannot exceed MemTotal; "
            "check that both are bytes and come from the same host" % (fmt_gb(available), fmt_gb(total))
        )
    limit: Optional[int] = None
    if data.get("mem_limit_bytes") is not None:
        limit = memory_bytes("mem_limit_bytes", data["mem_limit_bytes"])
        if limit > total:
            warnings.append(
                "the container memory limit (%s) is larger than the host's RAM (%s): it protects nothing; "
                "set the container's memory below the host's" % (fmt_gib(limit), fmt_gib(total))
            )
    return total, available, limit


def _gpu_memory_mib(raw: Any) -> int:
    gpu_memory_mib = as_int("gpu_memory_mib", raw, 1)
    if gpu_memory_mib < 1024:
        raise PlanError(
            "gpu_memory_mib=%d is less than 1 GiB: it looks like GiB or GB were passed where MiB are expected "
            "(nvidia-smi --query-gpu=memory.total --format=csv,nounits reports MiB)" % gpu_memory_mib
        )
    if gpu_memory_mib > 4 * 1024 * 1024:
        raise PlanError(
            "gpu_memory_mib=%d is more than 4 TiB per GPU: it looks like bytes or KiB were passed where MiB are expected" % gpu_memory_mib
        )
    return gpu_memory_mib


def _policy(data: Mapping[str, Any], total: int) -> Dict[str, Any]:
    """DEFAULT_POLICY with the overrides given."""
    policy = dict(DEFAULT_POLICY)
    for key in DEFAULT_POLICY:
        if data.get(key) is None:
            continue
        if key == "os_reserve_fraction":
            policy[key] = as_float(
                key,
                data[key],
                0.0,
                0.9,
                "; it is a fraction of RAM (0.10 for 10 percent)" if looks_like_percent(data[key]) else "",
            )
        elif key in ("page_size", "other_engine_ranks"):
            policy[key] = ranged_int(key, data[key])
        else:
            policy[key] = policy_bytes(key, data[key], total)
    if policy["os_reserve_min_bytes"] < SGLANG_RESERVE_BYTES:
        raise PlanError(
            "os_reserve_min_bytes=%d bytes (%s) is below the %s that SGLang itself keeps free "
            "(HICACHE_HOST_MEMORY_RESERVE_BYTES): a smaller reserve buys nothing and hides SGLang's own from the arithmetic. "
            "Give at least %d bytes (10 GiB), or leave it out for the default"
            % (policy["os_reserve_min_bytes"], fmt_gib(policy["os_reserve_min_bytes"]), fmt_gib(SGLANG_RESERVE_BYTES),
               SGLANG_RESERVE_BYTES)
        )
    return policy


def _overhead_warnings(policy: Mapping[str, Any]) -> List[str]:
    """A zero process overhead: every SGLang process holds a CUDA context, torch and (for a rank) NCCL in RAM."""
    what = {"rank_overhead_bytes": "each scheduler rank (CUDA context, torch, NCCL)",
            "frontend_overhead_bytes": "the front-end (HTTP server, tokenizer, detokenizer)"}
    return [
        "%s=0: the plan counts no RAM for %s, which holds several GiB in every SGLang process; the size is only safe "
        "if that memory is counted elsewhere (other_committed_bytes) or was measured as zero" % (key, what[key])
        for key in ("rank_overhead_bytes", "frontend_overhead_bytes")
        if policy[key] == 0
    ]


def _requested_gb(raw: Any, total: int) -> Optional[int]:
    """The per-rank size asked for (None: the plan chooses), a whole number of decimal GB."""
    if raw is None:
        return None
    if isinstance(raw, float) and math.isfinite(raw) and not raw.is_integer():
        raise PlanError(
            "requested_gb=%r: SGLang's --hicache-size is a whole number of GB (argparse type int; 8.5 makes it exit with code 2)" % raw
        )
    requested = as_int("requested_gb", raw, 1)
    if requested * GB_BYTES > 64 * total:
        raise PlanError(
            "requested_gb=%d is GB per rank, i.e. more than 64 times the host's %s of RAM per rank: "
            "it looks like bytes or MiB were passed; --hicache-size takes decimal GB" % (requested, fmt_gib(total))
        )
    return requested
