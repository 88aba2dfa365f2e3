"""Values as a careless or hostile operator gives them (issue 22): blank layout figures, non-ASCII digits, types named
as users know them, implausible container limits, plan_requested_gb=0 (sizing_values.py, sglang_request.py,
sglang_deploy.calculate)."""

from __future__ import annotations

import pytest

from ansible_collections.inferops.gpu_inference.plugins.module_utils.deploy import sglang_deploy as d
from ansible_collections.inferops.gpu_inference.plugins.module_utils.deploy import sglang_request as rq
from ansible_collections.inferops.gpu_inference.plugins.module_utils.sizing import sizing_values as sv

GIB = 2**30
INCIDENT = {"mem_total_bytes": 482110078976, "mem_available_bytes": 477815111680, "gpu_count": 8, "gpu_memory_mib": 97887,
            "sglang_version": "0.5.9", "tp_size": 8, "model_preset": "kimi-k2", "device_pool_tokens_per_rank": 116000}
SETTINGS = {"version": "0.5.21", "tp_size": 8, "model_preset": "kimi-k2", "requested_gb": 10, "model_path": "/m",
            "api_key_set": True}
CONTAINER = {"vmid": 129, "memory_mib": 420 * 1024, "gpus": list(range(8))}


@pytest.mark.parametrize("key", ["tp_size", "pp_size", "dp_size", "nnodes", "gpu_count", "mem_total_bytes", "gpu_memory_mib"])
@pytest.mark.parametrize("blank", ["", None, "  "])
def test_a_blank_layout_or_memory_figure_is_refused_not_read_as_one(key, blank):
    with pytest.raises(d.DeployError, match="plan_input: %s is blank" % key):
        d.calculate(dict(INCIDENT, **{key: blank}), None)


def test_other_blank_keys_are_named_with_the_default_used():
    out = d.calculate(dict(INCIDENT, page_size="", other_engine_ranks=None), None)
    assert out["notes"][0] == "plan_input: other_engine_ranks, page_size blank, so not given: the documented default is used."
    assert out["plan"]["per_rank_gb"] == d.calculate(INCIDENT, None)["plan"]["per_rank_gb"]


@pytest.mark.parametrize("value", ["\uff18", "\u0668", "\uff13\uff10\uff10", "\u0664\u0664"])
def test_only_ascii_digits_are_numbers(value):
    with pytest.raises(sv.PlanError, match="write the digits 0-9"):
        sv.as_int("tp_size", value, 1)
    with pytest.raises(rq.DeployError, match="write the digits 0-9"):
        rq.setting_int("sglang_server_tp_size", value, 1, 1024)
    with pytest.raises(sv.PlanError, match="the digits 0-9"):
        sv.as_float("os_reserve_fraction", value, 0.0, 0.9)


@pytest.mark.parametrize("value,word", [([8], "list"), ({"a": 1}, "mapping"), ("", "blank"), (None, "blank"), (True, "boolean"),
                                        (1.5, "number"), ("x", "string"), (object(), "value of another kind")])
def test_types_are_named_as_users_know_them(value, word):
    assert sv.type_word(value) == word


@pytest.mark.parametrize("value,word", [([8], "got a list"), ({"a": 1}, "got a mapping")])
def test_errors_name_no_internal_type(value, word):
    for call in (lambda: rq.setting_int("sglang_server_tp_size", value, 1, 8), lambda: sv.as_int("tp_size", value, 1)):
        with pytest.raises(ValueError) as exc:
            call()
        assert word in str(exc.value) and "dict" not in str(exc.value) and "Tagged" not in str(exc.value)


def test_a_container_limit_above_64_tib_is_refused_with_its_unit():
    r = rq.request(dict(SETTINGS))
    with pytest.raises(d.DeployError, match="the most is 64 TiB") as exc:
        d.calculate({}, None, r, dict(CONTAINER, memory_mib=999999999), "ct129")
    assert "KiB or bytes" in str(exc.value)


def test_a_container_limit_above_the_nodes_ram_is_refused():
    r = rq.request(dict(SETTINGS))
    with pytest.raises(d.DeployError, match="more than the node's RAM"):
        d.calculate({"mem_total_bytes": 449 * GIB, "mem_available_bytes": 445 * GIB}, None, r,
                    dict(CONTAINER, memory_mib=1024 * 1024), "ct129")


@pytest.mark.parametrize("zero", [0, "0"])
def test_plan_requested_gb_zero_clears_the_hosts_requested_size(zero):
    r = rq.request(dict(SETTINGS))
    asked = d.calculate({}, None, r, CONTAINER, "ct129")
    assert asked["plan"]["per_rank_gb"] == 10
    cleared = d.calculate({}, zero, r, CONTAINER, "ct129")
    assert cleared["plan"]["per_rank_gb"] > 30  # the plan chooses (41 here), not the host's 10
    assert any("plan_requested_gb=0 clears ct129's sglang_server_hicache_requested_gb (10)" in n for n in cleared["notes"])
    assert d.calculate({}, "", r, CONTAINER, "ct129")["plan"]["per_rank_gb"] == 10  # blank keeps the host's
