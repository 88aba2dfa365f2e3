# -*- coding: utf-8 -*-
# Copyright: inferops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""HiCache host-memory sizing model for SGLang (pure Python, no Ansible imports).

SGLang's ``--hicache-size`` is in decimal GB (1e9 bytes) **per rank**: every scheduler process on a
host pins its own pool.  This module counts the ranks on a host, takes a memory budget from host
facts and the container limit, and returns the largest per-rank size that fits, or explains, with
the arithmetic, why a requested size does not.  Facts and formulas: shared/reference/sglang-hicache.md.

Every memory quantity carries its unit in its name: ``_bytes`` (integers), ``_gb`` (1e9 bytes),
``_gib`` (2**30 bytes), ``_mib`` (2**20 bytes).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Tuple

GB_BYTES = 10**9
GIB_BYTES = 2**30
MIB_BYTES = 2**20

#: SGLang's own reserve (``HICACHE_HOST_MEMORY_RESERVE_BYTES``), 10 GiB in every version.
SGLANG_RESERVE_BYTES = 10 * GIB_BYTES
#: A memory figure below this cannot be a GPU host's: it is a value in the wrong unit.
MIN_PLAUSIBLE_MEMORY_BYTES = 64 * MIB_BYTES

KNOWN_FIRST_VERSION = (0, 4, 9)
KNOWN_LAST_VERSION = (0, 5, 23)

#: Policy defaults, each documented in docs/sizing.md.
DEFAULT_POLICY: Dict[str, Any] = {
    # OS, page cache, agents: the larger of SGLang's own 10 GiB and a share of RAM.
    "os_reserve_min_bytes": SGLANG_RESERVE_BYTES,
    "os_reserve_fraction": 0.10,
    # RSS of one scheduler process (CUDA context, torch, NCCL) and of the front-end
    # (HTTP server, tokenizer, detokenizer): 8 GiB each until measured (sglang-hicache.md section 4).
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
    # DeepseekV3 architecture: 61 layers, kv_lora_rank 512, qk_rope_head_dim 64.
    "kimi-k2": {"attention": "mla", "num_layers": 61, "kv_lora_rank": 512, "qk_rope_head_dim": 64},
    "deepseek-v3": {"attention": "mla", "num_layers": 61, "kv_lora_rank": 512, "qk_rope_head_dim": 64},
    "llama-3-70b": {"attention": "mha", "num_layers": 80, "num_kv_heads": 8, "head_dim": 128},
    "llama-3-8b": {"attention": "mha", "num_layers": 32, "num_kv_heads": 8, "head_dim": 128},
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

_MEMORY_KEYS = ("mem_total_bytes", "mem_available_bytes", "mem_limit_bytes")
_REQUIRED_KEYS = ("mem_total_bytes", "mem_available_bytes", "gpu_count", "gpu_memory_mib", "sglang_version")
_OPTIONAL_KEYS = (
    "mem_limit_bytes",
    "tp_size",
    "pp_size",
    "dp_size",
    "enable_dp_attention",
    "nnodes",
    "kv_bytes_per_token",
    "model_preset",
    "model_attention",
    "model_num_layers",
    "model_kv_lora_rank",
    "model_qk_rope_head_dim",
    "model_num_kv_heads",
    "model_head_dim",
    "kv_cache_dtype",
    "device_pool_tokens_per_rank",
    "requested_gb",
) + tuple(DEFAULT_POLICY)
ALLOWED_KEYS = frozenset(_REQUIRED_KEYS + _OPTIONAL_KEYS)

_VERSION_RE = re.compile(r"^v?(\d+)\.(\d+)\.(\d+)(?:[.\-+]?(?:post|rc|dev|a|b)\.?\d*)*(?:\+[\w.]+)?$")


class PlanError(ValueError):
    """Bad input, or a plan that cannot be made: the message says what was wrong and what to do."""


@dataclass(frozen=True, order=True)
class SglangVersion:
    """An SGLang release, compared by (major, minor, patch)."""

    major: int
    minor: int
    patch: int

    def __str__(self) -> str:
        return "%d.%d.%d" % (self.major, self.minor, self.patch)

    @property
    def key(self) -> Tuple[int, int, int]:
        return (self.major, self.minor, self.patch)

    # Version boundaries, sglang-hicache.md sections 2.2-2.5.
    @property
    def pins_power_of_two(self) -> bool:
        """Up to 0.5.4 torch pin_memory rounds each pool up to the next power of two."""
        return self.key <= (0, 5, 4)

    @property
    def asserts_host_exceeds_device(self) -> bool:
        """Up to 0.5.14 start-up asserts that the host pool holds more tokens than the device pool."""
        return self.key <= (0, 5, 14)

    @property
    def pages_align_up(self) -> bool:
        """From 0.5.6 the token count is aligned up to whole pages plus one page; before, down."""
        return self.key >= (0, 5, 6)

    @property
    def guard_divides_by_ranks(self) -> bool:
        """From 0.5.19 SGLang's own host-memory check divides MemAvailable by the ranks on the host."""
        return self.key >= (0, 5, 19)

    @property
    def guard_reads_cgroup(self) -> bool:
        """From 0.5.21 SGLang's own check also bounds by the cgroup headroom."""
        return self.key >= (0, 5, 21)

    @property
    def allocation(self) -> str:
        if self.pins_power_of_two:
            return "torch pin_memory (rounded up to a power of two)"
        if self.key <= (0, 5, 14):
            return "cudaHostRegister (exact size, locked at start-up)"
        return "mmap MAP_SHARED|MAP_POPULATE + cudaHostRegister (exact size, counted as Shmem)"


def parse_version(value: Any) -> SglangVersion:
    """Parse an SGLang version such as ``0.5.9``, ``v0.5.9`` or ``0.5.10.post1``."""
    text = str(value).strip() if value is not None else ""
    match = _VERSION_RE.match(text)
    if not match:
        raise PlanError(
            "sglang_version %r is not an SGLang release number: give it as MAJOR.MINOR.PATCH, "
            "for example '0.5.9' (the version of the installed sglang package)" % (value,)
        )
    version = SglangVersion(int(match.group(1)), int(match.group(2)), int(match.group(3)))
    if version.key < KNOWN_FIRST_VERSION:
        raise PlanError(
            "sglang_version %s is older than 0.4.9, the first release whose HiCache memory behaviour "
            "this model knows; upgrade SGLang or size the cache by hand" % version
        )
    return version


# --------------------------------------------------------------------------------------------
# Input coercion and validation


def _as_int(key: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool):
        raise PlanError("%s must be a number, got the boolean %r" % (key, value))
    if isinstance(value, str):
        text = value.strip().replace("_", "")
        if not re.match(r"^-?\d+(\.0*)?$", text):
            raise PlanError("%s must be a whole number, got %r" % (key, value))
        value = int(float(text)) if "." in text else int(text)
    elif isinstance(value, float):
        if not math.isfinite(value) or not value.is_integer():
            raise PlanError("%s must be a whole number, got %r" % (key, value))
        value = int(value)
    elif not isinstance(value, int):
        raise PlanError("%s must be a whole number, got %s %r" % (key, type(value).__name__, value))
    if value < minimum:
        raise PlanError("%s must be at least %d, got %d" % (key, minimum, value))
    return value


def _as_float(key: str, value: Any, low: float, high: float) -> float:
    if isinstance(value, bool):
        raise PlanError("%s must be a number, got the boolean %r" % (key, value))
    try:
        result = float(value)
    except (TypeError, ValueError) as exc:
        raise PlanError("%s must be a number, got %r" % (key, value)) from exc
    if not (low <= result <= high) or not math.isfinite(result):
        raise PlanError("%s must be between %s and %s, got %r" % (key, low, high, value))
    return result


def _as_bool(key: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "yes", "on", "1", "false", "no", "off", "0"):
        return value.strip().lower() in ("true", "yes", "on", "1")
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    raise PlanError("%s must be true or false, got %r" % (key, value))


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
    return result


@dataclass
class PlanInput:
    """Validated, unit-explicit inputs of a plan."""

    mem_total_bytes: int
    mem_available_bytes: int
    mem_limit_bytes: Optional[int]
    gpu_count: int
    gpu_memory_mib: int
    version: SglangVersion
    tp_size: int = 1
    pp_size: int = 1
    dp_size: int = 1
    enable_dp_attention: bool = False
    nnodes: int = 1
    kv_bytes_per_token: int = 0
    kv_source: str = ""
    device_pool_tokens_per_rank: Optional[int] = None
    requested_gb: Optional[int] = None
    policy: Dict[str, Any] = field(default_factory=dict)
    warnings: List[str] = field(default_factory=list)


def _kv_bytes_per_token(data: Mapping[str, Any], tp_size: int, pp_size: int, dp_size: int, dp_attention: bool) -> Tuple[int, str]:
    """KV bytes per token held by one rank (sglang-hicache.md sections 2.1 and 7)."""
    if data.get("kv_bytes_per_token") is not None:
        return _as_int("kv_bytes_per_token", data["kv_bytes_per_token"], 1), "given"
    geometry: Dict[str, Any] = {}
    preset = data.get("model_preset")
    if preset is not None:
        name = str(preset).strip().lower()
        if name not in MODEL_PRESETS:
            raise PlanError(
                "model_preset %r is unknown; known presets: %s. Or give the geometry (model_num_layers, ...) "
                "or kv_bytes_per_token" % (preset, ", ".join(sorted(MODEL_PRESETS)))
            )
        geometry.update(MODEL_PRESETS[name])
    for key in ("attention", "num_layers", "kv_lora_rank", "qk_rope_head_dim", "num_kv_heads", "head_dim"):
        if data.get("model_" + key) is not None:
            geometry[key] = data["model_" + key]
    if not geometry:
        raise PlanError(
            "the model's KV size is missing: give kv_bytes_per_token (bytes per token per rank), or model_preset "
            "(%s), or the geometry: model_num_layers with model_kv_lora_rank and model_qk_rope_head_dim (MLA), "
            "or model_num_layers with model_num_kv_heads and model_head_dim (MHA/GQA)" % ", ".join(sorted(MODEL_PRESETS))
        )
    attention = str(geometry.get("attention") or ("mla" if "kv_lora_rank" in geometry else "mha")).lower()
    if attention not in ("mla", "mha", "gqa"):
        raise PlanError("model_attention must be 'mla', 'mha' or 'gqa', got %r" % geometry.get("attention"))
    dtype_name = str(data.get("kv_cache_dtype") or "auto").strip().lower()
    if dtype_name not in KV_DTYPE_BYTES:
        raise PlanError("kv_cache_dtype %r is unknown; use one of %s" % (dtype_name, ", ".join(sorted(KV_DTYPE_BYTES))))
    dtype_bytes = KV_DTYPE_BYTES[dtype_name]
    if "num_layers" not in geometry:
        raise PlanError("model_num_layers is missing: the KV size per token needs the model's layer count")
    layers = _as_int("model_num_layers", geometry["num_layers"], 1)
    # With PP a rank holds only its stage's layers; the largest stage bounds every rank.
    stage_layers = -(-layers // pp_size)
    if attention == "mla":
        for key in ("kv_lora_rank", "qk_rope_head_dim"):
            if key not in geometry:
                raise PlanError("model_%s is missing: an MLA model's KV size needs kv_lora_rank and qk_rope_head_dim" % key)
        kv_dim = _as_int("model_kv_lora_rank", geometry["kv_lora_rank"], 1) + _as_int(
            "model_qk_rope_head_dim", geometry["qk_rope_head_dim"], 0
        )
        # MLA KV is replicated on every TP rank.
        return kv_dim * dtype_bytes * stage_layers, "MLA: (%d) x %d B x %d layers, replicated on every rank" % (
            kv_dim,
            dtype_bytes,
            stage_layers,
        )
    for key in ("num_kv_heads", "head_dim"):
        if key not in geometry:
            raise PlanError("model_%s is missing: an MHA/GQA model's KV size needs num_kv_heads and head_dim" % key)
    kv_heads = _as_int("model_num_kv_heads", geometry["num_kv_heads"], 1)
    head_dim = _as_int("model_head_dim", geometry["head_dim"], 1)
    attn_tp = tp_size // dp_size if dp_attention else tp_size
    heads_per_rank = max(1, kv_heads // attn_tp)
    return (
        2 * head_dim * heads_per_rank * stage_layers * dtype_bytes,
        "MHA/GQA: 2 x %d head_dim x %d KV heads/rank x %d layers x %d B" % (head_dim, heads_per_rank, stage_layers, dtype_bytes),
    )


def validate(data: Mapping[str, Any]) -> PlanInput:
    """Check and coerce one flat dict of facts and policy; raise PlanError on any bad input."""
    if not isinstance(data, Mapping):
        raise PlanError("the plan input must be a dict of facts and policy, got %s" % type(data).__name__)
    unknown = sorted(str(k) for k in data if k not in ALLOWED_KEYS)
    if unknown:
        hints = []
        for key in unknown:
            stem = re.sub(r"_(gb|gib|mb|mib|kb|kib)$", "", key)
            if stem != key and stem + "_bytes" in ALLOWED_KEYS:
                hints.append("%s: memory inputs are in bytes, use %s_bytes" % (key, stem))
        raise PlanError(
            "unknown key(s) %s%s. Known keys: %s"
            % (", ".join(unknown), (" (" + "; ".join(hints) + ")") if hints else "", ", ".join(sorted(ALLOWED_KEYS)))
        )
    missing = [k for k in _REQUIRED_KEYS if data.get(k) is None]
    if missing:
        raise PlanError(
            "missing required key(s): %s. mem_*_bytes come from /proc/meminfo or the gpu_host_facts module (bytes), "
            "gpu_count and gpu_memory_mib from nvidia-smi, sglang_version from the installed sglang package" % ", ".join(missing)
        )
    version = parse_version(data["sglang_version"])
    warnings: List[str] = []
    if version.key > KNOWN_LAST_VERSION:
        warnings.append(
            "SGLang %s is newer than 0.5.23, the last release this model was checked against; it is treated as 0.5.23" % version
        )

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

    gpu_count = _as_int("gpu_count", data["gpu_count"], 1)
    gpu_memory_mib = _as_int("gpu_memory_mib", data["gpu_memory_mib"], 1)
    if gpu_memory_mib < 1024:
        raise PlanError(
            "gpu_memory_mib=%d is less than 1 GiB: it looks like GiB or GB were passed where MiB are expected "
            "(nvidia-smi --query-gpu=memory.total --format=csv,nounits reports MiB)" % gpu_memory_mib
        )
    if gpu_memory_mib > 16 * 1024 * 1024:
        raise PlanError(
            "gpu_memory_mib=%d is more than 16 TiB per GPU: it looks like bytes were passed where MiB are expected" % gpu_memory_mib
        )

    tp = _as_int("tp_size", data.get("tp_size", 1), 1)
    pp = _as_int("pp_size", data.get("pp_size", 1), 1)
    dp = _as_int("dp_size", data.get("dp_size", 1), 1)
    nnodes = _as_int("nnodes", data.get("nnodes", 1), 1)
    dp_attention = _as_bool("enable_dp_attention", data.get("enable_dp_attention", False))
    if dp_attention and dp > 1 and tp % dp != 0:
        raise PlanError("with enable_dp_attention, dp_size (%d) must divide tp_size (%d): attention TP is tp/dp" % (dp, tp))
    if (tp * pp) % nnodes != 0:
        raise PlanError(
            "tp_size x pp_size = %d x %d = %d ranks cannot be spread evenly over nnodes=%d; "
            "SGLang places tp x pp / nnodes ranks on each node" % (tp, pp, tp * pp, nnodes)
        )

    kv_bytes, kv_source = _kv_bytes_per_token(data, tp, pp, dp, dp_attention)

    policy = dict(DEFAULT_POLICY)
    for key in DEFAULT_POLICY:
        if data.get(key) is not None:
            if key == "os_reserve_fraction":
                policy[key] = _as_float(key, data[key], 0.0, 0.9)
            elif key in ("page_size",):
                policy[key] = _as_int(key, data[key], 1)
            else:
                policy[key] = _as_int(key, data[key], 0)

    device_tokens = None
    if data.get("device_pool_tokens_per_rank") is not None:
        device_tokens = _as_int("device_pool_tokens_per_rank", data["device_pool_tokens_per_rank"], 1)

    requested = None
    if data.get("requested_gb") is not None:
        raw = data["requested_gb"]
        if isinstance(raw, float) and not raw.is_integer():
            raise PlanError(
                "requested_gb=%r: SGLang's --hicache-size is a whole number of GB (argparse type int; 8.5 makes it exit with code 2)" % raw
            )
        requested = _as_int("requested_gb", raw, 1)
        if requested * GB_BYTES > 64 * total:
            raise PlanError(
                "requested_gb=%d is GB per rank, i.e. %s per rank on a host with %s of RAM: "
                "it looks like bytes or MiB were passed; --hicache-size takes decimal GB"
                % (requested, fmt_gb(requested * GB_BYTES), fmt_gib(total))
            )

    return PlanInput(
        mem_total_bytes=total,
        mem_available_bytes=available,
        mem_limit_bytes=limit,
        gpu_count=gpu_count,
        gpu_memory_mib=gpu_memory_mib,
        version=version,
        tp_size=tp,
        pp_size=pp,
        dp_size=dp,
        enable_dp_attention=dp_attention,
        nnodes=nnodes,
        kv_bytes_per_token=kv_bytes,
        kv_source=kv_source,
        device_pool_tokens_per_rank=device_tokens,
        requested_gb=requested,
        policy=policy,
        warnings=warnings,
    )


# --------------------------------------------------------------------------------------------
# Arithmetic


def engine_ranks_per_host(tp_size: int, pp_size: int, dp_size: int, enable_dp_attention: bool, nnodes: int) -> int:
    """Scheduler processes (GPU ranks) one engine starts on each host (sglang-hicache.md section 3)."""
    replicas = 1 if (enable_dp_attention or dp_size == 1) else dp_size
    return tp_size * pp_size * replicas // nnodes


def pow2_ceil(value: int) -> int:
    """The next power of two at or above value (PyTorch's CachingHostAllocator rounding)."""
    return 1 if value <= 1 else 1 << (value - 1).bit_length()


def host_tokens(size_gb: int, kv_bytes_per_token: int, page_size: int, version: SglangVersion) -> int:
    """Tokens one rank's host pool holds for --hicache-size size_gb (sglang-hicache.md section 2.2)."""
    tokens = int(size_gb * GB_BYTES // kv_bytes_per_token)
    if version.pages_align_up:
        return (tokens // page_size + 1) * page_size
    return tokens - tokens % page_size


def pinned_bytes_per_rank(size_gb: int, kv_bytes_per_token: int, page_size: int, version: SglangVersion) -> int:
    """Host bytes one rank commits for --hicache-size size_gb (section 2.5)."""
    requested = host_tokens(size_gb, kv_bytes_per_token, page_size, version) * kv_bytes_per_token
    return pow2_ceil(requested) if version.pins_power_of_two else requested


def fmt_gb(value_bytes: float) -> str:
    return "%.1f GB" % (value_bytes / GB_BYTES)


def fmt_gib(value_bytes: float) -> str:
    value_gib = value_bytes / GIB_BYTES
    return ("%.2f GiB" if abs(value_gib) < 10 else "%.1f GiB") % value_gib


def fmt_both(value_bytes: float) -> str:
    return "%s (%s)" % (fmt_gb(value_bytes), fmt_gib(value_bytes))


def _largest_fitting_size_gb(per_rank_budget_bytes: int, kv: int, page: int, version: SglangVersion) -> int:
    size = per_rank_budget_bytes // GB_BYTES
    if version.pins_power_of_two and size > 0:
        # pow2_ceil(bytes) <= budget  <=>  bytes <= the largest power of two <= budget
        size = (1 << (per_rank_budget_bytes.bit_length() - 1)) // GB_BYTES
    while size > 0 and pinned_bytes_per_rank(size, kv, page, version) > per_rank_budget_bytes:
        size -= 1
    return size


def _sglang_guard(pool_bytes: int, engine_ranks: int, inp: PlanInput) -> Tuple[bool, bool, int, str]:
    """SGLang's own start-up check for an explicit size: (passes on a quiet host, passes for the last rank, limit, text)."""
    available = inp.mem_available_bytes
    if inp.version.guard_reads_cgroup and inp.mem_limit_bytes is not None:
        available = min(available, inp.mem_limit_bytes)
    free = available - SGLANG_RESERVE_BYTES
    if inp.version.guard_divides_by_ranks:
        limit = free // engine_ranks
        # A rank arriving after its peers pinned sees their pools gone from MemAvailable but still
        # divides by all ranks (sglang#38156): the worst case is the last of them.
        late_limit = (free - (engine_ranks - 1) * pool_bytes) // engine_ranks
        text = "(MemAvailable - 10 GiB) / %d ranks = %s per rank" % (engine_ranks, fmt_gb(limit))
    else:
        limit = free
        late_limit = free - (engine_ranks - 1) * pool_bytes
        text = "each rank alone against MemAvailable - 10 GiB = %s" % fmt_gb(limit)
    return pool_bytes <= limit, pool_bytes <= late_limit, limit, text


def _bar(segments: List[Tuple[str, int]], scale_bytes: int, limit_bytes: int, width: int = 64) -> str:
    """A stacked text bar of the segments; a '|' marks where the memory basis ends if demand overflows it."""
    cells = ""
    for char, value in segments:
        n = int(round(width * value / scale_bytes)) if scale_bytes else 0
        if value > 0 and n == 0:
            n = 1
        cells += char * n
    if limit_bytes < scale_bytes:
        cut = int(round(width * limit_bytes / scale_bytes))
        cells = cells[:cut] + "|" + cells[cut:]
    return "[" + cells + "]"


def plan(data: Mapping[str, Any]) -> Dict[str, Any]:
    """Compute the HiCache plan for one host. Raises PlanError on bad input only, never on 'does not fit'."""
    inp = validate(data)
    v = inp.version
    pol = inp.policy
    warnings = list(inp.warnings)
    page = pol["page_size"]
    kv = inp.kv_bytes_per_token

    engine_ranks = engine_ranks_per_host(inp.tp_size, inp.pp_size, inp.dp_size, inp.enable_dp_attention, inp.nnodes)
    if engine_ranks > inp.gpu_count:
        raise PlanError(
            "this layout puts %d GPU ranks on each host (tp %d x pp %d%s / nnodes %d) but the host has %d GPUs; "
            "lower tp/pp/dp, raise nnodes, or pass more GPUs to the container"
            % (
                engine_ranks,
                inp.tp_size,
                inp.pp_size,
                "" if (inp.enable_dp_attention or inp.dp_size == 1) else " x dp %d" % inp.dp_size,
                inp.nnodes,
                inp.gpu_count,
            )
        )
    if inp.gpu_count % engine_ranks != 0:
        raise PlanError(
            "the %d ranks per host of this layout do not divide the host's %d GPUs (tp_size %d); use a tp_size "
            "that divides the GPU count, or set gpu_count to the GPUs given to this container" % (engine_ranks, inp.gpu_count, inp.tp_size)
        )
    ranks = engine_ranks + pol["other_engine_ranks"]

    basis = inp.mem_available_bytes if inp.mem_limit_bytes is None else min(inp.mem_available_bytes, inp.mem_limit_bytes)
    ram = inp.mem_total_bytes if inp.mem_limit_bytes is None else min(inp.mem_total_bytes, inp.mem_limit_bytes)
    reserve = max(pol["os_reserve_min_bytes"], int(pol["os_reserve_fraction"] * ram))
    overhead = ranks * pol["rank_overhead_bytes"] + pol["frontend_overhead_bytes"]
    other = pol["other_committed_bytes"]
    budget = basis - reserve - overhead - other
    per_rank_budget = max(budget, 0) // ranks

    max_gb = _largest_fitting_size_gb(per_rank_budget, kv, page, v)

    # Up to 0.5.14 the host pool must hold more tokens than the device pool, or start-up asserts.
    gpu_bytes = inp.gpu_memory_mib * MIB_BYTES
    device_tokens = inp.device_pool_tokens_per_rank
    min_gb = 1
    if v.asserts_host_exceeds_device:
        if device_tokens is not None:
            while min_gb <= max(max_gb, 1) and host_tokens(min_gb, kv, page, v) <= device_tokens:
                min_gb += 1
        elif max_gb >= 1 and host_tokens(max_gb, kv, page, v) <= gpu_bytes // kv:
            warnings.append(
                "SGLang %s asserts at start-up that the host pool holds more tokens than the device pool; "
                "%d host tokens per rank do not exceed what %d MiB of GPU memory could hold. Pass "
                "device_pool_tokens_per_rank (max_total_num_tokens from /server_info) to check it"
                % (v, host_tokens(max_gb, kv, page, v), inp.gpu_memory_mib)
            )

    chosen = inp.requested_gb if inp.requested_gb is not None else max_gb
    fits_budget = chosen >= 1 and chosen <= max_gb
    fits_device = not (
        v.asserts_host_exceeds_device and device_tokens is not None and chosen >= 1 and host_tokens(chosen, kv, page, v) <= device_tokens
    )
    fits = fits_budget and fits_device

    pinned = pinned_bytes_per_rank(chosen, kv, page, v) if chosen >= 1 else 0
    total_pinned = pinned * ranks
    headroom = budget - total_pinned
    tokens = host_tokens(chosen, kv, page, v) if chosen >= 1 else 0

    layout = "tp %d x pp %d" % (inp.tp_size, inp.pp_size)
    if inp.dp_size > 1:
        layout += " x dp %d" % inp.dp_size if not inp.enable_dp_attention else " (dp %d with DP attention: no extra ranks)" % inp.dp_size
    layout += " / nnodes %d" % inp.nnodes

    explain: List[str] = [
        "SGLang %s: --hicache-size is decimal GB (1e9 bytes) PER RANK; each of the %d scheduler ranks on this host "
        "pins its own pool via %s." % (v, ranks, v.allocation),
        "Ranks on this host: %s = %d%s."
        % (layout, engine_ranks, (" + %d of other engines = %d" % (pol["other_engine_ranks"], ranks)) if pol["other_engine_ranks"] else ""),
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
    explain.append("KV per token per rank: %d bytes (%s)." % (kv, inp.kv_source))

    if inp.requested_gb is not None:
        verdict = "fits" if fits else "DOES NOT FIT"
        explain.append(
            "Requested --hicache-size %d: %d ranks x %s%s = %s pinned vs budget %s: %s%s."
            % (
                chosen,
                ranks,
                fmt_gb(pinned),
                (" (%d GB rounded up to a power of two)" % chosen) if v.pins_power_of_two else "",
                fmt_gb(total_pinned),
                fmt_gb(budget),
                verdict,
                (" (short by %s)" % fmt_gb(-headroom)) if headroom < 0 else (" (headroom %s)" % fmt_gb(headroom)),
            )
        )
        if not fits_device:
            explain.append(
                "SGLang %s asserts host tokens > device tokens at start-up: %d host tokens per rank <= %d device tokens per rank."
                % (v, tokens, device_tokens)
            )
        guard_ok, guard_late_ok, _limit, guard_text = _sglang_guard(pinned, engine_ranks, inp)
        if not fits and guard_ok:
            consequence = (
                "the host would run out of memory instead of refusing"
                if reserve + overhead + other + total_pinned > basis
                else "it would start, leaving less than the reserves above for the OS and the processes"
            )
            explain.append("SGLang %s's own check (%s) lets every rank through: %s." % (v, guard_text, consequence))
        elif not guard_ok:
            explain.append("SGLang %s's own check (%s) would refuse it at start-up." % (v, guard_text))
        if fits and guard_ok and not guard_late_ok:
            warnings.append(
                "SGLang %s's own check can refuse this size when ranks start one after another (it counts pools already "
                "pinned twice, sglang#38156); a retry may pass" % v
            )
        if max_gb >= min_gb:
            explain.append(
                "Largest safe value: --hicache-size %d (%d x %s = %s pinned)."
                % (
                    max_gb,
                    ranks,
                    fmt_gb(pinned_bytes_per_rank(max_gb, kv, page, v)),
                    fmt_gb(ranks * pinned_bytes_per_rank(max_gb, kv, page, v)),
                )
            )
    if inp.requested_gb is None or fits:
        if chosen >= 1 and fits:
            explain.append(
                "Plan: --hicache-size %d per rank -> %d ranks x %s = %s pinned%s, headroom %s; %d tokens per rank."
                % (
                    chosen,
                    ranks,
                    fmt_gb(pinned),
                    fmt_gb(total_pinned),
                    (
                        (" (each %d GB pool rounded up to a power of two, 2^%d bytes)" % (chosen, pinned.bit_length() - 1))
                        if v.pins_power_of_two
                        else ""
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
                % (fmt_gb(per_rank_budget), ", pinned as a power of two" if v.pins_power_of_two else "")
            )
        else:
            explain.append(
                "Nothing fits: SGLang %s needs more host tokens than the %d device tokens per rank (at least --hicache-size %d) "
                "but the budget allows at most %d. Upgrade to 0.5.15+ (a warning only) or give the pools more memory."
                % (v, device_tokens or 0, min_gb, max_gb)
            )

    demand = reserve + overhead + other + max(total_pinned, 0)
    scale = max(basis, demand)
    free_after = max(basis - demand, 0)
    picture = [
        "Host memory basis %s%s" % (fmt_both(basis), "" if demand <= basis else "; demand %s overflows it" % fmt_gb(demand)),
        _bar([("#", reserve), ("o", overhead + other), ("P" if fits else "!", total_pinned), (".", free_after)], scale, basis),
        " # OS reserve        %10s" % fmt_gb(reserve),
        " o processes         %10s" % fmt_gb(overhead + other),
        " %s KV pools          %10s  (%d ranks x %s%s)"
        % ("P" if fits else "!", fmt_gb(total_pinned), ranks, fmt_gb(pinned), "" if fits else ", does not fit"),
        " . left              %10s" % fmt_gb(free_after),
    ]

    return {
        "sglang_version": str(v),
        "per_rank_gb": chosen if fits else 0,
        "max_per_rank_gb": max_gb,
        "requested_gb": inp.requested_gb,
        "ranks_per_host": ranks,
        "engine_ranks_per_host": engine_ranks,
        "kv_bytes_per_token": kv,
        "host_tokens_per_rank": tokens,
        "device_pool_tokens_per_rank": device_tokens,
        "pinned_per_rank_bytes": pinned,
        "total_pinned_bytes": total_pinned,
        "memory_basis_bytes": basis,
        "reserve_bytes": reserve,
        "overhead_bytes": overhead + other,
        "budget_bytes": budget,
        "per_rank_budget_bytes": per_rank_budget,
        "headroom_bytes": headroom,
        "allocation": v.allocation,
        "fits": fits,
        "explain": explain,
        "picture": picture,
        "warnings": warnings,
    }


def size_gb(data: Mapping[str, Any]) -> int:
    """The --hicache-size to pass (GB per rank); raises PlanError with the arithmetic when nothing fits."""
    result = plan(data)
    if not result["fits"]:
        raise PlanError("\n".join(result["explain"]))
    return int(result["per_rank_gb"])
