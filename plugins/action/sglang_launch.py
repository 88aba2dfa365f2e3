# -*- coding: utf-8 -*-
# Copyright: inferops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Action plugin behind inferops.gpu_inference.sglang_launch (documentation: plugins/modules/sglang_launch.py).

Runs on the controller, contacts nothing: the launch of one container planned from its own view
(module_utils/deploy/sglang_deploy.py launch, launch_record, install_steps) and where its software comes from
(module_utils/deploy/supply_chain.py plan).
"""
from __future__ import annotations

from ansible_collections.inferops.gpu_inference.plugins.module_utils.deploy import sglang_deploy, supply_chain
from ansible_collections.inferops.gpu_inference.plugins.plugin_utils.deploy_action import DeployAction


class ActionModule(DeployAction):
    NAME = "sglang_launch"

    def stage(self, args, task_vars, result):
        request, node_state, container = args["request"], args["node_state"], args["container"]
        installed = args.get("installed") or {}
        launch = sglang_deploy.launch(request, node_state, container, args["paths"])
        result["launch"] = launch
        result["launch_record"] = sglang_deploy.launch_record(launch, request["version"])
        result["install"] = sglang_deploy.install_steps(request["version"], args.get("installed"))
        result["supply"] = supply_chain.plan(args.get("supply") or {}, request["version"],
                                             str(node_state.get("driver_version") or ""),
                                             str(container.get("driver_version") or ""),
                                             list(installed.get("pip_extra_packages") or []))
