"""Model geometry from the model directory's config.json, and the KV bytes per token one rank
holds (sglang-hicache.md sections 2.1 and 7)."""

import json
import os

MLA_ARCHS = {
    "DeepseekV2ForCausalLM",
    "DeepseekV3ForCausalLM",
    "DeepseekV32ForCausalLM",
    "DeepseekVL2ForCausalLM",
    "KimiK2ForCausalLM",
    "KimiVLForConditionalGeneration",
}

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "half": 2, "float32": 4, "float": 4, "float8_e4m3fn": 1}


class ModelConfig:
    def __init__(self, model_path: str):
        self.model_path = model_path
        path = os.path.join(model_path, "config.json")
        if not os.path.isfile(path):
            # what transformers says for a directory without config.json
            raise OSError(
                "%s does not appear to have a file named config.json. Checkout "
                "'https://huggingface.co/%s/tree/None' for available files." % (model_path, model_path)
            )
        with open(path) as f:
            self.hf = json.load(f)
        hf = self.hf
        self.architectures = list(hf.get("architectures") or [])
        self.model_type = hf.get("model_type", "")
        self.num_layers = int(hf["num_hidden_layers"])
        self.num_attention_heads = int(hf.get("num_attention_heads", 1))
        self.num_kv_heads = int(hf.get("num_key_value_heads") or self.num_attention_heads)
        self.hidden_size = int(hf.get("hidden_size", 0) or 0)
        self.head_dim = int(hf.get("head_dim") or (self.hidden_size // self.num_attention_heads if self.hidden_size else 128))
        self.is_mla = bool(set(self.architectures) & MLA_ARCHS) or "kv_lora_rank" in hf
        self.kv_lora_rank = int(hf.get("kv_lora_rank") or 0)
        self.qk_rope_head_dim = int(hf.get("qk_rope_head_dim") or 0)
        self.dtype = str(hf.get("torch_dtype") or hf.get("dtype") or "bfloat16")
        self.context_len = int(hf.get("max_position_embeddings") or 4096)
        self.weights_bytes = self._weights_bytes()

    def _weights_bytes(self) -> int:
        """metadata.total_size of model.safetensors.index.json (no real weights in the lab)."""
        idx = os.path.join(self.model_path, "model.safetensors.index.json")
        try:
            with open(idx) as f:
                return int(json.load(f)["metadata"]["total_size"])
        except (OSError, KeyError, ValueError, TypeError):
            total = 0
            for name in os.listdir(self.model_path):
                if name.endswith(".safetensors"):
                    total += os.path.getsize(os.path.join(self.model_path, name))
            return total

    def dtype_bytes(self, kv_cache_dtype: str) -> int:
        """store_dtype itemsize: fp8 KV is stored as uint8 (1 byte); auto = the model dtype."""
        kv = (kv_cache_dtype or "auto").lower()
        if kv.startswith("fp8"):
            return 1
        if kv in ("bf16", "bfloat16", "fp16", "float16"):
            return 2
        if kv == "fp4_e2m1":
            return 1  # stored as uint8 (packed); unsourced for the host pool
        return DTYPE_BYTES.get(self.dtype.lower().replace("torch.", ""), 2)

    def num_kv_heads_per_rank(self, attn_tp_size: int) -> int:
        """get_num_kv_heads: max(1, total_kv_heads // attn_tp_size) (KV heads replicated when fewer)."""
        return max(1, self.num_kv_heads // max(1, attn_tp_size))

    def bytes_per_token(self, layers: int, attn_tp_size: int, kv_cache_dtype: str) -> int:
        itemsize = self.dtype_bytes(kv_cache_dtype)
        if self.is_mla:
            # MLATokenToKVPoolHost: (kv_lora_rank + qk_rope_head_dim) * itemsize * layers; replicated
            return (self.kv_lora_rank + self.qk_rope_head_dim) * itemsize * layers
        # MHATokenToKVPoolHost: head_dim * head_num * layer_num * itemsize * 2
        return self.head_dim * self.num_kv_heads_per_rank(attn_tp_size) * layers * itemsize * 2


def pp_layers(num_layers: int, pp_rank: int, pp_size: int) -> int:
    """Layers held by one PP stage: SGLang's get_pp_indices (python/sglang/srt/distributed/utils.py,
    the same from 0.4.9 to 0.5.23) splits evenly and gives the extra layers to the LAST
    ``num_layers % pp_size`` stages.  (SGLANG_PP_LAYER_PARTITION is not modelled.)"""
    if pp_size <= 1:
        return num_layers
    base, remainder = divmod(num_layers, pp_size)
    return base + (1 if pp_rank >= pp_size - remainder else 0)
