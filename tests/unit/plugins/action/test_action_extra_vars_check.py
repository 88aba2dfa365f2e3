# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The action extra_vars_check run as a play runs it: the run's extra variables against the entry playbook's list, and
the inventory's unknown names of the hosts it is given (plugins/action/extra_vars_check.py)."""
from __future__ import annotations

import os

from ansible_collections.inferops.gpu_inference.plugins.action import extra_vars_check
from ansible_collections.inferops.gpu_inference.tests.unit.plugins.action import harness

DEPLOY_TASK = os.path.join(harness.PLAYBOOKS, "deploy.yml") + ":16"


def run(monkeypatch, tmp_path, extra, hosts=(), inventory_text="all:\n  hosts:\n    ct1: {}\n", playbook="deploy.yml"):
    harness.set_run(monkeypatch, extra, playbook)
    manager, loader = harness.inventory(tmp_path, inventory_text)
    action = harness.make(extra_vars_check, {"playbook": "deploy.yml", "inventory_hosts": list(hosts)}, tmp_path,
                          path=DEPLOY_TASK, inventory_manager=manager, loader=loader)
    return action.run(task_vars={"hostvars": {h: manager.get_host(h).get_vars() for h in hosts}})


def test_documented_extra_variables_pass(monkeypatch, tmp_path):
    result = run(monkeypatch, tmp_path, {"deploy_containers": "ct1", "sglang_server_port": 30001})
    assert not result.get("failed"), result
    assert result["checked"] == 2 and result["accepted"] > 50


def test_an_undocumented_extra_variable_is_refused_with_the_closest_name(monkeypatch, tmp_path):
    result = run(monkeypatch, tmp_path, {"sglang_server_prot": 30001})
    assert result["failed"] and "sglang_server_prot" in result["msg"] and "sglang_server_port" in result["msg"]


def test_a_computed_name_given_as_extra_variable_is_refused(monkeypatch, tmp_path):
    result = run(monkeypatch, tmp_path, {"__sglang_server_request": {}})
    assert result["failed"] and "__sglang_server_request" in result["msg"]


def test_a_renamed_variable_is_still_accepted_under_both_names(monkeypatch, tmp_path):
    result = run(monkeypatch, tmp_path, {"sglang_server_stop_timeout": 30, "sglang_server_stop_timeout_s": 30,
                                         "pve_gpu_container_task_timeout": 60, "pve_gpu_container_task_timeout_s": 60})
    assert not result.get("failed"), result


def test_an_unknown_inventory_variable_is_refused_or_warned_about(monkeypatch, tmp_path):
    text = "all:\n  hosts:\n    ct1:\n      sglang_sever_port: 30001\n"
    result = run(monkeypatch, tmp_path, {}, hosts=["ct1"], inventory_text=text)
    assert result["failed"] and "ct1" in result["msg"] and "sglang_sever_port" in result["msg"]
    assert result["inventory_checked"] >= 1
    warned = run(monkeypatch, tmp_path, {}, hosts=["ct1"],
                 inventory_text=text + "      inferops_unknown_variables: warn\n")
    assert not warned.get("failed"), warned
    assert any("sglang_sever_port" in w for w in warned["warnings"])
