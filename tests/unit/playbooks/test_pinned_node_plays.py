# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Each play of the entry playbooks that runs a node role (as a role, or an entry point of it in its tasks) pins the
node's SSH host keys before anything reaches the node: only the extra-variables check (an action that contacts
nothing) may come before the pin tasks. What the pin does against a real sshd is tested in
tests/lab/test_hostile_hostkeys.py."""
from __future__ import annotations

import os

import pytest
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
NODE_ROLES = {"inferops.gpu_inference.pve_gpu_container", "inferops.gpu_inference.gpu_recover"}
PIN = "tasks/pin_node_host_keys.yml"


def _plays(name):
    with open(os.path.join(ROOT, "playbooks", name)) as f:
        return [p for p in yaml.safe_load(f) if "hosts" in p]


# The node role's entry point that describes a container from its host's variables (no connection, container hosts).
NO_CONNECTION = {("inferops.gpu_inference.pve_gpu_container", "container_spec.yml")}


def _included_roles(play):
    """The roles a play's tasks include or import to run on its hosts (a node play may run a role's entry point as a
    task)."""
    out = set()
    for task in play.get("tasks") or []:
        for key, value in task.items():
            if key.rsplit(".", 1)[-1] in ("include_role", "import_role") and isinstance(value, dict):
                if (value["name"], value.get("tasks_from")) not in NO_CONNECTION:
                    out.add(value["name"])
    return out


@pytest.mark.parametrize("playbook", ["deploy.yml", "recover.yml"])
def test_node_plays_pin_first(playbook):
    node_plays = [p for p in _plays(playbook)
                  if ({r["role"] if isinstance(r, dict) else r for r in p.get("roles", [])} | _included_roles(p)) & NODE_ROLES]
    assert node_plays, playbook
    for play in node_plays:
        if play.get("roles"):
            assert not play.get("tasks"), play["name"]  # tasks run after roles; the pin must come before them
        pre = play.get("pre_tasks") or []
        first = [i for i, t in enumerate(pre) if t.get("ansible.builtin.import_tasks") == PIN]
        assert first, "%s: %s does not import %s" % (playbook, play["name"], PIN)
        for t in pre[:first[0]]:
            assert "inferops.gpu_inference.extra_vars_check" in t, (playbook, play["name"], t.get("name"))
        assert "always" in pre[first[0]].get("tags", []), "the pin must run under --tags too"


def test_pin_task_file_sets_what_ssh_reads():
    with open(os.path.join(ROOT, "playbooks", PIN)) as f:
        tasks = yaml.safe_load(f)
    facts = [t["ansible.builtin.set_fact"] for t in tasks if "ansible.builtin.set_fact" in t][0]
    # both host-key-checking variables (ansible's ssh plugin takes the last one set of its vars list)
    assert facts["ansible_host_key_checking"] is True and facts["ansible_ssh_host_key_checking"] is True
    assert "ssh_args" in facts["ansible_ssh_args"]
    assert all("always" in t.get("tags", []) for t in tasks)
