# -*- coding: utf-8 -*-
# Copyright: inferops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A plan told in words and drawn (pure Python, no Ansible imports): the arithmetic behind each figure of a
:class:`Sizing` (``explain``) and a bar of the host's memory (``picture``).  Every figure shown is one the
model computed; nothing here decides anything.
"""

from __future__ import annotations

from typing import List, Tuple

from ansible_collections.inferops.gpu_inference.plugins.module_utils.sizing.hicache_model import PAGE_TABLE_SHARE, Budget, HostPinned, Sizing
from ansible_collections.inferops.gpu_inference.plugins.module_utils.sizing.hicache_pools import placement_text
from ansible_collections.inferops.gpu_inference.plugins.module_utils.sizing.hicache_releases import SGLANG_RESERVE_BYTES
from ansible_collections.inferops.gpu_inference.plugins.module_utils.sizing.sizing_values import fmt_both, fmt_gb, fmt_gib


def _up_to(sizing: Sizing, load: HostPinned) -> str:
    """'up to ' where the ranks' pools differ (PP stages of different sizes), so ranks x the dearest is a bound."""
    return "up to " if load.total_bytes != sizing.ranks * load.rank.charged_bytes else ""


def explain(sizing: Sizing) -> List[str]:
    """The plan's arithmetic, one line a step: ranks, budget, KV size, the verdict and what to do."""
    lines = _budget_lines(sizing)
    if sizing.inp.requested_gb is not None:
        lines += _requested_lines(sizing)
    if sizing.fits:
        lines.append(_plan_line(sizing))
    if not sizing.fits and sizing.inp.requested_gb is None:
        lines.append(_nothing_fits_line(sizing))
    return lines


def _budget_lines(sizing: Sizing) -> List[str]:
    inp, budget, rules, pools = sizing.inp, sizing.budget, sizing.shown.rules, sizing.pools
    pol = inp.policy
    release_names = [str(r) for r in inp.releases]
    lines = [
        "SGLang %s%s: --hicache-size is decimal GB (1e9 bytes) PER RANK; each of the %d scheduler ranks on this host "
        "pins its own pool via %s."
        % (
            inp.version,
            (" (behaviour of %s)" % " or ".join(release_names)) if release_names != [str(inp.version)] else "",
            sizing.ranks,
            rules.allocation,
        ),
        "Ranks on this host: %s%s."
        % (
            placement_text(inp.placement, inp.tp_size, inp.dp_size, inp.enable_dp_attention),
            (" + %d of other engines = %d" % (pol["other_engine_ranks"], sizing.ranks)) if pol["other_engine_ranks"] else "",
        ),
        "Memory basis: min(MemAvailable %s, container limit %s) = %s."
        % (
            fmt_both(inp.mem_available_bytes),
            fmt_both(inp.mem_limit_bytes) if inp.mem_limit_bytes is not None else "none",
            fmt_both(budget.basis_bytes),
        ),
        reserve_text(budget),
        "  - process overhead: %d ranks x %s + front-end %s = %s"
        % (sizing.ranks, fmt_gib(pol["rank_overhead_bytes"]), fmt_gib(pol["frontend_overhead_bytes"]), fmt_gb(budget.processes_bytes)),
    ]
    if budget.other_committed_bytes:
        lines.append("  - committed to other engines/services: %s" % fmt_gb(budget.other_committed_bytes))
    lines.append("  = budget for host KV pools: %s, %s per rank." % (fmt_gb(budget.budget_bytes), fmt_gb(budget.per_rank_budget_bytes)))
    lines.append(headroom_text(sizing))
    if sizing.own_cap_gb is not None:
        lines.append(
            "SGLang's own check caps the size at %d: from 0.5.19 each rank's pool must fit an equal share of MemAvailable "
            "less 10 GiB after the processes loaded (%s / %d ranks), and the dearest rank's pool (its PP stage holds the "
            "most layers) passes that share before the budget is spent."
            % (sizing.own_cap_gb, fmt_gb(budget.basis_bytes - budget.overhead_bytes - SGLANG_RESERVE_BYTES),
               max(inp.tp_size * inp.pp_size // inp.nnodes, 1))
        )
    if inp.attn_dp_size > 1:
        lines.append(
            "Attention DP: --attn-dp-size %d splits the %d TP ranks into %d attention groups (SGLang 0.5.22+, "
            "arg_groups/parallel_hook.py); it starts no extra processes." % (inp.attn_dp_size, inp.tp_size, inp.attn_dp_size)
        )
    if pools.draft_bytes:
        lines.append(
            "Speculative draft: SGLang gives the draft model a host pool of the target pool's token count outside "
            "--hicache-size (hybrid_pool_assembler.build_full_draft_pools): %s per rank at %d bytes per token, priced in."
            % (fmt_gb(pools.draft_bytes), inp.draft_kv_bytes_per_token)
        )
    lines.append("KV per token per rank: %d bytes (%s)." % (sizing.shown.choice.largest.kv_bytes_per_token, inp.kv_source))
    if inp.dsa and rules.dsa_indexer == "outside":
        lines.append(
            "DSA indexer: SGLang %s allocates a second pool of the KV pool's token count outside --hicache-size "
            "(pool_host/dsa.py): %s per rank at --hicache-size %d, priced in." % (rules, fmt_gb(pools.index_bytes), max(sizing.chosen_gb, 0))
        )
    elif inp.dsa and rules.dsa_indexer == "inside":
        lines.append(
            "DSA indexer: SGLang %s counts the indexer keys inside --hicache-size (NSATokenToKVPoolHost, one buffer per layer)." % rules
        )
    if inp.pp_size > 1 and not rules.pp_min_tokens:
        lines.append(
            "PP: SGLang %s rounds each stage's token count up to a page on its own (no sync before 0.5.15); the most "
            "expensive stage is priced." % rules
        )
    return lines


def reserve_text(budget: Budget) -> str:
    """The OS reserve's arithmetic: SGLang's own 10 GiB, what the host measurably needs, the fraction rule if set."""
    r = budget.reserve
    if r is None:  # a Budget built without its parts (never by budget_of)
        return "  - OS reserve: %s" % fmt_gb(budget.reserve_bytes)
    if r.idle_source == "given":
        idle = "idle use %s (idle_used_bytes)" % fmt_gib(r.idle_used_bytes)
    elif r.idle_source == "outside":
        idle = ("idle use 0 B (these are a node's facts with the container's limit: the container's own idle use is "
                "not in them; the plan in the container reads it)")
    elif r.idle_used_bytes:
        idle = "idle use %s (MemTotal - MemAvailable of the facts, with no SGLang running)" % fmt_gib(r.idle_used_bytes)
    else:
        idle = ("idle use 0 B (the facts show nothing in use: MemAvailable equals MemTotal, as offline where no host is "
                "read; give mem_available_bytes or idle_used_bytes from the host at idle)")
    terms = ["SGLang's own %s" % fmt_gib(r.sglang_bytes),
             "%s + margin %s + page tables of the pools %s (1/%d of the basis) = %s"
             % (idle, fmt_gib(r.margin_bytes), fmt_gib(r.page_tables_bytes), PAGE_TABLE_SHARE, fmt_gib(r.node_bytes))]
    if r.fraction:
        terms.append("%s%% of %s RAM (os_reserve_fraction) = %s" % (_percent(r.fraction), fmt_gib(budget.ram_bytes), fmt_gib(r.fraction_bytes)))
    return "  - OS reserve: max(%s) = %s" % ("; ".join(terms), fmt_gb(budget.reserve_bytes))


def _percent(fraction: float) -> str:
    text = "%.2f" % (fraction * 100)
    return text.rstrip("0").rstrip(".")


def headroom_text(sizing: Sizing) -> str:
    """How much the policy keeps back from the pools, and why (docs/sizing.md, "Policy defaults and why")."""
    budget, pol = sizing.budget, sizing.inp.policy
    kept = budget.reserve_bytes + budget.overhead_bytes
    if kept > budget.ram_bytes:
        # A share above 100% reads as a typo of the tool's; say plainly that the headroom alone overflows the RAM.
        share = "more than all %s of RAM" % fmt_gib(budget.ram_bytes)
    else:
        share = "%d%% of %s RAM" % (round(100 * kept / budget.ram_bytes) if budget.ram_bytes else 0, fmt_gib(budget.ram_bytes))
    return (
        "Headroom the policy keeps: %s (%s) for the OS reserve and %d ranks' and the front-end's processes; "
        "the per-rank %s and front-end %s are this collection's budget, not a measured SGLang figure (none is published): "
        "the deploy's verify measures what the running processes use and offers it for the next plan (never applied)."
        % (
            fmt_gb(kept),
            share,
            sizing.ranks,
            fmt_gib(pol["rank_overhead_bytes"]),
            fmt_gib(pol["frontend_overhead_bytes"]),
        )
    )


def _requested_lines(sizing: Sizing) -> List[str]:
    """The verdict on a requested size, SGLang's own check of it, and the largest safe value."""
    inp, budget, load = sizing.inp, sizing.budget, sizing.load
    chosen, headroom = sizing.chosen_gb, sizing.headroom_bytes
    lines = [
        "Requested --hicache-size %d: %d ranks x %s%s%s = %s pinned vs budget %s: %s%s."
        % (
            chosen,
            sizing.ranks,
            _up_to(sizing, load),
            fmt_gb(load.rank.charged_bytes),
            (" (%d GB rounded up to a power of two)" % chosen) if sizing.shown.rules.pins_power_of_two else "",
            fmt_gb(load.total_bytes),
            fmt_gb(budget.budget_bytes),
            "fits" if sizing.fits else "DOES NOT FIT",
            (" (short by %s)" % fmt_gb(-headroom)) if headroom < 0 else (" (headroom %s)" % fmt_gb(headroom)),
        )
    ]
    if not sizing.fits_device:
        lines.append(
            "SGLang %s asserts host tokens > device tokens at start-up: %d host tokens per rank <= %d device tokens per rank."
            % (" / ".join(str(c.rules) for c in sizing.device_cases), sizing.device_min_tokens(), inp.device_pool_tokens_per_rank)
        )
    for check in sizing.guards:
        if not sizing.fits and check.passes:
            consequence = (
                "the host would run out of memory instead of refusing"
                if sizing.required_available_bytes > budget.basis_bytes
                else "it would start, leaving less than the reserves above for the OS and the processes"
            )
            lines.append("SGLang %s's own check (%s) lets every rank through: %s." % (check.rules, check.text, consequence))
        elif not check.passes:
            lines.append("SGLang %s's own check (%s) would refuse it at start-up." % (check.rules, check.text))
        else:
            lines.append("SGLang %s's own check (%s) lets it through." % (check.rules, check.text))
    if sizing.best is not None:
        best = sizing.best
        lines.append(
            "Largest safe value: --hicache-size %d (%d x %s%s = %s pinned)."
            % (sizing.max_gb, sizing.ranks, _up_to(sizing, best), fmt_gb(best.rank.charged_bytes), fmt_gb(best.total_bytes))
        )
    return lines


def _plan_line(sizing: Sizing) -> str:
    chosen, load, pools = sizing.chosen_gb, sizing.load, sizing.pools
    if sizing.shown.rules.pins_power_of_two:
        detail = " (each %d GB pool rounded up to a power of two, 2^%d bytes)" % (chosen, pools.charged_bytes.bit_length() - 1)
    elif pools.index_bytes:
        detail = " (%s KV + %s indexer each)" % (fmt_gb(pools.kv_bytes), fmt_gb(pools.index_bytes))
    else:
        detail = ""
    return "Plan: --hicache-size %d per rank -> %d ranks x %s%s = %s pinned%s, headroom %s; %d tokens per rank." % (
        chosen,
        sizing.ranks,
        _up_to(sizing, load),
        fmt_gb(pools.charged_bytes),
        fmt_gb(load.total_bytes),
        detail,
        fmt_gb(sizing.headroom_bytes),
        pools.tokens,
    )


def _nothing_fits_line(sizing: Sizing) -> str:
    inp = sizing.inp
    if sizing.max_gb < 1:
        return (
            "Nothing fits: %s per rank is less than the smallest pool (1 GB%s). Free memory, raise the container limit, "
            "or lower the reserve/overhead policy if you have measured it."
            % (fmt_gb(sizing.budget.per_rank_budget_bytes), ", pinned as a power of two" if any(r.pins_power_of_two for r in inp.releases) else "")
        )
    return (
        "Nothing fits: SGLang %s needs more host tokens than the %d device tokens per rank (at least --hicache-size %d) "
        "but the budget allows at most %d. Upgrade to 0.5.15+ (a warning only) or give the pools more memory."
        % (inp.version, inp.device_pool_tokens_per_rank or 0, sizing.min_gb, sizing.max_gb)
    )


def picture(sizing: Sizing) -> List[str]:
    """The host's memory as a bar: reserve, processes, the pools and what is left, against the basis."""
    budget, load = sizing.budget, sizing.load
    pinned = max(load.total_bytes, 0)
    demand = budget.required_available_bytes(pinned)
    free_after = max(budget.basis_bytes - demand, 0)
    mark = "P" if sizing.fits else "!"
    return [
        "Host memory basis %s%s" % (fmt_both(budget.basis_bytes), "" if demand <= budget.basis_bytes else "; demand %s overflows it" % fmt_gb(demand)),
        stacked_bar(
            [("#", budget.reserve_bytes), ("o", budget.overhead_bytes), (mark, load.total_bytes), (".", free_after)],
            max(budget.basis_bytes, demand),
            budget.basis_bytes,
        ),
        " # OS reserve        %10s" % fmt_gb(budget.reserve_bytes),
        " o processes         %10s" % fmt_gb(budget.overhead_bytes),
        " %s KV pools          %10s  (%d ranks x %s%s%s)"
        % (mark, fmt_gb(load.total_bytes), sizing.ranks, _up_to(sizing, load), fmt_gb(load.rank.charged_bytes), "" if sizing.fits else ", does not fit"),
        " . left              %10s" % fmt_gb(free_after),
    ]


def stacked_bar(segments: List[Tuple[str, int]], scale_bytes: int, limit_bytes: int, width: int = 64) -> str:
    """A stacked text bar of the segments; a '|' marks where the memory basis ends if demand overflows it."""
    cells = ""
    for char, value in segments:
        n = (width * value * 2 + scale_bytes) // (2 * scale_bytes) if scale_bytes else 0
        if value > 0 and n == 0:
            n = 1
        cells += char * n
    if limit_bytes < scale_bytes:
        cut = (width * limit_bytes * 2 + scale_bytes) // (2 * scale_bytes)
        cells = cells[:cut] + "|" + cells[cut:]
    return "[" + cells + "]"
