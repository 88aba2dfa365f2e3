"""Unit tests for the inferops.gpu_inference.hicache_size filter."""

from __future__ import annotations

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.inferops.gpu_inference.plugins.filter.hicache_size import FilterModule, hicache_size
from ansible_collections.inferops.gpu_inference.tests.unit.plugins.incident import GB, GIB, INCIDENT_FACTS as FACTS


def test_registered_under_its_name():
    assert FilterModule().filters()["hicache_size"] is hicache_size


def test_incident_host_gets_an_int_between_30_and_52():
    size = hicache_size(FACTS)
    assert isinstance(size, int)
    assert 30 <= size <= 52


def test_requested_size_that_fits_is_returned():
    assert hicache_size(FACTS, requested_gb=20) == 20


def test_requested_300_raises_with_the_arithmetic():
    with pytest.raises(AnsibleFilterError, match=r"8 ranks x 300.0 GB = 2400.0 GB pinned") as info:
        hicache_size(FACTS, requested_gb=300)
    assert "Largest safe value: --hicache-size" in str(info.value)


def test_0_5_4_returns_a_size_whose_power_of_two_total_fits():
    size = hicache_size(dict(FACTS, sglang_version="0.5.4"))
    pinned = 1 << ((size * GB) - 1).bit_length()
    assert 8 * pinned < 445 * GIB
    assert size < 48


def test_nothing_fits_raises():
    with pytest.raises(AnsibleFilterError, match="Nothing fits"):
        hicache_size(dict(FACTS, mem_total_bytes=64 * GIB, mem_available_bytes=60 * GIB))


@pytest.mark.parametrize(
    "facts, message",
    [
        (dict(FACTS, mem_available_bytes=-5), "hicache_size: mem_available_bytes must be at least 0"),
        (dict(FACTS, gpu_memory_mib=80), "hicache_size: gpu_memory_mib=80"),
        (None, "hicache_size: the input must be a dict"),
    ],
)
def test_bad_input(facts, message):
    with pytest.raises(AnsibleFilterError, match=message):
        hicache_size(facts)


def test_dsa_preset_size_leaves_room_for_the_indexer_pool():
    # GLM-5 on 0.5.21: the indexer pool outside --hicache-size makes the safe size smaller than Kimi-K2's.
    glm = hicache_size(dict(FACTS, model_preset="glm-5", sglang_version="0.5.21"))
    kimi = hicache_size(dict(FACTS, sglang_version="0.5.21"))
    assert 1 <= glm < kimi


def test_pre_release_gets_the_more_conservative_size():
    assert hicache_size(dict(FACTS, sglang_version="0.5.5rc1")) == hicache_size(dict(FACTS, sglang_version="0.5.4"))


@pytest.mark.parametrize(
    "change, message",
    [
        ({"mem_total_bytes": 10**400}, "hicache_size: mem_total_bytes=.* is more than 1 PiB"),
        ({"os_reserve_fraction": 2**1024}, "hicache_size: os_reserve_fraction must be a number"),
        ({"requested_gb": "9" * 5000}, "hicache_size: requested_gb must be a whole number"),
        ({"tp_size": 8, "dp_size": 2, "nnodes": 2}, "hicache_size: SGLang refuses dp_size 2 without DP attention"),
    ],
)
def test_overflow_and_refused_layouts_are_filter_errors(change, message):
    with pytest.raises(AnsibleFilterError, match=message) as info:
        hicache_size(dict(FACTS, **change))
    assert info.value.orig_exc is not None
