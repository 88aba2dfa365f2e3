# -*- coding: utf-8 -*-
# Copyright: inferops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Action plugin behind inferops.gpu_inference.extra_vars_check (documentation: plugins/modules/extra_vars_check.py).

Runs on the controller, contacts nothing; the allow-list and the inventory's names are judged in
module_utils/deploy/playbook_inputs.py.
"""
from __future__ import annotations

import os

from ansible import context
from ansible.plugins.action import ActionBase
from ansible.utils.vars import load_extra_vars

from ansible_collections.inferops.gpu_inference.plugins.module_utils.deploy import playbook_inputs
from ansible_collections.inferops.gpu_inference.plugins.plugin_utils.inventory_vars import inventory_names


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        task_vars = task_vars or {}
        result["changed"] = False
        load = self._loader.load_from_file
        try:
            playbook = self._task.args.get("playbook")
            task_dir = os.path.dirname(str(self._task.get_path() or "").rsplit(":", 1)[0])
            entry = playbook_inputs.entry_playbook(str(playbook), task_dir, context.CLIARGS.get("args") or (), load)
            accepted = playbook_inputs.allowed(entry, load)
            names = list(load_extra_vars(self._loader))
            playbook_inputs.refuse_undocumented(names, entry, accepted)
            result.update(accepted=len(accepted), checked=len(names), inventory_checked=0)
            if entry == playbook:
                self._check_inventory(result, task_vars, load)
        except playbook_inputs.InputsError as exc:
            result["failed"] = True
            result["msg"] = str(exc)
        return result

    def _check_inventory(self, result, task_vars, load):
        """Unknown inventory variables of the hosts named in inventory_hosts: refused, or warned about per host."""
        hosts = self._task.args.get("inventory_hosts") or []
        if isinstance(hosts, str):
            hosts = [hosts]
        documented = None
        refused, warned = {}, {}
        hostvars = task_vars.get("hostvars") or {}
        for host in dict.fromkeys(str(h) for h in hosts if h):
            names = inventory_names(self, host)
            result["inventory_checked"] += len(names)
            if not names:
                continue
            if documented is None:
                documented = playbook_inputs.inventory_documented(load)
            unknown = playbook_inputs.unknown_inventory_names(names, documented)
            if not unknown:
                continue
            switch = None
            if playbook_inputs.UNKNOWN_SWITCH in names:
                switch = hostvars[host].get(playbook_inputs.UNKNOWN_SWITCH)
            mode = playbook_inputs.unknown_mode(switch, host)
            (warned if mode == "warn" else refused)[host] = unknown
        if warned:
            result.setdefault("warnings", []).append(playbook_inputs.inventory_message(warned, refused=False))
        if refused:
            raise playbook_inputs.InputsError(playbook_inputs.inventory_message(refused, refused=True))
