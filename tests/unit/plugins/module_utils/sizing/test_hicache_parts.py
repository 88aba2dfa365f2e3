"""Unit tests for the parts of the HiCache sizing model (plugins/module_utils/sizing/hicache_*.py): each part alone, and
that hicache.plan returns what they compute."""

from __future__ import annotations

import pytest

from ansible_collections.inferops.gpu_inference.plugins.module_utils.sizing import hicache
from ansible_collections.inferops.gpu_inference.plugins.module_utils.sizing import hicache_explain as explain
from ansible_collections.inferops.gpu_inference.plugins.module_utils.sizing import hicache_geometry as geometry
from ansible_collections.inferops.gpu_inference.plugins.module_utils.sizing import hicache_input as hinput
from ansible_collections.inferops.gpu_inference.plugins.module_utils.sizing import hicache_model as model
from ansible_collections.inferops.gpu_inference.plugins.module_utils.sizing import hicache_pools as pools
from ansible_collections.inferops.gpu_inference.plugins.module_utils.sizing import hicache_releases as rel
from ansible_collections.inferops.gpu_inference.tests.unit.plugins.incident import GB, INCIDENT_FACTS as INCIDENT


def sizing(**overrides):
    return model.size_host(hinput.validate(dict(INCIDENT, **overrides)))


# ---------------------------------------------------------------- releases


def test_release_rules_and_rules_of():
    assert rel.release_text((0, 5, 9)) == "0.5.9"
    assert [str(r) for r in rel.release_rules("0.5.5rc1")] == ["0.5.4", "0.5.5"]
    assert [str(r) for r in rel.release_rules(rel.parse_version("0.5.9"))] == ["0.5.9"]
    assert str(rel.rules_of("0.5.9+cu128")) == "0.5.8"
    rules = rel.Rules((0, 5, 4))
    assert rel.rules_of(rules) is rules
    with pytest.raises(rel.PlanError, match="older than 0.4.9"):
        rel.release_rules("0.4.8")


def test_distinct_guards_keeps_one_release_per_behaviour_of_sglangs_check():
    releases = [rel.Rules(r) for r in rel.KNOWN_RELEASES]
    guards = rel.distinct_guards(releases)
    assert [str(r) for r in guards] == ["0.4.9", "0.5.5", "0.5.19", "0.5.21", "0.5.22"]


# ---------------------------------------------------------------- placement and one rank's pools


def test_placement_text_names_the_launchers_formula():
    placement = pools.place_ranks(8, 1, 2, False, 1, (0, 5, 9))
    text = pools.placement_text(placement, 8, 2, False)
    assert text.endswith("x dp 2 replicas (plain DP: launch_dp_schedulers starts 2 full TP groups) = 16")
    assert pools.engine_ranks_per_host(8, 1, 2, False, 1) == 16


def test_dearest_rank_and_single_stage_helpers():
    rules = rel.Rules((0, 5, 9))
    choice = pools.KvChoice((pools.Stage(1000, 10), pools.Stage(1100, 11)), False, "", (0, 1))
    stages = pools.stage_pools(4, choice, 64, rules)
    assert pools.dearest(stages) == stages[0]  # up to 0.5.14 the smaller stage holds more tokens for the same size
    assert pools.rank_pools(4, choice, 64, rules).min_tokens == stages[1].tokens
    assert pools.stage_pools(0, choice, 64, rules) == [pools.NO_POOLS, pools.NO_POOLS]
    assert pools.host_tokens(48, 70272, 64, "0.5.5") == 683008
    assert pools.pinned_bytes_per_rank(48, 70272, 64, "0.5.4") == 2**36


# ---------------------------------------------------------------- geometry and input


def test_kv_choices_of_a_preset_and_of_a_dsa_model():
    choices, text, dsa = geometry.kv_choices({"model_preset": "kimi-k2"}, 8, 1, 1, False)
    assert [c.largest.kv_bytes_per_token for c in choices] == [61 * 576 * 2] and not dsa
    assert text == "MLA: 576 x 2 B per layer x 61 layers, replicated on every rank"
    choices, text, dsa = geometry.kv_choices({"model_preset": "glm-5"}, 8, 1, 1, False)
    assert dsa and [c.label for c in choices] == ["bf16 576 x 2 B", "fp8 packed 656 B", "fp8 trtllm 576 B"]
    assert text.endswith("indexer 132 B per layer")


def test_validate_gives_a_plan_input_with_the_policy_defaults():
    inp = hinput.validate(INCIDENT)
    assert isinstance(inp, hinput.PlanInput)
    assert inp.policy == hinput.DEFAULT_POLICY and inp.placement.ranks_per_node == 8
    assert inp.kv_bytes_per_token == 70272 and inp.requested_gb is None
    assert "requested_gb" in hinput.ALLOWED_KEYS and "model_num_layers" in hinput.ALLOWED_KEYS


# ---------------------------------------------------------------- the model


def test_budget_is_the_basis_less_reserve_processes_and_other_commitments():
    inp = hinput.validate(dict(INCIDENT, other_committed_bytes=10 * GB))
    budget = model.budget_of(inp, 8)
    assert budget.overhead_bytes == budget.processes_bytes + 10 * GB == 8 * 8 * 2**30 + 8 * 2**30 + 10 * GB
    assert budget.budget_bytes == budget.basis_bytes - budget.reserve_bytes - budget.overhead_bytes
    assert budget.required_available_bytes(5) == budget.reserve_bytes + budget.overhead_bytes + 5
    assert budget.per_rank_budget_bytes == budget.budget_bytes // 8


def test_host_load_sums_the_stages_on_the_most_loaded_node_and_other_engines():
    inp = hinput.validate(dict(INCIDENT, tp_size=2, pp_size=3, model_preset=None, model_num_layers=13,
                               model_kv_lora_rank=512, model_qk_rope_head_dim=64, other_engine_ranks=2))
    choice = inp.kv_choices[0]
    host = model.host_load(inp.placement, 3, 1, choice, 2)
    case = model.Case(inp.releases[0], choice)
    pinned = host.pinned(case, 40, 64)
    stages = pools.stage_pools(40, choice, 64, inp.releases[0])
    assert pinned.engine_bytes == 2 * sum(p.charged_bytes for p in (stages[0], stages[0], stages[1]))
    assert pinned.other_bytes == 2 * pinned.rank.charged_bytes and pinned.rank == pools.dearest(stages)
    assert pinned.total_bytes == pinned.engine_bytes + pinned.other_bytes
    assert model.NOTHING_PINNED.total_bytes == 0


def test_largest_and_smallest_sizes_are_the_boundaries():
    inp = hinput.validate(INCIDENT)
    case = model.Case(inp.releases[0], inp.kv_choices[0])
    host = model.host_load(inp.placement, 1, 1, case.choice, 0)
    budget = 352 * GB + 10**8
    largest = model.largest_fitting_size_gb(budget, case, host, 64)
    assert host.pinned(case, largest, 64).total_bytes <= budget < host.pinned(case, largest + 1, 64).total_bytes
    assert model.largest_fitting_size_gb(0, case, host, 64) == 0
    old = model.Case(rel.Rules((0, 5, 14)), case.choice)
    smallest = model.smallest_size_above_device(old, 64, 116000, 100)
    assert old.pools(smallest, 64).min_tokens > 116000 >= old.pools(smallest - 1, 64).min_tokens
    assert model.smallest_size_above_device(old, 64, 10**9, 100) is None


def test_sglang_guard_lets_the_incident_through_on_0_5_9_and_refuses_it_on_0_5_21():
    inp = hinput.validate(dict(INCIDENT, requested_gb=300))
    case = model.Case(inp.releases[0], inp.kv_choices[0])
    check = model.sglang_guard(case.pools(300, 64), inp, rel.Rules((0, 5, 9)))
    assert check.passes and check.text.startswith("each rank alone")
    newer = model.sglang_guard(case.pools(300, 64), inp, rel.Rules((0, 5, 21)))
    assert not newer.passes and "/ 8 ranks (tp x pp // nnodes)" in newer.text


def test_size_host_gives_every_figure_plan_returns():
    s = sizing(requested_gb=300)
    result = hicache.plan(dict(INCIDENT, requested_gb=300))
    assert not s.fits and s.chosen_gb == 300 and s.max_gb == result["max_per_rank_gb"] == 48
    assert result["total_pinned_bytes"] == s.load.total_bytes and result["engine_pinned_bytes"] == s.load.engine_bytes
    assert result["required_available_bytes"] == s.required_available_bytes
    assert result["ceiling_bytes"] == s.ceiling_bytes == s.load.engine_bytes + s.budget.overhead_bytes
    assert result["headroom_bytes"] == s.headroom_bytes < 0
    assert [str(g.rules) for g in s.guards] == ["0.5.9"] and s.best is not None and s.best.total_bytes <= s.budget.budget_bytes
    assert result["explain"] == explain.explain(s) and result["picture"] == explain.picture(s)


def test_size_host_refuses_more_ranks_than_gpus():
    with pytest.raises(hicache.PlanError, match="16 GPU ranks on each host .* but the host has 8 GPUs"):
        sizing(dp_size=2)


# ---------------------------------------------------------------- words and picture


def test_bar_scales_segments_and_marks_the_basis():
    assert explain.stacked_bar([("#", 1), ("P", 3)], 4, 4, width=8) == "[##PPPPPP]"
    assert explain.stacked_bar([("#", 2), ("!", 6)], 8, 4, width=8) == "[##!!|!!!!]"
    assert explain.stacked_bar([("#", 1), ("P", 1000)], 1001, 1001, width=8) == "[#PPPPPPPP]"  # a small segment still shows


def test_picture_shows_the_models_figures():
    s = sizing()
    lines = explain.picture(s)
    assert lines[0].startswith("Host memory basis 477.8 GB")
    assert "(8 ranks x 48.0 GB)" in lines[4]
    assert explain.explain(s)[-1].startswith("Plan: --hicache-size 48 per rank -> 8 ranks x 48.0 GB = 384.0 GB pinned")
