# -*- coding: utf-8 -*-
# Copyright: inferops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""HiCache host-memory sizing model for SGLang (pure Python, no Ansible imports).

SGLang's ``--hicache-size`` is in decimal GB (1e9 bytes) **per rank**: every scheduler process on a
host pins its own pool.  This module places the ranks on the hosts the way SGLang's launcher does,
takes a memory budget from host facts and the container limit, and returns the largest per-rank
size whose pools (the KV pool and, for DSA models, the indexer pool) fit on the most loaded host,
or explains, with the arithmetic, why a requested size does not.  Every rule follows the SGLang
release it applies to; the table of rules with the file each was read from is in docs/sizing.md
("Rules by release"), with the sgl-project/sglang issues and pull requests behind them.

Every memory quantity carries its unit in its name: ``_bytes`` (integers), ``_gb`` (1e9 bytes),
``_gib`` (2**30 bytes), ``_mib`` (2**20 bytes).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

GB_BYTES = 10**9
GIB_BYTES = 2**30
MIB_BYTES = 2**20
KIB_BYTES = 2**10

#: SGLang's own reserve (``HICACHE_HOST_MEMORY_RESERVE_BYTES``), 10 GiB in every version.
SGLANG_RESERVE_BYTES = 10 * GIB_BYTES
#: A host memory figure below this cannot be a GPU host's: it is a value in the wrong unit.
MIN_PLAUSIBLE_MEMORY_BYTES = 64 * MIB_BYTES
#: No single host has a pebibyte of RAM: a larger figure was converted to bytes twice.
MAX_PLAUSIBLE_MEMORY_BYTES = 2**50
#: A policy amount of memory (overhead, reserve) below this is a GiB or MiB figure passed as bytes.
MIN_PLAUSIBLE_POLICY_BYTES = MIB_BYTES
#: Host buffers are mapped in pages: every buffer is charged rounded up to this (the largest base
#: page of a Linux GPU host, 64 KiB on aarch64) plus one more for the allocator's header.
ALLOC_GRANULE_BYTES = 64 * KIB_BYTES

#: SGLang's final releases from the first whose HiCache behaviour this model knows (0.5.0 was
#: published as release candidates only).
KNOWN_RELEASES: Tuple[Tuple[int, int, int], ...] = ((0, 4, 9), (0, 4, 10)) + tuple((0, 5, n) for n in range(1, 24))
KNOWN_FIRST_VERSION = KNOWN_RELEASES[0]
KNOWN_LAST_VERSION = KNOWN_RELEASES[-1]

#: Policy defaults, each documented in docs/sizing.md.
DEFAULT_POLICY: Dict[str, Any] = {
    # OS, page cache, agents: the larger of SGLang's own 10 GiB and a share of RAM.
    "os_reserve_min_bytes": SGLANG_RESERVE_BYTES,
    "os_reserve_fraction": 0.10,
    # RSS of one scheduler process (CUDA context, torch, NCCL) and of the front-end
    # (HTTP server, tokenizer, detokenizer): 8 GiB each until measured (no published figure; docs/sizing.md).
    "rank_overhead_bytes": 8 * GIB_BYTES,
    "frontend_overhead_bytes": 8 * GIB_BYTES,
    # Memory already promised to something else on this host (other engines' pools, ...).
    "other_committed_bytes": 0,
    # Ranks of other engines that will pin pools of the same per-rank size on this host.
    "other_engine_ranks": 0,
    "page_size": 64,
}

#: Model geometries for the common models (config.json of each model).
MODEL_PRESETS: Dict[str, Dict[str, Any]] = {
    # DeepseekV3 architecture: 61 layers, kv_lora_rank 512, qk_rope_head_dim 64, 64 heads.
    "kimi-k2": {"attention": "mla", "num_layers": 61, "kv_lora_rank": 512, "qk_rope_head_dim": 64, "num_attention_heads": 64},
    "deepseek-v3": {"attention": "mla", "num_layers": 61, "kv_lora_rank": 512, "qk_rope_head_dim": 64, "num_attention_heads": 128},
    # DSA (DeepSeek sparse attention): MLA plus an indexer key cache of index_head_dim per layer.
    "deepseek-v3.2": {
        "attention": "dsa",
        "num_layers": 61,
        "kv_lora_rank": 512,
        "qk_rope_head_dim": 64,
        "index_head_dim": 128,
        "num_attention_heads": 128,
    },
    # GLM-5 (GlmMoeDsaForCausalLM, zai-org/GLM-5-FP8 config.json): 78 layers, indexer on every layer.
    "glm-5": {
        "attention": "dsa",
        "num_layers": 78,
        "kv_lora_rank": 512,
        "qk_rope_head_dim": 64,
        "index_head_dim": 128,
        "num_attention_heads": 64,
    },
    "llama-3-70b": {"attention": "mha", "num_layers": 80, "num_kv_heads": 8, "head_dim": 128, "num_attention_heads": 64},
    "llama-3-8b": {"attention": "mha", "num_layers": 32, "num_kv_heads": 8, "head_dim": 128, "num_attention_heads": 32},
}

KV_DTYPE_BYTES: Dict[str, int] = {
    "auto": 2,  # the model dtype; bf16/fp16 for every preset
    "bf16": 2,
    "bfloat16": 2,
    "fp16": 2,
    "float16": 2,
    "half": 2,
    "fp8_e4m3": 1,  # stored as torch.uint8
    "fp8_e5m2": 1,
    "fp8": 1,
    "fp32": 4,
    "float32": 4,
}
#: DSA's indexer keys are fp8 in blocks of this many elements, each block with a 4-byte scale.
DSA_QUANT_BLOCK = 128

#: Plausible ranges of the whole-number inputs: (minimum, maximum, what a value outside says).
_INT_RANGES: Dict[str, Tuple[int, int, str]] = {
    "gpu_count": (1, 64, "the GPUs of this host or container, not of the cluster"),
    "tp_size": (1, 1024, "SGLang's --tp-size"),
    "pp_size": (1, 256, "SGLang's --pp-size"),
    "dp_size": (1, 1024, "SGLang's --dp-size"),
    "nnodes": (1, 1024, "SGLang's --nnodes"),
    "model_num_layers": (1, 1024, "the model's num_hidden_layers"),
    "model_kv_lora_rank": (1, 16384, "config.json kv_lora_rank"),
    "model_qk_rope_head_dim": (0, 4096, "config.json qk_rope_head_dim"),
    "model_num_kv_heads": (1, 1024, "config.json num_key_value_heads"),
    "model_head_dim": (8, 4096, "config.json head_dim"),
    "model_index_head_dim": (1, 4096, "config.json index_head_dim"),
    "model_num_attention_heads": (1, 4096, "config.json num_attention_heads"),
    "device_pool_tokens_per_rank": (1, 10**10, "max_total_num_tokens from /server_info, in tokens"),
    "page_size": (1, 4096, "SGLang's --page-size, in tokens"),
    "other_engine_ranks": (0, 1024, "scheduler ranks of other engines on this host"),
}
#: A KV entry is at least a few hundred bytes per token even for a tiny model: below this the figure
#: is in KiB; above, it is not per token.
MIN_PLAUSIBLE_KV_BYTES_PER_TOKEN = 512
MAX_PLAUSIBLE_KV_BYTES_PER_TOKEN = 64 * MIB_BYTES

_MEMORY_KEYS = ("mem_total_bytes", "mem_available_bytes", "mem_limit_bytes")
_REQUIRED_KEYS = ("mem_total_bytes", "mem_available_bytes", "gpu_count", "gpu_memory_mib", "sglang_version")
_GEOMETRY_KEYS = ("attention", "num_layers", "kv_lora_rank", "qk_rope_head_dim", "num_kv_heads", "head_dim", "index_head_dim", "num_attention_heads")
_OPTIONAL_KEYS = (
    (
        "mem_limit_bytes",
        "tp_size",
        "pp_size",
        "dp_size",
        "enable_dp_attention",
        "nnodes",
        "kv_bytes_per_token",
        "model_preset",
        "kv_cache_dtype",
        "device_pool_tokens_per_rank",
        "requested_gb",
    )
    + tuple("model_" + k for k in _GEOMETRY_KEYS)
    + tuple(DEFAULT_POLICY)
)
ALLOWED_KEYS = frozenset(_REQUIRED_KEYS + _OPTIONAL_KEYS)

_VERSION_RE = re.compile(
    r"^v?(\d{1,4})\.(\d{1,4})\.(\d{1,4})"
    r"(?:[.\-_]?(rc|c|a|alpha|b|beta|pre|preview)[.\-_]?(\d{1,6})?)?"
    r"(?:[.\-_]?(post|rev|r)[.\-_]?(\d{1,6})?)?"
    r"(?:[.\-_]?(dev)[.\-_]?(\d{1,6})?)?"
    r"(?:\+([a-z0-9]+(?:[.\-_][a-z0-9]+)*))?$",
    re.IGNORECASE,
)


class PlanError(ValueError):
    """Bad input, or a plan that cannot be made: the message says what was wrong and what to do."""


# --------------------------------------------------------------------------------------------
# Versions and the rules of each release


def _vtext(key: Tuple[int, int, int]) -> str:
    return "%d.%d.%d" % key


@dataclass(frozen=True)
class Rules:
    """The HiCache host-memory behaviour of one SGLang release (docs/sizing.md, table of rules)."""

    release: Tuple[int, int, int]

    def __str__(self) -> str:
        return _vtext(self.release)

    @property
    def pins_power_of_two(self) -> bool:
        """Up to 0.5.4 torch's pinned allocator rounds each pool up to the next power of two."""
        return self.release <= (0, 5, 4)

    @property
    def pages_align_up(self) -> bool:
        """From 0.5.6 the token count is aligned up to whole pages plus one page; before, down."""
        return self.release >= (0, 5, 6)

    @property
    def asserts_host_exceeds_device(self) -> bool:
        """Up to 0.5.14 start-up asserts that the host pool holds more tokens than the device pool."""
        return self.release <= (0, 5, 14)

    @property
    def pp_min_tokens(self) -> bool:
        """From 0.5.15 a fixed size takes the minimum token count across PP stages; before, each
        stage rounds its own."""
        return self.release >= (0, 5, 15)

    @property
    def dsa_indexer(self) -> str:
        """'none' up to 0.5.8 (no DSA host pool), 'inside' 0.5.9-0.5.18 (indexer bytes counted in
        --hicache-size, one buffer per layer), 'outside' from 0.5.19 (a separate pool of the KV
        pool's token count)."""
        if self.release <= (0, 5, 8):
            return "none"
        return "inside" if self.release <= (0, 5, 18) else "outside"

    @property
    def guard_divisor(self) -> str:
        """What SGLang's own check divides the free memory by."""
        if self.release <= (0, 5, 18):
            return "none"
        return "world_size // nnodes" if self.release <= (0, 5, 20) else "tp x pp // nnodes"

    @property
    def guard_reads_cgroup(self) -> bool:
        return self.release >= (0, 5, 21)

    @property
    def allocation(self) -> str:
        if self.pins_power_of_two:
            return "torch pin_memory (rounded up to a power of two)"
        if self.release <= (0, 5, 12):
            return "torch.empty + cudaHostRegister (exact size, locked at start-up)"
        return "mmap MAP_SHARED|MAP_POPULATE + cudaHostRegister (exact size, counted as Shmem)"


@dataclass(frozen=True)
class SglangVersion:
    """An SGLang version as given, with the releases whose behaviour it may have."""

    text: str
    major: int
    minor: int
    patch: int
    pre: bool = False
    post: bool = False
    dev: bool = False
    local: bool = False

    def __str__(self) -> str:
        return self.text

    @property
    def key(self) -> Tuple[int, int, int]:
        return (self.major, self.minor, self.patch)

    @property
    def is_final(self) -> bool:
        return not (self.pre or self.post or self.dev or self.local)


def parse_version(value: Any) -> SglangVersion:
    """Parse an SGLang version such as ``0.5.9``, ``v0.5.9``, ``0.5.10.post1``, ``0.5.5rc1``,
    ``0.5.15.dev0`` or ``0.5.9+cu128``."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise PlanError(
            "sglang_version must be a release number such as '0.5.9' (the version of the installed sglang package), got %s"
            % type(value).__name__
        )
    text = str(value).strip()
    match = _VERSION_RE.match(text) if len(text) <= 64 else None
    if not match:
        raise PlanError(
            "sglang_version %r is not an SGLang release number: give it as MAJOR.MINOR.PATCH, "
            "for example '0.5.9' (the version of the installed sglang package)" % (text[:64],)
        )
    version = SglangVersion(
        text=text.lower().lstrip("v"),
        major=int(match.group(1)),
        minor=int(match.group(2)),
        patch=int(match.group(3)),
        pre=match.group(4) is not None,
        post=match.group(6) is not None,
        dev=match.group(8) is not None,
        local=match.group(10) is not None,
    )
    behaviour_releases(version)  # refuses what lies before the first known release
    return version


def _prev_release(key: Tuple[int, int, int]) -> Optional[Tuple[int, int, int]]:
    older = [r for r in KNOWN_RELEASES if r < key]
    return older[-1] if older else None


def _next_release(key: Tuple[int, int, int]) -> Optional[Tuple[int, int, int]]:
    newer = [r for r in KNOWN_RELEASES if r > key]
    return newer[0] if newer else None


def behaviour_releases(version: SglangVersion) -> Tuple[List[Tuple[int, int, int]], Optional[str]]:
    """The releases whose behaviour ``version`` may have, and the warning that says so.

    A final release behaves as itself.  A pre-release or dev build of X lies between the release
    before X and X; a post release of X between X and the next release (SGLang cuts post releases
    from main); a local build (``+tag``) may be either neighbour.  The plan must hold for every
    release in the list, so each rule is taken at its most expensive.
    """
    key = version.key
    if key < KNOWN_FIRST_VERSION or (key == KNOWN_FIRST_VERSION and (version.pre or (version.dev and not version.post) or version.local)):
        raise PlanError(
            "sglang_version %s is older than 0.4.9, the first release whose HiCache memory behaviour "
            "this model knows; upgrade SGLang or size the cache by hand" % version
        )
    if key > KNOWN_LAST_VERSION:
        return [KNOWN_LAST_VERSION], (
            "SGLang %s is newer than 0.5.23, the last release this model was checked against; it is treated as 0.5.23" % version
        )
    known = key in KNOWN_RELEASES
    below = key if known else _prev_release(key)
    above = key if known else _next_release(key)
    releases: List[Tuple[int, int, int]] = []
    if version.post:
        releases = [below or key]
        if _next_release(below or key):
            releases.append(_next_release(below or key))  # type: ignore[arg-type]
        why = "a post release, cut after %s" % _vtext(below or key)
    elif version.pre or version.dev:
        releases = [_prev_release(key) or key, above or KNOWN_LAST_VERSION]
        why = "a pre-release or dev build of %s" % _vtext(key)
    elif known:
        releases = [key]
        why = ""
    else:
        releases = [below or key, above or KNOWN_LAST_VERSION]
        why = "not a published final release (%s lies between two releases)" % _vtext(key)
    if version.local:
        lo, hi = min(releases), max(releases)
        releases += [r for r in (_prev_release(lo), _next_release(hi)) if r is not None]
        why = (why + ", and a local build" if why else "a local build of %s" % _vtext(key))
    releases = sorted(set(releases))
    if len(releases) == 1:
        return releases, None
    return releases, (
        "SGLang %s is %s: its code may behave as %s; the plan holds for each of them (every rule at its most expensive)"
        % (version, why, " or ".join(_vtext(r) for r in releases))
    )


# --------------------------------------------------------------------------------------------
# Input coercion and validation


def _clip(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _as_int(key: str, value: Any, minimum: int) -> int:
    """A whole number from an int, an integral float or a string of digits (extra-vars are strings)."""
    if isinstance(value, bool):
        raise PlanError("%s must be a number, got the boolean %r" % (key, value))
    if isinstance(value, int):
        result = int(value)
    elif isinstance(value, float):
        if not math.isfinite(value) or not value.is_integer():
            raise PlanError("%s must be a whole number, got %r" % (key, value))
        result = int(value)
    elif isinstance(value, str):
        text = value.strip().replace("_", "")
        match = re.match(r"^([+-]?\d{1,30})(\.0*)?$", text)
        if not match:
            raise PlanError("%s must be a whole number, got %s" % (key, _clip(value)))
        result = int(match.group(1))
    else:
        raise PlanError("%s must be a whole number, got %s %s" % (key, type(value).__name__, _clip(value)))
    if result < minimum:
        raise PlanError("%s must be at least %d, got %d" % (key, minimum, result))
    return result


def _ranged_int(key: str, value: Any) -> int:
    low, high, what = _INT_RANGES[key]
    result = _as_int(key, value, low)
    if result > high:
        raise PlanError("%s=%d is implausible (at most %d): it is %s" % (key, result, high, what))
    return result


def _as_float(key: str, value: Any, low: float, high: float, hint: str = "") -> float:
    if isinstance(value, bool):
        raise PlanError("%s must be a number, got the boolean %r" % (key, value))
    if isinstance(value, str) and len(value) > 40:
        raise PlanError("%s must be a number, got %s" % (key, _clip(value)))
    try:
        result = float(value)
    except (TypeError, ValueError, OverflowError) as exc:
        raise PlanError("%s must be a number between %s and %s, got %s" % (key, low, high, _clip(value))) from exc
    if not math.isfinite(result) or not (low <= result <= high):
        raise PlanError("%s must be between %s and %s, got %s%s" % (key, low, high, _clip(value), hint))
    return result


def _as_bool(key: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "yes", "on", "1", "false", "no", "off", "0"):
        return value.strip().lower() in ("true", "yes", "on", "1")
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    raise PlanError("%s must be true or false, got %s" % (key, _clip(value)))


def _memory_bytes(key: str, value: Any) -> int:
    result = _as_int(key, value, 0)
    if result == 0:
        raise PlanError("%s is 0: a host or container with no memory cannot run SGLang; check the fact it came from" % key)
    if result < MIN_PLAUSIBLE_MEMORY_BYTES:
        if result <= 16384:
            hint = "a GiB or GB figure"
            guess = "%d GiB (%d bytes) or %d GB" % (result, result * GIB_BYTES, result * GB_BYTES)
        else:
            hint = "a MiB figure (like ansible_memtotal_mb)"
            guess = "%d MiB (%d bytes)" % (result, result * MIB_BYTES)
        raise PlanError(
            "%s=%d is only %d bytes, far too small for a GPU host: it looks like %s passed where bytes are "
            "expected; if you meant %s, pass that many bytes (e.g. ansible_memtotal_mb * 1048576)" % (key, result, result, hint, guess)
        )
    if result > MAX_PLAUSIBLE_MEMORY_BYTES:
        raise PlanError(
            "%s=%d is more than 1 PiB, which no single host has: it looks like a figure already in bytes was "
            "multiplied again (KiB x 1024 applied twice); pass the host's bytes once" % (key, result)
        )
    return result


def _policy_bytes(key: str, value: Any, total: int) -> int:
    result = _as_int(key, value, 0)
    if 0 < result < MIN_PLAUSIBLE_POLICY_BYTES:
        raise PlanError(
            "%s=%d is only %d bytes: it looks like a GiB or MiB figure passed where bytes are expected "
            "(%d GiB is %d bytes, %d MiB is %d bytes)"
            % (key, result, result, result, result * GIB_BYTES, result, result * MIB_BYTES)
        )
    if result > total:
        raise PlanError(
            "%s=%d bytes is more than the host's RAM (%d bytes): it looks like a figure in the wrong unit" % (key, result, total)
        )
    return result


@dataclass(frozen=True)
class Placement:
    """Where SGLang's launcher puts one engine's scheduler processes (entrypoints/engine.py)."""

    tp_per_node: int
    pp_per_node: int
    replicas: int
    nnodes_per_pp_rank: int
    nodes_launching_missing_stages: Tuple[int, ...]

    @property
    def ranks_per_node(self) -> int:
        return self.tp_per_node * self.pp_per_node * self.replicas


@dataclass(frozen=True)
class Stage:
    """The KV geometry of one PP stage on one rank."""

    kv_bytes_per_token: int
    layers: Optional[int]  # None: the stage's layers are unknown (kv_bytes_per_token was given)
    index_bytes_per_token_per_layer: int = 0


@dataclass(frozen=True)
class KvChoice:
    """One way SGLang may lay out the KV cache for the input (a DSA model's layout depends on the
    GPU and the attention backend SGLang picks): the stages of the rank's pipeline."""

    stages: Tuple[Stage, ...]
    smaller_stages_unknown: bool
    label: str
    stage_of_rank: Tuple[int, ...] = (0,)  # index into stages of each PP rank

    @property
    def largest(self) -> Stage:
        return max(self.stages, key=lambda s: s.kv_bytes_per_token + s.index_bytes_per_token_per_layer * (s.layers or 0))


@dataclass
class PlanInput:
    """Validated, unit-explicit inputs of a plan."""

    mem_total_bytes: int
    mem_available_bytes: int
    mem_limit_bytes: Optional[int]
    gpu_count: int
    gpu_memory_mib: int
    version: SglangVersion
    releases: List[Rules]
    placement: Placement
    tp_size: int = 1
    pp_size: int = 1
    dp_size: int = 1
    enable_dp_attention: bool = False
    nnodes: int = 1
    kv_choices: List[KvChoice] = field(default_factory=list)
    kv_source: str = ""
    dsa: bool = False
    device_pool_tokens_per_rank: Optional[int] = None
    requested_gb: Optional[int] = None
    policy: Dict[str, Any] = field(default_factory=dict)
    warnings: List[str] = field(default_factory=list)

    @property
    def kv_bytes_per_token(self) -> int:
        return self.kv_choices[0].largest.kv_bytes_per_token


def pp_stage_layers(num_layers: int, pp_size: int) -> List[int]:
    """Layers of each PP stage (get_pp_indices, distributed/utils.py, every release): an even split,
    the last ``num_layers % pp_size`` stages one layer more."""
    base, remainder = divmod(num_layers, pp_size)
    return [base + (1 if rank >= pp_size - remainder else 0) for rank in range(pp_size)]


def place_ranks(tp: int, pp: int, dp: int, dp_attention: bool, nnodes: int, release: Tuple[int, int, int]) -> Placement:
    """Place one engine's ranks as SGLang's launcher does, or refuse what SGLang refuses.

    ``_launch_scheduler_processes`` / ``launch_tensor_parallel_group`` (0.4.9 to 0.5.23, the
    formula moved into ``_calculate_rank_ranges`` in 0.5.10): node ``i`` runs the PP ranks
    ``[a * (i // b), a * (i // b + 1))`` times the TP ranks ``[t * (i % b), t * (i % b + 1))`` with
    ``a = max(pp // nnodes, 1)``, ``b = max(nnodes // pp, 1)``, ``t = tp // b``; plain DP (no DP
    attention) starts ``dp`` such groups, on one node only.
    """
    if (tp * pp) % nnodes != 0:
        raise PlanError(
            "SGLang refuses tp_size %d x pp_size %d on %d nodes at start-up: \"tp_size must be divisible by number of "
            "nodes\" (check_server_args: tp x pp must be a multiple of nnodes)" % (tp, pp, nnodes)
        )
    plain_dp = dp > 1 and not dp_attention
    if plain_dp and nnodes > 1:
        reason = (
            "multi-node data-parallel replicas are not supported; use attention DP (--attn-dp-size) across nodes"
            if release >= (0, 5, 22)
            else "multi-node data parallel is not supported unless dp attention!"
        )
        raise PlanError(
            "SGLang refuses dp_size %d without DP attention on %d nodes at start-up: \"%s\" (check_server_args); "
            "run the replicas as separate engines on single nodes, or set enable_dp_attention" % (dp, nnodes, reason)
        )
    if dp_attention and dp > 1 and tp % dp != 0:
        raise PlanError(
            "SGLang refuses --enable-dp-attention with dp_size %d and tp_size %d: tp_size must be divisible by dp_size "
            "(the DP groups split the TP ranks; server_args _handle_data_parallelism)" % (dp, tp)
        )
    a = max(pp // nnodes, 1)
    b = max(nnodes // pp, 1)
    t = tp // b
    if t * b < tp:
        raise PlanError(
            "SGLang's launcher would never start TP ranks %d-%d: on %d nodes with pp_size %d each node runs tp // "
            "max(nnodes // pp, 1) = %d // %d = %d TP ranks (entrypoints/engine.py), and start-up would wait for the "
            "missing ranks forever; use a tp_size that max(nnodes // pp, 1) = %d divides" % (t * b, tp - 1, nnodes, pp, tp, b, t, b)
        )
    launched_stages = a * ((nnodes - 1) // b + 1)
    if launched_stages < pp:
        raise PlanError(
            "SGLang's launcher would never start PP stages %d-%d: on %d nodes each node runs max(pp // nnodes, 1) = %d "
            "stage(s) (entrypoints/engine.py), %d in all, and start-up would wait for the missing stages forever; "
            "use a pp_size that nnodes divides, or a multiple of it" % (launched_stages, pp - 1, nnodes, a, launched_stages)
        )
    extra = tuple(i for i in range(nnodes) if a * (i // b + 1) > pp)
    return Placement(tp_per_node=t, pp_per_node=a, replicas=dp if plain_dp else 1, nnodes_per_pp_rank=b, nodes_launching_missing_stages=extra)


def _kv_choices(data: Mapping[str, Any], tp: int, pp: int, dp: int, dp_attention: bool) -> Tuple[List[KvChoice], str, bool]:
    """The KV geometry of a rank's stages (SGLang's get_size_per_token and get_pp_indices; docs/sizing.md)."""
    geometry: Dict[str, Any] = {}
    preset = data.get("model_preset")
    if preset is not None:
        name = str(preset).strip().lower() if isinstance(preset, str) else None
        if name not in MODEL_PRESETS:
            raise PlanError(
                "model_preset %s is unknown; known presets: %s. Or give the geometry (model_num_layers, ...) "
                "or kv_bytes_per_token" % (_clip(preset), ", ".join(sorted(MODEL_PRESETS)))
            )
        geometry.update(MODEL_PRESETS[name])  # type: ignore[index]
    for key in _GEOMETRY_KEYS:
        if data.get("model_" + key) is not None:
            geometry[key] = data["model_" + key]
    attn_tp = tp // dp if (dp_attention and dp > 1) else tp

    layers: Optional[int] = None
    if geometry.get("num_layers") is not None:
        layers = _ranged_int("model_num_layers", geometry["num_layers"])
        if pp > layers:
            raise PlanError(
                "pp_size %d is more than the model's %d layers: SGLang's get_pp_indices would give a stage no layers" % (pp, layers)
            )
    if geometry.get("num_attention_heads") is not None:
        heads = _ranged_int("model_num_attention_heads", geometry["num_attention_heads"])
        if heads % attn_tp != 0:
            raise PlanError(
                "SGLang cannot shard the model's %d attention heads over an attention TP size of %d (\"%d is not "
                "divisible by %d\": the attention layer splits the heads evenly over the ranks); use a tp_size%s "
                "that divides %d" % (heads, attn_tp, heads, attn_tp, " / dp_size" if attn_tp != tp else "", heads)
            )

    attention = geometry.get("attention")
    if attention is None and geometry:
        attention = "dsa" if "index_head_dim" in geometry else ("mla" if "kv_lora_rank" in geometry else "mha")
    attention = str(attention).lower() if attention is not None else None
    if attention is not None and attention not in ("mla", "mha", "gqa", "dsa"):
        raise PlanError("model_attention must be 'mla', 'mha', 'gqa' or 'dsa', got %s" % _clip(geometry.get("attention")))
    dsa = attention == "dsa"

    dtype_raw = data.get("kv_cache_dtype")
    dtype_name = str(dtype_raw).strip().lower() if isinstance(dtype_raw, str) else ("auto" if dtype_raw is None else None)
    if dtype_name not in KV_DTYPE_BYTES:
        raise PlanError("kv_cache_dtype %s is unknown; use one of %s" % (_clip(dtype_raw), ", ".join(sorted(KV_DTYPE_BYTES))))
    dtype_bytes = KV_DTYPE_BYTES[dtype_name]  # type: ignore[index]

    if data.get("kv_bytes_per_token") is not None:
        if dsa:
            raise PlanError(
                "kv_bytes_per_token cannot price a DSA model (DeepSeek-V3.2, GLM-5): its indexer pool needs the geometry; "
                "give model_preset, or model_num_layers, model_kv_lora_rank, model_qk_rope_head_dim and model_index_head_dim"
            )
        kv = _as_int("kv_bytes_per_token", data["kv_bytes_per_token"], 1)
        if kv < MIN_PLAUSIBLE_KV_BYTES_PER_TOKEN:
            raise PlanError(
                "kv_bytes_per_token=%d is far too small: a rank's KV entry is at least a few hundred bytes per token even for a "
                "tiny model; it looks like a KiB figure (%d KiB is %d bytes)" % (kv, kv, kv * KIB_BYTES)
            )
        if layers is not None and kv < 64 * -(-layers // pp):
            raise PlanError(
                "kv_bytes_per_token=%d is less than 64 bytes per layer for %d layers per stage: it looks like a KiB figure "
                "(%d KiB is %d bytes)" % (kv, -(-layers // pp), kv, kv * KIB_BYTES)
            )
        if kv > MAX_PLAUSIBLE_KV_BYTES_PER_TOKEN:
            raise PlanError("kv_bytes_per_token=%d is more than 64 MiB per token: it is not a per-token figure" % kv)
        choice = KvChoice(stages=(Stage(kv, None),), smaller_stages_unknown=pp > 1, label="given", stage_of_rank=(0,) * pp)
        return [choice], "given%s" % (" for the largest PP stage" if pp > 1 else ""), False

    if not geometry:
        raise PlanError(
            "the model's KV size is missing: give kv_bytes_per_token (bytes per token per rank), or model_preset "
            "(%s), or the geometry: model_num_layers with model_kv_lora_rank and model_qk_rope_head_dim (MLA; plus "
            "model_index_head_dim for DSA), or model_num_layers with model_num_kv_heads and model_head_dim (MHA/GQA)"
            % ", ".join(sorted(MODEL_PRESETS))
        )
    if layers is None:
        raise PlanError("model_num_layers is missing: the KV size per token needs the model's layer count")
    stage_layers = pp_stage_layers(layers, pp)

    if attention in ("mla", "dsa"):
        for key in ("kv_lora_rank", "qk_rope_head_dim") + (("index_head_dim",) if dsa else ()):
            if geometry.get(key) is None:
                raise PlanError(
                    "model_%s is missing: an %s model's KV size needs kv_lora_rank and qk_rope_head_dim%s"
                    % (key, attention.upper(), " and index_head_dim" if dsa else "")
                )
        lora = _ranged_int("model_kv_lora_rank", geometry["kv_lora_rank"])
        rope = _ranged_int("model_qk_rope_head_dim", geometry["qk_rope_head_dim"])
        if not dsa:
            per_layer = [((lora + rope) * dtype_bytes, "%d x %d B" % (lora + rope, dtype_bytes))]
            index_per_layer = 0
        else:
            index_dim = _ranged_int("model_index_head_dim", geometry["index_head_dim"])
            # Indexer keys: fp8 values plus one 4-byte scale per 128 (uint8 storage; memory_pool.py).
            index_per_layer = index_dim + index_dim // DSA_QUANT_BLOCK * 4
            bf16 = ((lora + rope) * 2, "bf16 %d x 2 B" % (lora + rope))
            # FP8 DSA: latent fp8 + its scales + rope kept bf16 (calculate_mla_kv_cache_dim); the trtllm
            # backend keeps the plain (lora + rope) x 1 B.
            fp8_packed = (lora + lora // DSA_QUANT_BLOCK * 4 + rope * 2, "fp8 packed %d B" % (lora + lora // DSA_QUANT_BLOCK * 4 + rope * 2))
            fp8_plain = (lora + rope, "fp8 trtllm %d B" % (lora + rope))
            if dtype_name in ("bf16", "bfloat16"):
                per_layer = [bf16]
            elif dtype_name == "fp8_e4m3":
                per_layer = [fp8_packed, fp8_plain]
            elif dtype_name == "auto":
                # SGLang picks fp8_e4m3 on SM100+ and bfloat16 before (_set_default_nsa_kv_cache_dtype).
                per_layer = [bf16, fp8_packed, fp8_plain]
            else:
                raise PlanError(
                    "SGLang refuses kv_cache_dtype %s for a DSA model: \"DeepSeek DSA only supports bf16/bfloat16 or "
                    "fp8_e4m3 kv_cache_dtype\" (server_args.py)" % dtype_name
                )
        distinct = sorted(set(stage_layers))
        choices = []
        for kv_layer, label in per_layer:
            stages = tuple(Stage(kv_layer * n, n, index_per_layer) for n in distinct)
            choices.append(KvChoice(stages, False, label, tuple(distinct.index(n) for n in stage_layers)))
        largest = max(stage_layers)
        text = "%s: %s per layer x %d layers%s, replicated on every rank" % (
            attention.upper(),
            " or ".join(label for _k, label in per_layer),
            largest,
            " (largest PP stage)" if pp > 1 else "",
        )
        if dsa:
            text += "; indexer %d B per layer" % index_per_layer
        return choices, text, dsa

    for key in ("num_kv_heads", "head_dim"):
        if geometry.get(key) is None:
            raise PlanError("model_%s is missing: an MHA/GQA model's KV size needs num_kv_heads and head_dim" % key)
    kv_heads = _ranged_int("model_num_kv_heads", geometry["num_kv_heads"])
    head_dim = _ranged_int("model_head_dim", geometry["head_dim"])
    if not (kv_heads % attn_tp == 0 or attn_tp % kv_heads == 0):
        raise PlanError(
            "SGLang cannot shard %d KV heads over an attention TP size of %d (QKVParallelLinear: \"%d is not divisible by %d\"); "
            "use a tp_size that divides the KV heads or a multiple of them" % (kv_heads, attn_tp, max(kv_heads, attn_tp), min(kv_heads, attn_tp))
        )
    heads_per_rank = max(1, kv_heads // attn_tp)
    per_layer_bytes = 2 * head_dim * heads_per_rank * dtype_bytes
    distinct = sorted(set(stage_layers))
    stages = tuple(Stage(per_layer_bytes * n, n) for n in distinct)
    largest = max(stage_layers)
    return (
        [KvChoice(stages, False, "", tuple(distinct.index(n) for n in stage_layers))],
        "MHA/GQA: 2 x %d head_dim x %d KV heads/rank x %d layers%s x %d B"
        % (head_dim, heads_per_rank, largest, " (largest PP stage)" if pp > 1 else "", dtype_bytes),
        False,
    )


def validate(data: Mapping[str, Any]) -> PlanInput:
    """Check and coerce one flat dict of facts and policy; raise PlanError on any bad input."""
    if not isinstance(data, Mapping):
        raise PlanError("the plan input must be a dict of facts and policy, got %s" % type(data).__name__)
    unknown = sorted(str(k)[:60] for k in data if k not in ALLOWED_KEYS)
    if unknown:
        hints = []
        for key in unknown:
            stem = re.sub(r"_(gb|gib|mb|mib|kb|kib)$", "", key)
            if stem != key and stem + "_bytes" in ALLOWED_KEYS:
                hints.append("%s: memory inputs are in bytes, use %s_bytes" % (key, stem))
        raise PlanError(
            "unknown key(s) %s%s. Known keys: %s"
            % (", ".join(unknown[:10]), (" (" + "; ".join(hints) + ")") if hints else "", ", ".join(sorted(ALLOWED_KEYS)))
        )
    missing = [k for k in _REQUIRED_KEYS if data.get(k) is None]
    if missing:
        raise PlanError(
            "missing required key(s): %s. mem_*_bytes come from /proc/meminfo or the gpu_host_facts module (bytes), "
            "gpu_count and gpu_memory_mib from nvidia-smi, sglang_version from the installed sglang package" % ", ".join(missing)
        )
    version = parse_version(data["sglang_version"])
    release_keys, version_warning = behaviour_releases(version)
    warnings: List[str] = [version_warning] if version_warning else []
    releases = [Rules(r) for r in release_keys]

    total = _memory_bytes("mem_total_bytes", data["mem_total_bytes"])
    available = _memory_bytes("mem_available_bytes", data["mem_available_bytes"])
    if available > total:
        raise PlanError(
            "mem_available_bytes (%s) is larger than mem_total_bytes (%s): MemAvailable cannot exceed MemTotal; "
            "check that both are bytes and come from the same host" % (fmt_gb(available), fmt_gb(total))
        )
    limit: Optional[int] = None
    if data.get("mem_limit_bytes") is not None:
        limit = _memory_bytes("mem_limit_bytes", data["mem_limit_bytes"])
        if limit > total:
            warnings.append(
                "the container memory limit (%s) is larger than the host's RAM (%s): it protects nothing; "
                "set the container's memory below the host's" % (fmt_gib(limit), fmt_gib(total))
            )

    gpu_count = _ranged_int("gpu_count", data["gpu_count"])
    gpu_memory_mib = _as_int("gpu_memory_mib", data["gpu_memory_mib"], 1)
    if gpu_memory_mib < 1024:
        raise PlanError(
            "gpu_memory_mib=%d is less than 1 GiB: it looks like GiB or GB were passed where MiB are expected "
            "(nvidia-smi --query-gpu=memory.total --format=csv,nounits reports MiB)" % gpu_memory_mib
        )
    if gpu_memory_mib > 4 * 1024 * 1024:
        raise PlanError(
            "gpu_memory_mib=%d is more than 4 TiB per GPU: it looks like bytes or KiB were passed where MiB are expected" % gpu_memory_mib
        )

    def given(key: str, default: Any) -> Any:
        return default if data.get(key) is None else data[key]

    tp = _ranged_int("tp_size", given("tp_size", 1))
    pp = _ranged_int("pp_size", given("pp_size", 1))
    dp = _ranged_int("dp_size", given("dp_size", 1))
    nnodes = _ranged_int("nnodes", given("nnodes", 1))
    dp_attention = _as_bool("enable_dp_attention", given("enable_dp_attention", False))
    if dp == 1:
        dp_attention = False  # SGLang turns it off with dp_size 1 (_handle_data_parallelism)

    # SGLang's start-up checks, as the newest candidate release words them.
    placement = place_ranks(tp, pp, dp, dp_attention, nnodes, max(release_keys))
    if placement.nodes_launching_missing_stages:
        nodes = placement.nodes_launching_missing_stages
        warnings.append(
            "pp_size %d does not divide nnodes %d: SGLang's launcher makes node rank(s) %s start %d scheduler(s) each for "
            "a PP stage that does not exist; they cannot join the job, so those nodes are wasted. The plan still sizes "
            "every node for the %d ranks the launcher starts on it"
            % (pp, nnodes, ", ".join(str(n) for n in nodes), placement.ranks_per_node, placement.ranks_per_node)
        )

    kv_choices, kv_source, dsa = _kv_choices(data, tp, pp, dp, dp_attention)
    if dsa and all(r.dsa_indexer == "none" for r in releases):
        warnings.append(
            "SGLang %s has no DSA host pool (NSATokenToKVPoolHost arrived in 0.5.9): the KV cache of this DSA model is "
            "priced as plain MLA" % version
        )

    policy = dict(DEFAULT_POLICY)
    for key in DEFAULT_POLICY:
        if data.get(key) is None:
            continue
        if key == "os_reserve_fraction":
            policy[key] = _as_float(
                key,
                data[key],
                0.0,
                0.9,
                "; it is a fraction of RAM (0.10 for 10 percent)" if _looks_like_percent(data[key]) else "",
            )
        elif key in ("page_size", "other_engine_ranks"):
            policy[key] = _ranged_int(key, data[key])
        else:
            policy[key] = _policy_bytes(key, data[key], total)

    device_tokens = None
    if data.get("device_pool_tokens_per_rank") is not None:
        device_tokens = _ranged_int("device_pool_tokens_per_rank", data["device_pool_tokens_per_rank"])

    requested = None
    if data.get("requested_gb") is not None:
        raw = data["requested_gb"]
        if isinstance(raw, float) and math.isfinite(raw) and not raw.is_integer():
            raise PlanError(
                "requested_gb=%r: SGLang's --hicache-size is a whole number of GB (argparse type int; 8.5 makes it exit with code 2)" % raw
            )
        requested = _as_int("requested_gb", raw, 1)
        if requested * GB_BYTES > 64 * total:
            raise PlanError(
                "requested_gb=%d is GB per rank, i.e. more than 64 times the host's %s of RAM per rank: "
                "it looks like bytes or MiB were passed; --hicache-size takes decimal GB" % (requested, fmt_gib(total))
            )

    return PlanInput(
        mem_total_bytes=total,
        mem_available_bytes=available,
        mem_limit_bytes=limit,
        gpu_count=gpu_count,
        gpu_memory_mib=gpu_memory_mib,
        version=version,
        releases=releases,
        tp_size=tp,
        pp_size=pp,
        dp_size=dp,
        enable_dp_attention=dp_attention,
        nnodes=nnodes,
        placement=placement,
        kv_choices=kv_choices,
        kv_source=kv_source,
        dsa=dsa,
        device_pool_tokens_per_rank=device_tokens,
        requested_gb=requested,
        policy=policy,
        warnings=warnings,
    )


def _looks_like_percent(value: Any) -> bool:
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        return False
    return math.isfinite(number) and 1 <= number <= 100


# --------------------------------------------------------------------------------------------
# Arithmetic


def engine_ranks_per_host(tp_size: int, pp_size: int, dp_size: int, enable_dp_attention: bool, nnodes: int) -> int:
    """Scheduler processes one engine starts on each host, as SGLang's launcher places them (uses
    the newest known release's start-up checks; see place_ranks)."""
    placement = place_ranks(tp_size, pp_size, dp_size, enable_dp_attention and dp_size > 1, nnodes, KNOWN_LAST_VERSION)
    return placement.ranks_per_node


def pow2_ceil(value: int) -> int:
    """The next power of two at or above value (PyTorch's CachingHostAllocator rounding)."""
    return 1 if value <= 1 else 1 << (value - 1).bit_length()


def _round_up(value: int, granule: int) -> int:
    return -(-value // granule) * granule


def charge_buffer(nbytes: int, rules: Rules) -> int:
    """Host memory one pinned buffer of nbytes takes: the power of two up to 0.5.4, else the pages
    it maps plus one for the allocator, at the largest base page size."""
    if nbytes <= 0:
        return 0
    if rules.pins_power_of_two:
        return _round_up(pow2_ceil(nbytes), ALLOC_GRANULE_BYTES)
    return _round_up(nbytes, ALLOC_GRANULE_BYTES) + ALLOC_GRANULE_BYTES


def _page_align(tokens: int, page_size: int, rules: Rules) -> int:
    if rules.pages_align_up:
        return (tokens // page_size + 1) * page_size
    return tokens - tokens % page_size


@dataclass(frozen=True)
class RankPools:
    """One rank's host pools for one --hicache-size under one release and KV choice (the most
    expensive stage)."""

    tokens: int  # KV pool tokens of the largest stage
    min_tokens: int  # the fewest tokens any stage holds (SGLang <= 0.5.14's assertion)
    kv_bytes: int
    index_bytes: int
    requested_bytes: int  # what SGLang's own check compares (the KV pool, indexer included up to 0.5.18)
    index_requested_bytes: int  # what 0.5.19+ checks for the separate indexer pool
    charged_bytes: int  # host memory the rank really takes for its pools


def stage_pools(size_gb: int, choice: KvChoice, page_size: int, rules: Rules) -> List[RankPools]:
    """The host pools of one rank of each stage of choice for --hicache-size size_gb
    (SGLang's HostKVCache token count, page alignment and allocators; docs/sizing.md, "Rules by release")."""
    if size_gb <= 0:
        return [RankPools(0, 0, 0, 0, 0, 0, 0) for _stage in choice.stages]
    size_bytes = size_gb * GB_BYTES

    def per_token(stage: Stage) -> int:
        if rules.dsa_indexer == "inside":
            return stage.kv_bytes_per_token + stage.index_bytes_per_token_per_layer * (stage.layers or 0)
        return stage.kv_bytes_per_token

    raw = [size_bytes // per_token(stage) for stage in choice.stages]
    if rules.pp_min_tokens:
        raw = [min(raw)] * len(raw)  # sync_fixed_hicache_size: MIN across the PP group
    pools: List[RankPools] = []
    for stage, stage_raw in zip(choice.stages, raw):
        tokens = _page_align(stage_raw, page_size, rules)
        kv_bytes = tokens * stage.kv_bytes_per_token
        charged = charge_buffer(kv_bytes, rules)
        index_bytes = 0
        index_requested = 0
        if rules.dsa_indexer != "none" and stage.index_bytes_per_token_per_layer and stage.layers:
            index_pages = (tokens + page_size + 1) // page_size
            per_layer = index_pages * page_size * stage.index_bytes_per_token_per_layer
            index_bytes = per_layer * stage.layers
            if rules.dsa_indexer == "inside":
                charged += stage.layers * charge_buffer(per_layer, rules)  # one buffer per layer
            else:
                charged += charge_buffer(index_bytes, rules)
                index_requested = tokens * stage.index_bytes_per_token_per_layer * stage.layers
        if choice.smaller_stages_unknown and not rules.pp_min_tokens:
            # Each stage rounds its own count (up to 0.5.14) and the smaller stages are unknown: a
            # stage of b <= kv bytes per token pins at most size + page x b (aligned up) or size.
            bound = size_bytes + (page_size * stage.kv_bytes_per_token if rules.pages_align_up else 0)
            charged = max(charged, charge_buffer(bound, rules))
        pools.append(
            RankPools(
                tokens=tokens,
                min_tokens=tokens,
                kv_bytes=kv_bytes,
                index_bytes=index_bytes,
                requested_bytes=tokens * per_token(stage),
                index_requested_bytes=index_requested,
                charged_bytes=charged,
            )
        )
    return pools


def rank_pools(size_gb: int, choice: KvChoice, page_size: int, rules: Rules) -> RankPools:
    """The most expensive rank's pools (its min_tokens: the fewest tokens of any stage)."""
    pools = stage_pools(size_gb, choice, page_size, rules)
    worst = max(pools, key=lambda p: (p.charged_bytes, p.kv_bytes))
    return RankPools(
        tokens=worst.tokens,
        min_tokens=min(p.tokens for p in pools),
        kv_bytes=worst.kv_bytes,
        index_bytes=worst.index_bytes,
        requested_bytes=worst.requested_bytes,
        index_requested_bytes=worst.index_requested_bytes,
        charged_bytes=worst.charged_bytes,
    )


def host_tokens(size_gb: int, kv_bytes_per_token: int, page_size: int, version: Any) -> int:
    """Tokens one rank's host pool holds for --hicache-size size_gb (one stage, no indexer)."""
    rules = _as_rules(version)
    return rank_pools(size_gb, KvChoice((Stage(kv_bytes_per_token, None),), False, ""), page_size, rules).tokens


def pinned_bytes_per_rank(size_gb: int, kv_bytes_per_token: int, page_size: int, version: Any) -> int:
    """Host bytes one rank commits for --hicache-size size_gb (one stage, no indexer)."""
    rules = _as_rules(version)
    return rank_pools(size_gb, KvChoice((Stage(kv_bytes_per_token, None),), False, ""), page_size, rules).charged_bytes


def _as_rules(version: Any) -> Rules:
    if isinstance(version, Rules):
        return version
    if isinstance(version, SglangVersion):
        return Rules(behaviour_releases(version)[0][0])
    return Rules(behaviour_releases(parse_version(version))[0][0])


def fmt_gb(value_bytes: int) -> str:
    """Decimal GB with one decimal, in integer arithmetic (no float overflow for any int)."""
    tenths = (abs(value_bytes) * 10 + GB_BYTES // 2) // GB_BYTES
    return "%s%d.%d GB" % ("-" if value_bytes < 0 and tenths else "", tenths // 10, tenths % 10)


def fmt_gib(value_bytes: int) -> str:
    if abs(value_bytes) < 10 * GIB_BYTES:
        hundredths = (abs(value_bytes) * 100 + GIB_BYTES // 2) // GIB_BYTES
        return "%s%d.%02d GiB" % ("-" if value_bytes < 0 and hundredths else "", hundredths // 100, hundredths % 100)
    tenths = (abs(value_bytes) * 10 + GIB_BYTES // 2) // GIB_BYTES
    return "%s%d.%d GiB" % ("-" if value_bytes < 0 else "", tenths // 10, tenths % 10)


def fmt_both(value_bytes: int) -> str:
    return "%s (%s)" % (fmt_gb(value_bytes), fmt_gib(value_bytes))


@dataclass(frozen=True)
class _Case:
    """One release x one KV choice: the plan must hold for every case of the input."""

    rules: Rules
    choice: KvChoice

    def pools(self, size_gb: int, page_size: int) -> RankPools:
        return rank_pools(size_gb, self.choice, page_size, self.rules)


@dataclass(frozen=True)
class _Host:
    """What the most loaded host holds: per node, how many ranks of each stage (the launcher's PP
    ranges), times the TP ranks and DP replicas of each, plus other engines' ranks."""

    compositions: Tuple[Tuple[int, ...], ...]
    ranks_per_stage_rank: int
    other_ranks: int

    def pinned(self, case: _Case, size_gb: int, page_size: int) -> Tuple[int, RankPools]:
        pools = stage_pools(size_gb, case.choice, page_size, case.rules)
        worst = max(pools, key=lambda p: (p.charged_bytes, p.kv_bytes))
        engine = self.ranks_per_stage_rank * max(sum(n * p.charged_bytes for n, p in zip(comp, pools)) for comp in self.compositions)
        return engine + self.other_ranks * worst.charged_bytes, worst


def _host_of(placement: Placement, pp_size: int, nnodes: int, choice: KvChoice, other_ranks: int) -> _Host:
    a, b = placement.pp_per_node, placement.nnodes_per_pp_rank
    compositions = set()
    for node in range(nnodes):
        counts = [0] * len(choice.stages)
        for pp_rank in range(a * (node // b), min(a * (node // b + 1), pp_size)):
            counts[choice.stage_of_rank[pp_rank]] += 1
        compositions.add(tuple(counts))
    return _Host(tuple(sorted(compositions)), placement.tp_per_node * placement.replicas, other_ranks)


def _largest_fitting_size_gb(budget_bytes: int, case: _Case, host: _Host, page: int) -> int:
    """The largest H whose pools on the most loaded host fit budget_bytes (they grow with H)."""
    if budget_bytes <= 0 or host.pinned(case, 1, page)[0] > budget_bytes:
        return 0
    low, high = 1, max(2, budget_bytes // GB_BYTES + 1)
    while host.pinned(case, high, page)[0] <= budget_bytes:
        low, high = high, high * 2
    while high - low > 1:
        middle = (low + high) // 2
        if host.pinned(case, middle, page)[0] <= budget_bytes:
            low = middle
        else:
            high = middle
    return low


def _smallest_size_above_device(case: _Case, page: int, device_tokens: int, ceiling_gb: int) -> Optional[int]:
    """The smallest H up to ceiling_gb whose every stage holds more tokens than the device pool."""
    if case.pools(ceiling_gb, page).min_tokens <= device_tokens:
        return None
    low, high = 0, ceiling_gb  # pools(low) fails (or low == 0), pools(high) passes
    while high - low > 1:
        middle = (low + high) // 2
        if case.pools(middle, page).min_tokens > device_tokens:
            high = middle
        else:
            low = middle
    return high


def _sglang_guard(pools: RankPools, inp: PlanInput, rules: Rules) -> Tuple[bool, bool, str]:
    """SGLang's own start-up check of an explicit size under one release: (passes on a quiet host,
    passes for the last rank to start, text).  Exact per release (docs/sizing.md)."""
    placement = inp.placement
    available = inp.mem_available_bytes
    basis_text = "MemAvailable"
    if rules.guard_reads_cgroup and inp.mem_limit_bytes is not None:
        available = min(available, inp.mem_limit_bytes)
        basis_text = (
            "min(MemAvailable, cgroup limit - usage)"
            if rules.release <= (0, 5, 21)
            else "min(MemAvailable, cgroup limit - (usage - file cache))"
        )
    free = available - SGLANG_RESERVE_BYTES
    requested = pools.requested_bytes
    if rules.guard_divisor == "none":
        divisor = 1
        limit = free
        text = "each rank alone: %s of the %s pool%s against %s - 10 GiB = %s" % (
            fmt_gb(requested),
            "requested" if rules.pins_power_of_two else "KV",
            " (before the power-of-two rounding)" if rules.pins_power_of_two else "",
            basis_text,
            fmt_gb(limit),
        )
    else:
        divisor = max(inp.tp_size * inp.pp_size // inp.nnodes, 1)
        limit = free // divisor
        text = "(%s - 10 GiB) / %d ranks (%s) = %s per rank" % (basis_text, divisor, rules.guard_divisor, fmt_gb(limit))
        if rules.dsa_indexer == "outside" and pools.index_requested_bytes:
            text += "; the indexer pool (%s) is checked the same way, on its own" % fmt_gb(pools.index_requested_bytes)
    passes = requested <= limit and pools.index_requested_bytes <= limit
    # A rank that starts after its peers pinned their pools sees them gone from MemAvailable
    # but still divides by all ranks (sglang#38156): the worst case is the last of them.
    peers = divisor - 1 if rules.guard_divisor != "none" else placement.ranks_per_node - 1
    late_limit = (free - peers * pools.charged_bytes) // divisor
    late_passes = requested <= late_limit and pools.index_requested_bytes <= late_limit
    if rules.guard_divisor != "none" and divisor != placement.ranks_per_node:
        why = []
        if placement.replicas > 1:
            why.append("the %d DP replicas without DP attention are not counted" % placement.replicas)
        if placement.tp_per_node * placement.pp_per_node != divisor:
            why.append("the launcher places %d ranks per node, not tp x pp / nnodes" % (placement.tp_per_node * placement.pp_per_node))
        text += ", although %d ranks run on this host (%s)" % (placement.ranks_per_node, "; ".join(why))
    return passes, late_passes, text


def _bar(segments: List[Tuple[str, int]], scale_bytes: int, limit_bytes: int, width: int = 64) -> str:
    """A stacked text bar of the segments; a '|' marks where the memory basis ends if demand overflows it."""
    cells = ""
    for char, value in segments:
        n = (width * value * 2 + scale_bytes) // (2 * scale_bytes) if scale_bytes else 0
        if value > 0 and n == 0:
            n = 1
        cells += char * n
    if limit_bytes < scale_bytes:
        cut = (width * limit_bytes * 2 + scale_bytes) // (2 * scale_bytes)
        cells = cells[:cut] + "|" + cells[cut:]
    return "[" + cells + "]"


def _layout_text(inp: PlanInput) -> str:
    placement = inp.placement
    text = (
        "SGLang's launcher (entrypoints/engine.py) places tp // max(nnodes // pp, 1) = %d // %d = %d TP rank(s) x "
        "max(pp // nnodes, 1) = %d PP stage(s) on each node"
        % (inp.tp_size, placement.nnodes_per_pp_rank, placement.tp_per_node, placement.pp_per_node)
    )
    if inp.dp_size > 1 and not inp.enable_dp_attention:
        text += ", x dp %d replicas (plain DP: launch_dp_schedulers starts %d full TP groups)" % (inp.dp_size, inp.dp_size)
    elif inp.dp_size > 1:
        text += " (dp %d with DP attention: the DP groups share the TP ranks, no extra ranks)" % inp.dp_size
    return text + " = %d" % placement.ranks_per_node


def plan(data: Mapping[str, Any]) -> Dict[str, Any]:
    """Compute the HiCache plan for one host. Raises PlanError on bad input only, never on 'does not fit'."""
    inp = validate(data)
    pol = inp.policy
    warnings = list(inp.warnings)
    page = pol["page_size"]
    placement = inp.placement

    engine_ranks = placement.ranks_per_node
    if engine_ranks > inp.gpu_count:
        raise PlanError(
            "this layout puts %d GPU ranks on each host (%s) but the host has %d GPUs; lower tp/pp/dp, raise nnodes, "
            "or pass more GPUs to the container" % (engine_ranks, _layout_text(inp), inp.gpu_count)
        )
    ranks = engine_ranks + pol["other_engine_ranks"]

    basis = inp.mem_available_bytes if inp.mem_limit_bytes is None else min(inp.mem_available_bytes, inp.mem_limit_bytes)
    ram = inp.mem_total_bytes if inp.mem_limit_bytes is None else min(inp.mem_total_bytes, inp.mem_limit_bytes)
    reserve = max(pol["os_reserve_min_bytes"], int(pol["os_reserve_fraction"] * ram))
    overhead = ranks * pol["rank_overhead_bytes"] + pol["frontend_overhead_bytes"]
    other = pol["other_committed_bytes"]
    budget = basis - reserve - overhead - other
    per_rank_budget = max(budget, 0) // ranks

    cases = [_Case(rules, choice) for rules in inp.releases for choice in inp.kv_choices]
    hosts = {id(choice): _host_of(placement, inp.pp_size, inp.nnodes, choice, pol["other_engine_ranks"]) for choice in inp.kv_choices}

    def on_host(case: _Case, size: int) -> Tuple[int, RankPools]:
        return hosts[id(case.choice)].pinned(case, size, page)

    max_by_case = [_largest_fitting_size_gb(budget, case, hosts[id(case.choice)], page) for case in cases]
    max_gb = min(max_by_case)
    governing = cases[max_by_case.index(max_gb)]

    # Up to 0.5.14 the host pool must hold more tokens than the device pool, or start-up asserts.
    device_tokens = inp.device_pool_tokens_per_rank
    old_cases = [case for case in cases if case.rules.asserts_host_exceeds_device]
    min_gb = 1
    if old_cases and device_tokens is not None:
        ceiling = max(max_gb, inp.requested_gb or 0, 1)
        needed = [_smallest_size_above_device(case, page, device_tokens, ceiling) for case in old_cases]
        min_gb = ceiling + 1 if any(n is None for n in needed) else max([1] + [n for n in needed if n is not None])
    elif old_cases and max_gb >= 1:
        worst = min(case.pools(max_gb, page).min_tokens for case in old_cases)
        gpu_tokens_bound = inp.gpu_memory_mib * MIB_BYTES // min(c.choice.largest.kv_bytes_per_token for c in old_cases)
        if worst <= gpu_tokens_bound:
            warnings.append(
                "SGLang %s asserts at start-up that the host pool holds more tokens than the device pool; "
                "%d host tokens per rank do not exceed what %d MiB of GPU memory could hold. Pass "
                "device_pool_tokens_per_rank (max_total_num_tokens from /server_info) to check it"
                % (" / ".join(str(c.rules) for c in old_cases[:1]), worst, inp.gpu_memory_mib)
            )

    chosen = inp.requested_gb if inp.requested_gb is not None else max_gb
    fits_budget = 1 <= chosen <= max_gb
    fits_device = not (old_cases and device_tokens is not None and chosen >= 1 and chosen < min_gb)
    fits = fits_budget and fits_device

    # The case that costs most at the chosen size is the one the numbers below show: what may be pinned.
    shown = governing
    if chosen >= 1:
        shown = max(cases, key=lambda c: (on_host(c, chosen)[0], -cases.index(c)))
    if chosen >= 1:
        total_pinned, pools = on_host(shown, chosen)
    else:
        total_pinned, pools = 0, RankPools(0, 0, 0, 0, 0, 0, 0)
    pinned = pools.charged_bytes
    headroom = budget - total_pinned
    tokens = pools.tokens
    rules = shown.rules
    release_names = [str(r) for r in inp.releases]

    explain: List[str] = [
        "SGLang %s%s: --hicache-size is decimal GB (1e9 bytes) PER RANK; each of the %d scheduler ranks on this host "
        "pins its own pool via %s."
        % (
            inp.version,
            (" (behaviour of %s)" % " or ".join(release_names)) if release_names != [str(inp.version)] else "",
            ranks,
            rules.allocation,
        ),
        "Ranks on this host: %s%s."
        % (_layout_text(inp), (" + %d of other engines = %d" % (pol["other_engine_ranks"], ranks)) if pol["other_engine_ranks"] else ""),
        "Memory basis: min(MemAvailable %s, container limit %s) = %s."
        % (
            fmt_both(inp.mem_available_bytes),
            fmt_both(inp.mem_limit_bytes) if inp.mem_limit_bytes is not None else "none",
            fmt_both(basis),
        ),
        "  - OS reserve: max(%s, %d%% of %s RAM) = %s"
        % (fmt_gib(pol["os_reserve_min_bytes"]), round(pol["os_reserve_fraction"] * 100), fmt_gib(ram), fmt_gb(reserve)),
        "  - process overhead: %d ranks x %s + front-end %s = %s"
        % (ranks, fmt_gib(pol["rank_overhead_bytes"]), fmt_gib(pol["frontend_overhead_bytes"]), fmt_gb(overhead)),
    ]
    if other:
        explain.append("  - committed to other engines/services: %s" % fmt_gb(other))
    explain.append("  = budget for host KV pools: %s, %s per rank." % (fmt_gb(budget), fmt_gb(per_rank_budget)))
    explain.append("KV per token per rank: %d bytes (%s)." % (shown.choice.largest.kv_bytes_per_token, inp.kv_source))
    if inp.dsa and rules.dsa_indexer == "outside":
        explain.append(
            "DSA indexer: SGLang %s allocates a second pool of the KV pool's token count outside --hicache-size "
            "(pool_host/dsa.py): %s per rank at --hicache-size %d, priced in." % (rules, fmt_gb(pools.index_bytes), max(chosen, 0))
        )
    elif inp.dsa and rules.dsa_indexer == "inside":
        explain.append(
            "DSA indexer: SGLang %s counts the indexer keys inside --hicache-size (NSATokenToKVPoolHost, one buffer per layer)." % rules
        )
    if inp.pp_size > 1 and not rules.pp_min_tokens:
        explain.append(
            "PP: SGLang %s rounds each stage's token count up to a page on its own (no sync before 0.5.15); the most "
            "expensive stage is priced." % rules
        )

    if inp.requested_gb is not None:
        verdict = "fits" if fits else "DOES NOT FIT"
        explain.append(
            "Requested --hicache-size %d: %d ranks x %s%s%s = %s pinned vs budget %s: %s%s."
            % (
                chosen,
                ranks,
                "up to " if total_pinned != ranks * pinned else "",
                fmt_gb(pinned),
                (" (%d GB rounded up to a power of two)" % chosen) if rules.pins_power_of_two else "",
                fmt_gb(total_pinned),
                fmt_gb(budget),
                verdict,
                (" (short by %s)" % fmt_gb(-headroom)) if headroom < 0 else (" (headroom %s)" % fmt_gb(headroom)),
            )
        )
        if not fits_device:
            explain.append(
                "SGLang %s asserts host tokens > device tokens at start-up: %d host tokens per rank <= %d device tokens per rank."
                % (" / ".join(str(c.rules) for c in old_cases), min(c.pools(chosen, page).min_tokens for c in old_cases), device_tokens)
            )
        for guard_rules in _distinct_guards(inp.releases):
            guard_pools = _Case(guard_rules, shown.choice).pools(chosen, page)
            guard_ok, guard_late_ok, guard_text = _sglang_guard(guard_pools, inp, guard_rules)
            if not fits and guard_ok:
                consequence = (
                    "the host would run out of memory instead of refusing"
                    if reserve + overhead + other + total_pinned > basis
                    else "it would start, leaving less than the reserves above for the OS and the processes"
                )
                explain.append("SGLang %s's own check (%s) lets every rank through: %s." % (guard_rules, guard_text, consequence))
            elif not guard_ok:
                explain.append("SGLang %s's own check (%s) would refuse it at start-up." % (guard_rules, guard_text))
            else:
                explain.append("SGLang %s's own check (%s) lets it through." % (guard_rules, guard_text))
            if fits and guard_ok and not guard_late_ok and guard_rules.guard_divisor != "none":
                warnings.append(
                    "SGLang %s's own check can refuse this size when ranks start one after another (it counts pools already "
                    "pinned twice, sglang#38156); a retry may pass" % guard_rules
                )
        if max_gb >= min_gb:
            best_total, best = max((on_host(c, max_gb) for c in cases), key=lambda pinned_pools: pinned_pools[0])
            explain.append(
                "Largest safe value: --hicache-size %d (%d x %s%s = %s pinned)."
                % (max_gb, ranks, "up to " if best_total != ranks * best.charged_bytes else "", fmt_gb(best.charged_bytes), fmt_gb(best_total))
            )
    if inp.requested_gb is None or fits:
        if chosen >= 1 and fits:
            explain.append(
                "Plan: --hicache-size %d per rank -> %d ranks x %s%s = %s pinned%s, headroom %s; %d tokens per rank."
                % (
                    chosen,
                    ranks,
                    "up to " if total_pinned != ranks * pinned else "",
                    fmt_gb(pinned),
                    fmt_gb(total_pinned),
                    (
                        (" (each %d GB pool rounded up to a power of two, 2^%d bytes)" % (chosen, pinned.bit_length() - 1))
                        if rules.pins_power_of_two
                        else (" (%s KV + %s indexer each)" % (fmt_gb(pools.kv_bytes), fmt_gb(pools.index_bytes)) if pools.index_bytes else "")
                    ),
                    fmt_gb(headroom),
                    tokens,
                )
            )
    if not fits and inp.requested_gb is None:
        if max_gb < 1:
            explain.append(
                "Nothing fits: %s per rank is less than the smallest pool (1 GB%s). Free memory, raise the container limit, "
                "or lower the reserve/overhead policy if you have measured it."
                % (fmt_gb(per_rank_budget), ", pinned as a power of two" if any(r.pins_power_of_two for r in inp.releases) else "")
            )
        else:
            explain.append(
                "Nothing fits: SGLang %s needs more host tokens than the %d device tokens per rank (at least --hicache-size %d) "
                "but the budget allows at most %d. Upgrade to 0.5.15+ (a warning only) or give the pools more memory."
                % (inp.version, device_tokens or 0, min_gb, max_gb)
            )

    demand = reserve + overhead + other + max(total_pinned, 0)
    scale = max(basis, demand)
    free_after = max(basis - demand, 0)
    picture = [
        "Host memory basis %s%s" % (fmt_both(basis), "" if demand <= basis else "; demand %s overflows it" % fmt_gb(demand)),
        _bar([("#", reserve), ("o", overhead + other), ("P" if fits else "!", total_pinned), (".", free_after)], scale, basis),
        " # OS reserve        %10s" % fmt_gb(reserve),
        " o processes         %10s" % fmt_gb(overhead + other),
        " %s KV pools          %10s  (%d ranks x %s%s%s)"
        % (
            "P" if fits else "!",
            fmt_gb(total_pinned),
            ranks,
            "up to " if total_pinned != ranks * pinned else "",
            fmt_gb(pinned),
            "" if fits else ", does not fit",
        ),
        " . left              %10s" % fmt_gb(free_after),
    ]

    return {
        "sglang_version": str(inp.version),
        "behaviour_of_releases": release_names,
        "per_rank_gb": chosen if fits else 0,
        "max_per_rank_gb": max_gb,
        "requested_gb": inp.requested_gb,
        "ranks_per_host": ranks,
        "engine_ranks_per_host": engine_ranks,
        "placement": {
            "tp_ranks_per_node": placement.tp_per_node,
            "pp_stages_per_node": placement.pp_per_node,
            "dp_replicas_per_node": placement.replicas,
            "formula": "tp // max(nnodes // pp, 1) x max(pp // nnodes, 1)%s" % (" x dp" if placement.replicas > 1 else ""),
        },
        "kv_bytes_per_token": shown.choice.largest.kv_bytes_per_token,
        "host_tokens_per_rank": tokens,
        "device_pool_tokens_per_rank": device_tokens,
        "kv_pool_bytes_per_rank": pools.kv_bytes,
        "indexer_pool_bytes_per_rank": pools.index_bytes,
        "pinned_per_rank_bytes": pinned,
        "total_pinned_bytes": total_pinned,
        "memory_basis_bytes": basis,
        "reserve_bytes": reserve,
        "overhead_bytes": overhead + other,
        "budget_bytes": budget,
        "per_rank_budget_bytes": per_rank_budget,
        "headroom_bytes": headroom,
        "allocation": rules.allocation,
        "fits": fits,
        "explain": explain,
        "picture": picture,
        "warnings": warnings,
    }


def _distinct_guards(releases: Sequence[Rules]) -> List[Rules]:
    """One release per distinct behaviour of SGLang's own check."""
    seen: Dict[Tuple[str, bool, bool, bool, bool], Rules] = {}
    for rules in releases:
        key = (rules.guard_divisor, rules.guard_reads_cgroup, rules.release <= (0, 5, 21), rules.pins_power_of_two, rules.dsa_indexer == "outside")
        seen.setdefault(key, rules)
    return list(seen.values())


def size_gb(data: Mapping[str, Any]) -> int:
    """The --hicache-size to pass (GB per rank); raises PlanError with the arithmetic when nothing fits."""
    result = plan(data)
    if not result["fits"]:
        raise PlanError("\n".join(result["explain"]))
    return int(result["per_rank_gb"])
