# -*- coding: utf-8 -*-
# Copyright: inferops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Controller-side base of the deploy's actions (sglang_request, sglang_node_gate, sglang_launch, sglang_verify,
sglang_installer_check, sglang_restart_plan, and the calculator sglang_deploy_plan): the checks each of them makes
before its stage, and the way a refusal is returned. No decision here: the stages are module_utils' (sglang_request.py,
node_plan.py, sglang_deploy.py, supply_chain.py), the checks playbook_inputs.py's and sglang_extra_vars.py's."""
from __future__ import annotations

from ansible import context
from ansible.plugins.action import ActionBase
from ansible.utils.vars import load_extra_vars

from ansible_collections.inferops.gpu_inference.plugins.module_utils.deploy import playbook_inputs, sglang_extra_vars, sglang_request, supply_chain
from ansible_collections.inferops.gpu_inference.plugins.module_utils.common import safe_text
from ansible_collections.inferops.gpu_inference.plugins.module_utils.host import node_facts
from ansible_collections.inferops.gpu_inference.plugins.plugin_utils.inventory_vars import inventory_names


def node_reserve_bytes(action, args):
    """The node's reserve as given, else the pve_gpu_container role's documented default (plan.yml reads a node's
    settings without running that role on it)."""
    if args.get("node_reserve_bytes") not in (None, ""):
        return int(args["node_reserve_bytes"])
    try:
        return int(playbook_inputs.role_default("pve_gpu_container", "main", "pve_gpu_container_node_reserve_bytes",
                                                action._loader.load_from_file))
    except playbook_inputs.InputsError as exc:
        raise sglang_request.DeployError(str(exc)) from exc


def with_node_facts(args, containers):
    """plan.yml's calculators: ``plan_input`` merged over the node's hardware its inventory declares (``node_declared``,
    given for an inventory host's node), and the notes saying where each fact came from (module_utils/host/node_facts.py)."""
    node = str(args.get("node_host") or "")
    if not node or not args.get("node_declared"):
        return args.get("plan_input"), []
    facts = node_facts.declared(args["node_declared"], node)
    node_facts.check_gpus_declared(facts, containers, node)
    return node_facts.merge_plan_input(args.get("plan_input"), facts, node)


class DeployAction(ActionBase):
    """One stage of the deploy. A subclass sets NAME and implements ``stage(args, task_vars, result)``, which fills
    ``result`` or raises DeployError / SupplyError (a refusal, said to the operator)."""

    TRANSFERS_FILES = False
    _requires_connection = False
    NAME = "sglang_deploy"
    # Stages that read the role settings an operator gives: a blank one among the extra vars is said.
    READS_SETTINGS = False

    def stage(self, args, task_vars, result):  # pragma: no cover - every subclass overrides it
        raise NotImplementedError

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        task_vars = task_vars or {}
        args = dict(self._task.args)
        result["changed"] = False
        self.blank_note = ""
        try:
            # Extra vars (-e, AWX survey answers) outrank set_fact and register: the playbook's allow-list again, at
            # every stage (a play may be entered with --start-at-task, which skips the playbook's first task).
            extra_vars = load_extra_vars(self._loader)
            try:
                playbook_inputs.refuse_for_run(list(extra_vars), context.CLIARGS.get("args") or (), self._loader.load_from_file)
            except playbook_inputs.InputsError as exc:
                raise sglang_request.DeployError(str(exc)) from exc
            if self.READS_SETTINGS:
                # A blank role setting among the extra vars (an unanswered survey question) means the default, and it
                # hides the inventory's value: said every time, never silent.
                self.blank_note = sglang_extra_vars.blank_extra_vars_note(sglang_extra_vars.blank_extra_vars(extra_vars))
            # Every computed or private value of the roles and playbooks has a private name (__role_*, _role_*,
            # __<playbook>_*). The inventory cannot outrank set_fact, but such a name set there for the host is a
            # misunderstanding worth stopping, at every stage (set_fact, register and the playbooks' own vars are not
            # the inventory, so the values the run computes are never taken for it).
            sglang_extra_vars.refuse_injected(inventory_names(self, task_vars.get("inventory_hostname")),
                                              "the inventory of %s" % task_vars.get("inventory_hostname"))
            self.stage(args, task_vars, result)
        except supply_chain.SupplyError as exc:
            result["failed"] = True
            result["msg"] = str(exc)
        except sglang_request.DeployError as exc:
            result["failed"] = True
            result.update(safe_text.failure_result(str(exc) + ("\n" + self.blank_note if self.blank_note else "")))
            # The default callback prints a failed result on one line unless told, as debug and assert tell it:
            # msg_lines then reads one line each.
            result["_ansible_verbose_always"] = "msg_lines" in result
        except (KeyError, TypeError, ValueError) as exc:
            result["failed"] = True
            result["msg"] = "%s: malformed input from the role: %s: %s" % (self.NAME, type(exc).__name__, exc)
        return result
