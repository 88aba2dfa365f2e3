# -*- coding: utf-8 -*-
# Copyright: inferops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
name: hicache_plan
short_description: Plan SGLang's per-rank C(--hicache-size) from host facts, with the arithmetic
version_added: "0.1.0"
author: inferops contributors
description:
  - SGLang's C(--hicache-size) is decimal GB (1e9 bytes) B(per rank); every scheduler process on a host pins its own pool.
    Read as a total, C(--tp-size 8 --hicache-size 300) asks a host for 2.4 TB.
  - This filter places the ranks on each host as SGLang's launcher does (C(tp // max(nnodes // pp, 1)) TP ranks x
    C(max(pp // nnodes, 1)) PP stages per node, times C(dp) without DP attention, plus other engines), refuses the layouts
    SGLang refuses with SGLang's reason, takes the smaller of MemAvailable and the container memory limit, subtracts an
    OS reserve and the processes' overhead, and returns the largest per-rank size whose pools fit on the most loaded host,
    following each SGLang release's allocation (power-of-two pinning up to 0.5.4, exact from 0.5.5), token arithmetic
    (page alignment, per-stage rounding up to 0.5.14), extra pools (the DSA indexer pool from 0.5.19) and start-up checks
    (host pool larger than the device pool up to 0.5.14).
  - A pre-release, dev, post or local build (C(0.5.5rc1), C(0.5.15.dev0), C(0.5.9.post1), C(0.5.9+cu128)) is planned for
    every release whose code it may carry, each rule at its most expensive, with a warning naming them.
  - With O(requested_gb) it checks that size instead and explains, with the arithmetic, why it does or does not fit.
  - A plan that does not fit is returned with RV(_value.fits=false); bad input raises an error that says what was wrong.
    Use P(inferops.gpu_inference.hicache_size#filter) to get the number or an error.
  - Every memory input is in bytes (C(_bytes)), GPU memory in MiB (C(_mib)); a value that is obviously in the wrong
    unit is refused.
options:
  _input:
    description:
      - One flat dict of facts and policy.
      - Required keys C(mem_total_bytes), C(mem_available_bytes) (MemTotal and MemAvailable of the host or container, bytes),
        C(gpu_count), C(gpu_memory_mib) (per GPU), C(sglang_version).
      - Layout keys C(tp_size), C(pp_size), C(dp_size), C(enable_dp_attention), C(nnodes) (defaults 1, 1, 1, false, 1);
        C(attn_dp_size) (SGLang 0.5.22+'s C(--attn-dp-size), the same ranks as C(dp_size) N with C(enable_dp_attention); not
        with C(dp_size) > 1).
      - C(draft_kv_bytes_per_token) a sidecar speculative draft model's (EAGLE3 and similar) KV bytes per token per rank, all
        its layers; SGLang gives it a host pool of the target's token count outside C(--hicache-size), which the plan
        prices. NextN/MTP layers packed into the target pool need nothing here.
      - C(mem_limit_bytes) the container's memory limit (omit or null when none).
      - The KV size per token per rank, either C(kv_bytes_per_token) (not for DSA models), or C(model_preset) (C(kimi-k2),
        C(deepseek-v3), C(deepseek-v3.2), C(glm-5), C(llama-3-70b), C(llama-3-8b)), or geometry C(model_num_layers) with
        C(model_kv_lora_rank) and C(model_qk_rope_head_dim) (MLA; plus C(model_index_head_dim) for DSA) or with
        C(model_num_kv_heads) and C(model_head_dim) (MHA/GQA); optional C(model_num_attention_heads) and C(model_attention)
        (C(mla), C(mha), C(gqa), C(dsa)); C(kv_cache_dtype) (C(auto), C(bf16), C(fp8_e4m3), ...).
      - Every number is range-checked; a value that is implausible for its unit (an overhead of 8 bytes, 69 bytes of KV per
        token, 10**18 bytes of RAM) is refused with the unit it looks like.
      - C(device_pool_tokens_per_rank) (max_total_num_tokens from SGLang's /server_info) checks SGLang <= 0.5.14's
        start-up assertion exactly.
      - C(idle_used_bytes) what the host uses with no SGLang running (MemTotal - MemAvailable at idle); not given, the
        plan reads it from C(mem_total_bytes) - C(mem_available_bytes) (0 for a node's facts with a container limit below
        its RAM). The OS reserve is the largest of C(os_reserve_min_bytes), that idle use again plus
        C(os_reserve_margin_bytes) plus the pools' page tables (1/512 of the basis), and C(os_reserve_fraction) of RAM.
      - Policy overrides C(os_reserve_min_bytes) (10 GiB, SGLang's own reserve; no less), C(os_reserve_margin_bytes)
        (4 GiB), C(os_reserve_fraction) (a fraction of RAM, 0 to 0.9; default 0, off; 0.10 is the rule before the
        reserve came from the node), C(rank_overhead_bytes) (8 GiB), C(frontend_overhead_bytes) (8 GiB),
        C(other_committed_bytes) (0), C(other_engine_ranks) (0), C(page_size) (64).
      - C(requested_gb) a per-rank size to check instead of computing one.
    type: dict
    required: true
  requested_gb:
    description:
      - A per-rank C(--hicache-size) to check; overrides C(requested_gb) in the input. Any other input key may also be
        given as a keyword and overrides the input.
    type: int
seealso:
  - plugin: inferops.gpu_inference.hicache_size
    plugin_type: filter
"""

EXAMPLES = r"""
- name: Plan the incident host (449 GiB, Kimi-K2, TP 8, SGLang 0.5.9)
  ansible.builtin.debug:
    msg: "{{ facts | inferops.gpu_inference.hicache_plan }}"
  vars:
    facts:
      mem_total_bytes: "{{ 449 * 1024 ** 3 }}"
      mem_available_bytes: "{{ 445 * 1024 ** 3 }}"
      gpu_count: 8
      gpu_memory_mib: 97887
      sglang_version: "0.5.9"
      tp_size: 8
      model_preset: kimi-k2
  # => per_rank_gb: 44, ranks_per_host: 8, total_pinned_bytes: 352..., fits: true

- name: Check the size the operator meant as a total
  ansible.builtin.assert:
    that: not (facts | inferops.gpu_inference.hicache_plan(requested_gb=300)).fits
    fail_msg: "{{ (facts | inferops.gpu_inference.hicache_plan(requested_gb=300)).explain | join('\n') }}"
"""

RETURN = r"""
_value:
  description: The plan.
  type: dict
  contains:
    per_rank_gb:
      description: The C(--hicache-size) to pass (decimal GB per rank); 0 when nothing fits or the requested size does not fit.
      type: int
    max_per_rank_gb:
      description: The largest per-rank size that fits the budget.
      type: int
    ranks_per_host:
      description: Ranks pinning a pool on this host (this engine's plus C(other_engine_ranks)).
      type: int
    engine_ranks_per_host:
      description: This engine's scheduler ranks on each host, as SGLang's launcher places them.
      type: int
    placement:
      description: The launcher's placement per node (C(tp_ranks_per_node), C(pp_stages_per_node), C(dp_replicas_per_node),
        C(formula)).
      type: dict
    behaviour_of_releases:
      description: The SGLang releases whose behaviour the plan holds for (one for a final release).
      type: list
      elements: str
    kv_pool_bytes_per_rank:
      description: Bytes of the dearest rank's KV host pool.
      type: int
    indexer_pool_bytes_per_rank:
      description: Bytes of the dearest rank's DSA indexer host pool (0 for other models).
      type: int
    draft_pool_bytes_per_rank:
      description: Bytes of the dearest rank's speculative draft host pool as priced (0 without C(draft_kv_bytes_per_token)).
      type: int
    policy_headroom_bytes:
      description: What the policy keeps back from the pools, the OS reserve plus the processes' overhead and other
        commitments; the explanation says why.
      type: int
    pinned_per_rank_bytes:
      description: Bytes the dearest rank commits for its pools (power-of-two rounded up to 0.5.4; KV and indexer pools).
      type: int
    total_pinned_bytes:
      description: Bytes all ranks on the most loaded host commit (with C(other_engine_ranks)' pools).
      type: int
    engine_pinned_bytes:
      description: Bytes this engine's ranks on the most loaded host commit (RV(_value.total_pinned_bytes) without other
        engines' ranks); what a deploy verifies its ranks pin.
      type: int
    required_available_bytes:
      description: The memory basis (MemAvailable within the container limit) the plan needs, OS reserve + process
        overhead + other commitments + RV(_value.total_pinned_bytes); the plan fits only if the basis holds it, and a
        deploy's start guard waits for it.
      type: int
    ceiling_bytes:
      description: The most this engine's processes should hold, RV(_value.engine_pinned_bytes) + the overhead the plan
        budgets; what a deploy verifies the running server against.
      type: int
    budget_bytes:
      description: Memory basis minus OS reserve, process overhead and other commitments; what the pools may pin.
      type: int
    headroom_bytes:
      description: Budget minus total pinned bytes (negative when it does not fit).
      type: int
    host_tokens_per_rank:
      description: Tokens one rank's host pool holds.
      type: int
    kv_bytes_per_token:
      description: KV bytes per token per rank.
      type: int
    fits:
      description: Whether the chosen or requested size fits.
      type: bool
    explain:
      description: Lines a person reads, with the arithmetic.
      type: list
      elements: str
    picture:
      description: The memory budget drawn as a stacked text bar.
      type: list
      elements: str
    warnings:
      description: Things to look at that do not stop the plan.
      type: list
      elements: str
"""

from collections.abc import Mapping

from ansible.errors import AnsibleFilterError

from ansible_collections.inferops.gpu_inference.plugins.module_utils.sizing.hicache import PlanError, plan


def _merged(facts, overrides):
    if not isinstance(facts, Mapping):
        raise AnsibleFilterError("hicache_plan: the input must be a dict of facts and policy, got %s" % type(facts).__name__)
    data = dict(facts)
    data.update(overrides)
    return data


def hicache_plan(facts, **overrides):
    """Return the HiCache plan for one host."""
    try:
        return plan(_merged(facts, overrides))
    except PlanError as exc:
        raise AnsibleFilterError("hicache_plan: %s" % exc, orig_exc=exc) from exc


class FilterModule(object):
    def filters(self):
        return {"hicache_plan": hicache_plan}
