# -*- coding: utf-8 -*-
# Copyright: inferops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Action plugin behind inferops.gpu_inference.sglang_deploy_plan (documentation: plugins/modules/sglang_deploy_plan.py).

Runs on the controller, contacts nothing; every decision is in module_utils: sglang_request.py (the request stage),
sglang_deploy.py (node, launch, verify, calculate), playbook_inputs.py (the extra variables the run's playbook
accepts), sglang_extra_vars.py (private names set in the inventory, blank survey answers) and the sizing model hicache.py.
"""
from __future__ import annotations

from ansible import context
from ansible.plugins.action import ActionBase
from ansible.utils.vars import load_extra_vars

from ansible_collections.inferops.gpu_inference.plugins.module_utils.host import node_facts
from ansible_collections.inferops.gpu_inference.plugins.module_utils.sizing import node_plan
from ansible_collections.inferops.gpu_inference.plugins.module_utils.deploy import (
    playbook_inputs,
    sglang_deploy,
    sglang_extra_vars,
    sglang_request,
    supply_chain,
)
from ansible_collections.inferops.gpu_inference.plugins.module_utils.common import safe_text
from ansible_collections.inferops.gpu_inference.plugins.plugin_utils.inventory_vars import inventory_names

_STAGES = ("request", "node", "launch", "verify", "calculate", "installer")


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        task_vars = task_vars or {}
        args = dict(self._task.args)
        stage = args.pop("stage", None)
        result["changed"] = False
        blank_note = ""
        try:
            if stage not in _STAGES:
                raise sglang_request.DeployError("stage must be one of %s, got %r" % (", ".join(_STAGES), stage))
            # Extra vars (-e, AWX survey answers) outrank set_fact and register: the playbook's allow-list again, at
            # every stage (a play may be entered with --start-at-task, which skips the playbook's first task).
            extra_vars = load_extra_vars(self._loader)
            try:
                playbook_inputs.refuse_for_run(list(extra_vars), context.CLIARGS.get("args") or (), self._loader.load_from_file)
            except playbook_inputs.InputsError as exc:
                raise sglang_request.DeployError(str(exc)) from exc
            if stage in ("request", "calculate"):
                # A blank role setting among the extra vars (an unanswered survey question) means the default, and it
                # hides the inventory's value: said every time, never silent.
                blank_note = sglang_extra_vars.blank_extra_vars_note(sglang_extra_vars.blank_extra_vars(extra_vars))
                if blank_note and stage == "request":
                    result["warnings"] = [blank_note]
            # Every computed or private value of the roles and playbooks has a private name (__role_*, _role_*,
            # __<playbook>_*). The inventory cannot outrank set_fact, but such a name set there for the host is a
            # misunderstanding worth stopping, at every stage (set_fact, register and the playbooks' own vars are not
            # the inventory, so the values the run computes are never taken for it).
            sglang_extra_vars.refuse_injected(inventory_names(self, task_vars.get("inventory_hostname")),
                                              "the inventory of %s" % task_vars.get("inventory_hostname"))
            if stage == "request":
                result["request"] = sglang_request.request(args.get("settings") or {})
            elif stage == "node":
                # The node's hardware as its inventory declares it, against what was read on it: a difference refused.
                checked = node_facts.check_live(node_facts.declared(args.get("node_declared") or {}, str(args.get("node_name") or "the node")),
                                                args["node"].get("gpus") or [], args["node"].get("mem_total_bytes"),
                                                str(args.get("node_name") or "the node"))
                result["node_plan"] = node_plan.plan_node(args["requests"], args["containers"], args["node"],
                                                          args.get("guests") or [], self._node_reserve_bytes(args),
                                                          str(args.get("others_count") or "limit"), str(args.get("node_name") or "the node"),
                                                          str(args.get("owner_tag") or ""))
                result["node_plan"]["declared_checked"] = checked
                if result["node_plan"]["notes"]:
                    result["warnings"] = list(result["node_plan"]["notes"])
            elif stage == "launch":
                launch = sglang_deploy.launch(args["request"], args["node_state"], args["container"], args["paths"])
                result["launch"] = launch
                result["launch_record"] = sglang_deploy.launch_record(launch, args["request"]["version"])
                result["install"] = sglang_deploy.install_steps(args["request"]["version"], args.get("installed"))
                result["supply"] = supply_chain.plan(args.get("supply") or {}, args["request"]["version"],
                                                     str(args["node_state"].get("driver_version") or ""),
                                                     str(args["container"].get("driver_version") or ""),
                                                     list((args.get("installed") or {}).get("pip_extra_packages") or []))
            elif stage == "installer":
                supply_chain.check_installer(str(args["expected_sha256"]), args.get("sha256"), str(args["path"]))
            elif stage == "calculate" and args.get("containers") is not None:
                plan_input, merged = self._with_node_facts(args, args["containers"])
                result["calculation"] = node_plan.calculate_node(plan_input, args.get("requests") or {},
                                                                 args["containers"], str(args.get("node_name") or ""),
                                                                 self._node_reserve_bytes(args), args.get("requested_gb"))
                result["calculation"]["notes"] = merged + result["calculation"]["notes"]
            elif stage == "calculate":
                plan_input, merged = self._with_node_facts(args, [args["container"]] if args.get("container") else [])
                result["calculation"] = sglang_deploy.calculate(plan_input, args.get("requested_gb"),
                                                                args.get("request"), args.get("container"),
                                                                str(args.get("host") or ""))
                result["calculation"]["notes"] = merged + result["calculation"]["notes"]
            else:
                result["verify"] = sglang_deploy.verify(args["launch"], args.get("running"), args["measure"],
                                                        int(args.get("node_rank", 0)), float(args.get("tolerance", 0.10)))
        except supply_chain.SupplyError as exc:
            result["failed"] = True
            result["msg"] = str(exc)
        except sglang_request.DeployError as exc:
            result["failed"] = True
            result.update(safe_text.failure_result(str(exc) + ("\n" + blank_note if blank_note else "")))
            # The default callback prints a failed result on one line unless told, as debug and assert tell it:
            # msg_lines then reads one line each.
            result["_ansible_verbose_always"] = "msg_lines" in result
        except (KeyError, TypeError, ValueError) as exc:
            result["failed"] = True
            result["msg"] = "sglang_deploy_plan (%s): malformed input from the role: %s: %s" % (stage, type(exc).__name__, exc)
        return result

    def _with_node_facts(self, args, containers):
        """plan_input merged over the node's hardware its inventory declares (node_declared, given for an inventory
        host's node), and the notes saying where each fact came from."""
        node = str(args.get("node_host") or "")
        if not node or not args.get("node_declared"):
            return args.get("plan_input"), []
        facts = node_facts.declared(args["node_declared"], node)
        node_facts.check_gpus_declared(facts, containers, node)
        return node_facts.merge_plan_input(args.get("plan_input"), facts, node)

    def _node_reserve_bytes(self, args):
        """The node's reserve as given, else the pve_gpu_container role's documented default (plan.yml reads a node's
        settings without running that role on it)."""
        if args.get("node_reserve_bytes") not in (None, ""):
            return int(args["node_reserve_bytes"])
        try:
            return int(playbook_inputs.role_default("pve_gpu_container", "main", "pve_gpu_container_node_reserve_bytes",
                                                    self._loader.load_from_file))
        except playbook_inputs.InputsError as exc:
            raise sglang_request.DeployError(str(exc)) from exc
