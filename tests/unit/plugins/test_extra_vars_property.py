"""Property test of plan.yml's input stages, in-process: generated extra-vars dicts (documented and undocumented
names, private ones, AWX's job variables; values of every type: blank, null, numbers, strings of digits in any
script, booleans, lists, mappings) go through the allow-list (module_utils/deploy/playbook_inputs.py), plan.yml's first
check and the calculator (sglang_deploy.calculate). Each is refused with a message (an InputsError or DeployError,
never another exception), or planned; a plan that fits must be safe by the independent oracle
(tests/unit/plugins/sglang_oracle.py) for every release its version may carry.

Examples: EXTRA_VARS_PROPERTY_EXAMPLES (default 1,000 in `make unit`, about 5 s).
"""

from __future__ import annotations

import os
import re
from collections import Counter

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ansible_collections.inferops.gpu_inference.plugins.module_utils.deploy import playbook_inputs, sglang_deploy
from ansible_collections.inferops.gpu_inference.plugins.module_utils.deploy.sglang_request import DeployError
from ansible_collections.inferops.gpu_inference.tests.unit.plugins import sglang_oracle as oracle

EXAMPLES = int(os.environ.get("EXTRA_VARS_PROPERTY_EXAMPLES", "1000"))
EXAMPLE_DIR = os.path.join(playbook_inputs.COLLECTION_ROOT, "playbooks", "vars", "examples")
BASES = []
for _name in ("kimi-k2-incident.yml", "llama-3-70b-8gpu.yml", "llama-3-8b-dp-no-attention.yml", "glm-5-fp8-8gpu.yml"):
    with open(os.path.join(EXAMPLE_DIR, _name), encoding="utf-8") as _f:
        BASES.append(yaml.safe_load(_f)["plan_input"])


def _load(path):
    with open(path, encoding="utf-8") as f:
        return yaml.safe_load(f)


ACCEPTED = playbook_inputs.allowed("plan.yml", _load)
NAMES = ["plan_input", "plan_requested_gb", "plan_requested_gb", "awx_job_id", "awx_job_id", "tower_job_id", "plan_input",
         "tower_user_name", "sglang_server_tp_size",
         "__plan_calculation", "_plan_settings_given", "_plan_host", "__plan_host", "__sglang_server_request",
         "plan_requsted_gb", "ansible_python_interpreter", "sglang_server_api_key", "x" * 300]
LAYOUT_KEYS = ["tp_size", "pp_size", "dp_size", "nnodes", "gpu_count", "mem_total_bytes", "mem_available_bytes",
               "gpu_memory_mib", "enable_dp_attention", "requested_gb", "page_size", "rank_overhead_bytes",
               "os_reserve_fraction", "device_pool_tokens_per_rank", "sglang_version"]
DIGITS = st.sampled_from(["\uff18", "\u0668", "\u0967", "\uff13\uff10\uff10", "\u0664\u0664"])
SCALARS = st.one_of(
    st.none(), st.just(""), st.just("  "), st.booleans(), st.integers(-10, 2**62), st.sampled_from([0, 1, 2, 4, 8, 16, 40, 300]),
    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from(["8", "2", "1.5", "300GB", "44 GiB", "1e3", "-1", "0", "true", "auto"]),
    DIGITS, st.text(max_size=12),
)
VALUES = st.one_of(SCALARS, st.lists(SCALARS, max_size=3), st.dictionaries(st.text(max_size=5), SCALARS, max_size=2))


@st.composite
def extra_vars(draw):
    base = dict(draw(st.sampled_from(BASES)))
    for key in draw(st.lists(st.sampled_from(LAYOUT_KEYS), max_size=3, unique=True)):
        base[key] = draw(st.one_of(VALUES, st.sampled_from([1, 2, 4, 8, "4", " 8 ", 8.0, 2 * 10**11, 2**60])))
    extra = {"plan_input": base}
    for name in draw(st.lists(st.sampled_from(NAMES), max_size=2, unique=True)):
        extra[name] = base if name == "plan_input" else draw(VALUES)
    return extra


def _number(value):
    if isinstance(value, str):
        value = value.strip()
    return int(float(value))


def _oracle_input(plan_input, requested):
    """The plan's input as the oracle reads it (numbers; blank = not given)."""
    inp = {}
    for key, value in plan_input.items():
        if value is None or (isinstance(value, str) and not value.strip()):
            continue
        if key in ("sglang_version", "model_preset", "kv_cache_dtype", "enable_dp_attention"):
            inp[key] = str(value).strip() if key != "enable_dp_attention" else value
        elif key == "os_reserve_fraction":
            inp[key] = float(value)
        else:
            inp[key] = _number(value)
    inp.pop("requested_gb", None)
    return inp


def _one(extra, stats):
    try:
        playbook_inputs.refuse_undocumented(list(extra), "plan.yml", ACCEPTED)
    except playbook_inputs.InputsError as exc:
        assert str(exc).startswith("refused before any task runs: plan.yml does not accept"), str(exc)
        assert len(str(exc)) < 2000
        stats["refused: undocumented name"] += 1
        return
    if any(re.match(r"^(sglang_server|pve_gpu_container)_", n) for n in extra):
        stats["refused: deploy setting without plan_host"] += 1
        return
    try:
        result = sglang_deploy.calculate(extra.get("plan_input", {}), extra.get("plan_requested_gb"))
    except DeployError as exc:
        text = str(exc)
        assert "Traceback" not in text and not re.search(r"NoneType|_AnsibleTagged|\b(dict|str|int|float) object", text), text
        stats["refused: value"] += 1
        return
    plan = result["plan"]
    stats["planned"] += 1
    if not plan["fits"]:
        stats["planned, does not fit (refused by plan.yml)"] += 1
        return
    stats["planned, fits"] += 1
    inp = _oracle_input(extra["plan_input"], plan.get("requested_gb"))
    size = int(plan["per_rank_gb"])
    hidden = {"os_page": 4096, "gpu_sm": 90, "nsa_trtllm": False}
    for release in oracle.releases_of(inp["sglang_version"]):
        out = oracle.outcome(inp, hidden, release, max(size, 1))
        assert out.refused is None, "SGLang %s refuses %s (%s) but the plan says --hicache-size %d" % (release, inp, out.refused, size)
        for node in out.nodes:
            need, have = oracle.demand_on_node(inp, node)
            assert need <= have, "UNSAFE: SGLang %s at --hicache-size %d needs %d bytes, the node has %d (%s, extra %s)" % (
                release, size, need, have, inp, sorted(extra))
    stats["fits, safe by the oracle"] += 1


def test_extra_vars_are_refused_or_planned_safely(capsys):
    stats = Counter()

    @settings(max_examples=EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(extra_vars())
    def check(extra):
        stats["examples"] += 1
        _one(extra, stats)

    check()
    with capsys.disabled():
        print("\nextra-vars property: " + ", ".join("%s %d" % (k, v) for k, v in sorted(stats.items())))
    assert stats["refused: undocumented name"] and stats["refused: value"], dict(stats)
    assert stats["fits, safe by the oracle"] >= EXAMPLES // 50, dict(stats)  # the planned path is exercised, not only refusals
