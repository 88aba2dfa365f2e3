# -*- coding: utf-8 -*-
# Copyright: inferops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Where SGLang's ranks run and what one rank pins (pure Python, no Ansible imports).

:func:`place_ranks` places one engine's scheduler processes on the nodes as SGLang's launcher does
(or refuses what SGLang refuses); :func:`stage_pools` and :func:`rank_pools` give one rank's host
pools for a ``--hicache-size`` under one release: its token count, its KV and DSA indexer pools and
the host memory they really take (:func:`charge_buffer`).  docs/sizing.md has the formulas and the
SGLang files each was read from.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List, Optional, Tuple

from ansible_collections.inferops.gpu_inference.plugins.module_utils.sizing.hicache_releases import KNOWN_LAST_VERSION, Release, Rules, rules_of
from ansible_collections.inferops.gpu_inference.plugins.module_utils.sizing.sizing_values import GB_BYTES, KIB_BYTES, PlanError

#: Host buffers are mapped in pages: every buffer is charged rounded up to this (the largest base
#: page of a Linux GPU host, 64 KiB on aarch64) plus one more for the allocator's header.
ALLOC_GRANULE_BYTES = 64 * KIB_BYTES


# --------------------------------------------------------------------------------------------
# Placement (entrypoints/engine.py)


@dataclass(frozen=True)
class Placement:
    """Where SGLang's launcher puts one engine's scheduler processes (entrypoints/engine.py)."""

    tp_per_node: int
    pp_per_node: int
    replicas: int
    nnodes_per_pp_rank: int
    nodes_launching_missing_stages: Tuple[int, ...]

    @property
    def ranks_per_node(self) -> int:
        return self.tp_per_node * self.pp_per_node * self.replicas


def place_ranks(tp: int, pp: int, dp: int, dp_attention: bool, nnodes: int, release: Release) -> Placement:
    """Place one engine's ranks as SGLang's launcher does, or refuse what SGLang refuses.

    ``_launch_scheduler_processes`` / ``launch_tensor_parallel_group`` (0.4.9 to 0.5.23, the
    formula moved into ``_calculate_rank_ranges`` in 0.5.10): node ``i`` runs the PP ranks
    ``[a * (i // b), a * (i // b + 1))`` times the TP ranks ``[t * (i % b), t * (i % b + 1))`` with
    ``a = max(pp // nnodes, 1)``, ``b = max(nnodes // pp, 1)``, ``t = tp // b``; plain DP (no DP
    attention) starts ``dp`` such groups, on one node only.
    """
    if (tp * pp) % nnodes != 0:
        raise PlanError(
            "SGLang refuses tp_size %d x pp_size %d on %d nodes at start-up: \"tp_size must be divisible by number of "
            "nodes\" (check_server_args: tp x pp must be a multiple of nnodes)" % (tp, pp, nnodes)
        )
    plain_dp = dp > 1 and not dp_attention
    if plain_dp and nnodes > 1:
        reason = (
            "multi-node data-parallel replicas are not supported; use attention DP (--attn-dp-size) across nodes"
            if release >= (0, 5, 22)
            else "multi-node data parallel is not supported unless dp attention!"
        )
        raise PlanError(
            "SGLang refuses dp_size %d without DP attention on %d nodes at start-up: \"%s\" (check_server_args); "
            "run the replicas as separate engines on single nodes, or set enable_dp_attention" % (dp, nnodes, reason)
        )
    if dp_attention and dp > 1 and tp % dp != 0:
        raise PlanError(
            "SGLang refuses --enable-dp-attention with dp_size %d and tp_size %d: tp_size must be divisible by dp_size "
            "(the DP groups split the TP ranks; server_args _handle_data_parallelism)" % (dp, tp)
        )
    a = max(pp // nnodes, 1)
    b = max(nnodes // pp, 1)
    t = tp // b
    if t * b < tp:
        raise PlanError(
            "SGLang's launcher would never start TP ranks %d-%d: on %d nodes with pp_size %d each node runs tp // "
            "max(nnodes // pp, 1) = %d // %d = %d TP ranks (entrypoints/engine.py), and start-up would wait for the "
            "missing ranks forever; use a tp_size that max(nnodes // pp, 1) = %d divides" % (t * b, tp - 1, nnodes, pp, tp, b, t, b)
        )
    launched_stages = a * ((nnodes - 1) // b + 1)
    if launched_stages < pp:
        raise PlanError(
            "SGLang's launcher would never start PP stages %d-%d: on %d nodes each node runs max(pp // nnodes, 1) = %d "
            "stage(s) (entrypoints/engine.py), %d in all, and start-up would wait for the missing stages forever; "
            "use a pp_size that nnodes divides, or a multiple of it" % (launched_stages, pp - 1, nnodes, a, launched_stages)
        )
    extra = tuple(i for i in range(nnodes) if a * (i // b + 1) > pp)
    return Placement(tp_per_node=t, pp_per_node=a, replicas=dp if plain_dp else 1, nnodes_per_pp_rank=b, nodes_launching_missing_stages=extra)


def placement_text(placement: Placement, tp_size: int, dp_size: int, dp_attention: bool) -> str:
    """The launcher's formula with this layout's numbers, ending in the ranks per node."""
    text = (
        "SGLang's launcher (entrypoints/engine.py) places tp // max(nnodes // pp, 1) = %d // %d = %d TP rank(s) x "
        "max(pp // nnodes, 1) = %d PP stage(s) on each node"
        % (tp_size, placement.nnodes_per_pp_rank, placement.tp_per_node, placement.pp_per_node)
    )
    if dp_size > 1 and not dp_attention:
        text += ", x dp %d replicas (plain DP: launch_dp_schedulers starts %d full TP groups)" % (dp_size, dp_size)
    elif dp_size > 1:
        text += " (dp %d with DP attention: the DP groups share the TP ranks, no extra ranks)" % dp_size
    return text + " = %d" % placement.ranks_per_node


def engine_ranks_per_host(tp_size: int, pp_size: int, dp_size: int, enable_dp_attention: bool, nnodes: int) -> int:
    """Scheduler processes one engine starts on each host, as SGLang's launcher places them (uses
    the newest known release's start-up checks; see place_ranks)."""
    placement = place_ranks(tp_size, pp_size, dp_size, enable_dp_attention and dp_size > 1, nnodes, KNOWN_LAST_VERSION)
    return placement.ranks_per_node


def pp_stage_layers(num_layers: int, pp_size: int) -> List[int]:
    """Layers of each PP stage (get_pp_indices, distributed/utils.py, every release): an even split,
    the last ``num_layers % pp_size`` stages one layer more."""
    base, remainder = divmod(num_layers, pp_size)
    return [base + (1 if rank >= pp_size - remainder else 0) for rank in range(pp_size)]


# --------------------------------------------------------------------------------------------
# One rank's pools (mem_cache/memory_pool_host.py, pool_host/*.py)


@dataclass(frozen=True)
class Stage:
    """The KV geometry of one PP stage on one rank."""

    kv_bytes_per_token: int
    layers: Optional[int]  # None: the stage's layers are unknown (kv_bytes_per_token was given)
    index_bytes_per_token_per_layer: int = 0


@dataclass(frozen=True)
class KvChoice:
    """One way SGLang may lay out the KV cache for the input (a DSA model's layout depends on the
    GPU and the attention backend SGLang picks): the stages of the rank's pipeline."""

    stages: Tuple[Stage, ...]
    smaller_stages_unknown: bool
    label: str
    stage_of_rank: Tuple[int, ...] = (0,)  # index into stages of each PP rank
    draft_kv_bytes_per_token: int = 0  # a sidecar draft model's host pool (0: none)

    @property
    def largest(self) -> Stage:
        return max(self.stages, key=lambda s: s.kv_bytes_per_token + s.index_bytes_per_token_per_layer * (s.layers or 0))


@dataclass(frozen=True)
class RankPools:
    """One rank's host pools for one --hicache-size under one release and KV choice (the most
    expensive stage)."""

    tokens: int  # KV pool tokens of the largest stage
    min_tokens: int  # the fewest tokens any stage holds (SGLang <= 0.5.14's assertion)
    kv_bytes: int
    index_bytes: int
    requested_bytes: int  # what SGLang's own check compares (the KV pool, indexer included up to 0.5.18)
    index_requested_bytes: int  # what 0.5.19+ checks for the separate indexer pool
    charged_bytes: int  # host memory the rank really takes for its pools
    draft_bytes: int = 0  # the sidecar draft pool (outside --hicache-size)
    draft_requested_bytes: int = 0  # what SGLang's own check compares for the draft pool


NO_POOLS = RankPools(0, 0, 0, 0, 0, 0, 0)

#: The draft pool takes the target pool's token count (pool_host/base.py host_token_capacity, 0.5.22+);
#: releases that derive it from a ratio instead may align it one page up: priced with two pages more.
DRAFT_SLACK_PAGES = 2


def pow2_ceil(value: int) -> int:
    """The next power of two at or above value (PyTorch's CachingHostAllocator rounding)."""
    return 1 if value <= 1 else 1 << (value - 1).bit_length()


def _round_up(value: int, granule: int) -> int:
    return -(-value // granule) * granule


def charge_buffer(nbytes: int, rules: Rules) -> int:
    """Host memory one pinned buffer of nbytes takes: the power of two up to 0.5.4, else the pages
    it maps plus one for the allocator, at the largest base page size."""
    if nbytes <= 0:
        return 0
    if rules.pins_power_of_two:
        return _round_up(pow2_ceil(nbytes), ALLOC_GRANULE_BYTES)
    return _round_up(nbytes, ALLOC_GRANULE_BYTES) + ALLOC_GRANULE_BYTES


def _page_align(tokens: int, page_size: int, rules: Rules) -> int:
    if rules.pages_align_up:
        return (tokens // page_size + 1) * page_size
    return tokens - tokens % page_size


def stage_pools(size_gb: int, choice: KvChoice, page_size: int, rules: Rules) -> List[RankPools]:
    """The host pools of one rank of each stage of choice for --hicache-size size_gb
    (SGLang's HostKVCache token count, page alignment and allocators; docs/sizing.md, "Rules by release")."""
    if size_gb <= 0:
        return [NO_POOLS for _stage in choice.stages]
    size_bytes = size_gb * GB_BYTES

    def per_token(stage: Stage) -> int:
        if rules.dsa_indexer == "inside":
            return stage.kv_bytes_per_token + stage.index_bytes_per_token_per_layer * (stage.layers or 0)
        return stage.kv_bytes_per_token

    raw = [size_bytes // per_token(stage) for stage in choice.stages]
    if rules.pp_min_tokens:
        raw = [min(raw)] * len(raw)  # sync_fixed_hicache_size: MIN across the PP group
    pools: List[RankPools] = []
    for stage, stage_raw in zip(choice.stages, raw):
        tokens = _page_align(stage_raw, page_size, rules)
        kv_bytes = tokens * stage.kv_bytes_per_token
        charged = charge_buffer(kv_bytes, rules)
        index_bytes = 0
        index_requested = 0
        if rules.dsa_indexer != "none" and stage.index_bytes_per_token_per_layer and stage.layers:
            index_pages = (tokens + page_size + 1) // page_size
            per_layer = index_pages * page_size * stage.index_bytes_per_token_per_layer
            index_bytes = per_layer * stage.layers
            if rules.dsa_indexer == "inside":
                charged += stage.layers * charge_buffer(per_layer, rules)  # one buffer per layer
            else:
                charged += charge_buffer(index_bytes, rules)
                index_requested = tokens * stage.index_bytes_per_token_per_layer * stage.layers
        draft_bytes = 0
        if choice.draft_kv_bytes_per_token:
            draft_tokens = tokens
            if choice.smaller_stages_unknown and not rules.pp_min_tokens:
                # The draft pool follows the stage's token count; an unknown stage of get_pp_indices' even split
                # holds at least half the largest stage's layers, so at most twice its tokens.
                draft_tokens = max(tokens, size_bytes // max(1, stage.kv_bytes_per_token // 2))
            draft_bytes = (draft_tokens + DRAFT_SLACK_PAGES * page_size) * choice.draft_kv_bytes_per_token
        if choice.smaller_stages_unknown and not rules.pp_min_tokens:
            # Each stage rounds its own count (up to 0.5.14) and the smaller stages are unknown: a
            # stage of b <= kv bytes per token pins at most size + page x b (aligned up) or size.
            bound = size_bytes + (page_size * stage.kv_bytes_per_token if rules.pages_align_up else 0)
            charged = max(charged, charge_buffer(bound, rules))
        pools.append(
            RankPools(
                tokens=tokens,
                min_tokens=tokens,
                kv_bytes=kv_bytes,
                index_bytes=index_bytes,
                requested_bytes=tokens * per_token(stage),
                index_requested_bytes=index_requested,
                charged_bytes=charged + charge_buffer(draft_bytes, rules),
                draft_bytes=draft_bytes,
                draft_requested_bytes=tokens * choice.draft_kv_bytes_per_token,
            )
        )
    return pools


def dearest(pools: List[RankPools]) -> RankPools:
    """The stage whose rank takes the most host memory (on a tie, the larger KV pool)."""
    return max(pools, key=lambda p: (p.charged_bytes, p.kv_bytes))


def rank_pools(size_gb: int, choice: KvChoice, page_size: int, rules: Rules) -> RankPools:
    """The most expensive rank's pools (its min_tokens: the fewest tokens of any stage)."""
    pools = stage_pools(size_gb, choice, page_size, rules)
    worst = dearest(pools)
    return RankPools(
        tokens=worst.tokens,
        min_tokens=min(p.tokens for p in pools),
        kv_bytes=worst.kv_bytes,
        index_bytes=worst.index_bytes,
        requested_bytes=worst.requested_bytes,
        index_requested_bytes=worst.index_requested_bytes,
        charged_bytes=worst.charged_bytes,
        draft_bytes=worst.draft_bytes,
        draft_requested_bytes=worst.draft_requested_bytes,
    )


def _single_stage(kv_bytes_per_token: int) -> KvChoice:
    return KvChoice((Stage(kv_bytes_per_token, None),), False, "")


def host_tokens(size_gb: int, kv_bytes_per_token: int, page_size: int, version: Any) -> int:
    """Tokens one rank's host pool holds for --hicache-size size_gb (one stage, no indexer)."""
    return rank_pools(size_gb, _single_stage(kv_bytes_per_token), page_size, rules_of(version)).tokens


def pinned_bytes_per_rank(size_gb: int, kv_bytes_per_token: int, page_size: int, version: Any) -> int:
    """Host bytes one rank commits for --hicache-size size_gb (one stage, no indexer)."""
    return rank_pools(size_gb, _single_stage(kv_bytes_per_token), page_size, rules_of(version)).charged_bytes
