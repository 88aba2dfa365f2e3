# -*- coding: utf-8 -*-
# Copyright: inferops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Action plugin behind inferops.gpu_inference.sglang_deploy_plan (documentation: plugins/modules/sglang_deploy_plan.py):
the calculator of playbooks/plan.yml for one host, touching no host.

The deploy's stages are their own actions (sglang_request, sglang_node_gate, sglang_launch, sglang_verify,
sglang_installer_check, sglang_restart_plan), and the plan of a node's containers together is sglang_plan_node; the
decision is module_utils/deploy/sglang_deploy.py's calculate (node_facts.py for the node's declared hardware).
"""
from __future__ import annotations

from ansible_collections.inferops.gpu_inference.plugins.module_utils.deploy import sglang_deploy, sglang_request
from ansible_collections.inferops.gpu_inference.plugins.plugin_utils.deploy_action import DeployAction, with_node_facts

_MOVED = {"request": "sglang_request", "node": "sglang_node_gate", "launch": "sglang_launch", "verify": "sglang_verify",
          "installer": "sglang_installer_check"}


class ActionModule(DeployAction):
    NAME = "sglang_deploy_plan"
    READS_SETTINGS = True

    def stage(self, args, task_vars, result):
        stage = args.pop("stage", "calculate")
        if stage != "calculate":
            raise sglang_request.DeployError(
                "sglang_deploy_plan is the calculator (stage calculate) only; %s" % (
                    "the stage %s is the action inferops.gpu_inference.%s" % (stage, _MOVED[stage]) if stage in _MOVED
                    else "stage must be calculate, got %r" % (stage,)))
        if args.get("containers") is not None:
            raise sglang_request.DeployError("sglang_deploy_plan plans one host; the plan of a node's containers together "
                                             "is the action inferops.gpu_inference.sglang_plan_node")
        # A plan from plan_input, or the offline plan of one inventory host (its request and declared container).
        plan_input, merged = with_node_facts(args, [args["container"]] if args.get("container") else [])
        calculation = sglang_deploy.calculate(plan_input, args.get("requested_gb"), args.get("request"),
                                              args.get("container"), str(args.get("host") or ""))
        calculation["notes"] = merged + calculation["notes"]
        result["calculation"] = calculation
