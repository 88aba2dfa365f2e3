# -*- coding: utf-8 -*-
# Copyright: inferops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""HiCache host-memory sizing model for SGLang: the public entry (pure Python, no Ansible imports).

SGLang's ``--hicache-size`` is in decimal GB (1e9 bytes) **per rank**: every scheduler process on a
host pins its own pool.  :func:`plan` places the ranks on the hosts the way SGLang's launcher does,
takes a memory budget from host facts and the container limit, and returns the largest per-rank
size whose pools (the KV pool and, for DSA models, the indexer pool) fit on the most loaded host,
or explains, with the arithmetic, why a requested size does not.  Every rule follows the SGLang
release it applies to; the table of rules with the file each was read from is in docs/sizing.md
("Rules by release"), with the sgl-project/sglang issues and pull requests behind them.

The model, one concern a file, each used only through the one below it:

==========================  ========================================================================
``hicache.py``              :func:`plan` and :func:`size_gb`: input -> model -> words -> one dict
``hicache_explain.py``      the arithmetic in words and the picture of the host's memory
``hicache_model.py``        the budget, the most loaded host's pools, the largest size that fits,
                            SGLang's own start-up check: every figure of the plan, once
``hicache_input.py``        the input dict checked and coerced into a ``PlanInput``; the policy defaults
``hicache_geometry.py``     KV bytes per token of each PP stage (presets, MLA, MHA/GQA, DSA)
``hicache_pools.py``        where the launcher places the ranks; one rank's pools and what they pin
``hicache_releases.py``     SGLang versions, the releases each may carry, the rules of each release
``sizing_values.py``        units, ``PlanError``, the coercion of one value (shared with the deploy plan)
==========================  ========================================================================
"""

from __future__ import annotations

from typing import Any, Dict, Mapping

from ansible_collections.inferops.gpu_inference.plugins.module_utils.sizing.hicache_explain import explain, picture
from ansible_collections.inferops.gpu_inference.plugins.module_utils.sizing.hicache_input import validate
from ansible_collections.inferops.gpu_inference.plugins.module_utils.sizing.hicache_model import Sizing, size_host
from ansible_collections.inferops.gpu_inference.plugins.module_utils.sizing.sizing_values import PlanError

__all__ = ["PlanError", "plan", "size_gb"]


def plan(data: Mapping[str, Any]) -> Dict[str, Any]:
    """Compute the HiCache plan for one host. Raises PlanError on bad input only, never on 'does not fit'."""
    sizing = size_host(validate(data))
    result = _figures(sizing)
    result.update(explain=explain(sizing), picture=picture(sizing), warnings=sizing.warnings)
    return result


def size_gb(data: Mapping[str, Any]) -> int:
    """The --hicache-size to pass (GB per rank); raises PlanError with the arithmetic when nothing fits."""
    result = plan(data)
    if not result["fits"]:
        raise PlanError("\n".join(result["explain"]))
    return int(result["per_rank_gb"])


def _figures(sizing: Sizing) -> Dict[str, Any]:
    """The plan's figures, each as the model computed it (the filter hicache_plan documents every key)."""
    inp, budget, load, placement = sizing.inp, sizing.budget, sizing.load, sizing.inp.placement
    return {
        "sglang_version": str(inp.version),
        "behaviour_of_releases": [str(r) for r in inp.releases],
        "per_rank_gb": sizing.chosen_gb if sizing.fits else 0,
        "max_per_rank_gb": sizing.max_gb,
        "requested_gb": inp.requested_gb,
        "ranks_per_host": sizing.ranks,
        "engine_ranks_per_host": sizing.engine_ranks,
        "placement": {
            "tp_ranks_per_node": placement.tp_per_node,
            "pp_stages_per_node": placement.pp_per_node,
            "dp_replicas_per_node": placement.replicas,
            "formula": "tp // max(nnodes // pp, 1) x max(pp // nnodes, 1)%s" % (" x dp" if placement.replicas > 1 else ""),
        },
        "kv_bytes_per_token": sizing.shown.choice.largest.kv_bytes_per_token,
        "host_tokens_per_rank": load.rank.tokens,
        "device_pool_tokens_per_rank": inp.device_pool_tokens_per_rank,
        "kv_pool_bytes_per_rank": load.rank.kv_bytes,
        "indexer_pool_bytes_per_rank": load.rank.index_bytes,
        "draft_pool_bytes_per_rank": load.rank.draft_bytes,
        "policy_headroom_bytes": budget.reserve_bytes + budget.overhead_bytes,
        "pinned_per_rank_bytes": load.rank.charged_bytes,
        "total_pinned_bytes": load.total_bytes,
        "engine_pinned_bytes": load.engine_bytes,
        "memory_basis_bytes": budget.basis_bytes,
        "reserve_bytes": budget.reserve_bytes,
        "overhead_bytes": budget.overhead_bytes,
        "budget_bytes": budget.budget_bytes,
        "per_rank_budget_bytes": budget.per_rank_budget_bytes,
        "headroom_bytes": sizing.headroom_bytes,
        "required_available_bytes": sizing.required_available_bytes,
        "ceiling_bytes": sizing.ceiling_bytes,
        "allocation": sizing.shown.rules.allocation,
        "fits": sizing.fits,
    }
