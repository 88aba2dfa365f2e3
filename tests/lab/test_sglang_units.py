"""In-process checks of the SGLang stand-in's arithmetic against sglang-hicache.md (no processes)."""

import re

import pytest
# the stand-in's own source (sglang_standin/src, on the path by pytest.ini), as its wheels install it
from sglang.srt.mem_cache.memory_pool_host import committed_bytes, host_pool_tokens, pow2_ceil
from sglang.srt.model_config import ModelConfig, pp_layers
from sglang.srt.server_args import local_ranks, prepare_server_args, ranks_per_host

from sglang_standin import build_wheels


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    out = tmp_path_factory.mktemp("models")
    build_wheels.write_models(str(out))
    return {name: ModelConfig(str(out / "models" / name)) for name in build_wheels.MODELS}


# sglang-hicache.md section 7 table
@pytest.mark.parametrize("model,tp,kv,expected", [
    ("kimi-k2-tiny", 8, "auto", 70272),
    ("kimi-k2-tiny", 1, "auto", 70272),
    ("kimi-k2-tiny", 8, "fp8_e4m3", 35136),
    ("llama-3-70b-tiny", 8, "auto", 40960),
    ("llama-3-70b-tiny", 8, "fp8_e5m2", 20480),
    ("llama-3-70b-tiny", 4, "auto", 81920),
    ("llama-3-70b-tiny", 1, "auto", 327680),
    ("llama-3-70b-tiny", 16, "auto", 40960),  # KV heads replicated: max(1, 8 // 16)
])
def test_bytes_per_token(models, model, tp, kv, expected):
    mc = models[model]
    assert mc.bytes_per_token(mc.num_layers, tp, kv) == expected


def test_host_tokens_by_version():
    # Kimi-K2 bf16, H=48: 683,060 raw; 683,072 with +1 page at page size 64 (section 7)
    assert host_pool_tokens(48, 2.0, 0, 70272, 1, (0, 5, 5)) == 683060
    assert host_pool_tokens(48, 2.0, 0, 70272, 64, (0, 5, 5)) == 683008  # aligned down
    assert host_pool_tokens(48, 2.0, 0, 70272, 64, (0, 5, 6)) == 683072  # up plus one page
    assert host_pool_tokens(48, 2.0, 0, 40960, 1, (0, 5, 9)) == 1171876  # 1,171,875 + one page of 1
    # ratio path when hicache_size is 0: a token ratio of the device pool
    assert host_pool_tokens(0, 2.0, 1000, 70272, 1, (0, 5, 4)) == 2000


def test_power_of_two_commit():
    assert pow2_ceil(3 * 10 ** 9) == 4 * 2 ** 30
    assert pow2_ceil(2 ** 32) == 2 ** 32
    req = host_pool_tokens(48, 2.0, 0, 70272, 1, (0, 5, 4)) * 70272
    assert committed_bytes(req, (0, 5, 4)) == 2 ** 36  # 68.7 GB per rank (section 2.5)
    assert committed_bytes(req, (0, 5, 5)) == req


def _args(argv, version="0.5.9"):
    return prepare_server_args(["--model-path", "/m"] + argv, version)


@pytest.mark.parametrize("argv,titles,rph", [
    (["--tp", "8"], ["sglang::scheduler_TP%d" % i for i in range(8)], 8),
    ([], ["sglang::scheduler"], 1),
    (["--tp", "2", "--dp", "2"], ["sglang::scheduler_DP0_TP0", "sglang::scheduler_DP0_TP1",
                                  "sglang::scheduler_DP1_TP0", "sglang::scheduler_DP1_TP1"], 2),
    (["--tp", "4", "--dp", "4", "--enable-dp-attention"],
     ["sglang::scheduler_DP0_TP0", "sglang::scheduler_DP1_TP1", "sglang::scheduler_DP2_TP2", "sglang::scheduler_DP3_TP3"], 4),
    (["--tp", "2", "--pp-size", "2"], ["sglang::scheduler_TP0_PP0", "sglang::scheduler_TP1_PP0",
                                       "sglang::scheduler_TP0_PP1", "sglang::scheduler_TP1_PP1"], 4),
    (["--tp", "8", "--nnodes", "2", "--node-rank", "1"], ["sglang::scheduler_TP%d" % i for i in range(4, 8)], 4),
])
def test_local_ranks(argv, titles, rph):
    a = _args(argv)
    assert [r["title"] for r in local_ranks(a)] == titles
    assert ranks_per_host(a) == rph


def test_gpu_ids_dp_without_attention():
    a = _args(["--tp", "2", "--dp", "2", "--base-gpu-id", "1"])
    assert [r["gpu_id"] for r in local_ranks(a)] == [1, 2, 3, 4]


def test_pp_layers_follow_get_pp_indices():
    # SGLang's get_pp_indices (distributed/utils.py): the LAST num_layers % pp_size stages get one more layer.
    assert [pp_layers(61, r, 2) for r in range(2)] == [30, 31]
    assert [pp_layers(80, r, 3) for r in range(3)] == [26, 27, 27]
    assert [pp_layers(11, r, 4) for r in range(4)] == [2, 3, 3, 3]
    assert pp_layers(61, 0, 1) == 61


# entrypoints/engine.py: node i runs tp // max(nnodes // pp, 1) TP ranks x max(pp // nnodes, 1) stages
@pytest.mark.parametrize("tp,pp,nnodes,per_node,stages_by_node", [
    (8, 2, 2, 8, [[0], [1]]),
    (8, 2, 4, 4, [[0], [0], [1], [1]]),
    (4, 4, 2, 8, [[0, 1], [2, 3]]),
    (6, 2, 3, 6, [[0], [1], [2]]),  # pp does not divide nnodes: node 2 gets a stage that does not exist
])
def test_rank_placement_per_node_rank(tp, pp, nnodes, per_node, stages_by_node):
    for node_rank in range(nnodes):
        a = _args(["--tp", str(tp), "--pp-size", str(pp), "--nnodes", str(nnodes), "--node-rank", str(node_rank)])
        ranks = local_ranks(a)
        assert len(ranks) == per_node
        assert sorted({r["pp_rank"] for r in ranks}) == stages_by_node[node_rank]
        assert ranks_per_host(a) == max(tp * pp // nnodes, 1)  # what SGLang's own check divides by (0.5.19+)


@pytest.mark.parametrize("argv,version,message", [
    (["--tp", "6", "--nnodes", "4", "--node-rank", "1"], "0.5.9", "tp_size must be divisible by number of nodes"),
    (["--tp", "4", "--dp", "2", "--nnodes", "2"], "0.5.9", "multi-node data parallel is not supported unless dp attention!"),
    (["--tp", "4", "--dp", "2", "--nnodes", "2"], "0.5.22", "multi-node data-parallel replicas are not supported"),
])
def test_check_server_args(argv, version, message):
    with pytest.raises(AssertionError, match=re.escape(message)):
        _args(argv, version)
    # with DP attention the DP groups share the TP ranks and may span nodes
    if "--dp" in argv:
        assert _args(argv + ["--enable-dp-attention"], version)["enable_dp_attention"] is True


def test_dp_attention_is_off_with_dp_1():
    assert _args(["--tp", "4", "--enable-dp-attention"])["enable_dp_attention"] is False


def test_hicache_args_by_version():
    assert _args([], "0.5.18")["hicache_ratio"] == 2.0
    assert _args([], "0.5.14")["hicache_mem_layout"] == "layer_first"
    assert _args([], "0.5.15")["hicache_mem_layout"] == "page_first"
    a = _args(["--enable-hierarchical-cache"], "0.5.21")
    assert a["hicache_host_memory_fraction"] == 0.8 and a["hicache_ratio"] == 2.0
    assert _args(["--hicache-size", "4"], "0.5.21")["hicache_host_memory_fraction"] is None
    assert _args(["--hicache-ratio", "1.5"], "0.5.21")["hicache_host_memory_fraction"] is None
    with pytest.raises(ValueError, match=r"must be in \(0, 1\]"):
        _args(["--hicache-host-memory-fraction", "1.5"], "0.5.21")
    with pytest.raises(SystemExit) as e:
        _args(["--hicache-host-memory-fraction", "0.5"], "0.5.20")  # not an argument before 0.5.21
    assert e.value.code == 2
    with pytest.raises(SystemExit) as e:
        _args(["--enable-hicache"], "0.5.21")
    assert e.value.code == 2
    assert _args(["--enable-hicache"], "0.5.23")["enable_hierarchical_cache"] is True


# Choice lists (server_args_choices.py, copied from each release's wheel): anything else exits 2 as argparse does.
CHOICE_FLAGS = ["--load-format", "--quantization", "--attention-backend", "--prefill-attention-backend",
                "--decode-attention-backend", "--schedule-policy", "--hicache-storage-backend"]


@pytest.mark.parametrize("version", ["0.5.2", "0.5.9", "0.5.15", "0.5.23"])
@pytest.mark.parametrize("flag", CHOICE_FLAGS)
def test_choice_flags_refuse_unknown_values(version, flag, capsys):
    with pytest.raises(SystemExit) as e:
        prepare_server_args(["--model-path", "/m", flag, "no-such-value"], version)
    assert e.value.code == 2
    assert "invalid choice: 'no-such-value'" in capsys.readouterr().err


@pytest.mark.parametrize("version,flag,value,accepted", [
    ("0.5.9", "--load-format", "safetensors", True),
    ("0.5.9", "--load-format", "runai_streamer", False),   # added in 0.5.10
    ("0.5.10", "--load-format", "runai_streamer", True),
    ("0.5.9", "--quantization", "fp8", True),
    ("0.5.9", "--quantization", "modelopt_mixed", False),  # added in 0.5.10
    ("0.5.18", "--quantization", "marlin", True),
    ("0.5.20", "--quantization", "marlin", False),         # dropped in 0.5.20
    ("0.5.2", "--attention-backend", "fa3", True),
    ("0.5.2", "--attention-backend", "fa4", False),        # added in 0.5.4
    ("0.5.4", "--prefill-attention-backend", "fa4", True),
    ("0.5.19", "--decode-attention-backend", "dual_chunk_flash_attn", True),
    ("0.5.20", "--decode-attention-backend", "dual_chunk_flash_attn", False),
    ("0.5.2", "--schedule-policy", "priority", False),     # added in 0.5.4
    ("0.5.4", "--schedule-policy", "priority", True),
    ("0.5.20", "--schedule-policy", "hrrn", True),
    ("0.5.2", "--hicache-storage-backend", "file", True),
    ("0.5.2", "--hicache-storage-backend", "mooncake", True),
    ("0.5.2", "--hicache-storage-backend", "eic", False),  # added in 0.5.4
    ("0.5.23", "--hicache-storage-backend", "seaweedfs", True),
])
def test_choice_lists_follow_the_release(version, flag, value, accepted):
    argv = ["--model-path", "/m", flag, value]
    if accepted:
        args = prepare_server_args(argv, version)
        assert args[flag[2:].replace("-", "_")] == value
    else:
        with pytest.raises(SystemExit) as e:
            prepare_server_args(argv, version)
        assert e.value.code == 2


def test_defaults_are_in_the_choice_lists():
    from sglang.srt.server_args_choices import CHOICES, choices_for
    for flag in CHOICES:
        for first, _ in CHOICES[flag]:
            assert choices_for(flag, first) is not None
    for version in ["0.5.2", "0.5.23"]:
        args = prepare_server_args(["--model-path", "/m"], version)
        assert args["load_format"] == "auto" and args["schedule_policy"] == "fcfs"


def test_attn_dp_size_from_0_5_22_runs_the_ranks_of_dp_attention_and_is_refused_as_sglang_refuses_it():
    args = _args(["--tp", "4", "--attn-dp-size", "4"], "0.5.23")
    assert args["dp_size"] == 4 and args["enable_dp_attention"] is True
    with pytest.raises(ValueError, match="replicas combined with attention data parallelism"):
        _args(["--tp", "4", "--dp", "2", "--attn-dp-size", "2"], "0.5.22")
    with pytest.raises(AssertionError):
        _args(["--tp", "4", "--attn-dp-size", "3"], "0.5.23")
    with pytest.raises(SystemExit):
        _args(["--tp", "4", "--attn-dp-size", "4"], "0.5.21")
