# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What an action plugin's ActionModule needs to run in a unit test: a task (its args, check and diff mode, the file it
is in, the variable manager with a real inventory), a connection (none, or the real local one), a play context, the
real DataLoader and Templar, and the run's command line (the extra variables and the playbook). Nothing the plugin
decides is replaced: each test runs ActionModule.run as ansible-playbook would."""
from __future__ import annotations

import json
import os
from types import SimpleNamespace

from ansible import context
from ansible.inventory.manager import InventoryManager
from ansible.module_utils.common.collections import ImmutableDict
from ansible.parsing.dataloader import DataLoader
from ansible.playbook.play_context import PlayContext
from ansible.plugins.loader import connection_loader
from ansible.template import Templar
from ansible.utils.vars import load_extra_vars

from ansible_collections.inferops.gpu_inference.plugins.module_utils.deploy import playbook_inputs

ROOT = playbook_inputs.COLLECTION_ROOT
PLAYBOOKS = os.path.join(ROOT, "playbooks")


class FakeTask:
    """The parts of ansible.playbook.task.Task an action reads."""

    def __init__(self, args, check_mode=False, diff=False, path="", inventory=None, action="test"):
        self.args = dict(args)
        self.check_mode = check_mode
        self.diff = diff
        self.async_val = 0
        self.action = action
        self._path = path
        self._inventory = inventory

    def get_path(self):
        return self._path

    def get_variable_manager(self):
        return SimpleNamespace(_inventory=self._inventory)

    def get_search_path(self):
        return [os.path.dirname(self._path.rsplit(":", 1)[0])] if self._path else []


def set_run(monkeypatch, extra_vars=None, playbook=None):
    """The command line of the run: -e as JSON (as ansible-playbook gives it), and the playbook it started."""
    args = ImmutableDict(extra_vars=(json.dumps(extra_vars),) if extra_vars else (),
                         args=(os.path.join(PLAYBOOKS, playbook),) if playbook else ())
    monkeypatch.setattr(context, "CLIARGS", args)
    # ansible-core reads the extra variables once per process and keeps them on the function: each test is a run.
    monkeypatch.setattr(load_extra_vars, "extra_vars", None, raising=False)


def inventory(tmp_path, text):
    """A real inventory (an INI or YAML file's text) as Ansible reads it."""
    path = tmp_path / "hosts.yml"
    path.write_text(text)
    loader = DataLoader()
    return InventoryManager(loader=loader, sources=[str(path)]), loader


def make(module, args, tmp_path=None, check_mode=False, diff=False, path="", inventory_manager=None, loader=None,
         local=False):
    """The action ``module.ActionModule`` ready to run (``local``: with the real local connection)."""
    loader = loader or DataLoader()
    play_context = PlayContext()
    if local:
        connection = connection_loader.get("local", play_context)
    else:
        connection = SimpleNamespace(_shell=SimpleNamespace(tmpdir=str(tmp_path or "/tmp")))
    task = FakeTask(args, check_mode=check_mode, diff=diff, path=path, inventory=inventory_manager)
    return module.ActionModule(task, connection, play_context, loader, Templar(loader=loader), None)
