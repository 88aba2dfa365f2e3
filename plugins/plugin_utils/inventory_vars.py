# -*- coding: utf-8 -*-
# Copyright: inferops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Controller-side helper of the action plugins: the variable names the inventory gives a host (no decisions here;
those are in module_utils/deploy/playbook_inputs.py and module_utils/deploy/sglang_extra_vars.py)."""
from __future__ import annotations

from ansible.vars.plugins import get_vars_from_inventory_sources, get_vars_from_path


def inventory_names(action, host_name):
    """The variable names the inventory gives ``host_name``: the inventory sources' host and group vars, and the
    host_vars/ and group_vars/ next to the inventory or the playbook (vars plugins), as Ansible's variable manager
    reads them; not set_fact, register, play or role vars, nor the extra vars. ``action``: the running ActionBase."""
    manager = action._task.get_variable_manager()
    inventory = getattr(manager, "_inventory", None)
    host = inventory.get_host(host_name) if inventory is not None and host_name else None
    if host is None:
        return []
    loader = action._loader
    entities = list(host.get_groups()) + [host]
    names = set(host.get_vars())
    for group in host.get_groups():
        names.update(group.get_vars())
    names.update(get_vars_from_inventory_sources(loader, getattr(inventory, "_sources", None) or [], entities, "task"))
    for path in dict.fromkeys([loader.get_basedir()] + list(action._task.get_search_path())):
        names.update(get_vars_from_path(loader, path, entities, "task"))
    return sorted(names)
