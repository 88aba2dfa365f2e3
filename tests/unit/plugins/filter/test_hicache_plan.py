"""Unit tests for the inferops.gpu_inference.hicache_plan filter."""

from __future__ import annotations

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.inferops.gpu_inference.plugins.filter.hicache_plan import FilterModule, hicache_plan
from ansible_collections.inferops.gpu_inference.tests.unit.plugins.incident import GIB, INCIDENT_FACTS as FACTS


def test_registered_under_its_name():
    assert FilterModule().filters()["hicache_plan"] is hicache_plan


def test_returns_the_documented_keys():
    result = hicache_plan(FACTS)
    for key in (
        "per_rank_gb",
        "ranks_per_host",
        "pinned_per_rank_bytes",
        "total_pinned_bytes",
        "budget_bytes",
        "headroom_bytes",
        "host_tokens_per_rank",
        "fits",
        "explain",
        "warnings",
        "picture",
    ):
        assert key in result
    assert result["fits"] is True
    assert isinstance(result["explain"], list) and all(isinstance(line, str) for line in result["explain"])


def test_keyword_overrides_the_input():
    result = hicache_plan(FACTS, requested_gb=300)
    assert result["fits"] is False
    assert "2400.0 GB" in "\n".join(result["explain"])
    assert "requested_gb" not in FACTS  # the caller's dict is not changed


def test_a_plan_that_does_not_fit_is_returned_not_raised():
    assert hicache_plan(dict(FACTS, mem_available_bytes=80 * GIB, mem_total_bytes=88 * GIB))["fits"] is False


@pytest.mark.parametrize(
    "facts, message",
    [
        ({k: v for k, v in FACTS.items() if k != "gpu_count"}, "hicache_plan: missing required key.*gpu_count"),
        (dict(FACTS, mem_total_bytes=449), "hicache_plan: mem_total_bytes=449 .*bytes are expected"),
        (dict(FACTS, sglang_version="nightly"), "hicache_plan: sglang_version 'nightly'"),
        (dict(FACTS, tp_size=3), "hicache_plan: SGLang cannot shard the model's 64 attention heads"),
        (dict(FACTS, os_reserve_fraction=10**400), "hicache_plan: os_reserve_fraction must be a number"),
        (dict(FACTS, tp_size=16, nnodes=2, dp_size=2), "hicache_plan: SGLang refuses dp_size 2 without DP attention on 2 nodes"),
        ("not a dict", "hicache_plan: the input must be a dict"),
    ],
)
def test_bad_input_raises_ansible_filter_error(facts, message):
    with pytest.raises(AnsibleFilterError, match=message) as info:
        hicache_plan(facts)
    if isinstance(facts, dict):
        assert info.value.orig_exc is not None
