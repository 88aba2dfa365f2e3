"""Property test of the sizing model against an independent oracle (tests/unit/plugins/sglang_oracle.py).

Over random layouts (versions including pre-, post-, dev and local builds, TP/PP/DP/DP attention,
several nodes, other engines, MLA, MHA/GQA, DSA and bare per-token figures, every policy knob), it
asserts:

* whenever the plan says it fits, what SGLang of each release the version may carry pins on the most
  loaded host, plus the OS reserve and the processes, is within that host's memory, and no rank of a
  release up to 0.5.14 trips the host-larger-than-device assertion;
* the plan never accepts a layout SGLang refuses (or would wait on forever), nor refuses one SGLang runs;
* every input, however wrong, gives a result or an AnsibleFilterError, never another exception.

`make unit` runs HICACHE_PROPERTY_EXAMPLES examples (default 2,000); `make property` runs 170,000, of
which at least 100,000 must be layouts the plan sizes (HICACHE_PROPERTY_MIN_PLANNED; about one example
in seven is a wrong input and some layouts are ones SGLang refuses).  The counts and the wall time are
printed (docs/sizing.md).
"""

from __future__ import annotations

import os
import time
from collections import Counter

from ansible.errors import AnsibleFilterError
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from ansible_collections.inferops.gpu_inference.plugins.filter.hicache_plan import hicache_plan
from ansible_collections.inferops.gpu_inference.plugins.filter.hicache_size import hicache_size
from ansible_collections.inferops.gpu_inference.tests.unit.plugins import sglang_oracle as oracle

GIB = 2**30
MIB = 2**20
EXAMPLES = int(os.environ.get("HICACHE_PROPERTY_EXAMPLES", "2000"))
MIN_LAYOUTS = int(os.environ.get("HICACHE_PROPERTY_MIN_LAYOUTS", "0"))
MIN_PLANNED = int(os.environ.get("HICACHE_PROPERTY_MIN_PLANNED", "0"))

FINAL = ["0.4.9", "0.4.10"] + ["0.5.%d" % n for n in range(1, 24)]
SUFFIXES = ["", "", "", "", "rc0", "rc2", ".dev0", ".post1", ".post2", ".post3", "+cu128", "rc1+local"]
GARBAGE = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**30), max_value=10**30),
    st.sampled_from([10**400, -(10**400), 2**64, 2**1024, 10**18, 0, -1]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([float("nan"), float("inf"), -float("inf"), 1e308, 8.5, -0.0]),
    st.text(max_size=12),
    st.sampled_from(["9" * 5000, "1e400", "0x10", "8 GiB", "  12  ", "yes", "no", "1_000", "-3", "nan", "", "0.5.9rc", "v0.5.99999"]),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
    st.binary(max_size=4),
)
NUMERIC_KEYS = [
    "mem_total_bytes", "mem_available_bytes", "mem_limit_bytes", "gpu_count", "gpu_memory_mib", "tp_size", "pp_size", "dp_size",
    "nnodes", "kv_bytes_per_token", "model_num_layers", "model_kv_lora_rank", "model_qk_rope_head_dim", "model_num_kv_heads",
    "model_head_dim", "model_index_head_dim", "model_num_attention_heads", "device_pool_tokens_per_rank", "requested_gb",
    "os_reserve_min_bytes", "os_reserve_fraction", "rank_overhead_bytes", "frontend_overhead_bytes", "other_committed_bytes",
    "other_engine_ranks", "page_size", "attn_dp_size", "draft_kv_bytes_per_token", "os_reserve_margin_bytes", "idle_used_bytes",
]
KEYS = [
    "mem_total_bytes", "mem_available_bytes", "mem_limit_bytes", "gpu_count", "gpu_memory_mib", "sglang_version",
    "tp_size", "pp_size", "dp_size", "enable_dp_attention", "nnodes", "kv_bytes_per_token", "model_preset",
    "model_attention", "model_num_layers", "model_kv_lora_rank", "model_qk_rope_head_dim", "model_num_kv_heads",
    "model_head_dim", "model_index_head_dim", "model_num_attention_heads", "kv_cache_dtype",
    "device_pool_tokens_per_rank", "requested_gb", "os_reserve_min_bytes", "os_reserve_fraction", "rank_overhead_bytes",
    "frontend_overhead_bytes", "other_committed_bytes", "other_engine_ranks", "page_size", "attn_dp_size",
    "draft_kv_bytes_per_token", "os_reserve_margin_bytes", "idle_used_bytes",
]

BOOL = st.booleans()
_INDEX = {}
_UNIT = st.integers(0, 2**62)


def pick(draw, options):
    """One of the options (an index draw: cheaper than building a sampled_from per draw)."""
    options = list(options)
    if len(options) not in _INDEX:
        _INDEX[len(options)] = st.integers(0, len(options) - 1)
    return options[draw(_INDEX[len(options)])]


def _rotate(items, n):
    return items[n:] + items[:n]


def between(draw, low, high):
    """A whole number in [low, high]."""
    return low + draw(_UNIT) % (high - low + 1)


@st.composite
def versions(draw):
    if pick(draw, range(40)) == 0:
        return pick(draw, ["0.5.4.post1", "0.5.4.post2", "0.5.4.post3", "0.5.4.post3+cu128"])  # read post releases
    base = pick(draw, FINAL + ["0.5.0", "0.5.24", "0.6.1"])
    suffix = pick(draw, SUFFIXES)
    if base == "0.4.9" and suffix and not suffix.startswith(".post"):
        suffix = ""  # nothing is known before 0.4.9
    return base + suffix


@st.composite
def model(draw, pp, attn_tp):
    kind = pick(draw, ["preset", "preset", "mla", "mha", "dsa", "given"])
    inp, hidden = {}, {}
    heads = pick(draw, [None, None, attn_tp * 8, attn_tp * 16, attn_tp * 4]) if pick(draw, range(6)) != 5 else pick(draw, [16, 32, 48, 64, 128])
    # mostly a preset whose heads split over the attention TP size; sometimes one that does not (refused)
    fitting = [name for name, geo in sorted(oracle.PRESETS.items()) if geo["heads"] % attn_tp == 0 and geo["layers"] >= pp]
    if kind == "preset" and not fitting and pick(draw, range(8)) != 7:
        kind = pick(draw, ["mla", "mha", "given"])
    if kind == "preset":
        inp["model_preset"] = pick(draw, fitting if fitting and pick(draw, range(8)) != 7 else sorted(oracle.PRESETS))
    elif kind in ("mla", "dsa"):
        inp.update(model_num_layers=between(draw, 1 if pick(draw, range(10)) == 9 else pp, 128), model_kv_lora_rank=pick(draw, [128, 256, 512]),
                   model_qk_rope_head_dim=pick(draw, [0, 32, 64]))
        if kind == "dsa":
            inp.update(model_attention="dsa", model_kv_lora_rank=512, model_qk_rope_head_dim=64, model_index_head_dim=128)
    elif kind == "mha":
        inp.update(model_num_layers=between(draw, 1 if pick(draw, range(10)) == 9 else pp, 128), model_num_kv_heads=pick(draw, [1, 2, 4, 8, 16, 32, 64]),
                   model_head_dim=pick(draw, [64, 80, 128, 256]))
    else:
        largest = between(draw, 512, 2_000_000)
        inp["kv_bytes_per_token"] = largest
        others = [between(draw, max(1, largest // 2), largest) for _stage in range(pp - 1)]
        stages = others + [largest]
        hidden["stage_kv_bytes"] = _rotate(stages, pick(draw, range(len(stages))))
    if heads is not None and kind != "preset":
        inp["model_num_attention_heads"] = heads
    dtypes = ["auto", "bf16", "bfloat16", "fp8_e4m3"]
    if kind != "dsa":
        dtypes += ["fp8_e5m2", "fp16"]
    elif pick(draw, range(10)) == 9:
        dtypes += ["fp8_e5m2"]  # refused for DSA
    if draw(BOOL):
        inp["kv_cache_dtype"] = pick(draw, dtypes)
    return inp, hidden


@st.composite
def layouts(draw):
    pp = pick(draw, [1, 1, 1, 2, 3, 4, 6, 8])
    nnodes = pick(draw, [1, 1, 1, 2, 3, 4, 6, 8])
    dp = pick(draw, [1, 1, 1, 2, 3, 4, 8])
    dpa = draw(BOOL)
    if nnodes > 1 and dp > 1 and not dpa and pick(draw, range(10)) != 9:
        dpa = True  # mostly layouts SGLang accepts; the rest checks the refusal
    tp = pick(draw, [1, 2, 3, 4, 6, 8, 8, 12, 16, 32])
    if nnodes > 1 and pick(draw, range(3)) != 2:
        tp = max(1, nnodes // pp) * pick(draw, [1, 2, 4, 8]) if pp < nnodes else pick(draw, [1, 2, 4, 8])
    if dpa and dp > 1 and pick(draw, range(5)) != 4:
        tp = dp * pick(draw, [1, 1, 2, 4])
    while tp * pp * (dp if dp > 1 and not dpa else 1) > 64 * nnodes and pick(draw, range(10)) != 9:
        if pp > 1:
            pp = 1
        elif dp > 1 and not dpa:
            dp = 1
        else:
            tp = max(1, tp // 2)
    if (tp * pp) % nnodes and pick(draw, range(8)) != 7:
        tp *= nnodes  # mostly layouts SGLang accepts; the rest checks the refusal
    version = draw(versions())
    inp = {
        "sglang_version": version,
        "tp_size": tp,
        "pp_size": pp,
        "dp_size": dp,
        "enable_dp_attention": dpa,
        "nnodes": nnodes,
    }
    candidates = oracle.releases_of(version)
    one_side = all(r >= (0, 5, 22) for r in candidates) or all(r < (0, 5, 22) for r in candidates)
    newer = all(r >= (0, 5, 22) for r in candidates)
    if dpa and dp > 1 and one_side and pick(draw, range(2 if newer else 24)) == 0:
        # the same layout spelled --attn-dp-size (0.5.22+); sometimes with dp_size too (refused)
        inp["attn_dp_size"] = dp
        if pick(draw, range(8)) != 7:
            inp["dp_size"] = 1
            inp["enable_dp_attention"] = draw(BOOL)
    geometry, hidden = draw(model(pp, max(1, tp // dp) if (dpa and dp > 1) else tp))
    inp.update(geometry)
    total = between(draw, 16, 8192) * GIB + between(draw, 0, GIB - 1)
    inp["mem_total_bytes"] = total
    inp["mem_available_bytes"] = total * between(draw, 30, 100) // 100
    if draw(BOOL):
        inp["mem_limit_bytes"] = max(64 * MIB, total * between(draw, 10, 120) // 100)
    per_node = max(1, tp * pp * (dp if dp > 1 and not dpa else 1) // nnodes)
    fitting = [n for n in (1, 2, 4, 8, 16, 32, 64) if n >= per_node] or [64]
    inp["gpu_count"] = pick(draw, [fitting[0], fitting[-1]]) if pick(draw, range(12)) != 11 else pick(draw, [1, 2, 4, 8, 16])
    inp["gpu_memory_mib"] = pick(draw, [24576, 49140, 81559, 97887, 143771, 196608])
    if draw(BOOL):
        inp["os_reserve_min_bytes"] = min(total, pick(draw, [10 * GIB, 16 * GIB, 32 * GIB]))
    if draw(BOOL):
        inp["os_reserve_fraction"] = pick(draw, [0.0, 0.02, 0.05, 0.1, 0.25])
    if draw(BOOL):
        inp["os_reserve_margin_bytes"] = min(total, pick(draw, [0, 64 * MIB, GIB, 4 * GIB, 32 * GIB]))
    if draw(BOOL):
        inp["idle_used_bytes"] = pick(draw, [0, 2 * MIB, 3 * GIB, total // 40, total // 2])
    if draw(BOOL):
        inp["rank_overhead_bytes"] = pick(draw, [0, 256 * MIB, 2 * GIB, 8 * GIB, 16 * GIB])
    if draw(BOOL):
        inp["frontend_overhead_bytes"] = pick(draw, [0, 512 * MIB, 8 * GIB])
    if draw(BOOL):
        inp["other_committed_bytes"] = min(total, pick(draw, [0, GIB, 64 * GIB]))
    if draw(BOOL):
        inp["other_engine_ranks"] = between(draw, 0, 8)
    if draw(BOOL):
        inp["page_size"] = pick(draw, [1, 16, 32, 64, 64, 128, 256])
    if draw(BOOL):
        inp["device_pool_tokens_per_rank"] = between(draw, 1000, 5_000_000)
    if pick(draw, range(4)) == 0:
        inp["draft_kv_bytes_per_token"] = pick(draw, [1024, 4096, 18432, 70272, between(draw, 64, 200_000)])
    if draw(BOOL):
        inp["requested_gb"] = min(64 * total // 10**9, draw(st.one_of(st.integers(1, 64), st.integers(1, 2000))))
    hidden.update(os_page=pick(draw, [4096, 65536]), gpu_sm=pick(draw, [90, 100]), nsa_trtllm=draw(BOOL))
    return inp, hidden


@st.composite
def mangled(draw):
    """A layout with one thing wrong, or a wrong thing instead of a layout."""
    inp, _hidden = draw(layouts())
    how = pick(draw, ["value", "value", "value", "overflow", "overflow", "unknown-key", "missing", "not-a-dict", "override"])
    overrides = {}
    if how == "value":
        inp[pick(draw, KEYS)] = draw(GARBAGE)
    elif how == "unknown-key":
        inp[pick(draw, ["mem_total_gb", "tp", "hicache_size", "x" * 100, 7, None])] = draw(GARBAGE)
    elif how == "overflow":
        inp[pick(draw, NUMERIC_KEYS)] = pick(draw, [10**400, -(10**400), 2**1024, float("inf"), float("nan"), 1e308, "9" * 5000, "1" * 31])
    elif how == "missing":
        inp.pop(pick(draw, ["mem_total_bytes", "mem_available_bytes", "gpu_count", "gpu_memory_mib", "sglang_version"]))
    elif how == "not-a-dict":
        inp = draw(GARBAGE)
    else:
        overrides[pick(draw, KEYS + ["bogus"])] = draw(GARBAGE)
    return inp, overrides


def _check_layout(inp, hidden, stats):
    try:
        result = hicache_plan(inp)
    except AnsibleFilterError as exc:
        assert str(exc).startswith("hicache_plan: "), str(exc)
        stats["refused by the plan"] += 1
        stats["  refused: " + _reason(str(exc))] += 1
        ran = [r for r in oracle.releases_of(inp["sglang_version"]) if oracle.outcome(inp, hidden, r, 1).refused is None]
        if ran:
            stats["OVER-REFUSED (SGLang %s runs it)" % ".".join(map(str, ran[0]))] += 1
            raise AssertionError("the plan refused a layout SGLang runs: %s" % exc) from exc
        return
    stats["planned"] += 1
    size = result["per_rank_gb"] if result["fits"] else (result["requested_gb"] or result["max_per_rank_gb"])
    for release in oracle.releases_of(inp["sglang_version"]):
        out = oracle.outcome(inp, hidden, release, max(size, 1))
        if out.refused is not None:
            stats["ACCEPTED A LAYOUT SGLANG REFUSES"] += 1
            raise AssertionError("SGLang %s refuses this layout (%s) but the plan accepted it" % (release, out.refused))
        if size >= 1:
            # What the plan says may be pinned covers what SGLang pins on every node, whatever the budget.
            for node in out.nodes:
                pools = node.pinned_bytes + int(inp.get("other_engine_ranks") or 0) * node.largest_rank_bytes
                if pools > result["total_pinned_bytes"]:
                    stats["UNDER-PRICED"] += 1
                    raise AssertionError(
                        "UNDER-PRICED: SGLang %s pins %d bytes of pools on a node at --hicache-size %d, the plan says %d"
                        % (release, pools, size, result["total_pinned_bytes"])
                    )
        if not result["fits"]:
            continue
        for node in out.nodes:
            need, have = oracle.demand_on_node(inp, node)
            if need > have:
                stats["UNSAFE"] += 1
                raise AssertionError(
                    "UNSAFE: SGLang %s at --hicache-size %d needs %d bytes on a node that has %d (plan: %s)"
                    % (release, size, need, have, "\n".join(result["explain"]))
                )
            if node.asserting_ranks:
                stats["START-UP ASSERTION"] += 1
                raise AssertionError("SGLang %s asserts host tokens > device tokens at --hicache-size %d" % (release, size))
    if result["fits"]:
        stats["fits"] += 1
        assert hicache_size(inp) == result["per_rank_gb"]
        if inp.get("requested_gb") is None and len(oracle.releases_of(inp["sglang_version"])) == 1:
            # Efficiency: would one more GB per rank still have fitted, by the oracle's count?
            release = oracle.releases_of(inp["sglang_version"])[0]
            bigger = oracle.outcome(inp, hidden, release, size + 1)
            if all(need <= have for need, have in (oracle.demand_on_node(inp, n) for n in bigger.nodes)):
                stats["fits, one more GB would also have fitted"] += 1
    else:
        stats["does not fit"] += 1
        try:
            hicache_size(inp)
        except AnsibleFilterError:
            pass
        else:
            raise AssertionError("hicache_size returned a size for a plan that does not fit")


def _reason(text):
    for needle in ("divisible by number of nodes", "multi-node data", "tp_size must be divisible by dp_size", "never start",
                   "GPU ranks on each host", "attention heads", "KV heads", "more than the model's", "DSA only supports",
                   "attention data parallelism", "attn_dp_size is SGLang 0.5.22", "--attn-dp-size"):
        if needle in text:
            return needle
    return text[len("hicache_plan: "):][:50]


def _check_mangled(inp, overrides, stats):
    for name, func in (("hicache_plan", hicache_plan), ("hicache_size", hicache_size)):
        try:
            func(inp, **{str(k): v for k, v in overrides.items()})
        except AnsibleFilterError as exc:
            assert str(exc).startswith(name + ": "), str(exc)
            stats["wrong input -> AnsibleFilterError (%s)" % name] += 1
        except Exception as exc:  # noqa: BLE001 - counting any other exception is the point
            stats["NON-FILTER ERROR"] += 1
            raise AssertionError("%s raised %s: %s" % (name, type(exc).__name__, exc)) from exc
        else:
            stats["wrong-looking input accepted (%s)" % name] += 1


def test_plans_are_safe_by_the_oracle_and_errors_are_filter_errors(capsys):
    stats = Counter()

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        phases=[Phase.explicit, Phase.generate, Phase.shrink],
        suppress_health_check=list(HealthCheck),
    )
    @given(case=st.integers(0, 6).flatmap(lambda n: mangled().map(lambda c: ("mangled",) + c) if n == 0 else layouts().map(lambda c: ("layout",) + c)))
    def run(case):
        stats["examples"] += 1
        if case[0] == "layout":
            stats["layouts"] += 1
            _check_layout(case[1], case[2], stats)
        else:
            stats["wrong inputs"] += 1
            _check_mangled(case[1], case[2], stats)

    start = time.monotonic()
    try:
        run()
    finally:
        elapsed = time.monotonic() - start
        with capsys.disabled():
            print(
                "\nhicache property run: %d examples (%d layouts: %d planned, %d refused; %d wrong inputs) in %.1f s"
                " (HICACHE_PROPERTY_EXAMPLES=%d)"
                % (stats["examples"], stats["layouts"], stats["planned"], stats["refused by the plan"], stats["wrong inputs"], elapsed, EXAMPLES)
            )
            for key in sorted(stats):
                print("  %-55s %d" % (key, stats[key]))
            print("  %-55s %d" % ("UNSAFE answers", stats["UNSAFE"]))
            print("  %-55s %d" % ("under-priced pools", stats["UNDER-PRICED"]))
            print("  %-55s %d" % ("non-filter errors", stats["NON-FILTER ERROR"]))
    assert stats["examples"] >= EXAMPLES
    assert stats["layouts"] >= MIN_LAYOUTS
    assert stats["planned"] >= MIN_PLANNED
    assert stats["UNSAFE"] == 0 and stats["NON-FILTER ERROR"] == 0 and stats["UNDER-PRICED"] == 0
