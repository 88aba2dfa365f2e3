"""Unit tests of the OS reserve taken from the node (docs/sizing.md, "The OS reserve") and of the cap SGLang's own
start-up check puts on a plan (hicache_model.own_check_cap_gb)."""

from __future__ import annotations

import pytest

from ansible_collections.inferops.gpu_inference.plugins.module_utils.sizing import hicache
from ansible_collections.inferops.gpu_inference.plugins.module_utils.sizing import hicache_input as hinput
from ansible_collections.inferops.gpu_inference.plugins.module_utils.sizing import hicache_model as model
from ansible_collections.inferops.gpu_inference.tests.unit.plugins.incident import GB, INCIDENT_FACTS as INCIDENT

GIB = 2**30
# The capacity issue's host: 2 TiB of RAM, MemAvailable 1990 GiB with nothing of SGLang's running.
BIG = {"mem_total_bytes": 2048 * GIB, "mem_available_bytes": 1990 * GIB, "gpu_count": 8, "gpu_memory_mib": 143771,
       "sglang_version": "0.5.23", "tp_size": 8, "model_preset": "kimi-k2"}


def reserve_line(plan):
    return next(line for line in plan["explain"] if line.startswith("  - OS reserve:"))


def test_the_incident_node_keeps_sglangs_own_10_gib_and_gets_48_per_rank():
    # 449 GiB, 445 GiB available (free -g: used 3-4): idle 4 GiB + margin 4 GiB + page tables 0.9 GiB = 8.9 GiB, so
    # SGLang's own 10 GiB is the reserve; the 10 % rule kept 48.2 GB and gave 44.
    plan = hicache.plan(INCIDENT)
    assert plan["reserve_bytes"] == 10 * GIB
    assert plan["per_rank_gb"] == 48 and 8 * 48 * GB < plan["total_pinned_bytes"] < 8 * 48 * GB + 8 * 2**24
    line = reserve_line(plan)
    assert "SGLang's own 10.0 GiB" in line and "idle use 4.00 GiB (MemTotal - MemAvailable of the facts" in line
    assert "margin 4.00 GiB" in line and "page tables of the pools 0.87 GiB (1/512 of the basis)" in line
    assert line.endswith("= 10.7 GB") and "os_reserve_fraction" not in line


def test_the_percentage_rule_stays_reachable():
    plan = hicache.plan(dict(INCIDENT, os_reserve_fraction=0.10))
    assert plan["per_rank_gb"] == 44 and plan["reserve_bytes"] == int(0.10 * INCIDENT["mem_total_bytes"])
    assert "10% of 449.0 GiB RAM (os_reserve_fraction) = 44.9 GiB" in reserve_line(plan)


def test_a_big_host_keeps_what_it_needs_not_a_tenth_of_its_ram():
    # The case: TP 8 x 240 GB on the 2 TiB host. The 10 % rule kept 219.9 GB and offered 229 per rank.
    plan = hicache.plan(dict(BIG, requested_gb=240))
    idle, margin, tables = 58 * GIB, 4 * GIB, 1990 * GIB // 512
    assert plan["fits"] and plan["reserve_bytes"] == idle + margin + tables
    assert "idle use 58.0 GiB" in reserve_line(plan)
    best = hicache.plan(BIG)
    budget = 1990 * GIB - (idle + margin + tables) - (8 * 8 + 8) * GIB
    assert best["per_rank_gb"] == budget // 8 // GB == 248
    assert hicache.plan(dict(BIG, os_reserve_fraction=0.10))["per_rank_gb"] == 229


def test_idle_use_given_overrides_what_the_facts_show():
    plan = hicache.plan(dict(BIG, idle_used_bytes=20 * GIB))
    assert plan["reserve_bytes"] == 20 * GIB + 4 * GIB + 1990 * GIB // 512
    assert "idle use 20.0 GiB (idle_used_bytes)" in reserve_line(plan)
    assert hicache.plan(dict(BIG, os_reserve_margin_bytes=0, idle_used_bytes=0))["reserve_bytes"] == 10 * GIB


@pytest.mark.parametrize("value, words", [
    (3, "looks like a GiB or MiB figure"),
    (2048 * GIB, "idle_used_bytes=2199023255552 bytes is all of the host's RAM"),
    (-1, "idle_used_bytes"),
    ("lots", "idle_used_bytes"),
])
def test_idle_use_in_the_wrong_unit_is_refused(value, words):
    with pytest.raises(hicache.PlanError, match=words):
        hinput.validate(dict(BIG, idle_used_bytes=value))


def test_a_nodes_facts_with_a_container_limit_do_not_count_the_nodes_use_as_the_containers():
    # The node gate: the node's MemTotal/MemAvailable with the container's limit below them.
    plan = hicache.plan(dict(BIG, mem_limit_bytes=400 * GIB))
    assert plan["reserve_bytes"] == 10 * GIB
    assert "the container's own idle use is not in them" in reserve_line(plan)
    # The container's own view (lxcfs: MemTotal is the limit): what it shows in use is its idle use.
    inside = hicache.plan(dict(BIG, mem_total_bytes=400 * GIB, mem_available_bytes=380 * GIB, mem_limit_bytes=400 * GIB))
    assert inside["reserve_bytes"] == 20 * GIB + 4 * GIB + 380 * GIB // 512


def test_offline_facts_with_nothing_in_use_say_the_idle_use_is_taken_as_zero():
    plan = hicache.plan(dict(BIG, mem_available_bytes=BIG["mem_total_bytes"]))
    assert "idle use 0 B (the facts show nothing in use" in reserve_line(plan)
    assert "give mem_available_bytes or idle_used_bytes" in reserve_line(plan)


def test_sglangs_own_check_caps_a_plan_whose_stages_differ():
    # PP 2 of Kimi-K2's 61 layers (31 + 30): the smaller stage pins less, so the budget alone would offer 23 GB, which
    # the 31-layer stage's ranks request past their equal share of MemAvailable - 10 GiB (0.5.19+), and SGLang refuses.
    host = {"mem_total_bytes": 256 * GIB, "mem_available_bytes": 252 * GIB, "gpu_count": 8, "gpu_memory_mib": 143771,
            "tp_size": 4, "pp_size": 2, "model_preset": "kimi-k2"}
    newer = model.size_host(hinput.validate(dict(host, sglang_version="0.5.19")))
    older = model.size_host(hinput.validate(dict(host, sglang_version="0.5.18")))
    assert older.max_gb == 23 and older.own_cap_gb is None  # each rank against the whole host: no cap
    assert newer.max_gb == 22 and newer.own_cap_gb == 22
    share = (newer.budget.basis_bytes - newer.budget.overhead_bytes - 10 * GIB) // 8
    assert newer.shown.pools(22, 64).requested_bytes <= share < newer.shown.pools(23, 64).requested_bytes
    plan = hicache.plan(dict(host, sglang_version="0.5.19"))
    assert any(line.startswith("SGLang's own check caps the size at 22") for line in plan["explain"])
    assert not hicache.plan(dict(host, sglang_version="0.5.19", requested_gb=23))["fits"]
