# -*- coding: utf-8 -*-
# Copyright: inferops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A PVE node's hardware as its inventory declares it (pure Python, no Ansible imports).

The node's GPU model, per-GPU memory, GPU count and RAM are declared once, on the node's host in the inventory
(``pve_gpu_container_node_*``, options of the pve_gpu_container role). The offline calculator (plan.yml, plan_host
and plan_node) takes them as the node's facts, each one overridden by a key of ``-e plan_input`` (merged key by key,
said in the plan's notes); deploy (pve_gpu_container's preflight) compares them with what it reads on the node and
refuses a difference with both figures, before any change: a declaration that no longer matches the node makes
every offline plan wrong.
"""
from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from ansible_collections.inferops.gpu_inference.plugins.module_utils.deploy.sglang_request import DeployError, SHOWN, setting_int
from ansible_collections.inferops.gpu_inference.plugins.module_utils.sizing.sizing_values import (
    MIB_BYTES,
    PlanError,
    clip,
    fmt_gib,
    is_blank,
)
from ansible_collections.inferops.gpu_inference.plugins.module_utils.sizing.sizing_values import memory_bytes as _memory_bytes

#: The node's declared hardware: inventory variable -> the calculator's fact key.
NODE_VARIABLES: Dict[str, str] = {
    "pve_gpu_container_node_gpu_model": "gpu_model",
    "pve_gpu_container_node_gpu_memory_mib": "gpu_memory_mib",
    "pve_gpu_container_node_gpu_count": "gpu_count",
    "pve_gpu_container_node_mem_total_bytes": "mem_total_bytes",
}
#: The declared facts plan_input may override (and the plan reads): the calculator's node facts.
PLAN_KEYS = ("mem_total_bytes", "gpu_memory_mib")
#: MemTotal moves by a few MiB between kernels and boots (reserved memory): a declared RAM within this share of the
#: live figure is the same RAM.
MEM_TOLERANCE = 0.01


def declared(values: Mapping[str, Any], node: str) -> Dict[str, Any]:
    """The node's declared facts (fact key: value), checked: a blank or absent variable is not declared."""
    out: Dict[str, Any] = {}
    for name, key in NODE_VARIABLES.items():
        value = values.get(name)
        if is_blank(value):
            continue
        where = " (inventory of node %s)" % node[:SHOWN]
        if key == "gpu_model":
            if not isinstance(value, str):
                raise DeployError("%s must be the GPU's model as nvidia-smi names it (e.g. \"NVIDIA H200\"), got %s%s"
                                  % (name, clip(value, SHOWN), where))
            out[key] = value.strip()
        elif key == "gpu_memory_mib":
            out[key] = setting_int(name, value, 1024, 4 << 20, " (MiB per GPU, inventory of node %s: nvidia-smi "
                                   "--query-gpu=memory.total --format=csv,noheader,nounits on the node gives it)" % node[:SHOWN])
        elif key == "gpu_count":
            out[key] = setting_int(name, value, 1, 64, where)
        else:
            try:
                out[key] = _memory_bytes(name, value)
            except PlanError as exc:
                raise DeployError("%s%s (bytes: free -b on the node, the Mem: total)" % (exc, where)) from exc
    return out


def merge_plan_input(plan_input: Any, facts: Mapping[str, Any], node: str) -> Tuple[Any, List[str]]:
    """``plan_input`` (from -e) merged over the node's declared ``facts``, key by key, and the notes that say where
    each of the node's facts came from. A blank plan_input key (an unanswered survey question) takes the declared
    value. ``plan_input`` that is not a mapping is returned as given (the calculator refuses it)."""
    if not is_blank(plan_input) and not isinstance(plan_input, Mapping):
        return plan_input, []
    given = dict(plan_input or {})
    merged = dict(given)
    notes: List[str] = []
    for key in PLAN_KEYS:
        if key not in facts:
            continue
        name = _variable(key)
        if key in given and not is_blank(given[key]):
            notes.append("plan_input.%s=%s overrides node %s's %s=%s." % (key, clip(given[key], SHOWN), node, name, facts[key]))
            continue
        merged[key] = facts[key]
        notes.append("%s from node %s's %s in the inventory: %s." % (key, node, name, _shown(key, facts[key])))
    if "gpu_model" in facts or "gpu_count" in facts:
        notes.append("Node %s declares %s x %s." % (node, facts.get("gpu_count", "?"), facts.get("gpu_model", "GPU (model not declared)")))
    return merged, notes


def check_gpus_declared(facts: Mapping[str, Any], containers: Sequence[Mapping[str, Any]], node: str) -> None:
    """A container asking for a GPU index the node's declared count does not have is refused (offline, as deploy
    refuses a GPU the node does not show)."""
    count = facts.get("gpu_count")
    if count is None:
        return
    for ct in containers:
        beyond = sorted(int(g) for g in (ct.get("gpus") or []) if str(g).strip().isdigit() and int(g) >= count)
        if beyond:
            raise DeployError("%s asks for GPU(s) %s (pve_gpu_container_gpus), and node %s declares %d GPU(s), indices 0-%d "
                              "(pve_gpu_container_node_gpu_count): give the container GPUs the node has, or correct the "
                              "node's declared count" % (ct.get("host"), ",".join(map(str, beyond)), node, count, count - 1))


def check_live(facts: Mapping[str, Any], gpus: Sequence[Mapping[str, Any]], mem_total_bytes: Optional[int],
               node: str) -> List[str]:
    """What deploy reads on the node against what its inventory declares: each difference refused with both figures
    (raised together); returns the notes of what matched."""
    problems: List[str] = []
    matched: List[str] = []
    if "gpu_count" in facts:
        if len(gpus) != facts["gpu_count"]:
            problems.append("pve_gpu_container_node_gpu_count=%d, and nvidia-smi shows %d GPU(s) (a GPU missing from "
                            "nvidia-smi has fallen off the bus or lost its driver: recover.yml; or the inventory is out "
                            "of date)" % (facts["gpu_count"], len(gpus)))
        else:
            matched.append("%d GPU(s)" % len(gpus))
    if "gpu_memory_mib" in facts and gpus:
        live = sorted({int(g.get("memory_total_mib") or 0) for g in gpus})
        if live != [facts["gpu_memory_mib"]]:
            problems.append("pve_gpu_container_node_gpu_memory_mib=%d, and nvidia-smi's memory.total is %s MiB (ECC "
                            "switched on or off changes it)" % (facts["gpu_memory_mib"], ", ".join(map(str, live))))
        else:
            matched.append("%d MiB per GPU" % live[0])
    if "gpu_model" in facts and gpus:
        names = sorted({str(g.get("name") or "") for g in gpus})
        if any(facts["gpu_model"].lower() not in n.lower() for n in names):
            problems.append("pve_gpu_container_node_gpu_model=%s, and nvidia-smi names the GPUs %s"
                            % (facts["gpu_model"][:SHOWN], ", ".join(names)))
        else:
            matched.append(", ".join(names))
    if "mem_total_bytes" in facts and mem_total_bytes:
        declared_total, live_total = facts["mem_total_bytes"], int(mem_total_bytes)
        if abs(declared_total - live_total) > MEM_TOLERANCE * live_total:
            problems.append("pve_gpu_container_node_mem_total_bytes=%d (%s), and the node's MemTotal is %d bytes (%s), "
                            "more than %d%% apart" % (declared_total, fmt_gib(declared_total), live_total,
                                                      fmt_gib(live_total), int(MEM_TOLERANCE * 100)))
        else:
            matched.append("RAM %s" % fmt_gib(live_total))
    if problems:
        raise DeployError("Node %s is not the node its inventory declares: %s. The offline plan (plan.yml) takes the "
                          "declared figures, so it would not be this node's plan. Correct the node's "
                          "pve_gpu_container_node_* in the inventory to what the node has (or remove them), or mend "
                          "the node. Nothing has been changed." % (node, "; ".join(problems)))
    return ["Node %s matches its inventory: %s." % (node, ", ".join(matched))] if matched else []


def _variable(key: str) -> str:
    return next(name for name, k in NODE_VARIABLES.items() if k == key)


def _shown(key: str, value: Any) -> str:
    if key == "mem_total_bytes":
        return "%d bytes (%s)" % (value, fmt_gib(value))
    if key == "gpu_memory_mib":
        return "%d MiB per GPU (%s)" % (value, fmt_gib(value * MIB_BYTES))
    return str(value)


__all__ = ["NODE_VARIABLES", "PLAN_KEYS", "declared", "merge_plan_input", "check_gpus_declared", "check_live"]
