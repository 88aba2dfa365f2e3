# -*- coding: utf-8 -*-
# Copyright: inferops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Action plugin behind inferops.gpu_inference.sglang_installer_check (documentation:
plugins/modules/sglang_installer_check.py).

Runs on the controller, contacts nothing: an NVIDIA installer whose sha256 is not the inventory's is refused before it
runs, and the container's userspace driver after it ran must be the node's (module_utils/deploy/supply_chain.py).
"""
from __future__ import annotations

from ansible_collections.inferops.gpu_inference.plugins.module_utils.deploy import sglang_request, supply_chain
from ansible_collections.inferops.gpu_inference.plugins.plugin_utils.deploy_action import DeployAction


class ActionModule(DeployAction):
    NAME = "sglang_installer_check"

    def stage(self, args, task_vars, result):
        if args.get("node_driver_version") not in (None, ""):
            result["driver_version"] = supply_chain.check_driver_installed(str(args["node_driver_version"]),
                                                                           args.get("nvidia_smi_stdout"))
        elif args.get("expected_sha256") not in (None, ""):
            supply_chain.check_installer(str(args["expected_sha256"]), args.get("sha256"), str(args.get("path") or ""))
            result["sha256"] = str(args["expected_sha256"]).lower()
        else:
            raise sglang_request.DeployError("sglang_installer_check needs expected_sha256 (before the installer runs) or "
                                             "node_driver_version (after it ran)")
