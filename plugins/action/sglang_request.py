# -*- coding: utf-8 -*-
# Copyright: inferops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Action plugin behind inferops.gpu_inference.sglang_request (documentation: plugins/modules/sglang_request.py).

Runs on the controller, contacts nothing: the operator's settings of one container checked and normalised by
module_utils/deploy/sglang_request.py (the request the node's gate and the launch plan read).
"""
from __future__ import annotations

from ansible_collections.inferops.gpu_inference.plugins.module_utils.deploy import renamed_vars
from ansible_collections.inferops.gpu_inference.plugins.module_utils.deploy import sglang_request
from ansible_collections.inferops.gpu_inference.plugins.plugin_utils.deploy_action import DeployAction


class ActionModule(DeployAction):
    NAME = "sglang_request"
    READS_SETTINGS = True

    def stage(self, args, task_vars, result):
        if self.blank_note:
            result["warnings"] = [self.blank_note]
        result["request"] = sglang_request.request(args.get("settings") or {})
        # The container host's variables under a name renamed for its unit (still read, said every run).
        deprecated = renamed_vars.deprecations(task_vars)
        if deprecated:
            result["deprecations"] = deprecated
