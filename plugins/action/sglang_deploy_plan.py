# -*- coding: utf-8 -*-
# Copyright: inferops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Action plugin behind inferops.gpu_inference.sglang_deploy_plan (documentation: plugins/modules/sglang_deploy_plan.py):
the calculator of playbooks/plan.yml, touching no host.

The deploy's stages are their own actions (sglang_request, sglang_node_gate, sglang_launch, sglang_verify,
sglang_installer_check, sglang_restart_plan); every decision is in module_utils: node_plan.py (a node's containers
planned together), sglang_deploy.py (one host's plan), node_facts.py (the node's declared hardware).
"""
from __future__ import annotations

from ansible_collections.inferops.gpu_inference.plugins.module_utils.host import node_facts
from ansible_collections.inferops.gpu_inference.plugins.module_utils.sizing import node_plan
from ansible_collections.inferops.gpu_inference.plugins.module_utils.deploy import sglang_deploy, sglang_request
from ansible_collections.inferops.gpu_inference.plugins.plugin_utils.deploy_action import DeployAction, node_reserve_bytes

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
            # The node's plan (plan.yml -e plan_node): every container the inventory places on it, planned together.
            plan_input, merged = self._with_node_facts(args, args["containers"])
            calculation = node_plan.calculate_node(plan_input, args.get("requests") or {}, args["containers"],
                                                   str(args.get("node_name") or ""), node_reserve_bytes(self, args),
                                                   args.get("requested_gb"))
        else:
            # A plan from plan_input, or the offline plan of one inventory host (its request and declared container).
            plan_input, merged = self._with_node_facts(args, [args["container"]] if args.get("container") else [])
            calculation = sglang_deploy.calculate(plan_input, args.get("requested_gb"), args.get("request"),
                                                  args.get("container"), str(args.get("host") or ""))
        calculation["notes"] = merged + calculation["notes"]
        result["calculation"] = calculation

    def _with_node_facts(self, args, containers):
        """plan_input merged over the node's hardware its inventory declares (node_declared, given for an inventory
        host's node), and the notes saying where each fact came from."""
        node = str(args.get("node_host") or "")
        if not node or not args.get("node_declared"):
            return args.get("plan_input"), []
        facts = node_facts.declared(args["node_declared"], node)
        node_facts.check_gpus_declared(facts, containers, node)
        return node_facts.merge_plan_input(args.get("plan_input"), facts, node)
