"""SGLang's server arguments (names, types, defaults by version; sglang-hicache.md section 1).

argparse as in SGLang: an unknown argument or a bad type (e.g. `--hicache-size 8.5`, type int)
exits with code 2.  The resulting dict plays the part of `dataclasses.asdict(server_args)`.
"""

import argparse

from sglang.srt.server_args_choices import choices_for
from sglang.version import parse

KV_CACHE_DTYPES = ["auto", "fp8_e5m2", "fp8_e4m3", "bf16", "bfloat16", "fp4_e2m1"]
WRITE_POLICIES = ["write_back", "write_through", "write_through_selective"]
MEM_LAYOUTS = ["layer_first", "page_first", "page_first_direct", "page_first_kv_split", "page_head"]


def _str2bool(v):
    return str(v).lower() in ("1", "true", "yes", "on")


def build_parser(version: str) -> argparse.ArgumentParser:
    v = parse(version)
    p = argparse.ArgumentParser(prog="python3 -m sglang.launch_server")
    a = p.add_argument

    def ch(flag):  # the release's own choice list (server_args_choices.py): other values exit 2 as in SGLang
        return choices_for(flag, v)
    # model and tokenizer
    a("--model-path", "--model", dest="model_path", type=str, required=True)
    a("--tokenizer-path", type=str, default=None)
    a("--tokenizer-mode", type=str, default="auto", choices=["auto", "slow"])
    a("--skip-tokenizer-init", action="store_true")
    a("--load-format", type=str, default="auto", choices=ch("--load-format"))
    a("--trust-remote-code", action="store_true")
    a("--dtype", type=str, default="auto", choices=["auto", "half", "float16", "bfloat16", "float", "float32"])
    a("--kv-cache-dtype", type=str, default="auto", choices=KV_CACHE_DTYPES)
    a("--quantization", type=str, default=None, choices=ch("--quantization"))
    a("--context-length", type=int, default=None)
    a("--device", type=str, default=None)
    a("--served-model-name", type=str, default=None)
    a("--chat-template", type=str, default=None)
    a("--revision", type=str, default=None)
    a("--weight-loader-disable-mmap", action="store_true")
    # HTTP server
    a("--host", type=str, default="127.0.0.1")
    a("--port", type=int, default=30000)
    a("--api-key", type=str, default=None)
    a("--skip-server-warmup", action="store_true")
    a("--watchdog-timeout", type=float, default=300)
    # memory and scheduling
    a("--mem-fraction-static", type=float, default=None)
    a("--max-running-requests", type=int, default=None)
    a("--max-total-tokens", type=int, default=None)
    a("--chunked-prefill-size", type=int, default=None)
    a("--max-prefill-tokens", type=int, default=16384)
    a("--schedule-policy", type=str, default="fcfs", choices=ch("--schedule-policy"))
    a("--schedule-conservativeness", type=float, default=1.0)
    a("--page-size", type=int, default=1)
    # parallelism
    a("--tensor-parallel-size", "--tp-size", "--tp", dest="tp_size", type=int, default=1)
    a("--pipeline-parallel-size", "--pp-size", "--pp", dest="pp_size", type=int, default=1)
    a("--data-parallel-size", "--dp-size", "--dp", dest="dp_size", type=int, default=1)
    a("--expert-parallel-size", "--ep-size", "--ep", dest="ep_size", type=int, default=1)
    a("--enable-dp-attention", action="store_true")
    if v >= (0, 5, 22):
        # arg_groups/fields/parallel.py attn_dp_size (0.5.22, 0.5.23); older releases exit 2 on the flag
        a("--attn-dp-size", dest="attn_dp_size", type=int, default=1)
    a("--base-gpu-id", type=int, default=0)
    a("--gpu-id-step", type=int, default=1)
    a("--random-seed", type=int, default=None)
    a("--dist-init-addr", "--nccl-init-addr", dest="dist_init_addr", type=str, default=None)
    a("--nnodes", type=int, default=1)
    a("--dist-timeout", type=int, default=None)
    a("--node-rank", type=int, default=0)
    # logging and metrics
    a("--log-level", type=str, default="info")
    a("--log-level-http", type=str, default=None)
    a("--log-requests", action="store_true")
    a("--enable-metrics", action="store_true")
    a("--show-time-cost", action="store_true")
    # kernels and optimisations (accepted; no effect in the stand-in)
    a("--attention-backend", type=str, default=None, choices=ch("--attention-backend"))
    a("--prefill-attention-backend", type=str, default=None, choices=ch("--prefill-attention-backend"))
    a("--decode-attention-backend", type=str, default=None, choices=ch("--decode-attention-backend"))
    a("--sampling-backend", type=str, default=None)
    a("--disable-radix-cache", action="store_true")
    a("--disable-cuda-graph", action="store_true")
    a("--cuda-graph-max-bs", type=int, default=None)
    a("--enable-torch-compile", action="store_true")
    a("--disable-overlap-schedule", action="store_true")
    a("--enable-mixed-chunk", action="store_true")
    a("--tool-call-parser", type=str, default=None)
    a("--reasoning-parser", type=str, default=None)
    a("--speculative-algorithm", type=str, default=None)
    # hierarchical cache
    hicache_flags = ["--enable-hierarchical-cache"]
    if v >= (0, 5, 23):
        hicache_flags.append("--enable-hicache")  # alias in 0.5.23 (section 1.1)
    a(*hicache_flags, dest="enable_hierarchical_cache", action="store_true")
    a("--hicache-ratio", type=float, default=2.0 if v <= (0, 5, 18) else None)
    a("--hicache-size", type=int, default=0)
    a("--hicache-write-policy", type=str, choices=WRITE_POLICIES, default="write_through")
    io_backends = ["direct", "kernel", "kernel_ascend"]
    a("--hicache-io-backend", type=str, choices=io_backends, default="kernel")
    a("--hicache-mem-layout", type=str, choices=MEM_LAYOUTS, default="page_first" if v >= (0, 5, 15) else "layer_first")
    a("--hicache-storage-backend", type=str, default=None, choices=ch("--hicache-storage-backend"))
    a("--hicache-storage-prefetch-policy", type=str, choices=["best_effort", "wait_complete", "timeout"],
      default="timeout" if v >= (0, 5, 12) else "best_effort")
    a("--hicache-storage-backend-extra-config", type=str, default=None)
    if v >= (0, 5, 9):
        a("--disable-hicache-numa-detect", action="store_true")
    if v >= (0, 5, 19):
        a("--hicache-host-memory-mode", type=str, choices=["cache", "buffer_only"], default="cache")
    if v >= (0, 5, 21):
        a("--hicache-host-memory-fraction", type=float, default=0.8)
    return p


def prepare_server_args(argv, version: str) -> dict:
    """Parse (exit 2 on argparse errors) and post-process like ServerArgs.__post_init__."""
    ns = build_parser(version).parse_args(argv)
    args = dict(vars(ns))
    v = parse(version)
    if args["tokenizer_path"] is None:
        args["tokenizer_path"] = args["model_path"]
    if args["served_model_name"] is None:
        args["served_model_name"] = args["model_path"]
    if args["mem_fraction_static"] is None:
        # SGLang derives it from the GPU memory and parallelism; the stand-in uses a fixed value
        # (unsourced), overridable for the lab.
        try:
            import os

            args["mem_fraction_static"] = float(os.environ.get("SGLANG_STANDIN_MEM_FRACTION_STATIC", "0.88"))
        except ValueError:
            args["mem_fraction_static"] = 0.88
    if args["chunked_prefill_size"] is None:
        args["chunked_prefill_size"] = 8192
    if args["log_level_http"] is None:
        args["log_level_http"] = args["log_level"]
    if args["page_size"] is None or args["page_size"] < 1:
        args["page_size"] = 1

    # _handle_cache_compatibility (section 1.3)
    if args["enable_hierarchical_cache"] and args["disable_radix_cache"]:
        raise ValueError(
            "The arguments enable-hierarchical-cache and disable-radix-cache are mutually exclusive "
            "and cannot be used at the same time. Please use only one of them."
        )
    if args["enable_hierarchical_cache"] and args["hicache_mem_layout"] == "page_first_direct" and args["hicache_io_backend"] == "kernel":
        args["hicache_io_backend"] = "direct"

    explicit_ratio = args["hicache_ratio"] is not None and "--hicache-ratio" in " ".join(argv)
    if v >= (0, 5, 21):
        frac = args.get("hicache_host_memory_fraction")
        if frac is not None and not (0 < frac <= 1):
            raise ValueError("--hicache-host-memory-fraction must be in (0, 1].")
        if explicit_ratio or args["hicache_size"] > 0:
            args["hicache_host_memory_fraction"] = None  # explicit ratio or size disables auto-sizing
    if v >= (0, 5, 19):
        if args["hicache_host_memory_mode"] == "buffer_only" and args["enable_hierarchical_cache"] and not args["hicache_storage_backend"]:
            # unsourced text: "buffer_only requires a storage backend" (section 1.1)
            raise ValueError("--hicache-host-memory-mode buffer_only requires --hicache-storage-backend.")
        if args["hicache_ratio"] is None:
            args["hicache_ratio"] = 2.0 if args["hicache_host_memory_mode"] == "cache" else 1.2
    args["_explicit_hicache_ratio"] = explicit_ratio

    if v >= (0, 5, 22) and args.get("attn_dp_size", 1) != 1:
        # arg_groups/parallel_hook.py handle_data_parallelism (0.5.22, 0.5.23); the stand-in then runs the same
        # ranks as the deprecated --dp-size N --enable-dp-attention (handle_deprecated_dp_attention)
        if args["attn_dp_size"] < 1:
            raise ValueError("--attn-dp-size must be positive (got %d)." % args["attn_dp_size"])
        if args["dp_size"] > 1:
            raise ValueError("--dp-size %d with --attn-dp-size %d: data-parallel replicas combined with attention data "
                             "parallelism are not supported." % (args["dp_size"], args["attn_dp_size"]))
        assert args["tp_size"] % args["attn_dp_size"] == 0
        args["dp_size"], args["enable_dp_attention"] = args["attn_dp_size"], True
    # _handle_data_parallelism (0.5.9 server_args.py): DP attention is switched off with dp_size 1.
    if args["dp_size"] == 1:
        args["enable_dp_attention"] = False
    if args["enable_dp_attention"]:
        if args["dp_size"] < 1 or args["tp_size"] % args["dp_size"] != 0:
            raise ValueError("tp_size must be divisible by dp_size when --enable-dp-attention is set")
    if args["nnodes"] < 1 or not (0 <= args["node_rank"] < args["nnodes"]):
        raise ValueError("node_rank must be in [0, nnodes)")
    check_server_args(args, v)
    return args


def check_server_args(args: dict, v) -> None:
    """ServerArgs.check_server_args (server_args.py up to 0.5.18, arg_groups/validation_hook.py
    from 0.5.19): the parallel-size assertions, raised as AssertionError with SGLang's texts."""
    assert (args["tp_size"] * args["pp_size"]) % args["nnodes"] == 0, "tp_size must be divisible by number of nodes"
    if v >= (0, 5, 22):
        # --dp-size N --enable-dp-attention became --attn-dp-size N (dp_size 1) before this check
        assert not (args["dp_size"] > 1 and args["nnodes"] != 1 and not args["enable_dp_attention"]), (
            "multi-node data-parallel replicas are not supported; use attention DP (--attn-dp-size) across nodes"
        )
    else:
        assert not (
            args["dp_size"] > 1 and args["nnodes"] != 1 and not args["enable_dp_attention"]
        ), "multi-node data parallel is not supported unless dp attention!"


def public(args: dict) -> dict:
    """The server_args dict as /server_info shows it (internal keys removed)."""
    return {k: v for k, v in args.items() if not k.startswith("_")}


def attn_tp_size(args: dict) -> int:
    if args["enable_dp_attention"]:
        return max(1, args["tp_size"] // max(1, args["dp_size"]))
    return args["tp_size"]


def local_ranks(args: dict):
    """The scheduler processes SGLang starts on this node, as dicts with tp_rank, pp_rank, dp_rank,
    gpu_id (CUDA ordinal) and the process title: entrypoints/engine.py _launch_scheduler_processes
    (0.5.9; _calculate_rank_ranges from 0.5.10, the same formula to 0.5.23) and
    data_parallel_controller.py launch_tensor_parallel_group / launch_dp_schedulers: node i runs
    tp // max(nnodes // pp, 1) TP ranks x max(pp // nnodes, 1) PP stages (times dp groups without
    DP attention, one node only), which is tp x pp / nnodes only where pp and nnodes divide each
    other; a node whose PP range passes the last stage starts ranks that cannot join."""
    tp, pp, dp, nnodes, node_rank = args["tp_size"], args["pp_size"], args["dp_size"], args["nnodes"], args["node_rank"]
    pp_size_per_node = max(pp // nnodes, 1)
    nnodes_per_pp_rank = max(nnodes // pp, 1)
    tp_size_per_node = tp // nnodes_per_pp_rank
    tp_range = range(tp_size_per_node * (node_rank % nnodes_per_pp_rank), tp_size_per_node * (node_rank % nnodes_per_pp_rank + 1))
    pp_range = range(pp_size_per_node * (node_rank // nnodes_per_pp_rank), pp_size_per_node * (node_rank // nnodes_per_pp_rank + 1))
    step = args["gpu_id_step"]
    ranks = []
    groups = [None] if dp == 1 else ([None] if args["enable_dp_attention"] else list(range(dp)))
    for g in groups:
        # without DP attention, each DP replica is a full TP x PP group on its own GPUs
        base = args["base_gpu_id"] + (0 if g is None else g * tp_size_per_node * pp_size_per_node * step)
        for pp_rank in pp_range:
            for tp_rank in tp_range:
                gpu_id = base + ((pp_rank % pp_size_per_node) * tp_size_per_node) + (tp_rank % tp_size_per_node) * step
                if dp > 1 and args["enable_dp_attention"]:
                    dp_rank = tp_rank // attn_tp_size(args)
                else:
                    dp_rank = g
                prefix = ""
                if dp_rank is not None:
                    prefix += " DP%d" % dp_rank
                if tp > 1:
                    prefix += " TP%d" % tp_rank
                if pp > 1:
                    prefix += " PP%d" % pp_rank
                ranks.append({
                    "tp_rank": tp_rank,
                    "pp_rank": pp_rank,
                    "dp_rank": dp_rank,
                    "gpu_id": gpu_id,
                    "prefix": prefix,
                    "title": "sglang::scheduler" + prefix.replace(" ", "_"),
                })
    return ranks


def ranks_per_host(args: dict) -> int:
    """SGLang 0.5.19+'s ranks_per_host(): world_size // nnodes with world_size = tp * pp (no DP
    replicas; section 2.4)."""
    return max(args["tp_size"] * args["pp_size"] // max(args["nnodes"], 1), 1)
