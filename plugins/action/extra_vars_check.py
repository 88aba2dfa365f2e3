# -*- coding: utf-8 -*-
# Copyright: inferops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Action plugin behind inferops.gpu_inference.extra_vars_check (documentation: plugins/modules/extra_vars_check.py).

Runs on the controller, contacts nothing; the allow-list is computed in module_utils/playbook_inputs.py.
"""
from __future__ import annotations

import os

from ansible import context
from ansible.plugins.action import ActionBase
from ansible.utils.vars import load_extra_vars

from ansible_collections.inferops.gpu_inference.plugins.module_utils import playbook_inputs


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        result["changed"] = False
        load = self._loader.load_from_file
        try:
            playbook = self._task.args.get("playbook")
            task_dir = os.path.dirname(str(self._task.get_path() or "").rsplit(":", 1)[0])
            entry = playbook_inputs.entry_playbook(str(playbook), task_dir, context.CLIARGS.get("args") or (), load)
            accepted = playbook_inputs.allowed(entry, load)
            names = list(load_extra_vars(self._loader))
            playbook_inputs.refuse_undocumented(names, entry, accepted)
            result.update(accepted=len(accepted), checked=len(names))
        except playbook_inputs.InputsError as exc:
            result["failed"] = True
            result["msg"] = str(exc)
        return result
