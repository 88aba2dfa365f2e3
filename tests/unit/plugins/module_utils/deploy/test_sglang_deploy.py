"""Unit tests for the one deploy plan (plugins/module_utils/deploy/sglang_deploy.py)."""

from __future__ import annotations

import pytest

from ansible_collections.inferops.gpu_inference.plugins.module_utils.sizing import hicache
from ansible_collections.inferops.gpu_inference.plugins.module_utils.deploy import sglang_deploy as d
from ansible_collections.inferops.gpu_inference.plugins.module_utils.deploy import sglang_extra_vars as ev
from ansible_collections.inferops.gpu_inference.plugins.module_utils.deploy import sglang_request as rq

GIB = 2**30
MIB = 2**20

SETTINGS = {
    "version": "0.5.9", "tp_size": 8, "pp_size": 1, "dp_size": 1, "enable_dp_attention": False,
    "nnodes": 1, "node_rank": 0, "model_preset": "kimi-k2", "kv_cache_dtype": "auto", "requested_gb": 0,
    "policy": {}, "plan_extra": {}, "extra_args": [], "host": "", "port": 30000, "api_key_set": True,
    "allow_unauthenticated": False, "model_path": "/models/kimi", "served_model_name": "",
    "dist_init_host": "", "dist_init_port": 50000,
}
NODE = {
    "mem_total_bytes": 449 * GIB, "mem_available_bytes": 445 * GIB,
    "gpus": [{"index": i, "minor_number": i, "memory_total_mib": 97887} for i in range(8)],
    "device_paths": ["/dev/nvidia%d" % i for i in range(8)] + ["/dev/nvidiactl", "/dev/nvidia-uvm"],
}
CONTAINER = {"vmid": 129, "memory_mib": 420 * 1024, "gpus": list(range(8)), "existing_mem_bytes": 0}
PATHS = {"python": "/opt/sglang/venv/bin/python3", "launcher": "/usr/local/libexec/inferops/sglang-launch",
         "launch_json": "/etc/sglang/launch.json", "api_key_file": "/etc/sglang/api-key",
         "unit": "sglang.service", "unit_path": "/etc/systemd/system/sglang.service", "env_file": "/etc/sglang/sglang.env",
         "venv": "/opt/sglang/venv", "contract_state": "/run/inferops/sglang-contract.json"}


def req(**overrides):
    s = dict(SETTINGS)
    s.update(overrides)
    return rq.request(s)


def node_state(gate):
    return {"driver_version": "580.95.05", "memory_limit_bytes": gate["memory_limit_bytes"], "gpus": gate["gpus"],
            "node_host": "pve1", "vmid": 129, "node_plan": gate["plan"]}


def ct_facts(**overrides):
    facts = {"device_paths": ["/dev/nvidia%d" % i for i in range(8)], "mem_total_bytes": 420 * GIB,
             "mem_available_bytes": 416 * GIB, "cgroup_memory_limit_bytes": 420 * GIB, "unit_held_bytes": 0,
             "addresses": ["2: eth0    inet 10.77.0.129/24 brd 10.77.0.255 scope global eth0"],
             "declared_driver_version": ""}
    facts.update(overrides)
    return facts


def launched(**settings):
    return full(**settings)[2]


def full(**settings):
    r = req(**settings)
    gate = d.node_gate(r, NODE, CONTAINER, 4 * GIB)
    return r, gate, d.launch(r, node_state(gate), ct_facts(), PATHS)


# ---------------------------------------------------------------- the incident


def test_incident_300_per_rank_refused_at_the_node_gate_with_the_arithmetic():
    r = req(requested_gb=300)
    with pytest.raises(d.DeployError) as exc:
        d.node_gate(r, NODE, CONTAINER, 4 * GIB)
    text = str(exc.value)
    assert "refused before any change" in text
    assert "8 ranks x 300.0 GB = 2400.0 GB pinned" in text


def test_the_launched_size_is_the_planned_one_and_the_argv_carries_it_once():
    r, gate, ln = full()
    size = ln["hicache_size_gb"]
    assert size == ln["plan"]["per_rank_gb"] > 0 and size <= gate["per_rank_gb"]
    args = ln["sglang_args"]
    assert args.count("--hicache-size") == 1 and args[args.index("--hicache-size") + 1] == str(size)
    assert ln["guard"]["owned"]["--hicache-size"] == str(size)
    assert ln["expected_running"]["hicache_size"] == size
    assert ln["bounds"]["planned_pinned_bytes"] == ln["plan"]["pinned_per_rank_bytes"] * 8
    # the guard needs reserve + overhead + every rank's pool free
    p = ln["plan"]
    assert ln["guard"]["required_available_bytes"] == p["reserve_bytes"] + p["overhead_bytes"] + p["pinned_per_rank_bytes"] * 8


def test_a_requested_size_that_fits_is_launched_as_asked():
    ln = launched(requested_gb="20")
    assert ln["hicache_size_gb"] == 20


def test_the_api_key_is_never_in_the_argv_only_the_file_that_holds_it():
    ln = launched()
    assert "--api-key" not in ln["sglang_args"]
    assert ln["argv"][ln["argv"].index("--api-key-file") + 1] == "/etc/sglang/api-key"
    assert ln["argv"][:2] == [PATHS["python"], PATHS["launcher"]]


# ---------------------------------------------------------------- settings a survey or -e can give


@pytest.mark.parametrize("value", [None, "", "  ", 0, "0"])
def test_blank_or_zero_requested_size_lets_the_plan_choose(value):
    assert req(requested_gb=value)["requested_gb"] is None


@pytest.mark.parametrize("value, words", [
    ("300GB", "without a unit"), ("300 GiB", "322.1 GB"), ("48.5", "round it down to 48"), (48.5, "whole number"),
    (True, "boolean"), (-1, "between 0"), ("lots", "whole number"), ([48], "whole number"),
])
def test_requested_size_misreadings_are_refused_with_what_to_write(value, words):
    with pytest.raises(d.DeployError) as exc:
        req(requested_gb=value)
    assert words in str(exc.value)
    assert "sglang_server_hicache_requested_gb" in str(exc.value)


@pytest.mark.parametrize("args, flag", [
    (["--hicache-size", "300"], "--hicache-size"), (["--hicache-size=300"], "--hicache-size"),
    (["--hicache-si", "300"], "--hicache-size"), (["--tp", "4"], "--tp-size"), (["--api-key", "x"], "--api-key"),
    (["--host", "0.0.0.0"], "--host"), (["--hicache-ratio", "4"], "--hicache-ratio"),
    (["--enable-hier"], "--enable-hierarchical-cache"),
])
def test_extra_args_cannot_set_what_the_plan_owns(args, flag):
    with pytest.raises(d.DeployError) as exc:
        req(extra_args=["--max-running-requests", "64"] + args)
    assert flag in str(exc.value)


def test_extra_args_that_the_plan_does_not_own_pass_through_as_strings():
    r = req(extra_args=["--max-running-requests", 64, "--model-impl", "sglang"])
    assert r["extra_args"] == ["--max-running-requests", "64", "--model-impl", "sglang"]


def test_extra_args_as_one_string_are_refused():
    with pytest.raises(d.DeployError, match="must be a list"):
        req(extra_args="--max-running-requests 64")


@pytest.mark.parametrize("key, value, words", [
    ("tp_size", "eight", "sglang_server_tp_size must be a whole number"),
    ("tp_size", 0, "between 1"),
    ("version", "latest", "sglang_server_version"),
    ("version", "", "sglang_server_version must be set"),
    ("model_path", "models/kimi", "absolute path"),
    ("port", 70000, "sglang_server_port"),
    ("enable_dp_attention", "maybe", "true or false"),
    ("host", "my-host", "must be an IP address"),
])
def test_bad_settings_name_the_variable(key, value, words):
    with pytest.raises(d.DeployError) as exc:
        req(**{key: value})
    assert words in str(exc.value)


def test_policy_cannot_smuggle_facts_or_layout():
    with pytest.raises(d.DeployError, match="mem_total_bytes"):
        req(policy={"mem_total_bytes": 10**15})
    with pytest.raises(d.DeployError, match="requested_gb"):
        req(plan_extra={"requested_gb": 300})


def test_open_bind_without_a_key_is_refused_unless_allowed_by_name():
    with pytest.raises(d.DeployError, match="sglang_server_allow_unauthenticated"):
        req(host="0.0.0.0", api_key_set=False)
    assert req(host="127.0.0.1", api_key_set=False)["service"]["host"] == "127.0.0.1"
    assert req(host="0.0.0.0", api_key_set=False, allow_unauthenticated=True)["service"]["host"] == "0.0.0.0"


def test_default_bind_is_the_containers_own_address_and_needs_a_key():
    ln = launched()
    assert ln["bind_host"] == "10.77.0.129"
    assert ln["sglang_args"][ln["sglang_args"].index("--host") + 1] == "10.77.0.129"
    r = req(api_key_set=False)
    gate = d.node_gate(r, NODE, CONTAINER, 4 * GIB)
    with pytest.raises(d.DeployError, match="without an API key"):
        d.launch(r, node_state(gate), ct_facts(), PATHS)


def test_no_global_address_is_refused():
    r = req()
    gate = d.node_gate(r, NODE, CONTAINER, 4 * GIB)
    with pytest.raises(d.DeployError, match="no global IPv4"):
        d.launch(r, node_state(gate), ct_facts(addresses=["1: lo inet 127.0.0.1/8 scope host lo"]), PATHS)


# ---------------------------------------------------------------- injected names


@pytest.mark.parametrize("name", ["__sglang_server_request", "__sglang_server_launch_result", "_sglang_server_launch_json",
                                  "__pve_gpu_container_state", "__pve_gpu_container_spec", "__sglang_server_node_state",
                                  "__pve_gpu_container_plan_requests", "__deploy_cts", "__gpu_recover_result", "__gpu_recover",
                                  "_gpu_recover_pct", "__plan_host", "__recover_ct_hosts"])
def test_computed_or_private_names_from_the_operator_are_refused(name):
    with pytest.raises(d.DeployError) as exc:
        ev.refuse_injected(["sglang_server_tp_size", name], "the extra variables")
    assert name in str(exc.value) and "sglang_server_hicache_requested_gb" in str(exc.value)


def test_public_inputs_are_not_refused():
    # A public-looking name that no role documents (sglang_server_hicache_size) is the allow-list's to refuse as an
    # extra variable; in the inventory it is read by nothing. The published results are outputs, never read as input.
    ev.refuse_injected(["sglang_server_tp_size", "sglang_server_hicache_requested_gb", "recover_vmid",
                        "sglang_server_hicache_size", "sglang_server_result", "gpu_recover_result"], "x")


# ---------------------------------------------------------------- the node gate


def test_gate_refuses_gpus_the_node_lacks_and_a_layout_that_does_not_use_them():
    with pytest.raises(d.DeployError, match="asks for GPUs 8"):
        d.node_gate(req(), NODE, dict(CONTAINER, gpus=[8]), 4 * GIB)
    with pytest.raises(d.DeployError, match="8 scheduler rank"):
        d.node_gate(req(), NODE, dict(CONTAINER, gpus=[0, 1, 2, 3]), 4 * GIB)


def test_the_gate_finds_each_gpu_by_its_device_minor_not_by_the_index():
    # /dev/nvidia5 is GPU index 6 and /dev/nvidia6 index 5 on this node (nvidia-smi -q, Minor Number): the rows the
    # gate plans with are the GPUs the devN entries will pass.
    rows = [dict(g, minor_number={5: 6, 6: 5}.get(g["index"], g["index"]), pci_bus_id="bus%d" % g["index"])
            for g in NODE["gpus"]]
    node = dict(NODE, gpus=rows)
    by_minor = d.check_gpus_exist(129, [5, 6], node)
    assert (by_minor[5]["index"], by_minor[6]["index"]) == (6, 5)
    gate = d.node_gate(req(), node, CONTAINER, 4 * GIB)
    assert gate["gpu_minors"] == list(range(8))
    assert [g["index"] for g in gate["gpus"]] == [0, 1, 2, 3, 4, 6, 5, 7]


def test_a_gpu_whose_minor_the_driver_does_not_give_is_refused():
    rows = [dict(g, minor_number=None if g["index"] == 7 else g["index"]) for g in NODE["gpus"]]
    node = dict(NODE, gpus=rows, gpu_numbering_problems=["nvidia-smi -q exited with 15: GPU is lost"])
    assert sorted(d.check_gpus_exist(129, [0, 1], node)) == list(range(7))
    with pytest.raises(d.DeployError, match=r"asks for /dev/nvidia7, but which GPU that device node is cannot be read .*"
                                            r"GPU index 7 .*GPU is lost.*not taken to be the nvidia-smi index"):
        d.check_gpus_exist(129, [7], node)


def test_gate_refuses_a_limit_above_the_nodes_ram():
    with pytest.raises(d.DeployError, match="protects nothing"):
        d.node_gate(req(), NODE, dict(CONTAINER, memory_mib=449 * 1024), 4 * GIB)


def test_gate_counts_a_running_containers_memory_as_available():
    a = d.node_gate(req(), dict(NODE, mem_available_bytes=100 * GIB), dict(CONTAINER, existing_mem_bytes=345 * GIB), 4 * GIB)
    b = d.node_gate(req(), NODE, CONTAINER, 4 * GIB)
    assert a["per_rank_gb"] == b["per_rank_gb"]


def test_dp_without_dp_attention_multiplies_ranks():
    with pytest.raises(d.DeployError, match="16 scheduler rank"):
        d.node_gate(req(dp_size=2), NODE, CONTAINER, 4 * GIB)


# ---------------------------------------------------------------- launch in the container


def test_launch_uses_the_tighter_of_cgroup_and_declared_limits():
    r = req()
    gate = d.node_gate(r, NODE, CONTAINER, 4 * GIB)
    loose = d.launch(r, node_state(gate), ct_facts(), PATHS)
    tight = d.launch(r, node_state(gate), ct_facts(cgroup_memory_limit_bytes=200 * GIB, mem_total_bytes=200 * GIB,
                                                   mem_available_bytes=196 * GIB), PATHS)
    assert tight["memory_limit_bytes"] == 200 * GIB
    assert tight["hicache_size_gb"] < loose["hicache_size_gb"]


def test_launch_never_exceeds_the_size_the_node_issued():
    # Another tenant holds most of the node: its MemAvailable is 200 of 449 GiB. The container's own view (lxcfs:
    # 416 of its 420 GiB limit free) does not see that; the node's gate does, and its size is what launches.
    r = req()
    gate = d.node_gate(r, dict(NODE, mem_available_bytes=200 * GIB), CONTAINER, 4 * GIB)
    roomy = d.node_gate(r, NODE, CONTAINER, 4 * GIB)
    own = d.launch(r, node_state(roomy), ct_facts(), PATHS)["hicache_size_gb"]
    ln = d.launch(r, node_state(gate), ct_facts(), PATHS)
    assert gate["per_rank_gb"] < own
    assert ln["hicache_size_gb"] == gate["per_rank_gb"]
    assert ln["argv"][ln["argv"].index("--hicache-size") + 1] == str(gate["per_rank_gb"])
    # What it may pin stays within what the node committed for it.
    assert ln["bounds"]["ceiling_bytes"] <= gate["plan"]["ceiling_bytes"]
    assert any("the size the node issued" in w and "would allow %d GB" % own in w for w in ln["plan"]["warnings"])


def test_launch_takes_the_containers_tighter_view_below_the_issued_size():
    r = req()
    gate = d.node_gate(r, NODE, CONTAINER, 4 * GIB)
    ln = d.launch(r, node_state(gate), ct_facts(mem_available_bytes=300 * GIB), PATHS)
    assert 1 <= ln["hicache_size_gb"] < gate["per_rank_gb"]
    assert not any("the size the node issued" in w for w in ln["plan"]["warnings"])


@pytest.mark.parametrize("issued", [None, 0, "", "x", True, -3])
def test_launch_without_a_size_issued_by_the_node_is_refused(issued):
    r = req()
    gate = d.node_gate(r, NODE, CONTAINER, 4 * GIB)
    state = node_state(gate)
    state["node_plan"] = None if issued is None else dict(gate["plan"], per_rank_gb=issued)
    with pytest.raises(rq.DeployError, match="the node play issued no HiCache size"):
        d.launch(r, state, ct_facts(), PATHS)


def test_launch_refuses_device_nodes_that_do_not_match():
    r = req()
    gate = d.node_gate(r, NODE, CONTAINER, 4 * GIB)
    with pytest.raises(d.DeployError, match="sees 2 GPU device node"):
        d.launch(r, node_state(gate), ct_facts(device_paths=["/dev/nvidia0", "/dev/nvidia1"]), PATHS)


def test_launch_refuses_a_declared_driver_other_than_the_nodes():
    r = req()
    gate = d.node_gate(r, NODE, CONTAINER, 4 * GIB)
    with pytest.raises(d.DeployError, match="must equal the node's kernel module"):
        d.launch(r, node_state(gate), ct_facts(declared_driver_version="570.1"), PATHS)


def test_launch_record_has_no_figures_that_move_with_memavailable():
    r, gate, ln = full()
    rec = d.launch_record(ln, r["version"])
    assert "mem_available_bytes" not in str(rec) and "headroom" not in str(rec)
    assert rec["hicache_size"] == ln["hicache_size_gb"]


# ---------------------------------------------------------------- verify


def measure(ln, ranks=8, held=None, unit=None):
    held = ln["bounds"]["planned_pinned_bytes"] if held is None else held
    return {"rank_count": ranks, "ranks_held_bytes": held, "unit_held_bytes": held + 10**9 if unit is None else unit}


def running(ln, **overrides):
    info = {"hicache_size": ln["hicache_size_gb"], "enable_hierarchical_cache": True, "tp_size": 8, "pp_size": 1,
            "dp_size": 1, "model_path": "/models/kimi", "port": 30000, "host": "10.77.0.129"}
    info.update(overrides)
    return info


def test_verify_accepts_what_was_planned():
    ln = launched()
    assert d.verify(ln, running(ln), measure(ln), 0, 0.1)["ok"]


def test_verify_writes_the_reports_memory_line_in_hundredths_of_a_gb():
    ln = launched()
    ln["bounds"] = {"planned_pinned_bytes": 2_010_000_000, "ceiling_bytes": 4 * 10**9}
    v = d.verify(ln, running(ln), measure(ln, held=2_024_000_000, unit=2_500_000_000), 0, 0.1)
    assert v["memory_text"] == "ranks pinned 2.02 GB (planned 2.01 GB); unit holds 2.50 GB (ceiling 4.40 GB)"


def test_install_steps_run_only_what_the_container_lacks():
    ready = {"venv_pip_present": True, "sglang_installed_version": "0.5.9", "user_as_wanted": True, "pip_extra_packages": []}
    assert d.install_steps("0.5.9", ready) == {"remake_venv": False, "pip": False, "user": False}
    assert d.install_steps("0.5.10", ready)["pip"] is True  # another version wanted
    assert d.install_steps("0.5.9", dict(ready, sglang_installed_version=None))["pip"] is True
    assert d.install_steps("0.5.9", dict(ready, pip_extra_packages=["flashinfer"]))["pip"] is True
    assert d.install_steps("0.5.9", dict(ready, venv_pip_present=False)) == {"remake_venv": True, "pip": True, "user": False}
    assert d.install_steps("0.5.9", dict(ready, user_as_wanted=False))["user"] is True
    # as the templated values may arrive, and a read that did not happen (None): the step runs
    assert d.install_steps("0.5.9", dict(ready, venv_pip_present="True", user_as_wanted="true"))["pip"] is False
    assert d.install_steps("0.5.9", dict(ready, venv_pip_present=None, user_as_wanted=None)) == {
        "remake_venv": True, "pip": True, "user": True}
    assert d.install_steps("0.5.9", None) == {"remake_venv": True, "pip": True, "user": True}
    with pytest.raises(d.DeployError, match="venv_pip_present must be true or false"):
        d.install_steps("0.5.9", dict(ready, venv_pip_present="maybe"))


def test_verify_catches_another_size_running():
    ln = launched()
    v = d.verify(ln, running(ln, hicache_size=300), measure(ln), 0, 0.1)
    assert not v["ok"] and "hicache_size" in v["mismatches"][0]


def test_verify_catches_unpinned_pools_missing_ranks_and_excess():
    ln = launched()
    assert not d.verify(ln, running(ln), measure(ln, held=0), 0, 0.1)["ok"]
    assert not d.verify(ln, running(ln), measure(ln, ranks=7), 0, 0.1)["ok"]
    assert not d.verify(ln, running(ln), measure(ln, unit=10**15), 0, 0.1)["ok"]


def test_verify_on_a_follower_node_checks_memory_only():
    ln = launched()
    assert d.verify(ln, None, measure(ln), 1, 0.1)["ok"]


def test_verify_refuses_a_tolerance_that_is_not_a_fraction():
    ln = launched()
    with pytest.raises(d.DeployError):
        d.verify(ln, running(ln), measure(ln), 0, 10)


def test_hicache_module_is_the_only_arithmetic():
    # the deploy plan's size is the calculator's size for the same input
    r, gate, _launch = full()
    data = dict(r["plan_base"], mem_total_bytes=NODE["mem_total_bytes"], mem_available_bytes=NODE["mem_available_bytes"],
                mem_limit_bytes=CONTAINER["memory_mib"] * MIB, gpu_count=8, gpu_memory_mib=97887)
    assert hicache.size_gb(data) == gate["per_rank_gb"]


# ---------------------------------------------------------------- every byte figure is the sizing model's


def test_launch_takes_every_byte_figure_from_the_plan():
    ln = launched()
    p = ln["plan"]
    assert ln["bounds"]["planned_pinned_bytes"] == p["total_pinned_bytes"] == p["engine_pinned_bytes"]
    assert ln["bounds"]["ceiling_bytes"] == p["ceiling_bytes"]
    assert ln["guard"]["required_available_bytes"] == p["required_available_bytes"]


def test_with_pp_stages_of_different_sizes_launch_uses_the_plans_sum_not_ranks_times_the_dearest():
    ln = launched(tp_size=4, pp_size=2)  # kimi-k2's 61 layers: stages of 30 and 31 layers
    p = ln["plan"]
    assert p["total_pinned_bytes"] < 8 * p["pinned_per_rank_bytes"]
    assert ln["bounds"]["planned_pinned_bytes"] == p["total_pinned_bytes"]
    assert ln["guard"]["required_available_bytes"] == p["required_available_bytes"] <= p["memory_basis_bytes"]
    assert d.verify(ln, running(ln, tp_size=4, pp_size=2), measure(ln), 0, 0.0)["ok"]


def test_other_engines_pools_are_guarded_but_not_expected_of_this_unit():
    r = req(tp_size=4, policy={"other_engine_ranks": 4})
    gate = d.node_gate(r, NODE, dict(CONTAINER, gpus=[0, 1, 2, 3]), 4 * GIB)
    ln = d.launch(r, node_state(gate), ct_facts(device_paths=["/dev/nvidia%d" % i for i in range(4)]), PATHS)
    p = ln["plan"]
    assert ln["bounds"]["planned_pinned_bytes"] == p["engine_pinned_bytes"] == 4 * p["pinned_per_rank_bytes"]
    assert p["engine_pinned_bytes"] < p["total_pinned_bytes"]
    assert ln["guard"]["required_available_bytes"] == p["required_available_bytes"]
    assert ln["bounds"]["ceiling_bytes"] == p["ceiling_bytes"]


def test_the_plan_input_is_the_request_with_one_hosts_facts():
    r = req(requested_gb=20)
    facts = {"mem_total_bytes": 100 * GIB, "mem_available_bytes": 90 * GIB, "mem_limit_bytes": 80 * GIB, "gpu_count": 8,
             "gpu_memory_mib": 97887}
    data = d.plan_data(r, facts)
    assert data == dict(r["plan_base"], **facts) and data["requested_gb"] == 20
    assert d.plan_data(r, facts, held_bytes=4 * GIB)["mem_available_bytes"] == 94 * GIB
    assert d.plan_data(r, facts, held_bytes=40 * GIB)["mem_available_bytes"] == 100 * GIB  # up to MemTotal
    assert "mem_total_bytes" not in r["plan_base"]  # the request is left as it was


def test_the_node_gate_launch_and_calculator_plan_the_same_for_the_same_facts():
    r = req()
    gate = d.node_gate(r, NODE, CONTAINER, 4 * GIB)
    facts = {"mem_total_bytes": NODE["mem_total_bytes"], "mem_available_bytes": NODE["mem_available_bytes"]}
    calc = d.calculate(dict(facts, gpu_memory_mib=97887), None, r, CONTAINER, "ct129")["plan"]
    assert {k: calc[k] for k in ("per_rank_gb", "total_pinned_bytes", "required_available_bytes")} == \
        {k: gate["plan"][k] for k in ("per_rank_gb", "total_pinned_bytes", "required_available_bytes")}


# ---------------------------------------------------------------- one setting


def test_setting_helpers_shared_by_the_stages():
    assert rq.setting_int("x", " 12 ", 0, 20) == 12
    with pytest.raises(rq.DeployError, match="x must be between 0 and 20, got 21"):
        rq.setting_int("x", 21, 0, 20)
    assert rq.parse_requested_gb("") is None and rq.parse_requested_gb("4") == 4 and rq.parse_requested_gb(0) is None
    assert rq.is_loopback("127.0.0.1") and rq.is_loopback("::1") and rq.is_loopback("localhost")
    assert not rq.is_loopback("10.0.0.1") and not rq.is_loopback("0.0.0.0")
    layout = {"tp_size": 8, "pp_size": 1, "dp_size": 2, "enable_dp_attention": False, "nnodes": 1}
    assert rq.layout_text(layout) == "tp 8 x pp 1 x dp 2 over 1 node(s)"
    assert rq.ranks_on_this_node({"version": "0.5.9", "layout": layout}) == 16


@pytest.mark.parametrize("name", ["enable_dp_attention", "allow_unauthenticated", "api_key_set"])
def test_a_setting_that_is_not_a_boolean_is_a_deploy_error(name):
    with pytest.raises(d.DeployError, match="must be true or false, got 'maybe'"):
        req(**{name: "maybe"})


# ---------------------------------------------------------------- model and port, before any change

LISTEN = ['LISTEN 0 128 0.0.0.0:22 0.0.0.0:* users:(("sshd",pid=87,fd=3))',
          'LISTEN 0 5 10.77.0.129:30000 0.0.0.0:* users:(("python3",pid=790,fd=3))']


def launch_with(**facts):
    r = req()
    gate = d.node_gate(r, NODE, CONTAINER, 4 * GIB)
    return d.launch(r, node_state(gate), ct_facts(**facts), PATHS)


def test_a_port_held_by_another_program_is_refused_and_our_own_server_is_not():
    with pytest.raises(d.DeployError, match=r"port 30000 is already in use in the container by python3 \(pid 790\)"):
        launch_with(listeners=LISTEN)
    assert launch_with(listeners=LISTEN, unit_pids=[790, 792])["hicache_size_gb"] > 0
    assert launch_with(listeners=LISTEN[:1])["hicache_size_gb"] > 0


def test_the_port_of_a_hand_run_server_being_taken_over_is_your_server():
    r = req()
    gate = d.node_gate(r, NODE, CONTAINER, 4 * GIB)
    state = dict(node_state(gate), adopt_hand_run=[790])
    with pytest.raises(d.DeployError, match=r"port 30000 is held by your server, the SGLang started by hand .*pid 790"):
        d.launch(r, state, ct_facts(listeners=LISTEN), PATHS)
    state = dict(node_state(gate), adopt_hand_run=[791])
    with pytest.raises(d.DeployError, match=r"already in use in the container by python3 \(pid 790\)"):
        d.launch(r, state, ct_facts(listeners=LISTEN), PATHS)


def test_a_missing_model_is_refused():
    with pytest.raises(d.DeployError, match="does not exist in the container"):
        launch_with(model_present=False)
    with pytest.raises(d.DeployError, match="no config.json on the controller"):
        launch_with(model_src="/srv/models/x", model_src_present=False)
    assert launch_with(model_present=False, model_src="/srv/models/x", model_src_present=True)["ranks"] == 8


# --- survey answers as AWX passes them: blank (None or '') is not given -----------------------------------

@pytest.mark.parametrize("blank", [None, "", "  "])
def test_request_blank_settings_take_the_defaults(blank):
    r = req(tp_size=8, pp_size=blank, dp_size=blank, enable_dp_attention=blank, port=blank, dist_init_port=blank,
            kv_cache_dtype=blank, requested_gb=blank, host=blank, verify_memory_tolerance=blank, extra_args=blank)
    assert (r["layout"]["pp_size"], r["layout"]["dp_size"], r["layout"]["enable_dp_attention"]) == (1, 1, False)
    assert r["service"]["port"] == 30000 and r["service"]["dist_init_port"] == 50000
    assert r["kv_cache_dtype"] == "auto" and r["requested_gb"] is None and r["verify_memory_tolerance"] == 0.10


@pytest.mark.parametrize("blank", [None, ""])
def test_request_blank_required_setting_says_it_is_not_set(blank):
    with pytest.raises(d.DeployError, match="^sglang_server_version must be set$"):
        req(version=blank)
    with pytest.raises(d.DeployError, match="^sglang_server_model_path must be set$"):
        req(model_path=blank)


def test_request_integers_as_strings():
    r = req(tp_size="8", requested_gb="44", port="30001", enable_dp_attention="false")
    assert r["layout"]["tp_size"] == 8 and r["requested_gb"] == 44 and r["service"]["port"] == 30001


def test_blank_extra_vars_are_named_with_what_they_hide():
    names = ev.blank_extra_vars({"sglang_server_version": None, "sglang_server_tp_size": "", "pve_gpu_container_gpus": " ",
                                "sglang_server_port": 30000, "recover_node": "", "plan_requested_gb": None})
    assert names == ["pve_gpu_container_gpus", "sglang_server_tp_size", "sglang_server_version"]
    note = ev.blank_extra_vars_note(["sglang_server_tp_size"])
    assert note.startswith("sglang_server_tp_size is blank in the extra variables")
    assert "hides any value the inventory sets" in note
    assert ev.blank_extra_vars_note([]) == ""


# --- the calculator (playbooks/plan.yml) ------------------------------------------------------------------

INCIDENT_INPUT = {"mem_total_bytes": 482110078976, "mem_available_bytes": 477815111680, "gpu_count": 8,
                  "gpu_memory_mib": 97887, "sglang_version": "0.5.9", "tp_size": 8, "model_preset": "kimi-k2",
                  "device_pool_tokens_per_rank": 116000}


@pytest.mark.parametrize("blank", [None, "", 0, "0"])
def test_calculate_blank_requested_size_lets_the_plan_choose(blank):
    plan = d.calculate(INCIDENT_INPUT, blank)["plan"]
    assert plan["fits"] and plan["per_rank_gb"] == 48


def test_calculate_requested_size_forms():
    assert d.calculate(INCIDENT_INPUT, "44")["plan"]["per_rank_gb"] == 44
    assert d.calculate(dict(INCIDENT_INPUT, requested_gb=""), None)["plan"]["per_rank_gb"] == 48
    assert d.calculate(dict(INCIDENT_INPUT, requested_gb=300), None)["plan"]["fits"] is False
    with pytest.raises(d.DeployError, match=r"^plan_requested_gb='300GB': give a bare whole number"):
        d.calculate(INCIDENT_INPUT, "300GB")
    with pytest.raises(d.DeployError, match=r"round it down to 1"):
        d.calculate(INCIDENT_INPUT, "1.5")


def test_calculate_needs_something_to_plan():
    for empty in (None, {}, ""):
        with pytest.raises(d.DeployError, match="^Nothing to plan"):
            d.calculate(empty)
    with pytest.raises(d.DeployError, match="plan_input must be a dict"):
        d.calculate("kimi")


LAB_SPEC = {"vmid": 129, "memory_mib": 14336, "gpus": [0, 1]}


def lab_request(**overrides):
    s = dict(SETTINGS, version="0.5.21", tp_size=2,
             policy={"rank_overhead_bytes": 268435456, "frontend_overhead_bytes": 536870912})
    s.update(overrides)
    return rq.request(s)


def test_calculate_inventory_host_against_its_declared_limit():
    out = d.calculate({}, None, lab_request(), LAB_SPEC, "ct129")
    assert out["plan"]["per_rank_gb"] == 1 and out["plan"]["fits"] and out["vmid"] == 129
    assert out["notes"][0].startswith("Planned offline for ct129 (CT 129, tp 2 x pp 1 over 1 node(s), 2 GPU(s): 0,1)")
    # The same plan as the node's gate on a node with more MemAvailable than the limit.
    node = {"mem_total_bytes": 64 * GIB, "mem_available_bytes": 60 * GIB,
            "gpus": [{"index": i, "minor_number": i, "memory_total_mib": 81559} for i in range(2)],
            "device_paths": ["/dev/nvidia0", "/dev/nvidia1"]}
    gate = d.node_gate(lab_request(), node, LAB_SPEC, 4 * GIB)
    assert gate["per_rank_gb"] == out["plan"]["per_rank_gb"]


def test_a_memory_limit_written_in_gib_is_refused_with_the_mib_figure():
    # 440 meant as GiB: refused naming the unit and the figure meant, by the calculator and the node gate alike.
    for call in (lambda spec: d.calculate({}, None, lab_request(), spec, "ct129"),
                 d.container_spec):
        with pytest.raises(d.DeployError) as err:
            call(dict(LAB_SPEC, memory_mib=440))
        msg = str(err.value)
        assert msg.startswith("CT 129: pve_gpu_container_memory_mib=440 is 0.43 GiB, too little for a GPU container")
        assert "pve_gpu_container_memory_mib is MiB: 440 GiB is 450560." in msg
        assert "Headroom" not in msg
    # The least accepted passes this check (then the plan judges it against its policy).
    assert d.container_spec(dict(LAB_SPEC, memory_mib=4096))[1] == 4096
    with pytest.raises(d.DeployError, match="memory_mib=4095 is 4.00 GiB"):
        d.container_spec(dict(LAB_SPEC, memory_mib=4095))


def test_calculate_inventory_host_checks_like_the_gate():
    with pytest.raises(d.DeployError, match=r"tp 4 x pp 1 over 1 node\(s\) puts 4 scheduler rank\(s\) .* but 2 GPU\(s\)"):
        d.calculate({}, None, lab_request(tp_size=4), LAB_SPEC, "ct129")
    with pytest.raises(d.DeployError, match="pve_gpu_container_memory_mib must be a whole number"):
        d.calculate({}, None, lab_request(), dict(LAB_SPEC, memory_mib="14GiB"), "ct129")
    with pytest.raises(d.DeployError, match=r"plan_input may give only the node's facts \(.*\); tp_size come from ct129's"):
        d.calculate({"tp_size": 4}, None, lab_request(), LAB_SPEC, "ct129")
    with pytest.raises(d.DeployError, match="ask for a size with -e plan_requested_gb"):
        d.calculate({"requested_gb": 4}, None, lab_request(), LAB_SPEC, "ct129")


def test_calculate_inventory_host_override_and_facts():
    out = d.calculate({}, "2", lab_request(), LAB_SPEC, "ct129")
    assert out["plan"]["fits"] is False
    assert "plan_requested_gb=2 overrides ct129's sglang_server_hicache_requested_gb (none: the plan chooses)." in out["notes"]
    low = d.calculate({"mem_total_bytes": 64 * GIB, "mem_available_bytes": 11 * GIB}, None, lab_request(), LAB_SPEC, "ct129")
    assert low["plan"]["fits"] is False and "node's facts given in plan_input" in low["notes"][0]


def test_calculate_old_release_needs_the_gpu_memory():
    with pytest.raises(d.DeployError, match=r"SGLang 0\.5\.9 checks at start-up .*gpu_memory_mib"):
        d.calculate({}, None, lab_request(version="0.5.9"), LAB_SPEC, "ct129")
    out = d.calculate({"gpu_memory_mib": 81559}, None, lab_request(version="0.5.9"), LAB_SPEC, "ct129")
    assert out["plan"]["sglang_version"] == "0.5.9"


# ---------------------------------------------------------------- issue 28: attn-dp, draft pool, overhead seen


def test_attn_dp_size_is_launched_as_its_own_flag_with_the_same_ranks():
    ln = launched(version="0.5.23", attn_dp_size=8)
    args = ln["sglang_args"]
    assert args[args.index("--attn-dp-size") + 1] == "8"
    assert "--dp-size" not in args and "--enable-dp-attention" not in args
    assert ln["ranks"] == 8


def test_attn_dp_size_on_a_release_without_it_is_refused_before_any_change():
    with pytest.raises(d.DeployError, match="enable_dp_attention"):
        full(version="0.5.21", attn_dp_size=8)


@pytest.mark.parametrize("flag", ["--speculative-draft-model-path", "--speculative-draft-model-p",
                                  "--speculative-draft-model-path=/models/eagle"])
def test_a_draft_model_in_extra_args_needs_its_kv_size(flag):
    with pytest.raises(d.DeployError, match="sglang_server_draft_kv_bytes_per_token"):
        req(version="0.5.23", extra_args=[flag, "/models/eagle"] if "=" not in flag else [flag])
    r = req(version="0.5.23", extra_args=["--speculative-draft-model-path", "/models/eagle"], draft_kv_bytes_per_token=4096)
    assert r["plan_base"]["draft_kv_bytes_per_token"] == 4096


def test_extra_args_cannot_set_attn_dp_size():
    with pytest.raises(d.DeployError, match="--attn-dp-size"):
        req(version="0.5.23", extra_args=["--attn-dp-size", "8"])


def test_verify_reports_the_overhead_it_saw_next_to_the_budget():
    ln = launched()
    planned = ln["bounds"]["planned_pinned_bytes"]
    v = d.verify(ln, running(ln), measure(ln, held=planned + 8 * 3 * GIB, unit=planned + 8 * 3 * GIB + 2 * GIB), 0, 0.1)
    seen = v["overhead_seen"]
    assert seen["per_rank_bytes"] == 3 * GIB and seen["frontend_bytes"] == 2 * GIB
    assert seen["budgeted_bytes"] == ln["plan"]["overhead_bytes"]
    assert "per rank" in seen["text"] and "budgets" in seen["text"]


@pytest.mark.parametrize("settings", [dict(attn_dp_size=8), dict(dp_size=8, enable_dp_attention=True)])
def test_verify_accepts_attention_dp_as_0_5_22_reports_it_and_as_older_releases_did(settings):
    ln = launched(version="0.5.23", **settings)
    assert d.verify(ln, running(ln, dp_size=1, attn_dp_size=8), measure(ln), 0, 0.1)["ok"]
    assert d.verify(ln, running(ln, dp_size=8), measure(ln), 0, 0.1)["ok"]
    v = d.verify(ln, running(ln, dp_size=1, attn_dp_size=4), measure(ln), 0, 0.1)
    assert not v["ok"] and "dp_size" in v["mismatches"][0]


# ---------------------------------------------------------------- blank layout settings say which default is used


@pytest.mark.parametrize("blank", ["", None, "  "])
def test_a_blank_layout_setting_uses_its_default_and_the_plan_says_which(blank):
    # pp_size blank: the default 1 applies (the launch is the same as pp_size 1), and the plan's warnings say so.
    r = req(pp_size=blank)
    assert r["layout"]["pp_size"] == 1
    assert r["notes"] == ["sglang_server_pp_size was given blank ('' or null), so not given: the documented default 1 is used"]
    ln = d.launch(r, node_state(d.node_gate(r, NODE, CONTAINER, 4 * GIB)), ct_facts(), PATHS)
    assert ln["plan"]["warnings"][0] == r["notes"][0]
    assert "--pp-size" not in ln["argv"]


def test_a_blank_tp_size_that_no_longer_matches_the_gpus_names_the_blank_in_the_refusal():
    r = req(tp_size="")
    with pytest.raises(rq.DeployError) as err:
        d.node_gate(r, NODE, CONTAINER, 4 * GIB)
    assert "puts 1 scheduler rank(s) on this node" in str(err.value)
    assert "sglang_server_tp_size was given blank" in str(err.value)


def test_settings_given_have_no_notes():
    assert req()["notes"] == []


# ---------------------------------------------------------------- verify's arguments, the server's restart


@pytest.mark.parametrize("version,path", [
    ("0.5.5", "get_server_info"), ("0.5.4.post2", "get_server_info"),
    ("0.5.6", "server_info"), ("0.5.9", "server_info"), ("0.5.21", "server_info"),
    # A pre-release of 0.5.6 may carry 0.5.5's code: the path every candidate serves.
    ("0.5.6rc1", "get_server_info"), ("0.5.6.dev0", "get_server_info"),
    # A post release of 0.5.5 may carry 0.5.6's code, and 0.5.5's: the older path, which both serve.
    ("0.5.5.post1", "get_server_info"),
])
def test_verify_reads_the_server_info_path_its_release_serves(version, path):
    ln = launched(version=version)
    args = ln["verify_args"]
    assert args[args.index("--info-path") + 1] == path
    assert args[args.index("--health-url") + 1] == ln["health_url"] == "http://10.77.0.129:30000"


def test_verify_args_on_a_follower_and_without_a_key():
    r = req(cluster=["ct-a", "ct-b"], inventory_hostname="ct-b", nnodes=None, node_rank=None, tp_size=16,
            dist_init_host="10.0.0.1")
    assert r["cluster"] == ["ct-a", "ct-b"] and r["layout"]["node_rank"] == 1
    gate = d.node_gate(r, NODE, CONTAINER, 4 * GIB)
    ln = d.launch(r, node_state(gate), ct_facts(), PATHS)
    assert "--info-path" not in ln["verify_args"]  # node rank 0 serves the API
    assert ln["verify_args"][ln["verify_args"].index("--api-key-file") + 1] == PATHS["api_key_file"]
    ln = launched(api_key_set=False, host="127.0.0.1")
    assert "--api-key-file" not in ln["verify_args"] and "--info-path" in ln["verify_args"]


def test_the_server_restarts_for_its_own_reasons():
    assert d.server_restart("a", {"restart": False, "restart_reasons": []}, 1, [], {}) == {"restart": False, "reasons": []}
    got = d.server_restart("a", {"restart": True, "restart_reasons": ["the unit is inactive, not active"]}, 1, [], {})
    assert got == {"restart": True, "reasons": ["the unit is inactive, not active"]}


def test_a_server_over_several_containers_restarts_whole():
    members = ["a", "b", "c"]
    quiet = {"restart": False, "restart_reasons": []}
    loud = {"restart": True, "restart_reasons": ["installed since the running server started: launch.json"]}
    got = d.server_restart("a", quiet, 3, members, {"b": loud, "c": quiet})
    assert got["restart"] and "(b)" in got["reasons"][0]
    assert d.server_restart("a", quiet, 3, members, {"b": quiet, "c": None}) == {"restart": False, "reasons": []}
    # One container only: another host's restart is not this server's.
    assert not d.server_restart("a", quiet, 1, members, {"b": loud})["restart"]
    # Its own answer is never overridden by the others'.
    assert d.server_restart("a", loud, 3, members, {"b": quiet})["reasons"] == loud["restart_reasons"]
