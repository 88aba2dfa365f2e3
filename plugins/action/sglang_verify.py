# -*- coding: utf-8 -*-
# Copyright: inferops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Action plugin behind inferops.gpu_inference.sglang_verify (documentation: plugins/modules/sglang_verify.py).

Runs on the controller, contacts nothing: what runs (the server's own arguments, the memory its ranks pinned)
compared with the launch (module_utils/deploy/sglang_deploy.py verify).
"""
from __future__ import annotations

from ansible_collections.inferops.gpu_inference.plugins.module_utils.deploy import sglang_deploy
from ansible_collections.inferops.gpu_inference.plugins.plugin_utils.deploy_action import DeployAction


class ActionModule(DeployAction):
    NAME = "sglang_verify"

    def stage(self, args, task_vars, result):
        result["verify"] = sglang_deploy.verify(args["launch"], args.get("running"), args["measure"],
                                                int(args.get("node_rank", 0)), float(args.get("tolerance", 0.10)))
