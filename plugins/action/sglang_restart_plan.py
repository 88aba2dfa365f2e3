# -*- coding: utf-8 -*-
# Copyright: inferops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Action plugin behind inferops.gpu_inference.sglang_restart_plan (documentation: plugins/modules/sglang_restart_plan.py).

Runs on the controller, contacts nothing: whether this container's SGLang restarts, from the memory tool's comparison
of what runs with what is installed in it and, for a server over several containers, in each other member of the run
(module_utils/deploy/sglang_deploy.py server_restart). The members' comparisons are read from the run's results here, in
Python, not over hostvars in Jinja.
"""
from __future__ import annotations

import json

from ansible_collections.inferops.gpu_inference.plugins.module_utils.deploy import sglang_deploy, sglang_request
from ansible_collections.inferops.gpu_inference.plugins.plugin_utils.deploy_action import DeployAction


def _answer(raw, where):
    """The memory tool's JSON answer (the registered command's stdout), None when there is none."""
    if raw in (None, ""):
        return None
    if isinstance(raw, dict):
        return raw
    try:
        answer = json.loads(str(raw).strip().splitlines()[-1])
    except (ValueError, IndexError) as exc:
        raise sglang_request.DeployError("the comparison of what runs with what is installed in %s printed no JSON: %s"
                                         % (where, exc)) from exc
    if not isinstance(answer, dict):
        raise sglang_request.DeployError("the comparison in %s printed %s, not a JSON object" % (where, type(answer).__name__))
    return answer


class ActionModule(DeployAction):
    NAME = "sglang_restart_plan"

    def stage(self, args, task_vars, result):
        host = str(task_vars.get("inventory_hostname") or "")
        own = _answer(args.get("compare"), host) or {}
        nnodes = int(args.get("nnodes") or 1)
        members, compares = [], {}
        if nnodes > 1:
            register = str(args.get("members_register") or "")
            in_run = set(task_vars.get("ansible_play_hosts") or [])
            hostvars = task_vars.get("hostvars") or {}
            members = [str(m) for m in args.get("members") or [] if str(m) in in_run]
            for member in members:
                if member == host or not register:
                    continue
                registered = hostvars[member].get(register) if member in hostvars else None
                compares[member] = _answer((registered or {}).get("stdout"), member) if isinstance(registered, dict) else None
        decision = sglang_deploy.server_restart(host, own, nnodes, members, compares)
        result.update(decision)
