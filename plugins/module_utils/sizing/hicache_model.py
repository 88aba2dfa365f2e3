# -*- coding: utf-8 -*-
# Copyright: inferops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The sizing model: from a checked :class:`PlanInput` to every figure of one host's plan (pure Python,
no Ansible imports).

:func:`size_host` takes the memory budget (:class:`Budget`), prices the pools of the most loaded host
for every release and KV layout the input may have (:class:`Case`, :class:`HostLoad`), finds the
largest per-rank size that fits (:func:`largest_fitting_size_gb`), checks SGLang <= 0.5.14's
host-larger-than-device assertion and SGLang's own start-up check (:func:`sglang_guard`), and returns
a :class:`Sizing`.  Each figure the plan returns (and the deploy launches, guards and verifies with)
is computed here once; docs/sizing.md has the arithmetic.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Tuple

from ansible_collections.inferops.gpu_inference.plugins.module_utils.sizing.hicache_input import PlanInput
from ansible_collections.inferops.gpu_inference.plugins.module_utils.sizing.hicache_pools import (
    NO_POOLS,
    KvChoice,
    Placement,
    RankPools,
    dearest,
    placement_text,
    rank_pools,
    stage_pools,
)
from ansible_collections.inferops.gpu_inference.plugins.module_utils.sizing.hicache_releases import SGLANG_RESERVE_BYTES, Rules, distinct_guards
from ansible_collections.inferops.gpu_inference.plugins.module_utils.sizing.sizing_values import GB_BYTES, MIB_BYTES, PlanError, fmt_gb


@dataclass(frozen=True)
class Case:
    """One release x one KV choice: the plan must hold for every case of the input."""

    rules: Rules
    choice: KvChoice

    def pools(self, size_gb: int, page_size: int) -> RankPools:
        return rank_pools(size_gb, self.choice, page_size, self.rules)


@dataclass(frozen=True)
class HostPinned:
    """The pools on the most loaded host for one size: this engine's ranks, other engines' ranks, and
    the dearest rank's pools."""

    engine_bytes: int
    other_bytes: int
    rank: RankPools

    @property
    def total_bytes(self) -> int:
        return self.engine_bytes + self.other_bytes


NOTHING_PINNED = HostPinned(0, 0, NO_POOLS)


@dataclass(frozen=True)
class HostLoad:
    """What the most loaded host holds: per node, how many ranks of each stage (the launcher's PP
    ranges), times the TP ranks and DP replicas of each, plus other engines' ranks."""

    compositions: Tuple[Tuple[int, ...], ...]
    ranks_per_stage_rank: int
    other_ranks: int

    def pinned(self, case: Case, size_gb: int, page_size: int) -> HostPinned:
        """The host memory the pools take at --hicache-size size_gb: the one place a total is summed."""
        pools = stage_pools(size_gb, case.choice, page_size, case.rules)
        engine = self.ranks_per_stage_rank * max(sum(n * p.charged_bytes for n, p in zip(comp, pools)) for comp in self.compositions)
        worst = dearest(pools)
        return HostPinned(engine, self.other_ranks * worst.charged_bytes, worst)


def host_load(placement: Placement, pp_size: int, nnodes: int, choice: KvChoice, other_ranks: int) -> HostLoad:
    a, b = placement.pp_per_node, placement.nnodes_per_pp_rank
    compositions = set()
    for node in range(nnodes):
        counts = [0] * len(choice.stages)
        for pp_rank in range(a * (node // b), min(a * (node // b + 1), pp_size)):
            counts[choice.stage_of_rank[pp_rank]] += 1
        compositions.add(tuple(counts))
    return HostLoad(tuple(sorted(compositions)), placement.tp_per_node * placement.replicas, other_ranks)


#: Page tables of the pinned pools: x86-64 maps each 4 KiB page with one 8-byte entry, kernel memory that no
#: process's RSS shows and that grows with what is pinned: 1/512 of it, priced as 1/512 of the basis (the most that
#: can be pinned). Hugepage-backed pools (SGLANG_HUGEPAGE_SIZE) need less.
PAGE_TABLE_SHARE = 512


@dataclass(frozen=True)
class Reserve:
    """The OS reserve and its parts (docs/sizing.md, "The OS reserve")."""

    sglang_bytes: int  # os_reserve_min_bytes: SGLang's own 10 GiB (HICACHE_HOST_MEMORY_RESERVE_BYTES) or more
    idle_used_bytes: int  # what the host uses idle: given, or MemTotal - MemAvailable of the facts
    idle_source: str  # "given", "facts" (MemTotal - MemAvailable), "outside" (a node's facts, a container's limit)
    margin_bytes: int  # os_reserve_margin_bytes
    page_tables_bytes: int  # basis / PAGE_TABLE_SHARE
    fraction: float  # os_reserve_fraction (0: off)
    fraction_bytes: int  # os_reserve_fraction x RAM

    @property
    def node_bytes(self) -> int:
        """What the host measurably needs kept free: its idle use again, the margin and the pools' page tables."""
        return self.idle_used_bytes + self.margin_bytes + self.page_tables_bytes

    @property
    def bytes(self) -> int:
        return max(self.sglang_bytes, self.node_bytes, self.fraction_bytes)


@dataclass(frozen=True)
class Budget:
    """The host's memory and what the pools may take of it (docs/sizing.md, "The arithmetic")."""

    basis_bytes: int  # min(MemAvailable, container limit)
    ram_bytes: int  # min(MemTotal, container limit)
    reserve_bytes: int  # Reserve.bytes
    processes_bytes: int  # (ranks + other engines' ranks) x rank overhead + front-end
    other_committed_bytes: int
    ranks: int
    reserve: Optional[Reserve] = None

    @property
    def overhead_bytes(self) -> int:
        """Everything but the reserve and the pools: the processes and what is committed elsewhere."""
        return self.processes_bytes + self.other_committed_bytes

    @property
    def budget_bytes(self) -> int:
        return self.basis_bytes - self.reserve_bytes - self.overhead_bytes

    @property
    def per_rank_budget_bytes(self) -> int:
        return max(self.budget_bytes, 0) // self.ranks

    def required_available_bytes(self, pinned_bytes: int) -> int:
        """MemAvailable (within the container limit) that pools of pinned_bytes need: the plan fits iff the
        basis holds this much."""
        return self.reserve_bytes + self.overhead_bytes + pinned_bytes


def reserve_of(inp: PlanInput, basis_bytes: int, ram_bytes: int) -> Reserve:
    """The OS reserve: the largest of SGLang's own 10 GiB, what the host measurably needs (its idle use, counted
    again as room for the page cache it runs from and its growth, plus a margin and the pools' page tables), and the
    fraction of RAM when os_reserve_fraction is set."""
    pol = inp.policy
    if inp.idle_used_bytes is not None:
        idle, source = inp.idle_used_bytes, "given"
    elif inp.mem_limit_bytes is None or inp.mem_limit_bytes >= inp.mem_total_bytes:
        # The facts are the host's own view (or the container's own, lxcfs's): what they show in use is its idle use.
        idle, source = max(inp.mem_total_bytes - inp.mem_available_bytes, 0), "facts"
    else:
        # A node's facts with a container's limit below its RAM (the deploy's node gate, before the container runs):
        # the container's own use is not in them; the launch in the container reads it.
        idle, source = 0, "outside"
    return Reserve(
        sglang_bytes=pol["os_reserve_min_bytes"],
        idle_used_bytes=int(idle),
        idle_source=source,
        margin_bytes=pol["os_reserve_margin_bytes"],
        page_tables_bytes=basis_bytes // PAGE_TABLE_SHARE,
        fraction=pol["os_reserve_fraction"],
        fraction_bytes=int(pol["os_reserve_fraction"] * ram_bytes),
    )


def budget_of(inp: PlanInput, ranks: int) -> Budget:
    pol = inp.policy
    limit = inp.mem_limit_bytes
    basis = inp.mem_available_bytes if limit is None else min(inp.mem_available_bytes, limit)
    ram = inp.mem_total_bytes if limit is None else min(inp.mem_total_bytes, limit)
    reserve = reserve_of(inp, basis, ram)
    return Budget(
        basis_bytes=basis,
        ram_bytes=ram,
        reserve_bytes=reserve.bytes,
        processes_bytes=ranks * pol["rank_overhead_bytes"] + pol["frontend_overhead_bytes"],
        other_committed_bytes=pol["other_committed_bytes"],
        ranks=ranks,
        reserve=reserve,
    )


def largest_fitting_size_gb(budget_bytes: int, case: Case, host: HostLoad, page: int) -> int:
    """The largest H whose pools on the most loaded host fit budget_bytes (they grow with H)."""
    if budget_bytes <= 0 or host.pinned(case, 1, page).total_bytes > budget_bytes:
        return 0
    low, high = 1, max(2, budget_bytes // GB_BYTES + 1)
    while host.pinned(case, high, page).total_bytes <= budget_bytes:
        low, high = high, high * 2
    while high - low > 1:
        middle = (low + high) // 2
        if host.pinned(case, middle, page).total_bytes <= budget_bytes:
            low = middle
        else:
            high = middle
    return low


def smallest_size_above_device(case: Case, page: int, device_tokens: int, ceiling_gb: int) -> Optional[int]:
    """The smallest H up to ceiling_gb whose every stage holds more tokens than the device pool."""
    if case.pools(ceiling_gb, page).min_tokens <= device_tokens:
        return None
    low, high = 0, ceiling_gb  # pools(low) fails (or low == 0), pools(high) passes
    while high - low > 1:
        middle = (low + high) // 2
        if case.pools(middle, page).min_tokens > device_tokens:
            high = middle
        else:
            low = middle
    return high


def own_check_cap_gb(case: Case, inp: PlanInput, budget: Budget, page: int, ceiling_gb: int) -> Optional[int]:
    """The largest H up to ceiling_gb that SGLang's own check (0.5.19+: an equal share of MemAvailable - 10 GiB per
    rank) accepts for every rank, with MemAvailable after the processes loaded (the basis less the overheads the plan
    budgets); None for the releases that check each rank against the whole host (up to 0.5.18)."""
    if case.rules.guard_divisor == "none" or ceiling_gb < 1:
        return None
    share = (budget.basis_bytes - budget.overhead_bytes - SGLANG_RESERVE_BYTES) // max(inp.tp_size * inp.pp_size // inp.nnodes, 1)

    def accepted(size_gb: int) -> bool:
        return all(max(p.requested_bytes, p.index_requested_bytes, p.draft_requested_bytes) <= share
                   for p in stage_pools(size_gb, case.choice, page, case.rules))

    if accepted(ceiling_gb):
        return ceiling_gb
    low, high = 0, ceiling_gb  # accepted(low) or low == 0; not accepted(high)
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if accepted(middle) else (low, middle)
    return low


@dataclass(frozen=True)
class GuardCheck:
    """SGLang's own start-up check of one size under one release."""

    rules: Rules
    passes: bool  # on a quiet host
    late_passes: bool  # for the last rank to start (sglang#38156)
    text: str  # the check's arithmetic


def sglang_guard(pools: RankPools, inp: PlanInput, rules: Rules) -> GuardCheck:
    """SGLang's own start-up check of an explicit size under one release.  Exact per release (docs/sizing.md)."""
    placement = inp.placement
    available = inp.mem_available_bytes
    basis_text = "MemAvailable"
    if rules.guard_reads_cgroup and inp.mem_limit_bytes is not None:
        available = min(available, inp.mem_limit_bytes)
        basis_text = (
            "min(MemAvailable, cgroup limit - usage)"
            if rules.release <= (0, 5, 21)
            else "min(MemAvailable, cgroup limit - (usage - file cache))"
        )
    if rules.release >= (0, 5, 22):
        # host_memory._cgroup_memory_headroom walks up only to the cgroup mount's root (a container's
        # namespace root); a limit set above it is not seen, and an explicit size falls back to MemAvailable.
        basis_text += (
            " (SGLang's cgroup walk stops at the cgroup mount's root, a container's namespace root: a limit set above "
            "it is not seen, and MemAvailable, lxcfs's inside an LXC container, bounds)"
        )
    free = available - SGLANG_RESERVE_BYTES
    requested = pools.requested_bytes
    if rules.guard_divisor == "none":
        divisor = 1
        limit = free
        text = "each rank alone: %s of the %s pool%s against %s - 10 GiB = %s" % (
            fmt_gb(requested),
            "requested" if rules.pins_power_of_two else "KV",
            " (before the power-of-two rounding)" if rules.pins_power_of_two else "",
            basis_text,
            fmt_gb(limit),
        )
    else:
        divisor = max(inp.tp_size * inp.pp_size // inp.nnodes, 1)
        limit = free // divisor
        text = "(%s - 10 GiB) / %d ranks (%s) = %s per rank" % (basis_text, divisor, rules.guard_divisor, fmt_gb(limit))
        if rules.dsa_indexer == "outside" and pools.index_requested_bytes:
            text += "; the indexer pool (%s) is checked the same way, on its own" % fmt_gb(pools.index_requested_bytes)
    if pools.draft_requested_bytes:
        text += "; the draft pool (%s) is checked the same way, on its own" % fmt_gb(pools.draft_requested_bytes)
    passes = requested <= limit and pools.index_requested_bytes <= limit and pools.draft_requested_bytes <= limit
    # A rank that starts after its peers pinned their pools sees them gone from MemAvailable
    # but still divides by all ranks (sglang#38156): the worst case is the last of them.
    peers = divisor - 1 if rules.guard_divisor != "none" else placement.ranks_per_node - 1
    late_limit = (free - peers * pools.charged_bytes) // divisor
    late_passes = requested <= late_limit and pools.index_requested_bytes <= late_limit and pools.draft_requested_bytes <= late_limit
    if rules.guard_divisor != "none" and divisor != placement.ranks_per_node:
        why = []
        if placement.replicas > 1:
            why.append("the %d DP replicas without DP attention are not counted" % placement.replicas)
        if placement.tp_per_node * placement.pp_per_node != divisor:
            why.append("the launcher places %d ranks per node, not tp x pp / nnodes" % (placement.tp_per_node * placement.pp_per_node))
        text += ", although %d ranks run on this host (%s)" % (placement.ranks_per_node, "; ".join(why))
    return GuardCheck(rules, passes, late_passes, text)


@dataclass(frozen=True)
class Sizing:
    """Every figure of one host's plan."""

    inp: PlanInput
    warnings: List[str]
    engine_ranks: int  # this engine's ranks on the most loaded host
    ranks: int  # with other engines' ranks
    budget: Budget
    cases: List[Case]
    max_gb: int  # the largest size that fits the budget in every case
    min_gb: int  # the smallest size SGLang <= 0.5.14 starts with (host tokens > device tokens)
    device_cases: List[Case]  # the cases whose release asserts host tokens > device tokens
    chosen_gb: int  # the requested size, or max_gb
    fits_budget: bool
    fits_device: bool
    shown: Case  # the case that pins the most at chosen_gb
    load: HostPinned  # the pools at chosen_gb, in the shown case
    best: Optional[HostPinned]  # the dearest case's pools at max_gb (when max_gb >= min_gb)
    guards: List[GuardCheck]  # SGLang's own check of a requested size, one per distinct behaviour
    own_cap_gb: Optional[int] = None  # the largest size SGLang 0.5.19+'s own check accepts, where it binds

    @property
    def fits(self) -> bool:
        return self.fits_budget and self.fits_device

    @property
    def pools(self) -> RankPools:
        return self.load.rank

    @property
    def headroom_bytes(self) -> int:
        return self.budget.budget_bytes - self.load.total_bytes

    @property
    def required_available_bytes(self) -> int:
        return self.budget.required_available_bytes(self.load.total_bytes)

    @property
    def ceiling_bytes(self) -> int:
        """The most this engine's processes should hold: its pools and the overhead the plan budgets."""
        return self.load.engine_bytes + self.budget.overhead_bytes

    def device_min_tokens(self) -> int:
        """The fewest host tokens per rank, at chosen_gb, of the releases that assert host > device."""
        page = self.inp.policy["page_size"]
        return min(case.pools(self.chosen_gb, page).min_tokens for case in self.device_cases)


def size_host(inp: PlanInput) -> Sizing:
    """The plan of the most loaded host for a checked input. Raises PlanError when the host has too few GPUs."""
    pol = inp.policy
    page = pol["page_size"]
    warnings = list(inp.warnings)
    engine_ranks = inp.placement.ranks_per_node
    if engine_ranks > inp.gpu_count:
        raise PlanError(
            "this layout puts %d GPU ranks on each host (%s) but the host has %d GPUs; lower tp/pp/dp, raise nnodes, "
            "or pass more GPUs to the container"
            % (engine_ranks, placement_text(inp.placement, inp.tp_size, inp.dp_size, inp.enable_dp_attention), inp.gpu_count)
        )
    ranks = engine_ranks + pol["other_engine_ranks"]
    budget = budget_of(inp, ranks)

    cases = [Case(rules, choice) for rules in inp.releases for choice in inp.kv_choices]
    hosts = {id(choice): host_load(inp.placement, inp.pp_size, inp.nnodes, choice, pol["other_engine_ranks"]) for choice in inp.kv_choices}

    def on_host(case: Case, size: int) -> HostPinned:
        return hosts[id(case.choice)].pinned(case, size, page)

    max_by_case = [largest_fitting_size_gb(budget.budget_bytes, case, hosts[id(case.choice)], page) for case in cases]
    # SGLang 0.5.19+ refuses a rank whose pool exceeds an equal share of MemAvailable - 10 GiB (after the processes
    # loaded): where the stages' pools differ (PP), the budget alone can let the dearest rank past its share.
    caps = [own_check_cap_gb(case, inp, budget, page, fitting) for case, fitting in zip(cases, max_by_case)]
    budget_max_gb = min(max_by_case)
    max_by_case = [fitting if cap is None else min(fitting, cap) for fitting, cap in zip(max_by_case, caps)]
    max_gb = min(max_by_case)
    device_cases = [case for case in cases if case.rules.asserts_host_exceeds_device]
    chosen = inp.requested_gb if inp.requested_gb is not None else max_gb
    min_gb = _device_minimum_gb(inp, device_cases, max_gb, chosen, warnings)

    fits_budget = 1 <= chosen <= max_gb
    fits_device = not (device_cases and inp.device_pool_tokens_per_rank is not None and chosen >= 1 and chosen < min_gb)

    # The case that costs most at the chosen size is the one the figures show: what may be pinned.
    shown, load = cases[max_by_case.index(max_gb)], NOTHING_PINNED
    if chosen >= 1:
        loads = [on_host(case, chosen) for case in cases]
        index = max(range(len(cases)), key=lambda i: (loads[i].total_bytes, -i))
        shown, load = cases[index], loads[index]
    best = max((on_host(case, max_gb) for case in cases), key=lambda pinned: pinned.total_bytes) if max_gb >= min_gb else None

    guards: List[GuardCheck] = []
    if inp.requested_gb is not None:
        for guard_rules in distinct_guards(inp.releases):
            check = sglang_guard(Case(guard_rules, shown.choice).pools(chosen, page), inp, guard_rules)
            guards.append(check)
            if fits_budget and fits_device and check.passes and not check.late_passes and guard_rules.guard_divisor != "none":
                warnings.append(
                    "SGLang %s's own check can refuse this size when ranks start one after another (it counts pools already "
                    "pinned twice, sglang#38156); a retry may pass" % guard_rules
                )
    return Sizing(
        inp=inp,
        warnings=warnings,
        engine_ranks=engine_ranks,
        ranks=ranks,
        budget=budget,
        cases=cases,
        max_gb=max_gb,
        min_gb=min_gb,
        device_cases=device_cases,
        chosen_gb=chosen,
        fits_budget=fits_budget,
        fits_device=fits_device,
        shown=shown,
        load=load,
        best=best,
        guards=guards,
        own_cap_gb=max_gb if max_gb < budget_max_gb else None,
    )


def _device_minimum_gb(inp: PlanInput, device_cases: List[Case], max_gb: int, chosen_gb: int, warnings: List[str]) -> int:
    """Up to 0.5.14 the host pool must hold more tokens than the device pool, or start-up asserts: the
    smallest size that does (exactly, with device_pool_tokens_per_rank; else 1, with a warning asking for it
    when the GPU memory could hold more tokens than the chosen size gives the host pool)."""
    page = inp.policy["page_size"]
    device_tokens = inp.device_pool_tokens_per_rank
    if device_cases and device_tokens is not None:
        ceiling = max(max_gb, inp.requested_gb or 0, 1)
        needed = [smallest_size_above_device(case, page, device_tokens, ceiling) for case in device_cases]
        return ceiling + 1 if any(n is None for n in needed) else max([1] + [n for n in needed if n is not None])
    if device_cases and chosen_gb >= 1:
        worst = min(case.pools(chosen_gb, page).min_tokens for case in device_cases)
        gpu_tokens_bound = inp.gpu_memory_mib * MIB_BYTES // min(c.choice.largest.kv_bytes_per_token for c in device_cases)
        if worst <= gpu_tokens_bound:
            warnings.append(
                "SGLang %s asserts at start-up that the host pool holds more tokens than the device pool (\"The host "
                "memory should be larger than the device memory with the current protocol\"; memory_pool_host.py): at "
                "--hicache-size %d a rank's host pool holds %d tokens, which do not exceed what %d MiB of GPU memory "
                "could hold, so start-up may fail. Pass device_pool_tokens_per_rank (max_total_num_tokens from "
                "/server_info, or the scheduler's log line) and the plan checks it exactly"
                % (" / ".join(str(c.rules) for c in device_cases[:1]), chosen_gb, worst, inp.gpu_memory_mib)
            )
    return 1
