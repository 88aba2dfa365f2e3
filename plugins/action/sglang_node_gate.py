# -*- coding: utf-8 -*-
# Copyright: inferops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Action plugin behind inferops.gpu_inference.sglang_node_gate (documentation: plugins/modules/sglang_node_gate.py).

Runs on the controller, contacts nothing: the node's declared hardware against what was read on it
(module_utils/host/node_facts.py), then every container of the node planned together (module_utils/sizing/node_plan.py), before
any change.
"""
from __future__ import annotations

from ansible_collections.inferops.gpu_inference.plugins.module_utils.host import node_facts
from ansible_collections.inferops.gpu_inference.plugins.module_utils.sizing import node_plan
from ansible_collections.inferops.gpu_inference.plugins.module_utils.deploy import renamed_vars, sglang_extra_vars
from ansible_collections.inferops.gpu_inference.plugins.plugin_utils.deploy_action import DeployAction, node_reserve_bytes
from ansible_collections.inferops.gpu_inference.plugins.plugin_utils.inventory_vars import inventory_names


class ActionModule(DeployAction):
    NAME = "sglang_node_gate"

    def stage(self, args, task_vars, result):
        name = str(args.get("node_name") or "the node")
        # Every container planned here, not only this node: a container host left out of the run (--limit) had no
        # task of its own, so a computed value planted in its inventory (a request, a spec) was checked nowhere else.
        hosts = set(args["requests"]) | {str(ct.get("host")) for ct in args["containers"] if isinstance(ct, dict)}
        for host in sorted(hosts):
            sglang_extra_vars.refuse_injected(inventory_names(self, host), "the inventory of %s" % host)
        # The node's hardware as its inventory declares it, against what was read on it: a difference refused.
        checked = node_facts.check_live(node_facts.declared(args.get("node_declared") or {}, name),
                                        args["node"].get("gpus") or [], args["node"].get("mem_total_bytes"), name)
        plan = node_plan.plan_node(args["requests"], args["containers"], args["node"], args.get("guests") or [],
                                   node_reserve_bytes(self, args), str(args.get("others_count") or "limit"), name,
                                   str(args.get("owner_tag") or ""))
        plan["declared_checked"] = checked
        result["node_plan"] = plan
        if plan["notes"]:
            result["warnings"] = list(plan["notes"])
        # The node's variables under a name renamed for its unit (still read, said every run).
        deprecated = renamed_vars.deprecations(task_vars, "pve_gpu_container_")
        if deprecated:
            result["deprecations"] = deprecated
