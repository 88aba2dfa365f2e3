# -*- coding: utf-8 -*-
# Copyright: inferops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The KV bytes per token of a rank's PP stages, from a model preset, its geometry or a given figure
(pure Python, no Ansible imports).

SGLang's ``get_size_per_token`` of the MHA and MLA host pools, the DSA indexer of DeepSeek-V3.2 and
GLM-5, and ``get_pp_indices`` for the layers of each stage; docs/sizing.md ("The arithmetic", "DSA
models").
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Tuple

from ansible_collections.inferops.gpu_inference.plugins.module_utils.sizing.hicache_pools import KvChoice, Stage, pp_stage_layers
from ansible_collections.inferops.gpu_inference.plugins.module_utils.sizing.sizing_values import (
    KIB_BYTES,
    MIB_BYTES,
    PlanError,
    as_int,
    clip,
    ranged_int,
)

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

#: A KV entry is at least a few hundred bytes per token even for a tiny model: below this the figure
#: is in KiB; above, it is not per token.
MIN_PLAUSIBLE_KV_BYTES_PER_TOKEN = 512
MAX_PLAUSIBLE_KV_BYTES_PER_TOKEN = 64 * MIB_BYTES

#: The geometry keys of a preset; the plan input gives each as ``model_<key>``.
GEOMETRY_KEYS = ("attention", "num_layers", "kv_lora_rank", "qk_rope_head_dim", "num_kv_heads", "head_dim", "index_head_dim", "num_attention_heads")

#: (KV bytes per layer per token, how the explanation names it).
_PerLayer = Tuple[int, str]


def kv_choices(data: Mapping[str, Any], tp: int, pp: int, dp: int, dp_attention: bool) -> Tuple[List[KvChoice], str, bool]:
    """The KV geometry of a rank's stages, how it was found (for the explanation), and whether the model is DSA."""
    geometry = _geometry(data)
    attn_tp = tp // dp if (dp_attention and dp > 1) else tp
    layers = _layers_and_heads(geometry, pp, attn_tp, tp)

    attention = geometry.get("attention")
    if attention is None and geometry:
        attention = "dsa" if "index_head_dim" in geometry else ("mla" if "kv_lora_rank" in geometry else "mha")
    attention = str(attention).lower() if attention is not None else None
    if attention is not None and attention not in ("mla", "mha", "gqa", "dsa"):
        raise PlanError("model_attention must be 'mla', 'mha', 'gqa' or 'dsa', got %s" % clip(geometry.get("attention")))
    dsa = attention == "dsa"

    dtype_name, dtype_bytes = _kv_dtype(data.get("kv_cache_dtype"))
    if data.get("kv_bytes_per_token") is not None:
        return _given_choice(data["kv_bytes_per_token"], dsa, layers, pp)

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
    largest_text = "%d layers%s" % (max(stage_layers), " (largest PP stage)" if pp > 1 else "")

    if attention in ("mla", "dsa"):
        per_layer, index_per_layer = _mla_per_layer(geometry, attention, dtype_name, dtype_bytes)
        choices = [_choice(kv_layer, stage_layers, index_per_layer, label) for kv_layer, label in per_layer]
        text = "%s: %s per layer x %s, replicated on every rank" % (
            attention.upper(),
            " or ".join(label for _k, label in per_layer),
            largest_text,
        )
        if dsa:
            text += "; indexer %d B per layer" % index_per_layer
        return choices, text, dsa

    per_layer_bytes, head_dim, heads_per_rank = _mha_per_layer(geometry, attn_tp, dtype_bytes)
    return (
        [_choice(per_layer_bytes, stage_layers, 0, "")],
        "MHA/GQA: 2 x %d head_dim x %d KV heads/rank x %s x %d B" % (head_dim, heads_per_rank, largest_text, dtype_bytes),
        False,
    )


def _geometry(data: Mapping[str, Any]) -> Dict[str, Any]:
    """The preset's geometry, overridden by any ``model_<key>`` given."""
    geometry: Dict[str, Any] = {}
    preset = data.get("model_preset")
    if preset is not None:
        name = str(preset).strip().lower() if isinstance(preset, str) else None
        if name not in MODEL_PRESETS:
            raise PlanError(
                "model_preset %s is unknown; known presets: %s. Or give the geometry (model_num_layers, ...) "
                "or kv_bytes_per_token" % (clip(preset), ", ".join(sorted(MODEL_PRESETS)))
            )
        geometry.update(MODEL_PRESETS[name])  # type: ignore[index]
    for key in GEOMETRY_KEYS:
        if data.get("model_" + key) is not None:
            geometry[key] = data["model_" + key]
    return geometry


def _layers_and_heads(geometry: Mapping[str, Any], pp: int, attn_tp: int, tp: int) -> Optional[int]:
    """The model's layers (None when not given), refusing a PP size above them and heads that do not split."""
    layers: Optional[int] = None
    if geometry.get("num_layers") is not None:
        layers = ranged_int("model_num_layers", geometry["num_layers"])
        if pp > layers:
            raise PlanError(
                "pp_size %d is more than the model's %d layers: SGLang's get_pp_indices would give a stage no layers" % (pp, layers)
            )
    if geometry.get("num_attention_heads") is not None:
        heads = ranged_int("model_num_attention_heads", geometry["num_attention_heads"])
        if heads % attn_tp != 0:
            raise PlanError(
                "SGLang cannot shard the model's %d attention heads over an attention TP size of %d (\"%d is not "
                "divisible by %d\": the attention layer splits the heads evenly over the ranks); use a tp_size%s "
                "that divides %d" % (heads, attn_tp, heads, attn_tp, " / dp_size" if attn_tp != tp else "", heads)
            )
    return layers


def _kv_dtype(raw: Any) -> Tuple[str, int]:
    name = str(raw).strip().lower() if isinstance(raw, str) else ("auto" if raw is None else None)
    if name not in KV_DTYPE_BYTES:
        raise PlanError("kv_cache_dtype %s is unknown; use one of %s" % (clip(raw), ", ".join(sorted(KV_DTYPE_BYTES))))
    return name, KV_DTYPE_BYTES[name]  # type: ignore[index]


def _given_choice(raw: Any, dsa: bool, layers: Optional[int], pp: int) -> Tuple[List[KvChoice], str, bool]:
    """A bare kv_bytes_per_token: the largest stage's figure (the smaller stages are unknown)."""
    if dsa:
        raise PlanError(
            "kv_bytes_per_token cannot price a DSA model (DeepSeek-V3.2, GLM-5): its indexer pool needs the geometry; "
            "give model_preset, or model_num_layers, model_kv_lora_rank, model_qk_rope_head_dim and model_index_head_dim"
        )
    kv = as_int("kv_bytes_per_token", raw, 1)
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


def _mla_per_layer(geometry: Mapping[str, Any], attention: str, dtype_name: str, dtype_bytes: int) -> Tuple[List[_PerLayer], int]:
    """An MLA (or DSA) layer's KV bytes per token for each layout SGLang may pick, and the DSA indexer's."""
    dsa = attention == "dsa"
    for key in ("kv_lora_rank", "qk_rope_head_dim") + (("index_head_dim",) if dsa else ()):
        if geometry.get(key) is None:
            raise PlanError(
                "model_%s is missing: an %s model's KV size needs kv_lora_rank and qk_rope_head_dim%s"
                % (key, attention.upper(), " and index_head_dim" if dsa else "")
            )
    lora = ranged_int("model_kv_lora_rank", geometry["kv_lora_rank"])
    rope = ranged_int("model_qk_rope_head_dim", geometry["qk_rope_head_dim"])
    if not dsa:
        return [((lora + rope) * dtype_bytes, "%d x %d B" % (lora + rope, dtype_bytes))], 0
    index_dim = ranged_int("model_index_head_dim", geometry["index_head_dim"])
    # Indexer keys: fp8 values plus one 4-byte scale per 128 (uint8 storage; memory_pool.py).
    index_per_layer = index_dim + index_dim // DSA_QUANT_BLOCK * 4
    bf16 = ((lora + rope) * 2, "bf16 %d x 2 B" % (lora + rope))
    # FP8 DSA: latent fp8 + its scales + rope kept bf16 (calculate_mla_kv_cache_dim); the trtllm
    # backend keeps the plain (lora + rope) x 1 B.
    packed = lora + lora // DSA_QUANT_BLOCK * 4 + rope * 2
    fp8_packed = (packed, "fp8 packed %d B" % packed)
    fp8_plain = (lora + rope, "fp8 trtllm %d B" % (lora + rope))
    if dtype_name in ("bf16", "bfloat16"):
        return [bf16], index_per_layer
    if dtype_name == "fp8_e4m3":
        return [fp8_packed, fp8_plain], index_per_layer
    if dtype_name == "auto":
        # SGLang picks fp8_e4m3 on SM100+ and bfloat16 before (_set_default_nsa_kv_cache_dtype).
        return [bf16, fp8_packed, fp8_plain], index_per_layer
    raise PlanError(
        "SGLang refuses kv_cache_dtype %s for a DSA model: \"DeepSeek DSA only supports bf16/bfloat16 or "
        "fp8_e4m3 kv_cache_dtype\" (server_args.py)" % dtype_name
    )


def _mha_per_layer(geometry: Mapping[str, Any], attn_tp: int, dtype_bytes: int) -> Tuple[int, int, int]:
    """An MHA/GQA layer's KV bytes per token on one rank, with its head_dim and KV heads per rank."""
    for key in ("num_kv_heads", "head_dim"):
        if geometry.get(key) is None:
            raise PlanError("model_%s is missing: an MHA/GQA model's KV size needs num_kv_heads and head_dim" % key)
    kv_heads = ranged_int("model_num_kv_heads", geometry["num_kv_heads"])
    head_dim = ranged_int("model_head_dim", geometry["head_dim"])
    if not (kv_heads % attn_tp == 0 or attn_tp % kv_heads == 0):
        raise PlanError(
            "SGLang cannot shard %d KV heads over an attention TP size of %d (QKVParallelLinear: \"%d is not divisible by %d\"); "
            "use a tp_size that divides the KV heads or a multiple of them" % (kv_heads, attn_tp, max(kv_heads, attn_tp), min(kv_heads, attn_tp))
        )
    heads_per_rank = max(1, kv_heads // attn_tp)
    return 2 * head_dim * heads_per_rank * dtype_bytes, head_dim, heads_per_rank


def _choice(kv_per_layer: int, stage_layers: List[int], index_per_layer: int, label: str) -> KvChoice:
    """One KV layout over the PP stages: one Stage per distinct layer count."""
    distinct = sorted(set(stage_layers))
    stages = tuple(Stage(kv_per_layer * n, n, index_per_layer) for n in distinct)
    return KvChoice(stages, False, label, tuple(distinct.index(n) for n in stage_layers))
