"""Choice lists of SGLang's server arguments, per release, copied from the released wheels.

Generated from the wheels on PyPI (`pip download --no-deps sglang==<ver>`), one per release the stand-in
builds (build_wheels.py).  Each entry: (first release, choices, where in that release's wheel the list is).
A list applies from its release up to the next entry; releases between two entries that the stand-in
does not build were not checked.  SGLang builds --attention-backend etc. from module-level lists that
plugins may extend at run time (add_*_choices); these are the literal lists as released.
"""

CHOICES = {
    '--load-format': [
        # sglang-0.5.2-py3-none-any.whl: sglang/srt/server_args.py LOAD_FORMAT_CHOICES
        ((0, 5, 2), [
            'auto', 'pt', 'safetensors', 'npcache', 'dummy', 'sharded_state', 'gguf', 'bitsandbytes',
            'layered', 'remote',
        ]),
        # sglang-0.5.4-py3-none-any.whl: sglang/srt/server_args.py LOAD_FORMAT_CHOICES
        ((0, 5, 4), [
            'auto', 'pt', 'safetensors', 'npcache', 'dummy', 'sharded_state', 'gguf', 'bitsandbytes',
            'layered', 'remote', 'remote_instance',
        ]),
        # sglang-0.5.9-py3-none-any.whl: sglang/srt/server_args.py LOAD_FORMAT_CHOICES
        ((0, 5, 9), [
            'auto', 'pt', 'safetensors', 'npcache', 'dummy', 'sharded_state', 'gguf', 'bitsandbytes',
            'layered', 'flash_rl', 'remote', 'remote_instance', 'fastsafetensors', 'private',
        ]),
        # sglang-0.5.10-py3-none-any.whl: sglang/srt/server_args.py LOAD_FORMAT_CHOICES
        ((0, 5, 10), [
            'auto', 'pt', 'safetensors', 'npcache', 'dummy', 'sharded_state', 'gguf', 'bitsandbytes',
            'mistral', 'layered', 'flash_rl', 'remote', 'remote_instance', 'fastsafetensors', 'private',
            'runai_streamer',
        ]),
        # sglang-0.5.18-cp311-cp311-manylinux_2_34_x86_64.whl: sglang/srt/server_args.py LOAD_FORMAT_CHOICES
        ((0, 5, 18), [
            'auto', 'pt', 'safetensors', 'npcache', 'dummy', 'sharded_state', 'presharded', 'gguf',
            'bitsandbytes', 'mistral', 'layered', 'flash_rl', 'remote', 'remote_instance', 'fastsafetensors',
            'private', 'runai_streamer',
        ]),
        # sglang-0.5.19-cp311-cp311-manylinux_2_34_x86_64.whl: sglang/srt/server_args.py LOAD_FORMAT_CHOICES
        ((0, 5, 19), [
            'auto', 'pt', 'safetensors', 'npcache', 'dummy', 'sharded_state', 'presharded', 'gguf',
            'expert_pack', 'bitsandbytes', 'mistral', 'layered', 'flash_rl', 'remote', 'remote_instance',
            'fastsafetensors', 'private', 'runai_streamer',
        ]),
        # sglang-0.5.23-cp311-cp311-manylinux_2_34_x86_64.whl: sglang/srt/arg_groups/choices.py LOAD_FORMAT_CHOICES
        ((0, 5, 23), [
            'auto', 'pt', 'safetensors', 'instanttensor', 'npcache', 'dummy', 'sharded_state', 'presharded',
            'gguf', 'expert_pack', 'bitsandbytes', 'mistral', 'layered', 'flash_rl', 'remote',
            'remote_instance', 'fastsafetensors', 'private', 'runai_streamer',
        ]),
    ],
    '--quantization': [
        # sglang-0.5.2-py3-none-any.whl: sglang/srt/server_args.py QUANTIZATION_CHOICES
        ((0, 5, 2), [
            'awq', 'fp8', 'gptq', 'marlin', 'gptq_marlin', 'awq_marlin', 'bitsandbytes', 'gguf', 'modelopt',
            'modelopt_fp4', 'petit_nvfp4', 'w8a8_int8', 'w8a8_fp8', 'moe_wna16', 'qoq', 'w4afp8', 'mxfp4',
        ]),
        # sglang-0.5.4-py3-none-any.whl: sglang/srt/server_args.py QUANTIZATION_CHOICES
        ((0, 5, 4), [
            'awq', 'fp8', 'gptq', 'marlin', 'gptq_marlin', 'awq_marlin', 'bitsandbytes', 'gguf', 'modelopt',
            'modelopt_fp8', 'modelopt_fp4', 'petit_nvfp4', 'w8a8_int8', 'w8a8_fp8', 'moe_wna16', 'qoq',
            'w4afp8', 'mxfp4', 'compressed-tensors',
        ]),
        # sglang-0.5.5-py3-none-any.whl: sglang/srt/server_args.py QUANTIZATION_CHOICES
        ((0, 5, 5), [
            'awq', 'fp8', 'gptq', 'marlin', 'gptq_marlin', 'awq_marlin', 'bitsandbytes', 'gguf', 'modelopt',
            'modelopt_fp8', 'modelopt_fp4', 'petit_nvfp4', 'w8a8_int8', 'w8a8_fp8', 'moe_wna16', 'qoq',
            'w4afp8', 'mxfp4', 'auto-round', 'compressed-tensors',
        ]),
        # sglang-0.5.9-py3-none-any.whl: sglang/srt/server_args.py QUANTIZATION_CHOICES
        ((0, 5, 9), [
            'awq', 'fp8', 'mxfp8', 'gptq', 'marlin', 'gptq_marlin', 'awq_marlin', 'bitsandbytes', 'gguf',
            'modelopt', 'modelopt_fp8', 'modelopt_fp4', 'petit_nvfp4', 'w8a8_int8', 'w8a8_fp8', 'moe_wna16',
            'qoq', 'w4afp8', 'mxfp4', 'auto-round', 'compressed-tensors', 'modelslim', 'quark_int4fp8_moe',
        ]),
        # sglang-0.5.10-py3-none-any.whl: sglang/srt/server_args.py QUANTIZATION_CHOICES
        ((0, 5, 10), [
            'awq', 'fp8', 'mxfp8', 'gptq', 'marlin', 'gptq_marlin', 'awq_marlin', 'bitsandbytes', 'gguf',
            'modelopt', 'modelopt_fp8', 'modelopt_fp4', 'modelopt_mixed', 'petit_nvfp4', 'w8a8_int8',
            'w8a8_fp8', 'moe_wna16', 'qoq', 'w4afp8', 'mxfp4', 'auto-round', 'compressed-tensors',
            'modelslim', 'quark_int4fp8_moe',
        ]),
        # sglang-0.5.12-cp311-cp311-manylinux_2_34_x86_64.whl: sglang/srt/server_args.py QUANTIZATION_CHOICES
        ((0, 5, 12), [
            'awq', 'fp8', 'mxfp8', 'gptq', 'marlin', 'gptq_marlin', 'awq_marlin', 'bitsandbytes', 'gguf',
            'modelopt', 'modelopt_fp8', 'modelopt_fp4', 'modelopt_mixed', 'petit_nvfp4', 'w8a8_int8',
            'w8a8_fp8', 'moe_wna16', 'qoq', 'w4afp8', 'mxfp4', 'auto-round', 'compressed-tensors',
            'modelslim', 'quark', 'quark_int4fp8_moe', 'mlx_q4', 'mlx_q8', 'unquant',
        ]),
        # sglang-0.5.14-cp311-cp311-manylinux_2_34_x86_64.whl: sglang/srt/server_args.py QUANTIZATION_CHOICES
        ((0, 5, 14), [
            'awq', 'fp8', 'mxfp8', 'gptq', 'marlin', 'gptq_marlin', 'awq_marlin', 'bitsandbytes', 'gguf',
            'modelopt', 'modelopt_fp8', 'modelopt_fp4', 'nvfp4_online', 'modelopt_mixed', 'petit_nvfp4',
            'w8a8_int8', 'w8a8_fp8', 'moe_wna16', 'qoq', 'w4afp8', 'mxfp4', 'auto-round',
            'compressed-tensors', 'modelslim', 'quark', 'quark_int4fp8_moe', 'quark_mxfp4', 'mlx_q4',
            'mlx_q8', 'unquant',
        ]),
        # sglang-0.5.15-cp311-cp311-manylinux_2_34_x86_64.whl: sglang/srt/server_args.py QUANTIZATION_CHOICES
        ((0, 5, 15), [
            'awq', 'fp8', 'mxfp8', 'gptq', 'marlin', 'gptq_marlin', 'awq_marlin', 'bitsandbytes', 'gguf',
            'modelopt', 'modelopt_fp8', 'modelopt_fp4', 'nvfp4_online', 'modelopt_mixed', 'petit_nvfp4',
            'w8a8_int8', 'w8a8_fp8', 'moe_wna16', 'qoq', 'w4afp8', 'mxfp4', 'auto-round', 'auto-round-int8',
            'compressed-tensors', 'modelslim', 'mxfp_w4a8', 'quark', 'quark_int4fp8_moe', 'quark_mxfp4',
            'mlx_q4', 'mlx_q8', 'unquant',
        ]),
        # sglang-0.5.18-cp311-cp311-manylinux_2_34_x86_64.whl: sglang/srt/server_args.py QUANTIZATION_CHOICES
        ((0, 5, 18), [
            'awq', 'fp8', 'mxfp8', 'gptq', 'marlin', 'gptq_marlin', 'awq_marlin', 'bitsandbytes', 'gguf',
            'modelopt', 'modelopt_fp8', 'modelopt_fp4', 'nvfp4_online', 'modelopt_mixed', 'petit_nvfp4',
            'w8a8_int8', 'w8a8_fp8', 'moe_wna16', 'w4afp8', 'mxfp4', 'auto-round', 'auto-round-int8',
            'compressed-tensors', 'modelslim', 'mxfp_w4a8', 'quark', 'quark_int4fp8_moe', 'quark_mxfp4',
            'mlx_q4', 'mlx_q8', 'unquant', 'humming',
        ]),
        # sglang-0.5.20-cp311-cp311-manylinux_2_34_x86_64.whl: sglang/srt/arg_groups/choices.py QUANTIZATION_CHOICES
        ((0, 5, 20), [
            'awq', 'fp8', 'mxfp8', 'gptq', 'gptq_marlin', 'awq_marlin', 'bitsandbytes', 'gguf', 'modelopt',
            'modelopt_fp8', 'modelopt_fp4', 'nvfp4_online', 'modelopt_mixed', 'petit_nvfp4', 'w8a8_int8',
            'w8a8_fp8', 'moe_wna16', 'w4afp8', 'mxfp4', 'auto-round', 'auto-round-int8', 'compressed-tensors',
            'modelslim', 'mxfp_w4a8', 'quark', 'quark_int4fp8_moe', 'quark_mxfp4', 'mlx_q4', 'mlx_q8',
            'unquant', 'humming',
        ]),
    ],
    '--attention-backend': [
        # sglang-0.5.2-py3-none-any.whl: sglang/srt/server_args.py ATTENTION_BACKEND_CHOICES
        ((0, 5, 2), [
            'triton', 'torch_native', 'cutlass_mla', 'fa3', 'flashinfer', 'flashmla', 'trtllm_mla',
            'trtllm_mha', 'dual_chunk_flash_attn', 'hybrid_linear_attn', 'aiter', 'wave', 'intel_amx',
            'ascend',
        ]),
        # sglang-0.5.4-py3-none-any.whl: sglang/srt/server_args.py ATTENTION_BACKEND_CHOICES
        ((0, 5, 4), [
            'triton', 'torch_native', 'flex_attention', 'nsa', 'cutlass_mla', 'fa3', 'fa4', 'flashinfer',
            'flashmla', 'trtllm_mla', 'trtllm_mha', 'dual_chunk_flash_attn', 'aiter', 'wave', 'intel_amx',
            'ascend', 'intel_xpu',
        ]),
        # sglang-0.5.12-cp311-cp311-manylinux_2_34_x86_64.whl: sglang/srt/server_args.py ATTENTION_BACKEND_CHOICES
        ((0, 5, 12), [
            'triton', 'torch_native', 'flex_attention', 'nsa', 'dsv4', 'compressed', 'cutlass_mla', 'fa3',
            'fa4', 'flashinfer', 'flashmla', 'trtllm_mla', 'tokenspeed_mla', 'trtllm_mha',
            'dual_chunk_flash_attn', 'aiter', 'wave', 'intel_amx', 'ascend', 'intel_xpu',
        ]),
        # sglang-0.5.14-cp311-cp311-manylinux_2_34_x86_64.whl: sglang/srt/server_args.py ATTENTION_BACKEND_CHOICES
        ((0, 5, 14), [
            'triton', 'torch_native', 'flex_attention', 'dsa', 'nsa', 'dsv4', 'compressed', 'cutlass_mla',
            'fa3', 'fa4', 'flashinfer', 'flashmla', 'trtllm_mla', 'cutedsl_mla', 'tokenspeed_mla',
            'trtllm_mha', 'dual_chunk_flash_attn', 'aiter', 'wave', 'intel_amx', 'ascend', 'intel_xpu',
        ]),
        # sglang-0.5.18-cp311-cp311-manylinux_2_34_x86_64.whl: sglang/srt/server_args.py ATTENTION_BACKEND_CHOICES
        ((0, 5, 18), [
            'triton', 'torch_native', 'flex_attention', 'dsa', 'nsa', 'dsv4', 'compressed', 'cutlass_mla',
            'fa3', 'fa4', 'flashinfer', 'flashmla', 'trtllm_mla', 'cutedsl_mla', 'tokenspeed_mla',
            'trtllm_mha', 'dual_chunk_flash_attn', 'hpc_ops', 'aiter', 'wave', 'intel_amx', 'ascend',
            'intel_xpu',
        ]),
        # sglang-0.5.19-cp311-cp311-manylinux_2_34_x86_64.whl: sglang/srt/server_args.py ATTENTION_BACKEND_CHOICES
        ((0, 5, 19), [
            'triton', 'torch_native', 'flex_attention', 'dsa', 'nsa', 'dsv4', 'compressed', 'cutlass_mla',
            'fa3', 'fa4', 'flashinfer', 'flashmla', 'trtllm_mla', 'cutedsl_mla', 'tokenspeed_mla',
            'trtllm_mha', 'dual_chunk_flash_attn', 'hpc_ops', 'minicpm_flashattn', 'minicpm_flashinfer',
            'aiter', 'wave', 'intel_amx', 'ascend', 'intel_xpu',
        ]),
        # sglang-0.5.20-cp311-cp311-manylinux_2_34_x86_64.whl: sglang/srt/arg_groups/choices.py ATTENTION_BACKEND_CHOICES
        ((0, 5, 20), [
            'triton', 'torch_native', 'flex_attention', 'dsa', 'nsa', 'qsa', 'dsv4', 'compressed', 'fa3',
            'fa4', 'flashinfer', 'flashmla', 'trtllm_mla', 'cutedsl_mla', 'tokenspeed_mla', 'trtllm_mha',
            'hpc_ops', 'minicpm_flashattn', 'minicpm_flashinfer', 'aiter', 'wave', 'intel_amx', 'ascend',
            'intel_xpu',
        ]),
        # sglang-0.5.23-cp311-cp311-manylinux_2_34_x86_64.whl: sglang/srt/arg_groups/choices.py ATTENTION_BACKEND_CHOICES
        ((0, 5, 23), [
            'triton', 'torch_native', 'flex_attention', 'dsa', 'nsa', 'qsa', 'dsv4', 'compressed', 'fa3',
            'fa4', 'flashinfer', 'llada2_cfg_flashinfer', 'flashmla', 'trtllm_mla', 'cutedsl_mla',
            'tokenspeed_mla', 'trtllm_mha', 'hpc_ops', 'minicpm_flashattn', 'minicpm_flashinfer', 'aiter',
            'wave', 'intel_amx', 'ascend', 'intel_xpu',
        ]),
    ],
    '--prefill-attention-backend': [
        # sglang-0.5.2-py3-none-any.whl: sglang/srt/server_args.py ATTENTION_BACKEND_CHOICES
        ((0, 5, 2), [
            'triton', 'torch_native', 'cutlass_mla', 'fa3', 'flashinfer', 'flashmla', 'trtllm_mla',
            'trtllm_mha', 'dual_chunk_flash_attn', 'hybrid_linear_attn', 'aiter', 'wave', 'intel_amx',
            'ascend',
        ]),
        # sglang-0.5.4-py3-none-any.whl: sglang/srt/server_args.py ATTENTION_BACKEND_CHOICES
        ((0, 5, 4), [
            'triton', 'torch_native', 'flex_attention', 'nsa', 'cutlass_mla', 'fa3', 'fa4', 'flashinfer',
            'flashmla', 'trtllm_mla', 'trtllm_mha', 'dual_chunk_flash_attn', 'aiter', 'wave', 'intel_amx',
            'ascend', 'intel_xpu',
        ]),
        # sglang-0.5.12-cp311-cp311-manylinux_2_34_x86_64.whl: sglang/srt/server_args.py ATTENTION_BACKEND_CHOICES
        ((0, 5, 12), [
            'triton', 'torch_native', 'flex_attention', 'nsa', 'dsv4', 'compressed', 'cutlass_mla', 'fa3',
            'fa4', 'flashinfer', 'flashmla', 'trtllm_mla', 'tokenspeed_mla', 'trtllm_mha',
            'dual_chunk_flash_attn', 'aiter', 'wave', 'intel_amx', 'ascend', 'intel_xpu',
        ]),
        # sglang-0.5.14-cp311-cp311-manylinux_2_34_x86_64.whl: sglang/srt/server_args.py ATTENTION_BACKEND_CHOICES
        ((0, 5, 14), [
            'triton', 'torch_native', 'flex_attention', 'dsa', 'nsa', 'dsv4', 'compressed', 'cutlass_mla',
            'fa3', 'fa4', 'flashinfer', 'flashmla', 'trtllm_mla', 'cutedsl_mla', 'tokenspeed_mla',
            'trtllm_mha', 'dual_chunk_flash_attn', 'aiter', 'wave', 'intel_amx', 'ascend', 'intel_xpu',
        ]),
        # sglang-0.5.18-cp311-cp311-manylinux_2_34_x86_64.whl: sglang/srt/server_args.py ATTENTION_BACKEND_CHOICES
        ((0, 5, 18), [
            'triton', 'torch_native', 'flex_attention', 'dsa', 'nsa', 'dsv4', 'compressed', 'cutlass_mla',
            'fa3', 'fa4', 'flashinfer', 'flashmla', 'trtllm_mla', 'cutedsl_mla', 'tokenspeed_mla',
            'trtllm_mha', 'dual_chunk_flash_attn', 'hpc_ops', 'aiter', 'wave', 'intel_amx', 'ascend',
            'intel_xpu',
        ]),
        # sglang-0.5.19-cp311-cp311-manylinux_2_34_x86_64.whl: sglang/srt/server_args.py ATTENTION_BACKEND_CHOICES
        ((0, 5, 19), [
            'triton', 'torch_native', 'flex_attention', 'dsa', 'nsa', 'dsv4', 'compressed', 'cutlass_mla',
            'fa3', 'fa4', 'flashinfer', 'flashmla', 'trtllm_mla', 'cutedsl_mla', 'tokenspeed_mla',
            'trtllm_mha', 'dual_chunk_flash_attn', 'hpc_ops', 'minicpm_flashattn', 'minicpm_flashinfer',
            'aiter', 'wave', 'intel_amx', 'ascend', 'intel_xpu',
        ]),
        # sglang-0.5.20-cp311-cp311-manylinux_2_34_x86_64.whl: sglang/srt/arg_groups/choices.py ATTENTION_BACKEND_CHOICES
        ((0, 5, 20), [
            'triton', 'torch_native', 'flex_attention', 'dsa', 'nsa', 'qsa', 'dsv4', 'compressed', 'fa3',
            'fa4', 'flashinfer', 'flashmla', 'trtllm_mla', 'cutedsl_mla', 'tokenspeed_mla', 'trtllm_mha',
            'hpc_ops', 'minicpm_flashattn', 'minicpm_flashinfer', 'aiter', 'wave', 'intel_amx', 'ascend',
            'intel_xpu',
        ]),
        # sglang-0.5.23-cp311-cp311-manylinux_2_34_x86_64.whl: sglang/srt/arg_groups/choices.py ATTENTION_BACKEND_CHOICES
        ((0, 5, 23), [
            'triton', 'torch_native', 'flex_attention', 'dsa', 'nsa', 'qsa', 'dsv4', 'compressed', 'fa3',
            'fa4', 'flashinfer', 'llada2_cfg_flashinfer', 'flashmla', 'trtllm_mla', 'cutedsl_mla',
            'tokenspeed_mla', 'trtllm_mha', 'hpc_ops', 'minicpm_flashattn', 'minicpm_flashinfer', 'aiter',
            'wave', 'intel_amx', 'ascend', 'intel_xpu',
        ]),
    ],
    '--decode-attention-backend': [
        # sglang-0.5.2-py3-none-any.whl: sglang/srt/server_args.py ATTENTION_BACKEND_CHOICES
        ((0, 5, 2), [
            'triton', 'torch_native', 'cutlass_mla', 'fa3', 'flashinfer', 'flashmla', 'trtllm_mla',
            'trtllm_mha', 'dual_chunk_flash_attn', 'hybrid_linear_attn', 'aiter', 'wave', 'intel_amx',
            'ascend',
        ]),
        # sglang-0.5.4-py3-none-any.whl: sglang/srt/server_args.py ATTENTION_BACKEND_CHOICES
        ((0, 5, 4), [
            'triton', 'torch_native', 'flex_attention', 'nsa', 'cutlass_mla', 'fa3', 'fa4', 'flashinfer',
            'flashmla', 'trtllm_mla', 'trtllm_mha', 'dual_chunk_flash_attn', 'aiter', 'wave', 'intel_amx',
            'ascend', 'intel_xpu',
        ]),
        # sglang-0.5.12-cp311-cp311-manylinux_2_34_x86_64.whl: sglang/srt/server_args.py ATTENTION_BACKEND_CHOICES
        ((0, 5, 12), [
            'triton', 'torch_native', 'flex_attention', 'nsa', 'dsv4', 'compressed', 'cutlass_mla', 'fa3',
            'fa4', 'flashinfer', 'flashmla', 'trtllm_mla', 'tokenspeed_mla', 'trtllm_mha',
            'dual_chunk_flash_attn', 'aiter', 'wave', 'intel_amx', 'ascend', 'intel_xpu',
        ]),
        # sglang-0.5.14-cp311-cp311-manylinux_2_34_x86_64.whl: sglang/srt/server_args.py ATTENTION_BACKEND_CHOICES
        ((0, 5, 14), [
            'triton', 'torch_native', 'flex_attention', 'dsa', 'nsa', 'dsv4', 'compressed', 'cutlass_mla',
            'fa3', 'fa4', 'flashinfer', 'flashmla', 'trtllm_mla', 'cutedsl_mla', 'tokenspeed_mla',
            'trtllm_mha', 'dual_chunk_flash_attn', 'aiter', 'wave', 'intel_amx', 'ascend', 'intel_xpu',
        ]),
        # sglang-0.5.18-cp311-cp311-manylinux_2_34_x86_64.whl: sglang/srt/server_args.py ATTENTION_BACKEND_CHOICES
        ((0, 5, 18), [
            'triton', 'torch_native', 'flex_attention', 'dsa', 'nsa', 'dsv4', 'compressed', 'cutlass_mla',
            'fa3', 'fa4', 'flashinfer', 'flashmla', 'trtllm_mla', 'cutedsl_mla', 'tokenspeed_mla',
            'trtllm_mha', 'dual_chunk_flash_attn', 'hpc_ops', 'aiter', 'wave', 'intel_amx', 'ascend',
            'intel_xpu',
        ]),
        # sglang-0.5.19-cp311-cp311-manylinux_2_34_x86_64.whl: sglang/srt/server_args.py ATTENTION_BACKEND_CHOICES
        ((0, 5, 19), [
            'triton', 'torch_native', 'flex_attention', 'dsa', 'nsa', 'dsv4', 'compressed', 'cutlass_mla',
            'fa3', 'fa4', 'flashinfer', 'flashmla', 'trtllm_mla', 'cutedsl_mla', 'tokenspeed_mla',
            'trtllm_mha', 'dual_chunk_flash_attn', 'hpc_ops', 'minicpm_flashattn', 'minicpm_flashinfer',
            'aiter', 'wave', 'intel_amx', 'ascend', 'intel_xpu',
        ]),
        # sglang-0.5.20-cp311-cp311-manylinux_2_34_x86_64.whl: sglang/srt/arg_groups/choices.py ATTENTION_BACKEND_CHOICES
        ((0, 5, 20), [
            'triton', 'torch_native', 'flex_attention', 'dsa', 'nsa', 'qsa', 'dsv4', 'compressed', 'fa3',
            'fa4', 'flashinfer', 'flashmla', 'trtllm_mla', 'cutedsl_mla', 'tokenspeed_mla', 'trtllm_mha',
            'hpc_ops', 'minicpm_flashattn', 'minicpm_flashinfer', 'aiter', 'wave', 'intel_amx', 'ascend',
            'intel_xpu',
        ]),
        # sglang-0.5.23-cp311-cp311-manylinux_2_34_x86_64.whl: sglang/srt/arg_groups/choices.py ATTENTION_BACKEND_CHOICES
        ((0, 5, 23), [
            'triton', 'torch_native', 'flex_attention', 'dsa', 'nsa', 'qsa', 'dsv4', 'compressed', 'fa3',
            'fa4', 'flashinfer', 'llada2_cfg_flashinfer', 'flashmla', 'trtllm_mla', 'cutedsl_mla',
            'tokenspeed_mla', 'trtllm_mha', 'hpc_ops', 'minicpm_flashattn', 'minicpm_flashinfer', 'aiter',
            'wave', 'intel_amx', 'ascend', 'intel_xpu',
        ]),
    ],
    '--schedule-policy': [
        # sglang-0.5.2-py3-none-any.whl: sglang/srt/server_args.py add_argument('--schedule-policy')
        ((0, 5, 2), ['lpm', 'random', 'fcfs', 'dfs-weight', 'lof']),
        # sglang-0.5.4-py3-none-any.whl: sglang/srt/server_args.py add_argument('--schedule-policy')
        ((0, 5, 4), ['lpm', 'random', 'fcfs', 'dfs-weight', 'lof', 'priority']),
        # sglang-0.5.9-py3-none-any.whl: sglang/srt/server_args.py add_argument('--schedule-policy')
        ((0, 5, 9), ['lpm', 'random', 'fcfs', 'dfs-weight', 'lof', 'priority', 'routing-key']),
        # sglang-0.5.20-cp311-cp311-manylinux_2_34_x86_64.whl: sglang/srt/arg_groups/fields/schedule.py field schedule_policy
        ((0, 5, 20), ['lpm', 'random', 'fcfs', 'dfs-weight', 'lof', 'priority', 'routing-key', 'hrrn']),
        # sglang-0.5.21-cp311-cp311-manylinux_2_34_x86_64.whl: sglang/srt/arg_groups/fields/schedule.py field schedule_policy
        ((0, 5, 21), [
            'lpm', 'random', 'fcfs', 'dfs-weight', 'lof', 'priority', 'routing-key', 'hrrn',
            'shortest-prefill-first',
        ]),
    ],
    '--hicache-storage-backend': [
        # sglang-0.5.2-py3-none-any.whl: sglang/srt/server_args.py add_argument('--hicache-storage-backend')
        ((0, 5, 2), ['file', 'mooncake', 'hf3fs', 'nixl']),
        # sglang-0.5.4-py3-none-any.whl: sglang/srt/server_args.py add_argument('--hicache-storage-backend')
        ((0, 5, 4), ['file', 'mooncake', 'hf3fs', 'nixl', 'aibrix', 'dynamic', 'eic']),
        # sglang-0.5.12-cp311-cp311-manylinux_2_34_x86_64.whl: sglang/srt/server_args.py add_argument('--hicache-storage-backend')
        ((0, 5, 12), ['file', 'mooncake', 'hf3fs', 'nixl', 'aibrix', 'dynamic', 'eic', 'simm']),
        # sglang-0.5.15-cp311-cp311-manylinux_2_34_x86_64.whl: sglang/srt/server_args.py field hicache_storage_backend
        ((0, 5, 15), ['file', 'mooncake', 'hf3fs', 'nixl', 'aibrix', 'dynamic', 'eic', 'simm', 'mori']),
        # sglang-0.5.18-cp311-cp311-manylinux_2_34_x86_64.whl: sglang/srt/server_args.py field hicache_storage_backend
        ((0, 5, 18), [
            'file', 'mooncake', 'hf3fs', 'nixl', 'aibrix', 'dynamic', 'eic', 'simm', 'mori', 'shm',
        ]),
        # sglang-0.5.19-cp311-cp311-manylinux_2_34_x86_64.whl: sglang/srt/server_args.py field hicache_storage_backend
        ((0, 5, 19), [
            'file', 'sim', 'mooncake', 'hf3fs', 'nixl', 'aibrix', 'dynamic', 'eic', 'simm', 'mori', 'shm',
        ]),
        # sglang-0.5.20-cp311-cp311-manylinux_2_34_x86_64.whl: sglang/srt/arg_groups/fields/memory.py field hicache_storage_backend
        ((0, 5, 20), [
            'file', 'sim', 'mooncake', 'npu_memcache', 'hf3fs', 'nixl', 'aibrix', 'dynamic', 'eic', 'simm',
            'mori', 'shm',
        ]),
        # sglang-0.5.21-cp311-cp311-manylinux_2_34_x86_64.whl: sglang/srt/arg_groups/fields/memory.py field hicache_storage_backend
        ((0, 5, 21), [
            'file', 'sim', 'mooncake', 'npu_memcache', 'hf3fs', 'nixl', 'aibrix', 'dynamic', 'eic', 'simm',
            'mori', 'shm', 'tensorcast',
        ]),
        # sglang-0.5.23-cp311-cp311-manylinux_2_34_x86_64.whl: sglang/srt/arg_groups/fields/memory.py field hicache_storage_backend
        ((0, 5, 23), [
            'file', 'sim', 'mooncake', 'npu_memcache', 'hf3fs', 'nixl', 'aibrix', 'dynamic', 'eic', 'simm',
            'mori', 'shm', 'tensorcast', 'seaweedfs',
        ]),
    ],
}


def choices_for(flag: str, version: tuple) -> list:
    """The choice list of `flag` in the given release (a version tuple), or None before the first entry."""
    res = None
    for first, choices in CHOICES[flag]:
        if tuple(version[:3]) >= first:
            res = choices
    return res
