"""Issue 28: --attn-dp-size, the speculative draft pool, 0.5.4.postN's exact pinning, the 0.5.4 device-token
warning, SGLang 0.5.22+'s own-check text and the policy's headroom text (docs/sizing.md)."""

from __future__ import annotations

import pytest

from ansible_collections.inferops.gpu_inference.plugins.module_utils.sizing import hicache as h
from ansible_collections.inferops.gpu_inference.plugins.module_utils.sizing import hicache_releases as rel
from ansible_collections.inferops.gpu_inference.tests.unit.plugins.incident import GB, GIB

BIG = dict(mem_total_bytes=2048 * GIB, mem_available_bytes=2000 * GIB, gpu_count=8, gpu_memory_mib=81559, tp_size=8,
           model_preset="llama-3-70b")


def plan(**overrides):
    data = dict(BIG)
    data.update(overrides)
    return h.plan(data)


# ---------------------------------------------------------------- 0.5.4.postN


@pytest.mark.parametrize("version, exact", [("0.5.4", False), ("0.5.4.post1", False), ("0.5.4.post2", True),
                                            ("0.5.4.post3", True), ("0.5.5", True)])
def test_0_5_4_post2_and_later_pin_exactly_as_0_5_5(version, exact):
    result = plan(sglang_version=version, requested_gb=200)
    pinned = result["pinned_per_rank_bytes"]
    assert (pinned < 201 * GB) is exact, pinned
    assert ("power of two" in result["allocation"]) is not exact


def test_0_5_4_post3_is_planned_as_itself_and_0_5_5():
    assert plan(sglang_version="0.5.4.post3")["behaviour_of_releases"] == ["0.5.4.post3", "0.5.5"]
    assert plan(sglang_version="0.5.4.post1")["behaviour_of_releases"] == ["0.5.4.post1", "0.5.5"]
    assert [str(r) for r in rel.release_rules("0.5.9.post1")] == ["0.5.9", "0.5.10"]


def test_0_5_4_post3_allows_a_size_that_power_of_two_refuses():
    # 4 ranks x 240 GB on 2 TiB: exact pools fit, power-of-two pools (256 GiB each) do not
    post3 = plan(sglang_version="0.5.4.post3", tp_size=4, requested_gb=240, rank_overhead_bytes=2 * GIB)
    old = plan(sglang_version="0.5.4", tp_size=4, requested_gb=240, rank_overhead_bytes=2 * GIB)
    assert post3["max_per_rank_gb"] > old["max_per_rank_gb"]
    assert post3["pinned_per_rank_bytes"] < old["pinned_per_rank_bytes"]


# ---------------------------------------------------------------- 0.5.4's assertion without device tokens


def test_0_5_4_without_device_tokens_asks_for_them_naming_the_assertion_at_the_requested_size():
    result = plan(sglang_version="0.5.4", requested_gb=20)
    warning = next(w for w in result["warnings"] if "device pool" in w)
    assert "The host memory should be larger than the device memory" in warning
    assert "--hicache-size 20" in warning and "device_pool_tokens_per_rank" in warning
    assert "%d tokens" % result["host_tokens_per_rank"] in warning


def test_0_5_4_with_device_tokens_refuses_a_size_that_trips_the_assertion():
    result = plan(sglang_version="0.5.4", requested_gb=20, device_pool_tokens_per_rank=5_000_000)
    assert not result["fits"]
    assert any("asserts host tokens > device tokens" in line for line in result["explain"])


# ---------------------------------------------------------------- --attn-dp-size


def test_attn_dp_size_places_ranks_as_dp_attention_without_extra_processes():
    new = plan(sglang_version="0.5.23", attn_dp_size=8, model_preset="deepseek-v3")
    old = plan(sglang_version="0.5.23", dp_size=8, enable_dp_attention=True, model_preset="deepseek-v3")
    assert new["ranks_per_host"] == old["ranks_per_host"] == 8
    assert new["per_rank_gb"] == old["per_rank_gb"]
    assert any("--attn-dp-size 8" in line and "no extra processes" in line for line in new["explain"])


def test_attn_dp_size_with_the_deprecated_flag_adds_nothing():
    assert plan(sglang_version="0.5.22", attn_dp_size=2, enable_dp_attention=True)["ranks_per_host"] == 8


@pytest.mark.parametrize("overrides, words", [
    (dict(sglang_version="0.5.21", attn_dp_size=2), "give dp_size 2 with enable_dp_attention"),
    (dict(sglang_version="0.5.22rc0", attn_dp_size=2), "0.5.21"),
    (dict(sglang_version="0.5.23", attn_dp_size=2, dp_size=2), "data-parallel replicas combined with attention"),
    (dict(sglang_version="0.5.23", attn_dp_size=3), "tp_size % attn_dp_size == 0"),
    (dict(sglang_version="0.5.23", attn_dp_size=0), "attn_dp_size"),
    (dict(sglang_version="0.5.23", attn_dp_size=5000), "implausible"),
])
def test_attn_dp_size_refusals_say_why_and_what_to_do(overrides, words):
    with pytest.raises(h.PlanError, match=None) as err:
        plan(**overrides)
    assert words in str(err.value)


# ---------------------------------------------------------------- the speculative draft pool


def test_a_draft_model_pool_is_priced_outside_hicache_size():
    bare = plan(sglang_version="0.5.23", requested_gb=100)
    draft = plan(sglang_version="0.5.23", requested_gb=100, draft_kv_bytes_per_token=4096)
    tokens = draft["host_tokens_per_rank"]
    assert draft["draft_pool_bytes_per_rank"] >= tokens * 4096
    assert draft["pinned_per_rank_bytes"] >= bare["pinned_per_rank_bytes"] + tokens * 4096
    assert draft["max_per_rank_gb"] < bare["max_per_rank_gb"]
    assert any("build_full_draft_pools" in line for line in draft["explain"])
    assert any("draft pool" in line for line in draft["explain"] if "own check" in line)


def test_no_draft_prices_nothing_and_bad_draft_figures_are_refused():
    assert plan(sglang_version="0.5.23")["draft_pool_bytes_per_rank"] == 0
    assert plan(sglang_version="0.5.23", draft_kv_bytes_per_token=0)["draft_pool_bytes_per_rank"] == 0
    for bad in (8, 10**9, "4 KiB", -1, True):
        with pytest.raises(h.PlanError):
            plan(sglang_version="0.5.23", draft_kv_bytes_per_token=bad)


# ---------------------------------------------------------------- own check and headroom texts


def test_own_check_of_0_5_22_names_the_cgroup_walk_and_page_cache():
    result = plan(sglang_version="0.5.22", requested_gb=50, mem_limit_bytes=1900 * GIB)
    line = next(line for line in result["explain"] if "own check" in line)
    assert "file cache" in line and "namespace root" in line and "lxcfs" in line
    older = plan(sglang_version="0.5.21", requested_gb=50, mem_limit_bytes=1900 * GIB)
    assert not any("namespace root" in line for line in older["explain"])


def test_the_plan_says_how_much_headroom_the_policy_keeps_and_why():
    result = plan(sglang_version="0.5.23")
    line = next(line for line in result["explain"] if line.startswith("Headroom the policy keeps"))
    assert "not a measured SGLang figure" in line and "verify" in line
    assert result["policy_headroom_bytes"] == result["reserve_bytes"] + result["overhead_bytes"]


def test_headroom_above_the_whole_ram_is_said_in_words_not_as_a_percentage():
    # 440 MiB (GiB meant) as the limit: the policy's headroom is many times the RAM; "19084%" read as a bug.
    result = plan(sglang_version="0.5.21", mem_limit_bytes=440 * 2 ** 20)
    line = next(line for line in result["explain"] if line.startswith("Headroom the policy keeps"))
    assert "(more than all 0.43 GiB of RAM)" in line and "%" not in line.split(" for the OS reserve")[0]
    normal = plan(sglang_version="0.5.21")
    line = next(line for line in normal["explain"] if line.startswith("Headroom the policy keeps"))
    assert "% of " in line and "more than all" not in line
