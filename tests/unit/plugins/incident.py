"""The incident host as plan input: 449 GiB RAM (445 GiB available), 8 GPUs, Kimi-K2, TP 8, SGLang 0.5.9."""

GIB = 2**30
GB = 10**9

INCIDENT_FACTS = {
    "mem_total_bytes": 449 * GIB,
    "mem_available_bytes": 445 * GIB,
    "gpu_count": 8,
    "gpu_memory_mib": 97887,
    "sglang_version": "0.5.9",
    "tp_size": 8,
    "model_preset": "kimi-k2",
}
