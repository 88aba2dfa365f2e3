"""Unit tests for the HiCache sizing model (plugins/module_utils/sizing/hicache.py and the hicache_*.py files it is made of)."""

from __future__ import annotations

import glob
import os
import re

import pytest
import yaml

from ansible_collections.inferops.gpu_inference.plugins.module_utils.sizing import hicache as h
from ansible_collections.inferops.gpu_inference.plugins.module_utils.sizing import hicache_pools as pools
from ansible_collections.inferops.gpu_inference.plugins.module_utils.sizing import hicache_releases as rel
from ansible_collections.inferops.gpu_inference.plugins.module_utils.sizing import sizing_values as units
from ansible_collections.inferops.gpu_inference.tests.unit.plugins.incident import GB, GIB, INCIDENT_FACTS as INCIDENT


def plan(**overrides):
    data = dict(INCIDENT)
    data.update(overrides)
    return h.plan(data)


# ---------------------------------------------------------------- the incident (acceptance)


def test_incident_default_policy_size_fits_under_available_minus_reserves():
    result = plan()
    assert 30 <= result["per_rank_gb"] <= 52
    assert result["fits"] is True
    assert result["ranks_per_host"] == 8
    reserves = result["reserve_bytes"] + result["overhead_bytes"]
    assert result["per_rank_gb"] * 8 * GB <= INCIDENT["mem_available_bytes"] - reserves
    assert result["total_pinned_bytes"] <= result["budget_bytes"]
    assert result["headroom_bytes"] >= 0
    assert h.size_gb(INCIDENT) == result["per_rank_gb"]


def test_incident_requested_300_does_not_fit_and_names_ranks_and_total():
    result = plan(requested_gb=300)
    assert result["fits"] is False
    assert result["per_rank_gb"] == 0
    text = "\n".join(result["explain"])
    assert "8 ranks" in text
    assert "2400.0 GB" in text
    assert "DOES NOT FIT" in text
    # SGLang 0.5.9's own check passes each rank alone: that is how the incident happened.
    assert "lets every rank through" in text
    with pytest.raises(h.PlanError, match="2400.0 GB"):
        h.size_gb(dict(INCIDENT, requested_gb=300))


def test_incident_on_0_5_4_power_of_two_pinned_total_fits():
    result = plan(sglang_version="0.5.4")
    size = result["per_rank_gb"]
    assert 1 <= size < 40  # well below 48
    pinned = result["pinned_per_rank_bytes"]
    assert pinned & (pinned - 1) == 0, "0.5.4 pins a power of two"
    assert pinned >= size * GB * 0.99
    assert 8 * pinned <= result["budget_bytes"]
    assert result["total_pinned_bytes"] == 8 * pinned


def test_48_on_0_5_4_pins_549_8_gb_and_does_not_fit():
    result = plan(sglang_version="0.5.4", requested_gb=48)
    assert result["pinned_per_rank_bytes"] == 2**36
    assert result["total_pinned_bytes"] == 8 * 2**36
    assert "549.8 GB" in "\n".join(result["explain"])
    assert result["fits"] is False


# ---------------------------------------------------------------- version boundaries


@pytest.mark.parametrize(
    "version, power_of_two",
    [("0.4.9", True), ("0.5.4", True), ("0.5.5", False), ("0.5.9", False), ("0.5.23", False)],
)
def test_power_of_two_pinning_boundary_0_5_4(version, power_of_two):
    result = plan(sglang_version=version, requested_gb=20)
    pinned = result["pinned_per_rank_bytes"]
    assert (pinned == 2**35) is power_of_two
    if not power_of_two:
        # exact size: the tokens' bytes, plus at most two 64 KiB allocation granules
        assert 20 * GB - 70272 * 64 <= pinned <= 20 * GB + 70272 * 64 + 2 * pools.ALLOC_GRANULE_BYTES


def test_page_alignment_boundary_0_5_5_down_0_5_6_up_plus_one_page():
    # Kimi-K2 at 48 GB: 683,060 raw tokens; page 64 -> 683,008 down, 683,072 up (+1 page).
    assert plan(sglang_version="0.5.5", requested_gb=48)["host_tokens_per_rank"] == 683008
    assert plan(sglang_version="0.5.6", requested_gb=48)["host_tokens_per_rank"] == 683072


def test_host_larger_than_device_assertion_up_to_0_5_14():
    # A device pool larger than what any host size allowed can hold: fails on 0.5.14, fine on 0.5.15.
    big = {"device_pool_tokens_per_rank": 2_000_000}
    old = plan(sglang_version="0.5.14", **big)
    assert old["fits"] is False
    assert "0.5.14" in "\n".join(old["explain"])
    with pytest.raises(h.PlanError, match="device"):
        h.size_gb(dict(INCIDENT, sglang_version="0.5.14", **big))
    new = plan(sglang_version="0.5.15", **big)
    assert new["fits"] is True
    assert new["per_rank_gb"] == old["max_per_rank_gb"]


def test_requested_size_below_device_pool_refused_on_0_5_14():
    # 8 GB -> 113,856 tokens of Kimi-K2 <= 116,000 device tokens: SGLang <= 0.5.14 asserts.
    result = plan(sglang_version="0.5.14", requested_gb=8, device_pool_tokens_per_rank=116000)
    assert result["fits"] is False
    assert "asserts host tokens > device tokens" in "\n".join(result["explain"])
    assert plan(sglang_version="0.5.15", requested_gb=8, device_pool_tokens_per_rank=116000)["fits"] is True


def test_device_pool_unknown_on_old_version_warns():
    result = plan(sglang_version="0.5.14")
    assert any("device_pool_tokens_per_rank" in w for w in result["warnings"])
    assert not any("device_pool_tokens_per_rank" in w for w in plan(sglang_version="0.5.15")["warnings"])


def test_sglang_guard_boundary_0_5_18_per_rank_0_5_19_divided():
    old = "\n".join(plan(sglang_version="0.5.18", requested_gb=300)["explain"])
    new = "\n".join(plan(sglang_version="0.5.19", requested_gb=300)["explain"])
    assert "each rank alone" in old and "lets every rank through" in old
    assert "/ 8 ranks" in new and "would refuse it" in new


def test_guard_0_5_21_reads_the_container_limit():
    limit = 100 * GIB
    text_20 = "\n".join(plan(sglang_version="0.5.20", mem_limit_bytes=limit, requested_gb=13)["explain"])
    text_21 = "\n".join(plan(sglang_version="0.5.21", mem_limit_bytes=limit, requested_gb=13)["explain"])
    # 0.5.20 divides host MemAvailable (445 GiB - 10 GiB) / 8 = 58 GB; 0.5.21 the limit: 90 GiB / 8 = 12.1 GB.
    assert "would refuse" not in text_20
    assert "would refuse" in text_21


def test_late_rank_double_counting_warning_from_0_5_19():
    # A size that fits the plan but which SGLang's guard rejects for the last rank to start (sglang#38156).
    result = plan(sglang_version="0.5.19", requested_gb=40)
    assert result["fits"] is True
    assert any("38156" in w for w in result["warnings"])


@pytest.mark.parametrize(
    "text, behaves_as",
    [
        ("0.5.9", ["0.5.9"]),
        ("v0.5.9", ["0.5.9"]),
        (" 0.5.9 ", ["0.5.9"]),
        ("0.5.9.post1", ["0.5.9", "0.5.10"]),  # post releases are cut from main after 0.5.9
        ("0.5.10rc0", ["0.5.9", "0.5.10"]),
        ("0.5.15.dev0", ["0.5.14", "0.5.15"]),
        ("0.5.5rc1", ["0.5.4", "0.5.5"]),
        ("0.5.9+cu128", ["0.5.8", "0.5.9", "0.5.10"]),
        ("0.5.0", ["0.4.10", "0.5.1"]),  # 0.5.0 was only published as release candidates
        ("0.5.23.post1", ["0.5.23"]),
        ("0.6.0rc1", ["0.5.23"]),
    ],
)
def test_version_forms_and_the_releases_they_may_behave_as(text, behaves_as):
    version = rel.parse_version(text)
    assert str(version) == text.strip().lstrip("v")
    releases, warning = rel.behaviour_releases(version)
    assert ["%d.%d.%d" % r for r in releases] == behaves_as
    # Only a final, known release goes unsaid: a post, local or pre-release part always names the release assumed.
    assert (warning is None) is (version.is_final and len(behaves_as) == 1 and not version.key > rel.KNOWN_LAST_VERSION)
    if warning and len(behaves_as) == 1:
        assert "treated as %s" % behaves_as[0] in warning


def test_pre_release_is_planned_with_the_previous_release_pinning_too():
    # 0.5.5rc1 may still pin the 0.5.4 way (power of two): the plan must hold for that.
    rc = plan(sglang_version="0.5.5rc1")
    assert rc["per_rank_gb"] == plan(sglang_version="0.5.4")["per_rank_gb"] < plan(sglang_version="0.5.5")["per_rank_gb"]
    assert rc["behaviour_of_releases"] == ["0.5.4", "0.5.5"]
    assert any("0.5.4 or 0.5.5" in w for w in rc["warnings"])
    assert "behaviour of 0.5.4 or 0.5.5" in rc["explain"][0]


def test_dev_build_keeps_the_host_pool_assertion_of_the_previous_release():
    # 0.5.15.dev0 may still assert host tokens > device tokens (0.5.14): a size below the device pool is refused.
    dev = plan(sglang_version="0.5.15.dev0", requested_gb=8, device_pool_tokens_per_rank=116000)
    assert dev["fits"] is False
    assert "asserts host tokens > device tokens" in "\n".join(dev["explain"])
    assert plan(sglang_version="0.5.15", requested_gb=8, device_pool_tokens_per_rank=116000)["fits"] is True


@pytest.mark.parametrize("text", ["0.4.9rc1", "0.4.9.dev0", "0.4.9+local", "0.4.8"])
def test_builds_before_the_first_known_release_are_refused(text):
    with pytest.raises(h.PlanError, match="older than 0.4.9"):
        plan(sglang_version=text)


def test_newer_than_known_version_warns():
    result = plan(sglang_version="0.6.0")
    assert any("newer than 0.5.23" in w for w in result["warnings"])


# ---------------------------------------------------------------- layouts


def test_dp_without_dp_attention_multiplies_ranks():
    result = plan(tp_size=2, dp_size=4, enable_dp_attention=False)
    assert result["ranks_per_host"] == 8
    assert "x dp 4" in "\n".join(result["explain"])


def test_dp_with_dp_attention_adds_no_ranks():
    result = plan(tp_size=8, dp_size=8, enable_dp_attention=True)
    assert result["ranks_per_host"] == 8
    assert result["per_rank_gb"] == plan()["per_rank_gb"]


def test_dp_attention_shrinks_attention_tp_for_gqa():
    # Llama-3-70B, 8 KV heads: TP 8 -> 1 head/rank; with DP attention dp 4 -> attn_tp 2 -> 4 heads/rank.
    plain = plan(model_preset="llama-3-70b")
    dpa = plan(model_preset="llama-3-70b", dp_size=4, enable_dp_attention=True)
    assert plain["kv_bytes_per_token"] == 40960
    assert dpa["kv_bytes_per_token"] == 4 * 40960


def test_pp_counts_ranks_and_stage_layers():
    result = plan(tp_size=4, pp_size=2)
    assert result["ranks_per_host"] == 8
    # 61 layers over 2 stages: the larger stage has 31 layers.
    assert result["kv_bytes_per_token"] == 576 * 2 * 31


def test_multinode_tp16_puts_8_ranks_per_node():
    result = plan(tp_size=16, nnodes=2)
    assert result["ranks_per_host"] == 8
    assert result["per_rank_gb"] == plan()["per_rank_gb"]


def test_other_engine_ranks_share_the_budget():
    alone = plan(tp_size=4, gpu_count=4)
    shared = plan(tp_size=4, gpu_count=4, other_engine_ranks=4)
    assert shared["ranks_per_host"] == 8
    assert shared["per_rank_gb"] < alone["per_rank_gb"]


def test_container_limit_smaller_than_host_ram_bounds_the_plan():
    result = plan(mem_limit_bytes=200 * GIB)
    assert result["memory_basis_bytes"] == 200 * GIB
    assert result["per_rank_gb"] < plan()["per_rank_gb"]
    assert result["total_pinned_bytes"] + result["reserve_bytes"] + result["overhead_bytes"] <= 200 * GIB


def test_container_limit_above_host_ram_warns():
    result = plan(mem_limit_bytes=500 * GIB)
    assert any("larger than the host's RAM" in w for w in result["warnings"])


def test_nothing_fits_on_a_small_host():
    result = plan(mem_total_bytes=88 * GIB, mem_available_bytes=80 * GIB)
    assert result["fits"] is False
    assert result["per_rank_gb"] == 0
    assert "Nothing fits" in "\n".join(result["explain"])
    with pytest.raises(h.PlanError, match="Nothing fits"):
        h.size_gb(dict(INCIDENT, mem_total_bytes=88 * GIB, mem_available_bytes=80 * GIB))


def test_policy_overrides_change_the_budget():
    lean = plan(rank_overhead_bytes=2 * GIB, frontend_overhead_bytes=2 * GIB, os_reserve_fraction=0.05)
    assert lean["per_rank_gb"] > plan()["per_rank_gb"]


# ---------------------------------------------------------------- KV sizes (sglang-hicache.md section 7)


@pytest.mark.parametrize(
    "overrides, bytes_per_token, tokens_at_48",
    [
        ({"model_preset": "kimi-k2"}, 70272, 683072),
        ({"model_preset": "kimi-k2", "kv_cache_dtype": "fp8_e4m3"}, 35136, 1366144),
        ({"model_preset": "llama-3-70b"}, 40960, 1171904),
        ({"model_preset": "llama-3-70b", "kv_cache_dtype": "fp8_e5m2"}, 20480, 2343808),
        ({"model_preset": "llama-3-70b", "tp_size": 4, "gpu_count": 4}, 81920, 585984),
        ({"model_preset": "llama-3-70b", "tp_size": 1, "gpu_count": 1}, 327680, 146496),
    ],
)
def test_mla_vs_gqa_bytes_and_token_capacity(overrides, bytes_per_token, tokens_at_48):
    result = plan(requested_gb=48, mem_total_bytes=4096 * GIB, mem_available_bytes=4000 * GIB, **overrides)
    assert result["kv_bytes_per_token"] == bytes_per_token
    assert result["host_tokens_per_rank"] == tokens_at_48


def test_mla_is_replicated_gqa_is_sharded():
    assert plan(tp_size=1, gpu_count=1)["kv_bytes_per_token"] == plan(tp_size=8)["kv_bytes_per_token"]
    llama1 = plan(model_preset="llama-3-70b", tp_size=1, gpu_count=1)["kv_bytes_per_token"]
    llama8 = plan(model_preset="llama-3-70b", tp_size=8)["kv_bytes_per_token"]
    assert llama1 == 8 * llama8


def test_explicit_geometry_and_given_bytes():
    geometry = {"model_preset": None, "model_num_layers": 61, "model_kv_lora_rank": 512, "model_qk_rope_head_dim": 64}
    assert plan(**geometry)["kv_bytes_per_token"] == 70272
    assert plan(model_preset=None, kv_bytes_per_token=1000)["kv_bytes_per_token"] == 1000


def test_string_numbers_from_extra_vars_are_accepted():
    result = plan(tp_size="8", mem_total_bytes=str(449 * GIB), requested_gb="40", enable_dp_attention="false")
    assert result["per_rank_gb"] == 40


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "change, message",
    [
        ({"mem_available_bytes": None}, "missing required key.*mem_available_bytes"),
        ({"sglang_version": None}, "missing required key.*sglang_version"),
        ({"mem_total_bytes": -1}, "mem_total_bytes must be at least 0"),
        ({"mem_available_bytes": 0}, "mem_available_bytes is 0"),
        ({"mem_total_bytes": 449}, "GiB or GB figure passed where bytes are expected"),
        ({"mem_available_bytes": 445 * 1024}, "MiB figure"),
        ({"mem_limit_bytes": 64}, "mem_limit_bytes=64 is only 64 bytes"),
        ({"mem_available_bytes": 500 * GIB}, "cannot exceed MemTotal"),
        ({"tp_size": 3}, "64 attention heads over an attention TP size of 3"),
        ({"tp_size": 16}, "16 GPU ranks on each host .* has 8 GPUs"),
        ({"tp_size": 4, "dp_size": 4}, "16 GPU ranks"),
        ({"tp_size": 8, "dp_size": 3, "enable_dp_attention": True}, "tp_size must be divisible by dp_size"),
        ({"tp_size": 12, "nnodes": 8}, '"tp_size must be divisible by number of nodes"'),
        ({"tp_size": 0}, "tp_size must be at least 1"),
        ({"tp_size": True}, "tp_size must be a number"),
        ({"tp_size": "eight"}, "tp_size must be a whole number"),
        ({"sglang_version": "latest"}, "not an SGLang release number"),
        ({"sglang_version": "0.3.0"}, "older than 0.4.9"),
        ({"gpu_memory_mib": 96}, "looks like GiB or GB"),
        ({"gpu_memory_mib": 97887 * 2**20}, "looks like bytes"),
        ({"model_preset": None}, "KV size is missing"),
        ({"model_preset": "gpt-5"}, "model_preset 'gpt-5' is unknown"),
        ({"model_preset": None, "model_num_layers": 61, "model_kv_lora_rank": 512}, "qk_rope_head_dim"),
        ({"kv_cache_dtype": "int3"}, "kv_cache_dtype 'int3' is unknown"),
        ({"requested_gb": 8.5}, "whole number of GB"),
        ({"requested_gb": 0}, "requested_gb must be at least 1"),
        ({"requested_gb": 300 * GB}, "looks like bytes"),
        ({"mem_total_gb": 449}, "unknown key.*mem_total_gb: memory inputs are in bytes, use mem_total_bytes"),
        ({"enable_dp_attention": "maybe"}, "true or false"),
        ({"os_reserve_fraction": 1.5}, "between"),
    ],
)
def test_bad_input_is_refused_with_a_clear_message(change, message):
    data = dict(INCIDENT)
    data.update(change)
    with pytest.raises(h.PlanError, match=message):
        h.plan(data)


def test_input_must_be_a_mapping():
    with pytest.raises(h.PlanError, match="must be a dict"):
        h.plan([1, 2, 3])  # type: ignore[arg-type]


def test_units_helpers():
    assert pools.pow2_ceil(34 * GB) == 2**35
    assert pools.pow2_ceil(2**35) == 2**35
    assert units.fmt_gb(2400 * GB) == "2400.0 GB"
    assert units.fmt_gib(449 * GIB) == "449.0 GiB"


# ---------------------------------------------------------------- rank placement (entrypoints/engine.py)


def test_pp_that_does_not_divide_nnodes_is_sized_for_what_the_launcher_places():
    # tp 6 x pp 2 on 3 nodes: the launcher runs tp // max(3 // 2, 1) = 6 TP ranks x max(2 // 3, 1) = 1 stage
    # on every node (node 2 gets a stage that does not exist), not tp x pp / nnodes = 4.
    result = plan(tp_size=6, pp_size=2, nnodes=3, model_preset=None, kv_bytes_per_token=70272, requested_gb=80)
    assert result["engine_ranks_per_host"] == 6
    assert result["placement"] == {
        "tp_ranks_per_node": 6,
        "pp_stages_per_node": 1,
        "dp_replicas_per_node": 1,
        "formula": "tp // max(nnodes // pp, 1) x max(pp // nnodes, 1)",
    }
    assert result["total_pinned_bytes"] >= 6 * 80 * GB
    assert "tp // max(nnodes // pp, 1) = 6 // 1 = 6 TP rank(s) x max(pp // nnodes, 1) = 1 PP stage(s)" in "\n".join(result["explain"])
    assert any("node rank(s) 2" in w for w in result["warnings"])
    # The old count (tp x pp / nnodes = 4 ranks, 320 GB) would have said 80 fits; 6 ranks pin 480 GB.
    assert result["fits"] is False
    assert 4 * 80 * GB < result["budget_bytes"] < 6 * 80 * GB


@pytest.mark.parametrize(
    "layout, ranks",
    [
        ({"tp_size": 16, "nnodes": 2}, 8),
        ({"tp_size": 8, "pp_size": 2, "nnodes": 2}, 8),  # one stage per node
        ({"tp_size": 4, "pp_size": 4, "nnodes": 2}, 8),  # two stages per node
        ({"tp_size": 8, "pp_size": 2, "nnodes": 4}, 4),  # each stage over two nodes
        ({"tp_size": 2, "pp_size": 2, "dp_size": 2}, 8),  # plain DP: two full groups
        ({"tp_size": 8, "dp_size": 8, "enable_dp_attention": True, "nnodes": 2, "gpu_count": 8}, 4),
        ({"tp_size": 8, "dp_size": 1, "enable_dp_attention": True}, 8),  # DP attention is off with dp 1
    ],
)
def test_ranks_per_host_follow_the_launcher(layout, ranks):
    data = {"model_preset": None, "kv_bytes_per_token": 70272, "gpu_count": 8}
    data.update(layout)
    assert plan(**data)["engine_ranks_per_host"] == ranks


@pytest.mark.parametrize(
    "layout, message",
    [
        ({"tp_size": 8, "pp_size": 3, "nnodes": 2}, "would never start PP stages 2-2"),
        ({"tp_size": 5, "pp_size": 2, "nnodes": 5}, "would never start TP ranks 4-4"),
        ({"tp_size": 6, "nnodes": 4}, '"tp_size must be divisible by number of nodes"'),
        ({"tp_size": 8, "dp_size": 2, "nnodes": 2}, '"multi-node data parallel is not supported unless dp attention!"'),
        (
            {"tp_size": 8, "dp_size": 2, "nnodes": 2, "sglang_version": "0.5.22"},
            '"multi-node data-parallel replicas are not supported; use attention DP',
        ),
        ({"tp_size": 8, "dp_size": 3, "enable_dp_attention": True}, "tp_size must be divisible by dp_size"),
        ({"tp_size": 16}, "16 GPU ranks on each host"),
    ],
)
def test_layouts_sglang_refuses_are_refused_with_its_reason(layout, message):
    data = {"model_preset": None, "kv_bytes_per_token": 70272}
    data.update(layout)
    with pytest.raises(h.PlanError, match=re.escape(message)):
        plan(**data)


def test_tp_3_on_an_8_gpu_host_is_planned_when_the_model_allows_it():
    result = plan(tp_size=3, model_preset=None, kv_bytes_per_token=70272)
    assert result["fits"] is True
    assert result["engine_ranks_per_host"] == 3
    # ... and refused with SGLang's reason when the model's heads do not split three ways.
    with pytest.raises(h.PlanError, match="8 KV heads over an attention TP size of 3"):
        plan(tp_size=3, model_preset=None, model_num_layers=80, model_num_kv_heads=8, model_head_dim=128)


def test_other_engines_on_the_host_add_their_ranks_and_pools():
    alone = plan(tp_size=4)
    shared = plan(tp_size=4, other_engine_ranks=4)
    assert shared["ranks_per_host"] == 8 and shared["engine_ranks_per_host"] == 4
    assert shared["total_pinned_bytes"] == 8 * shared["pinned_per_rank_bytes"]
    assert shared["per_rank_gb"] < alone["per_rank_gb"]


def test_pp_stage_layers_follow_get_pp_indices():
    # SGLang gives the extra layers to the LAST stages (distributed/utils.py get_pp_indices).
    assert pools.pp_stage_layers(61, 2) == [30, 31]
    assert pools.pp_stage_layers(80, 3) == [26, 27, 27]
    with pytest.raises(h.PlanError, match="more than the model's 2 layers"):
        plan(pp_size=4, tp_size=2, model_preset=None, model_num_layers=2, model_kv_lora_rank=512, model_qk_rope_head_dim=64)


def test_up_to_0_5_14_each_stage_rounds_its_own_pages_and_the_dearest_is_priced():
    # MLA 1152 B/layer, 11 layers over 2 stages (5 and 6 layers), page 256, --hicache-size 7:
    # the 5-layer stage pins 7,001,210,880 bytes, the 6-layer one 7,000,031,232.
    geometry = {"model_preset": None, "model_num_layers": 11, "model_kv_lora_rank": 512, "model_qk_rope_head_dim": 64}
    old = plan(sglang_version="0.5.14", pp_size=2, tp_size=4, page_size=256, requested_gb=7, **geometry)
    assert old["pinned_per_rank_bytes"] >= 7_001_210_880
    assert "rounds each stage's token count" in "\n".join(old["explain"])
    # From 0.5.15 every stage takes the smallest token count: the 6-layer stage is the dearest.
    new = plan(sglang_version="0.5.15", pp_size=2, tp_size=4, page_size=256, requested_gb=7, **geometry)
    assert 7_000_031_232 <= new["pinned_per_rank_bytes"] < 7_001_210_880


def test_pp_on_one_host_sums_the_stages_it_holds():
    # tp 2 x pp 3 on one host, 13 layers (4, 4, 5): two ranks of each stage, not six of the largest.
    geometry = {"model_preset": None, "model_num_layers": 13, "model_kv_lora_rank": 512, "model_qk_rope_head_dim": 64}
    result = plan(sglang_version="0.5.17", tp_size=2, pp_size=3, requested_gb=40, **geometry)
    assert result["engine_ranks_per_host"] == 6
    assert result["total_pinned_bytes"] < 6 * result["pinned_per_rank_bytes"]
    assert "6 ranks x up to" in "\n".join(result["explain"])


# ---------------------------------------------------------------- the figures a deploy launches, guards and verifies with


@pytest.mark.parametrize(
    "change",
    [{}, {"requested_gb": 300}, {"tp_size": 4, "pp_size": 2}, {"tp_size": 4, "other_engine_ranks": 4},
     {"other_committed_bytes": 32 * GIB}, {"sglang_version": "0.5.4"}, {"model_preset": "deepseek-v3.2", "sglang_version": "0.5.19"}],
)
def test_required_available_is_the_sum_the_fit_is_decided_on(change):
    result = plan(**change)
    needed = result["required_available_bytes"]
    assert needed == result["reserve_bytes"] + result["overhead_bytes"] + result["total_pinned_bytes"]
    assert result["fits"] is (needed <= result["memory_basis_bytes"])
    assert result["headroom_bytes"] == result["memory_basis_bytes"] - needed


def test_engine_pinned_is_this_engines_share_of_the_total():
    alone = plan(tp_size=4)
    assert alone["engine_pinned_bytes"] == alone["total_pinned_bytes"] == 4 * alone["pinned_per_rank_bytes"]
    shared = plan(tp_size=4, other_engine_ranks=4)
    assert shared["engine_pinned_bytes"] == 4 * shared["pinned_per_rank_bytes"]
    assert shared["total_pinned_bytes"] == shared["engine_pinned_bytes"] + 4 * shared["pinned_per_rank_bytes"]
    assert shared["ceiling_bytes"] == shared["engine_pinned_bytes"] + shared["overhead_bytes"]


def test_with_pp_stages_of_different_sizes_the_total_is_summed_not_ranks_times_the_dearest():
    # kimi-k2's 61 layers over pp 2 (30 and 31): up to 0.5.14 each stage rounds its own tokens.
    result = plan(tp_size=4, pp_size=2)
    assert result["total_pinned_bytes"] == result["engine_pinned_bytes"] < 8 * result["pinned_per_rank_bytes"]
    assert result["ceiling_bytes"] == result["engine_pinned_bytes"] + result["overhead_bytes"]


def test_a_plan_that_does_not_fit_still_gives_its_figures_for_the_requested_size():
    result = plan(requested_gb=300)
    assert result["fits"] is False
    assert result["engine_pinned_bytes"] == result["total_pinned_bytes"] == 8 * result["pinned_per_rank_bytes"]
    assert result["required_available_bytes"] > result["memory_basis_bytes"]


# ---------------------------------------------------------------- SGLang's own check, per release


def _guard_lines(**overrides):
    return [line for line in plan(**overrides)["explain"] if "own check" in line]


def test_guard_up_to_0_5_4_compares_the_requested_bytes_before_the_power_of_two():
    (line,) = _guard_lines(sglang_version="0.5.4", requested_gb=48)
    assert "48.0 GB of the requested pool (before the power-of-two rounding)" in line
    assert "lets every rank through" in line


def test_guard_0_5_19_divides_by_world_size_over_nnodes_and_misses_plain_dp():
    (line,) = _guard_lines(sglang_version="0.5.19", tp_size=2, dp_size=4, requested_gb=50)
    assert "/ 2 ranks (world_size // nnodes)" in line
    assert "although 8 ranks run on this host (the 4 DP replicas without DP attention are not counted)" in line
    assert "lets every rank through" in line


def test_guard_from_0_5_21_divides_by_tp_x_pp_and_reads_the_cgroup():
    (line,) = _guard_lines(sglang_version="0.5.21", mem_limit_bytes=300 * GIB, requested_gb=20)
    assert "(min(MemAvailable, cgroup limit - usage) - 10 GiB) / 8 ranks (tp x pp // nnodes)" in line
    (line,) = _guard_lines(sglang_version="0.5.22", mem_limit_bytes=300 * GIB, requested_gb=20)
    assert "limit - (usage - file cache)" in line


def test_guard_of_each_release_a_pre_release_may_carry_is_shown():
    lines = _guard_lines(sglang_version="0.5.19rc0", requested_gb=20)
    assert [line.split("'s own check")[0] for line in lines] == ["SGLang 0.5.18", "SGLang 0.5.19"]


# ---------------------------------------------------------------- DSA (DeepSeek-V3.2, GLM-5)


def test_dsa_indexer_pool_is_priced_outside_hicache_size_from_0_5_19():
    new = plan(model_preset="deepseek-v3.2", kv_cache_dtype="bf16", sglang_version="0.5.19", requested_gb=30)
    # 61 layers x 1152 B KV; the indexer pool holds as many tokens at 132 B per layer (pool_host/dsa.py).
    assert new["kv_bytes_per_token"] == 61 * 1152
    assert new["indexer_pool_bytes_per_rank"] == (new["host_tokens_per_rank"] + 64) * 132 * 61
    assert new["pinned_per_rank_bytes"] >= 30 * GB + new["indexer_pool_bytes_per_rank"]
    assert "outside --hicache-size" in "\n".join(new["explain"])
    # 0.5.9 - 0.5.18 count the indexer inside --hicache-size: the same size costs less.
    old = plan(model_preset="deepseek-v3.2", kv_cache_dtype="bf16", sglang_version="0.5.18", requested_gb=30)
    assert old["pinned_per_rank_bytes"] < 30 * GB + 64 * 61 * (1152 + 132) + 64 * pools.ALLOC_GRANULE_BYTES
    separate = plan(model_preset="deepseek-v3.2", sglang_version="0.5.19")["per_rank_gb"]
    assert separate < plan(model_preset="deepseek-v3.2", sglang_version="0.5.18")["per_rank_gb"]


def test_glm_5_fp8_prices_the_backend_layout_with_the_most_tokens():
    # fp8 DSA stores 656 B per layer (flashmla) or 576 B (trtllm): the indexer of the 576 B layout is the larger.
    result = plan(model_preset="glm-5", kv_cache_dtype="fp8_e4m3", sglang_version="0.5.21", requested_gb=30)
    assert result["kv_bytes_per_token"] == 78 * 576
    tokens = result["host_tokens_per_rank"]
    assert tokens == (30 * GB // (78 * 576) // 64 + 1) * 64
    assert result["indexer_pool_bytes_per_rank"] == (tokens + 64) * 132 * 78


def test_dsa_before_0_5_9_has_no_indexer_pool():
    result = plan(model_preset="deepseek-v3.2", sglang_version="0.5.8")
    assert result["indexer_pool_bytes_per_rank"] == 0
    assert any("NSATokenToKVPoolHost arrived in 0.5.9" in w for w in result["warnings"])


def test_dsa_refusals():
    with pytest.raises(h.PlanError, match="DeepSeek DSA only supports bf16/bfloat16 or fp8_e4m3"):
        plan(model_preset="glm-5", kv_cache_dtype="fp8_e5m2")
    with pytest.raises(h.PlanError, match="cannot price a DSA model"):
        plan(model_preset="glm-5", kv_bytes_per_token=44928)


# ---------------------------------------------------------------- inputs: ranges, units, overflow


@pytest.mark.parametrize(
    "change, message",
    [
        ({"rank_overhead_bytes": 8}, "rank_overhead_bytes=8 is only 8 bytes: it looks like a GiB or MiB figure"),
        ({"os_reserve_min_bytes": 10}, "os_reserve_min_bytes=10 is only 10 bytes"),
        ({"frontend_overhead_bytes": 8192}, "8192 MiB is 8589934592 bytes"),
        ({"other_committed_bytes": 10**15}, "more than the host's RAM"),
        ({"model_preset": None, "kv_bytes_per_token": 69}, "69 KiB is 70656 bytes"),
        ({"kv_bytes_per_token": 69 * 2**20 * 1024}, "not a per-token figure"),
        ({"mem_total_bytes": 10**18}, "more than 1 PiB"),
        ({"mem_total_bytes": 10**400}, "more than 1 PiB"),
        ({"mem_available_bytes": "9" * 5000}, "mem_available_bytes must be a whole number"),
        ({"os_reserve_fraction": 10**400}, "os_reserve_fraction must be a number"),
        ({"os_reserve_fraction": 10}, "a fraction of RAM"),
        ({"os_reserve_fraction": float("nan")}, "between 0.0 and 0.9"),
        ({"requested_gb": float("inf")}, "requested_gb must be a whole number"),
        ({"requested_gb": 10**400}, "looks like bytes or MiB"),
        ({"gpu_count": 1000}, "gpu_count=1000 is implausible"),
        ({"tp_size": 10**6}, "tp_size=1000000 is implausible"),
        ({"page_size": 10**6}, "page_size=1000000 is implausible"),
        ({"device_pool_tokens_per_rank": 10**20}, "implausible"),
        ({"model_preset": None, "model_num_layers": 61, "model_kv_lora_rank": 512, "model_qk_rope_head_dim": 10**9}, "implausible"),
        ({"sglang_version": 0.5}, "not an SGLang release number"),
        ({"sglang_version": ["0.5.9"]}, "must be a release number"),
        ({"model_preset": 7}, "model_preset 7 is unknown"),
        ({"kv_cache_dtype": 8}, "kv_cache_dtype 8 is unknown"),
    ],
)
def test_implausible_or_overflowing_inputs_are_refused_with_a_unit_hint(change, message):
    data = dict(INCIDENT)
    data.update(change)
    with pytest.raises(h.PlanError, match=re.escape(message)):
        h.plan(data)


def test_legitimate_coercions_are_kept():
    result = plan(tp_size="8", pp_size="1", gpu_count="8", enable_dp_attention="no", requested_gb="40.0", os_reserve_fraction="0.1")
    assert result["per_rank_gb"] == 40
    assert plan(dp_size="8", enable_dp_attention="yes")["engine_ranks_per_host"] == 8
    assert plan(rank_overhead_bytes="8_589_934_592")["per_rank_gb"] == plan()["per_rank_gb"]


def test_every_memory_figure_is_formatted_without_floats():
    assert units.fmt_gb(10**40) == "10000000000000000000000000000000.0 GB"
    assert units.fmt_gib(-3 * GIB) == "-3.00 GiB"


# ---------------------------------------------------------------- the example inventories


EXAMPLES = sorted(glob.glob(os.path.join(os.path.dirname(__file__), "..", "..", "..", "..", "..", "playbooks", "vars", "examples", "*.yml")))


@pytest.mark.parametrize("path", EXAMPLES, ids=[os.path.basename(p) for p in EXAMPLES])
def test_every_example_plans_and_fits(path):
    with open(path) as handle:
        data = yaml.safe_load(handle)["plan_input"]
    result = h.plan(data)
    assert result["fits"] is True and result["per_rank_gb"] >= 1


def test_examples_were_found():
    assert len(EXAMPLES) >= 7


# ---------------------------------------------------------------- reserves and overheads a real node cannot have


@pytest.mark.parametrize("reserve", [0, 1 << 30, 10 * (1 << 30) - 1])
def test_a_reserve_below_sglangs_own_10_gib_is_refused_with_the_figure_to_give(reserve):
    with pytest.raises(h.PlanError) as err:
        plan(os_reserve_min_bytes=reserve, os_reserve_fraction=0)
    assert "below the 10.0 GiB that SGLang itself keeps free" in str(err.value)
    assert "at least 10737418240 bytes" in str(err.value)


def test_the_10_gib_reserve_itself_is_accepted():
    assert plan(os_reserve_min_bytes=10 << 30)["fits"] is True


@pytest.mark.parametrize("key", ["rank_overhead_bytes", "frontend_overhead_bytes"])
def test_a_zero_process_overhead_is_planned_with_a_warning(key):
    result = plan(**{key: 0})
    assert [w for w in result["warnings"] if w.startswith("%s=0: the plan counts no RAM" % key)]
    assert not [w for w in plan()["warnings"] if "the plan counts no RAM" in w]
