# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The deploy's actions run as a play runs them (plugins/action/sglang_*.py over plugin_utils/deploy_action.py): each
stage's answer from the real module_utils, the checks every stage makes first (the run's extra variables, private
names in the inventory), and a refusal returned as a failed result with its message, never a traceback."""
from __future__ import annotations

import json

import pytest

from ansible_collections.inferops.gpu_inference.plugins.action import (
    sglang_deploy_plan,
    sglang_installer_check,
    sglang_launch,
    sglang_node_gate,
    sglang_plan_node,
    sglang_request,
    sglang_restart_plan,
    sglang_verify,
)
from ansible_collections.inferops.gpu_inference.tests.unit.plugins.action import harness

GIB = 1 << 30
SETTINGS = {"version": "0.5.9", "tp_size": 4, "model_preset": "kimi-k2", "api_key_set": True, "model_path": "/models/kimi",
            "plan_extra": {"device_pool_tokens_per_rank": 116000}, "inventory_hostname": "ct129"}
NODE = {
    "mem_total_bytes": 449 * GIB, "mem_available_bytes": 445 * GIB,
    "gpus": [{"index": i, "minor_number": i, "memory_total_mib": 97887, "name": "NVIDIA H100 NVL"} for i in range(8)],
    "device_paths": ["/dev/nvidia%d" % i for i in range(8)] + ["/dev/nvidiactl", "/dev/nvidia-uvm"],
}
PATHS = {"python": "/opt/sglang/venv/bin/python3", "launcher": "/usr/local/libexec/inferops/sglang-launch",
         "launch_json": "/etc/sglang/launch.json", "api_key_file": "/etc/sglang/api-key", "unit": "sglang.service",
         "unit_path": "/etc/systemd/system/sglang.service", "env_file": "/etc/sglang/sglang.env",
         "venv": "/opt/sglang/venv", "contract_state": "/run/inferops/sglang-contract.json"}
INVENTORY = "all:\n  hosts:\n    ct129: {}\n    pve1: {}\n"


@pytest.fixture
def run(monkeypatch, tmp_path):
    """run(action module, args, task_vars, extra_vars=None, inventory=INVENTORY): the action's result."""
    def _run(module, args, task_vars=None, extra_vars=None, inventory_text=INVENTORY, playbook="deploy.yml"):
        harness.set_run(monkeypatch, extra_vars, playbook)
        manager, loader = harness.inventory(tmp_path, inventory_text)
        action = harness.make(module, args, tmp_path, inventory_manager=manager, loader=loader)
        return action.run(task_vars=dict({"inventory_hostname": "ct129"}, **(task_vars or {})))
    return _run


def request(run, **settings):
    result = run(sglang_request, {"settings": dict(SETTINGS, **settings)})
    assert not result.get("failed"), result
    return result["request"]


def gate(run, req, memory_gib=200):
    containers = [{"host": "ct129", "vmid": 129, "gpus": [0, 1, 2, 3], "memory_mib": memory_gib * 1024}]
    return run(sglang_node_gate, {"requests": {"ct129": req}, "containers": containers, "node": NODE, "guests": [],
                                  "node_reserve_bytes": 4 * GIB, "node_name": "pve1"}, {"inventory_hostname": "pve1"})


def launch(run, req, gate_result, **container):
    g = gate_result["node_plan"]["gates"]["ct129"]
    node_state = {"driver_version": "580.95.05", "memory_limit_bytes": g["memory_limit_bytes"], "gpus": g["gpus"],
                  "node_host": "pve1", "vmid": 129, "node_plan": g["plan"]}
    ct = {"device_paths": ["/dev/nvidia%d" % i for i in range(4)], "mem_total_bytes": 200 * GIB,
          "mem_available_bytes": 196 * GIB, "cgroup_memory_limit_bytes": 200 * GIB, "unit_held_bytes": 0,
          "addresses": ["2: eth0    inet 10.77.0.129/24 scope global eth0"], "declared_driver_version": "",
          "driver_version": "580.95.05"}
    ct.update(container)
    return run(sglang_launch, {"request": req, "node_state": node_state, "container": ct, "paths": PATHS,
                               "installed": {"venv_pip_present": True, "sglang_installed_version": "0.5.9",
                                             "user_as_wanted": True},
                               "supply": {"installer_sha256": {"580.95.05": "a" * 64}}})


# ---------------------------------------------------------------- the stages, in a deploy's order


def test_request_gate_launch_and_verify_carry_one_size(run):
    req = request(run)
    assert req["layout"]["tp_size"] == 4 and req["cluster"] == []
    node = gate(run, req)
    assert not node.get("failed"), node
    size = node["node_plan"]["gates"]["ct129"]["per_rank_gb"]
    assert size > 0 and any("ct129" in line or "129" in line for line in node["node_plan"]["table"])
    ln = launch(run, req, node)
    assert not ln.get("failed"), ln
    launched = ln["launch"]
    assert launched["hicache_size_gb"] <= size
    assert launched["argv"][launched["argv"].index("--hicache-size") + 1] == str(launched["hicache_size_gb"])
    assert launched["verify_args"][launched["verify_args"].index("--info-path") + 1] == "server_info"
    assert ln["install"] == {"remake_venv": False, "pip": False, "user": False}
    assert ln["supply"]["installer"]["needed"] is False
    pinned = launched["bounds"]["planned_pinned_bytes"]
    ok = run(sglang_verify, {"launch": launched, "running": dict(launched["expected_running"]), "node_rank": 0,
                             "measure": {"rank_count": 4, "ranks_held_bytes": pinned, "unit_held_bytes": pinned}})
    assert not ok.get("failed") and ok["verify"]["ok"], ok
    other = dict(launched["expected_running"], hicache_size=launched["hicache_size_gb"] + 100)
    bad = run(sglang_verify, {"launch": launched, "running": other, "node_rank": 0,
                              "measure": {"rank_count": 4, "ranks_held_bytes": pinned, "unit_held_bytes": pinned}})
    assert bad["verify"]["ok"] is False and any("hicache_size" in m for m in bad["verify"]["mismatches"])


def test_the_gate_refuses_a_node_that_does_not_fit_with_the_arithmetic(run):
    refused = gate(run, request(run, requested_gb=300))
    assert refused["failed"] and "refused before any change" in refused["msg"]
    assert refused.get("msg_lines") and refused["_ansible_verbose_always"] is True


def test_launch_needs_the_installer_and_its_source_when_the_container_driver_differs(run):
    req = request(run)
    ln = launch(run, req, gate(run, req), driver_version="")
    assert ln["supply"]["installer"] == {"needed": True, "file": "NVIDIA-Linux-x86_64-580.95.05.run",
                                         "sha256": "a" * 64, "source": "node"}


def test_the_installer_is_refused_unless_its_sha256_is_the_inventorys(run):
    ok = run(sglang_installer_check, {"expected_sha256": "a" * 64, "sha256": "A" * 64, "path": "/root/x.run"})
    assert not ok.get("failed") and ok["sha256"] == "a" * 64
    bad = run(sglang_installer_check, {"expected_sha256": "a" * 64, "sha256": "b" * 64, "path": "/root/x.run"})
    assert bad["failed"] and "/root/x.run" in bad["msg"] and "refused" in bad["msg"]
    after = run(sglang_installer_check, {"node_driver_version": "580.95.05", "nvidia_smi_stdout": "535.104.05\n"})
    assert after["failed"] and "535.104.05" in after["msg"]
    same = run(sglang_installer_check, {"node_driver_version": "580.95.05", "nvidia_smi_stdout": "580.95.05\n580.95.05"})
    assert not same.get("failed") and same["driver_version"] == "580.95.05"
    neither = run(sglang_installer_check, {})
    assert neither["failed"] and "expected_sha256" in neither["msg"]


# ---------------------------------------------------------------- the restart of a server over several containers


def compare(restart):
    return json.dumps({"restart": restart, "restart_reasons": ["the unit is inactive, not active"] if restart else []})


def test_a_server_over_two_containers_restarts_whole_from_the_runs_results(run):
    hostvars = {"ct129": {"__c": {"stdout": compare(False)}}, "ct130": {"__c": {"stdout": compare(True)}},
                "ct131": {"__c": {"stdout": compare(True)}}}
    args = {"compare": compare(False), "nnodes": 2, "members": ["ct129", "ct130"], "members_register": "__c"}
    both = run(sglang_restart_plan, args, {"hostvars": hostvars, "ansible_play_hosts": ["ct129", "ct130", "ct131"]})
    assert both["restart"] is True and "(ct130)" in both["reasons"][0]
    # ct130 left the run (failed before): its answer is not read; ct131 is another server's.
    alone = run(sglang_restart_plan, args, {"hostvars": hostvars, "ansible_play_hosts": ["ct129", "ct131"]})
    assert alone == dict(alone, restart=False, reasons=[])
    single = run(sglang_restart_plan, {"compare": compare(True)}, {"hostvars": hostvars})
    assert single["restart"] is True and single["reasons"] == ["the unit is inactive, not active"]
    garbled = run(sglang_restart_plan, {"compare": "Traceback (most recent call last):"})
    assert garbled["failed"] and "printed no JSON" in garbled["msg"]


# ---------------------------------------------------------------- the checks every stage makes first


@pytest.mark.parametrize("module,args", [
    (sglang_request, {"settings": SETTINGS}),
    (sglang_verify, {"launch": {}, "measure": {}}),
    (sglang_restart_plan, {"compare": compare(False)}),
])
def test_every_stage_refuses_an_undocumented_extra_variable(run, module, args):
    result = run(module, args, extra_vars={"sglang_server_hicache_size": 300})
    assert result["failed"] and "sglang_server_hicache_size" in result["msg"]


def test_a_private_name_set_in_the_inventory_is_refused(run):
    inventory = INVENTORY.replace("ct129: {}", "ct129:\n      __sglang_server_request: {}")
    result = run(sglang_request, {"settings": SETTINGS}, inventory_text=inventory)
    assert result["failed"] and "__sglang_server_request" in result["msg"] and "inventory of ct129" in result["msg"]


def test_the_gate_refuses_a_private_name_in_the_inventory_of_any_container_it_plans(run):
    # ct129 was left out of the run (--limit pve1): only the node's tasks ran, and ct129's inventory plants a request.
    req = request(run)
    inventory = INVENTORY.replace("ct129: {}", "ct129:\n      __sglang_server_request: {}")
    containers = [{"host": "ct129", "vmid": 129, "gpus": [0, 1, 2, 3], "memory_mib": 200 * 1024}]
    result = run(sglang_node_gate, {"requests": {"ct129": req}, "containers": containers, "node": NODE, "guests": [],
                                    "node_reserve_bytes": 4 * GIB, "node_name": "pve1"},
                 {"inventory_hostname": "pve1"}, inventory_text=inventory)
    assert result["failed"] and "inventory of ct129" in result["msg"] and "__sglang_server_request" in result["msg"]
    assert "node_plan" not in result
    assert not gate(run, req).get("failed")


def test_a_blank_survey_answer_is_said_and_a_renamed_variable_deprecated(run):
    result = run(sglang_request, {"settings": SETTINGS}, {"sglang_server_stop_timeout": 30},
                 extra_vars={"sglang_server_port": ""})
    assert not result.get("failed"), result
    assert any("sglang_server_port" in w for w in result["warnings"])
    assert [d["msg"].split()[0] for d in result["deprecations"]] == ["sglang_server_stop_timeout"]
    assert "sglang_server_stop_timeout_s" in result["deprecations"][0]["msg"]
    node = gate(run, request(run))
    assert "deprecations" not in node
    g = run(sglang_node_gate, {"requests": {"ct129": request(run)}, "node": NODE, "node_reserve_bytes": 4 * GIB,
                               "containers": [{"host": "ct129", "vmid": 129, "gpus": [0, 1, 2, 3], "memory_mib": 204800}]},
            {"inventory_hostname": "pve1", "pve_gpu_container_task_timeout": 600, "sglang_server_stop_timeout": 30})
    assert [d["msg"].split()[0] for d in g["deprecations"]] == ["pve_gpu_container_task_timeout"]


def test_malformed_input_from_a_role_is_a_message_not_a_traceback(run):
    result = run(sglang_launch, {"request": {}, "node_state": {}, "container": {}, "paths": {}})
    assert result["failed"] and result["msg"].startswith("sglang_launch: malformed input from the role: KeyError")


# ---------------------------------------------------------------- the calculator


def test_the_calculator_plans_and_names_the_action_of_a_moved_stage(run):
    plan_input = {"sglang_version": "0.5.21", "model_preset": "kimi-k2", "tp_size": 8, "gpu_count": 8,
                  "gpu_memory_mib": 97887, "mem_total_bytes": 1081 * 10**9, "mem_available_bytes": 1000 * 10**9}
    calc = run(sglang_deploy_plan, {"stage": "calculate", "plan_input": plan_input}, playbook="plan.yml")
    assert not calc.get("failed"), calc
    assert calc["calculation"]["plan"]["fits"] and calc["calculation"]["plan"]["per_rank_gb"] > 0
    moved = run(sglang_deploy_plan, {"stage": "launch"}, playbook="plan.yml")
    assert moved["failed"] and "inferops.gpu_inference.sglang_launch" in moved["msg"]


def test_the_node_calculator_plans_a_nodes_containers_together_and_one_host_is_the_other_action(run):
    req = request(run)
    containers = [{"host": "ct129", "vmid": 129, "gpus": [0, 1, 2, 3], "memory_mib": 200 * 1024},
                  {"host": "ct130", "vmid": 130, "gpus": [4, 5, 6, 7], "memory_mib": 200 * 1024}]
    facts = {"mem_total_bytes": 449 * GIB, "mem_available_bytes": 445 * GIB, "gpu_memory_mib": 97887}
    args = {"plan_input": facts, "requests": {"ct129": req, "ct130": req}, "containers": containers,
            "node_name": "pve1", "node_reserve_bytes": 4 * GIB}
    node = run(sglang_plan_node, args, playbook="plan.yml")
    assert not node.get("failed"), node
    gates = node["calculation"]["node_plan"]["gates"]
    assert sorted(gates) == ["ct129", "ct130"] and all(g["per_rank_gb"] > 0 for g in gates.values())
    # Together, against the node gate's own answer for the same two containers.
    gate = run(sglang_node_gate, {"requests": args["requests"], "containers": containers, "node": NODE,
                                  "node_reserve_bytes": 4 * GIB, "node_name": "pve1"}, {"inventory_hostname": "pve1"})
    assert {h: g["per_rank_gb"] for h, g in gates.items()} == {
        h: g["per_rank_gb"] for h, g in gate["node_plan"]["gates"].items()}
    moved = run(sglang_deploy_plan, dict(args, stage="calculate"), playbook="plan.yml")
    assert moved["failed"] and "inferops.gpu_inference.sglang_plan_node" in moved["msg"]
