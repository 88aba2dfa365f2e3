"""Unit tests for the units and the checking of one value (plugins/module_utils/sizing/sizing_values.py), shared by the
sizing model and the deploy plan."""

from __future__ import annotations

import pytest

from ansible_collections.inferops.gpu_inference.plugins.module_utils.sizing import sizing_values as v

GIB = 2**30
MIB = 2**20


class OtherError(ValueError):
    pass


def test_clip_keeps_a_message_short():
    assert v.clip("abc") == "'abc'"
    assert v.clip("x" * 100) == "'" + "x" * 36 + "..." and len(v.clip("x" * 100)) == 40
    assert len(v.clip("x" * 100, 60)) == 60 and v.clip("x" * 100, 60).endswith("...")


@pytest.mark.parametrize("value, blank", [(None, True), ("", True), ("   ", True), (0, False), ("0", False), ([], False), (False, False)])
def test_is_blank_is_an_unanswered_survey_field(value, blank):
    assert v.is_blank(value) is blank


@pytest.mark.parametrize("value, result", [(True, True), ("yes", True), (" ON ", True), ("1", True), (1, True),
                                           (False, False), ("no", False), ("off", False), (0, False), ("0", False)])
def test_as_bool_reads_the_words_yaml_and_extra_vars_use(value, result):
    assert v.as_bool("flag", value) is result


@pytest.mark.parametrize("value", ["maybe", 2, None, [True], 0.5])
def test_as_bool_refuses_anything_else_with_the_callers_error(value):
    with pytest.raises(v.PlanError, match="flag must be true or false"):
        v.as_bool("flag", value)
    with pytest.raises(OtherError, match="flag must be true or false"):
        v.as_bool("flag", value, OtherError)


def test_as_int_and_ranged_int():
    assert v.as_int("n", "1_000", 0) == 1000 and v.as_int("n", 8.0, 0) == 8 and v.as_int("n", " 40.0 ", 1) == 40
    for bad, words in ((True, "boolean"), (8.5, "whole number"), ("8 GiB", "whole number"), ([1], "list"), (-1, "at least 0")):
        with pytest.raises(v.PlanError, match=words):
            v.as_int("n", bad, 0)
    assert v.ranged_int("tp_size", "8") == 8
    with pytest.raises(v.PlanError, match="tp_size=2048 is implausible"):
        v.ranged_int("tp_size", 2048)


def test_as_float_and_percent():
    assert v.as_float("f", "0.1", 0.0, 0.9) == 0.1
    with pytest.raises(v.PlanError, match="between 0.0 and 0.9"):
        v.as_float("f", float("nan"), 0.0, 0.9)
    assert v.looks_like_percent(10) and v.looks_like_percent("100") and not v.looks_like_percent(0.1) and not v.looks_like_percent("x")


def test_memory_and_policy_bytes_refuse_figures_in_another_unit():
    assert v.memory_bytes("mem_total_bytes", 449 * GIB) == 449 * GIB
    with pytest.raises(v.PlanError, match="a GiB or GB figure") as err:
        v.memory_bytes("mem_total_bytes", 449)
    # Each figure meant is given in its unit and in bytes, never a byte count labelled GB.
    assert "if you meant 449 GiB (482110078976 bytes) or 449 GB (449000000000 bytes), pass" in str(err.value)
    assert "449000000000 GB" not in str(err.value)
    with pytest.raises(v.PlanError, match="a MiB figure"):
        v.memory_bytes("mem_total_bytes", 459776)
    with pytest.raises(v.PlanError, match="more than 1 PiB"):
        v.memory_bytes("mem_total_bytes", 2**51)
    assert v.policy_bytes("rank_overhead_bytes", 8 * GIB, 449 * GIB) == 8 * GIB
    with pytest.raises(v.PlanError, match="GiB or MiB figure"):
        v.policy_bytes("rank_overhead_bytes", 8, 449 * GIB)
    with pytest.raises(v.PlanError, match="more than the host's RAM"):
        v.policy_bytes("rank_overhead_bytes", 500 * GIB, 449 * GIB)


def test_formats():
    assert v.fmt_gb(2400 * 10**9) == "2400.0 GB" and v.fmt_gb(-5 * 10**8) == "-0.5 GB"
    assert v.fmt_gb(2_015_000_000, 2) == "2.02 GB" and v.fmt_gb(10**9 + 5 * 10**6, 2) == "1.01 GB"
    assert v.fmt_gb(7 * 10**7, 2) == "0.07 GB" and v.fmt_gb(-4 * 10**6, 2) == "0.00 GB"
    assert v.fmt_gib(449 * GIB) == "449.0 GiB" and v.fmt_gib(512 * MIB) == "0.50 GiB"
    assert v.fmt_both(10 * GIB) == "10.7 GB (10.0 GiB)"
