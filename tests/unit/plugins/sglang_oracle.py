"""What SGLang would really do on each host for a launch: an oracle for the sizing model's tests.

Written from SGLang's released source (the wheels of 0.4.9 to 0.5.23, read file by file; see the
table in docs/sizing.md), independently of plugins/module_utils/sizing/hicache.py, which it never
imports: it re-enacts the launcher's loops, the argument checks, get_pp_indices, HostKVCache's token
arithmetic, the DSA indexer pools and the allocators, rank by rank and node by node, and reports
what each node pins.  Its inputs are the plan's inputs plus the facts a plan cannot know (the GPU
generation, the attention backend, the OS page size, the layer split behind a bare
kv_bytes_per_token).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

GIB = 2**30
MIB = 2**20

# The final releases (0.5.0 was published as release candidates only).
RELEASES = [(0, 4, 9), (0, 4, 10)] + [(0, 5, n) for n in range(1, 24)]

# docs/sizing.md, "Policy defaults".
POLICY_DEFAULTS = {
    "os_reserve_min_bytes": 10 * GIB,
    "os_reserve_margin_bytes": 4 * GIB,
    "os_reserve_fraction": 0.0,
    "rank_overhead_bytes": 8 * GIB,
    "frontend_overhead_bytes": 8 * GIB,
    "other_committed_bytes": 0,
    "other_engine_ranks": 0,
    "page_size": 64,
}

PRESETS = {
    "kimi-k2": dict(kind="mla", layers=61, lora=512, rope=64, heads=64),
    "deepseek-v3": dict(kind="mla", layers=61, lora=512, rope=64, heads=128),
    "deepseek-v3.2": dict(kind="dsa", layers=61, lora=512, rope=64, index_dim=128, heads=128),
    "glm-5": dict(kind="dsa", layers=78, lora=512, rope=64, index_dim=128, heads=64),
    "llama-3-70b": dict(kind="mha", layers=80, kv_heads=8, head_dim=128, heads=64),
    "llama-3-8b": dict(kind="mha", layers=32, kv_heads=8, head_dim=128, heads=32),
}

DTYPE_BYTES = {"auto": 2, "bf16": 2, "bfloat16": 2, "fp16": 2, "float16": 2, "half": 2, "fp8_e4m3": 1, "fp8_e5m2": 1, "fp8": 1, "fp32": 4, "float32": 4}


def releases_of(version: str) -> List[Tuple[int, int, int]]:
    """The releases whose code a version string may carry: a final release is itself; an rc/dev
    build of X sits between the release before X and X; a post release of X between X and the next
    release; a +local build may be either neighbour too; past 0.5.23, 0.5.23."""
    m = re.match(r"^v?(\d+)\.(\d+)\.(\d+)(.*)$", version.strip().lower())
    assert m, version
    base = (int(m.group(1)), int(m.group(2)), int(m.group(3)))
    rest = m.group(4)
    if base > RELEASES[-1]:
        return [RELEASES[-1]]
    before = [r for r in RELEASES if r < base]
    after = [r for r in RELEASES if r > base]
    out = set()
    is_post = "post" in rest
    is_pre = bool(re.search(r"(rc|a|b|alpha|beta|pre|dev)\d*", rest.split("+")[0])) and not is_post
    post = re.match(r"^[.\-_]?(?:post|rev|r)[.\-_]?(\d*)", rest)
    if is_post and base == (0, 5, 4) and post and int(post.group(1) or 0) >= 2:
        # 0.5.4.post2 and .post3 carry 0.5.5's memory_pool_host.py (torch.empty + cudaHostRegister, read in
        # both wheels); as a 4-tuple it sorts after 0.5.4 and before 0.5.5 in every rule's comparison.
        out.add((0, 5, 4, int(post.group(1))))
        out.add(after[0])
    elif is_post:
        out.add(base if base in RELEASES else before[-1])
        if after:
            out.add(after[0])
    elif is_pre:
        out.add(before[-1])
        out.add(base if base in RELEASES else after[0])
    elif base in RELEASES:
        out.add(base)
    else:
        out.update([before[-1], after[0]])
    if "+" in rest:
        lower = [r for r in RELEASES if r < min(out)]
        upper = [r for r in RELEASES if r > max(out)]
        out.update(lower[-1:] + upper[:1])
    return sorted(out)


@dataclass
class Node:
    processes: int = 0
    pinned_bytes: int = 0
    largest_rank_bytes: int = 0
    asserting_ranks: int = 0


@dataclass
class Outcome:
    refused: Optional[str] = None
    nodes: List[Node] = field(default_factory=list)


def get_pp_indices(num_layers: int, pp_rank: int, pp_size: int) -> Tuple[int, int]:
    """distributed/utils.py get_pp_indices without SGLANG_PP_LAYER_PARTITION."""
    base_layers = num_layers // pp_size
    remainder = num_layers % pp_size
    if pp_rank >= pp_size - remainder:
        partitions_without_extra_layer = pp_size - remainder
        start = pp_rank * (base_layers + 1) - partitions_without_extra_layer
        return start, start + base_layers + 1
    return pp_rank * base_layers, pp_rank * base_layers + base_layers


def launched_ranks(tp: int, pp: int, dp: int, dp_attention: bool, nnodes: int, node_rank: int) -> List[Tuple[int, int, int, int]]:
    """(dp group, pp_rank, tp_rank, gpu_id) of every scheduler process one node starts:
    entrypoints/engine.py _launch_scheduler_processes and data_parallel_controller.py
    launch_tensor_parallel_group, launch_dp_schedulers."""
    pp_size_per_node = max(pp // nnodes, 1)
    nnodes_per_pp_rank = max(nnodes // pp, 1)
    pp_rank_range = range(pp_size_per_node * (node_rank // nnodes_per_pp_rank), pp_size_per_node * (node_rank // nnodes_per_pp_rank + 1))
    nnodes_per_tp_group = nnodes_per_pp_rank
    tp_size_per_node = tp // nnodes_per_tp_group
    tp_rank_range = range(tp_size_per_node * (node_rank % nnodes_per_tp_group), tp_size_per_node * (node_rank % nnodes_per_tp_group + 1))
    groups = dp if (dp > 1 and not dp_attention) else 1
    out = []
    base_gpu_id = 0
    for group in range(groups):
        for pp_rank in pp_rank_range:
            for tp_rank in tp_rank_range:
                gpu_id = base_gpu_id + (pp_rank % pp_size_per_node) * tp_size_per_node + (tp_rank % tp_size_per_node)
                out.append((group, pp_rank, tp_rank, gpu_id))
        base_gpu_id += tp * pp
    return out


def _rss(nbytes: int, release: Tuple[int, int, int], os_page: int) -> int:
    """Host memory one pinned buffer takes: torch's CachingHostAllocator rounds to PowerOf2Ceil up
    to 0.5.4; 0.5.5-0.5.12 torch.empty (posix_memalign through glibc's mmap, header included) then
    cudaHostRegister; from 0.5.13 alloc_mmap (whole pages)."""
    if nbytes <= 0:
        return 0
    if release <= (0, 5, 4):
        size = 1 << (nbytes - 1).bit_length() if nbytes > 1 else 1
        return -(-size // os_page) * os_page
    if release <= (0, 5, 12):
        return -(-(nbytes + 128) // os_page) * os_page
    return -(-nbytes // os_page) * os_page


def outcome(inp: Dict, hidden: Dict, release: Tuple[int, int, int], hicache_size: int) -> Outcome:
    """What SGLang `release` does on every node when launched with the plan input and
    --hicache-size hicache_size."""
    tp = int(inp.get("tp_size") or 1)
    pp = int(inp.get("pp_size") or 1)
    dp = int(inp.get("dp_size") or 1)
    nnodes = int(inp.get("nnodes") or 1)
    dpa = str(inp.get("enable_dp_attention", False)).lower() in ("true", "1", "yes", "on")
    if dp == 1:
        dpa = False
    attn_dp = int(inp.get("attn_dp_size") or 1)
    if attn_dp > 1:
        # --attn-dp-size arrived in 0.5.22 (arg_groups/fields/parallel.py); older argparse exits on it.
        if release < (0, 5, 22):
            return Outcome(refused="unrecognized arguments: --attn-dp-size")
        # arg_groups/parallel_hook.py handle_data_parallelism
        if dp > 1:
            return Outcome(refused="data-parallel replicas combined with attention data parallelism")
        if tp % attn_dp:
            return Outcome(refused="tp % attn_dp")
        dp, dpa = attn_dp, True  # num_dp_ranks = dp x attn_dp; one TP group, as DP attention
    policy = dict(POLICY_DEFAULTS)
    policy.update({k: v for k, v in inp.items() if k in POLICY_DEFAULTS and v is not None})
    page = int(policy["page_size"])

    # check_server_args and the server_args handlers
    if (tp * pp) % nnodes != 0:
        return Outcome(refused="tp_size must be divisible by number of nodes")
    if dp > 1 and nnodes != 1 and not dpa:
        return Outcome(refused="multi-node data parallel")
    if dpa and tp % dp != 0:
        return Outcome(refused="tp % dp")

    geometry = dict(PRESETS[inp["model_preset"]]) if inp.get("model_preset") else {}
    for key, name in (("layers", "model_num_layers"), ("lora", "model_kv_lora_rank"), ("rope", "model_qk_rope_head_dim"),
                      ("kv_heads", "model_num_kv_heads"), ("head_dim", "model_head_dim"), ("index_dim", "model_index_head_dim"),
                      ("heads", "model_num_attention_heads"), ("kind", "model_attention")):
        if inp.get(name) is not None:
            geometry[key] = inp[name]
    attn_tp = tp // dp if dpa else tp
    dtype = str(inp.get("kv_cache_dtype") or "auto")
    layers = geometry.get("layers")
    if layers is not None and pp > layers:
        return Outcome(refused="a stage without layers")
    if geometry.get("heads") is not None and geometry["heads"] % attn_tp != 0:
        return Outcome(refused="heads not divisible")
    kind = geometry.get("kind")
    if kind is None and geometry:
        kind = "dsa" if "index_dim" in geometry else ("mla" if "lora" in geometry else ("mha" if "kv_heads" in geometry else None))
    if kind in ("mha", "gqa"):
        kvh = geometry["kv_heads"]
        if not (kvh % attn_tp == 0 or attn_tp % kvh == 0):
            return Outcome(refused="kv heads not divisible")
    if kind == "dsa" and dtype not in ("auto", "bf16", "bfloat16", "fp8_e4m3"):
        return Outcome(refused="DSA dtype")

    # per-layer bytes of one token on one rank, as the device pool stores it (store_dtype)
    index_layer = 0
    if inp.get("kv_bytes_per_token") is not None:
        stage_bytes = hidden["stage_kv_bytes"]  # the real stages behind the given figure
        assert len(stage_bytes) == pp
        per_stage = [(b, None) for b in stage_bytes]
    else:
        if kind == "mha" or kind == "gqa":
            per_layer = 2 * geometry["head_dim"] * max(1, geometry["kv_heads"] // attn_tp) * DTYPE_BYTES[dtype]
        elif kind == "mla":
            per_layer = (geometry["lora"] + geometry["rope"]) * DTYPE_BYTES[dtype]
        else:  # DSA: _set_default_nsa_kv_cache_dtype, calculate_mla_kv_cache_dim
            resolved = dtype
            if resolved == "auto":
                resolved = "fp8_e4m3" if hidden.get("gpu_sm", 90) >= 100 else "bfloat16"
            lora, rope = geometry["lora"], geometry["rope"]
            if resolved in ("bf16", "bfloat16"):
                per_layer = (lora + rope) * 2
            elif hidden.get("nsa_trtllm") or release <= (0, 5, 8):
                per_layer = lora + rope
            else:
                per_layer = lora + lora // 128 * 4 + rope * 2
            if release >= (0, 5, 9):
                index_layer = geometry["index_dim"] + geometry["index_dim"] // 128 * 4
        per_stage = []
        for rank in range(pp):
            start, end = get_pp_indices(layers, rank, pp)
            per_stage.append((per_layer * (end - start), end - start))

    def size_per_token(stage: int) -> int:
        kv, n = per_stage[stage]
        if index_layer and (0, 5, 9) <= release <= (0, 5, 18):
            return kv + index_layer * n
        return kv

    # HostKVCache.__init__: host_size > 0 -> int(host_size * 1e9 // size_per_token)
    raw = [int(hicache_size * 1e9 // size_per_token(s)) for s in range(pp)]
    if release >= (0, 5, 15) and pp > 1:
        raw = [min(raw)] * pp  # sync_fixed_hicache_size: all_reduce MIN over the PP group

    def pool(stage: int) -> Tuple[int, int]:
        size = raw[stage]
        if release <= (0, 5, 5):
            size = size - size % page
        else:
            page_num = size // page + 1
            size = page_num * page
        kv, n = per_stage[stage]
        os_page = hidden.get("os_page", 4096)
        total = _rss(size * kv, release, os_page)
        draft = int(inp.get("draft_kv_bytes_per_token") or 0)
        if draft:
            # build_full_draft_pools: 0.5.23 host_token_capacity = the target's logical size; 0.5.22 and before
            # a ratio of it, then one page more (pool_host/base.py); releases not read are taken the same way.
            draft_tokens = size if release >= (0, 5, 23) else (size // page + 1) * page
            total += _rss(draft_tokens * draft, release, os_page)
        if index_layer and n:
            indexer_page_num = (size + page + 1) // page
            per_layer_bytes = indexer_page_num * page * index_layer
            if release <= (0, 5, 18):
                total += n * _rss(per_layer_bytes, release, os_page)  # NSATokenToKVPoolHost: one buffer per layer
            else:
                total += _rss(n * per_layer_bytes, release, os_page)  # DSAIndexerPoolHost (pool_host/dsa.py)
        return size, total

    stage_pools = [pool(s) for s in range(pp)]
    gpu_count = int(inp["gpu_count"])
    device_tokens = inp.get("device_pool_tokens_per_rank")
    nodes = []
    covered = set()
    for node_rank in range(nnodes):
        node = Node()
        for group, pp_rank, tp_rank, gpu_id in launched_ranks(tp, pp, dp, dpa, nnodes, node_rank):
            node.processes += 1
            if gpu_id >= gpu_count:
                return Outcome(refused="invalid device ordinal")
            if pp_rank >= pp:
                continue  # a stage that does not exist: the process cannot join and pins nothing
            covered.add((group, pp_rank, tp_rank))
            size, nbytes = stage_pools[pp_rank]
            node.pinned_bytes += nbytes
            node.largest_rank_bytes = max(node.largest_rank_bytes, nbytes)
            if release <= (0, 5, 14) and device_tokens is not None and not size > int(device_tokens):
                node.asserting_ranks += 1
        nodes.append(node)
    groups = dp if (dp > 1 and not dpa) else 1
    if len(covered) != groups * pp * tp:
        return Outcome(refused="ranks never launched: start-up waits forever")
    return Outcome(nodes=nodes)


def demand_on_node(inp: Dict, node: Node) -> Tuple[int, int]:
    """(what the node needs: pools, OS reserve and processes; what it has: min(MemAvailable, limit))."""
    policy = dict(POLICY_DEFAULTS)
    policy.update({k: v for k, v in inp.items() if k in POLICY_DEFAULTS and v is not None})
    total = int(inp["mem_total_bytes"])
    available = int(inp["mem_available_bytes"])
    limit = inp.get("mem_limit_bytes")
    ram = total if limit is None else min(total, int(limit))
    basis = available if limit is None else min(available, int(limit))
    # docs/sizing.md, "The OS reserve": SGLang's own 10 GiB; what the host needs (its idle use, given or what the
    # facts show in use, counted again, a margin, and one 8-byte page-table entry per 4 KiB page of the basis); the
    # fraction of RAM when set.
    idle = inp.get("idle_used_bytes")
    if idle is None:  # what the facts show in use, unless they are a node's with a container limit below its RAM
        idle = max(total - available, 0) if limit is None or int(limit) >= total else 0
    node_needs = idle + int(policy["os_reserve_margin_bytes"]) + basis * 8 // 4096
    reserve = max(int(policy["os_reserve_min_bytes"]), node_needs, int(float(policy["os_reserve_fraction"]) * ram))
    others = int(policy["other_engine_ranks"])
    processes = (node.processes + others) * int(policy["rank_overhead_bytes"]) + int(policy["frontend_overhead_bytes"])
    pools = node.pinned_bytes + others * node.largest_rank_bytes
    return pools + reserve + processes + int(policy["other_committed_bytes"]), basis
