# -*- coding: utf-8 -*-
# Copyright: inferops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Action plugin behind inferops.gpu_inference.sglang_plan_node (documentation: plugins/modules/sglang_plan_node.py):
playbooks/plan.yml -e plan_node, every container the inventory places on a node planned together, touching no host
(module_utils/sizing/node_plan.py calculate_node; node_facts.py for the node's declared hardware).
"""
from __future__ import annotations

from ansible_collections.inferops.gpu_inference.plugins.module_utils.sizing import node_plan
from ansible_collections.inferops.gpu_inference.plugins.plugin_utils.deploy_action import (
    DeployAction,
    node_reserve_bytes,
    with_node_facts,
)


class ActionModule(DeployAction):
    NAME = "sglang_plan_node"
    READS_SETTINGS = True

    def stage(self, args, task_vars, result):
        plan_input, merged = with_node_facts(args, args["containers"])
        calculation = node_plan.calculate_node(plan_input, args.get("requests") or {}, args["containers"],
                                               str(args.get("node_name") or ""), node_reserve_bytes(self, args),
                                               args.get("requested_gb"))
        calculation["notes"] = merged + calculation["notes"]
        result["calculation"] = calculation
