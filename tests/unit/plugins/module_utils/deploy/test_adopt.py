"""Unit tests for taking over a hand-made container (plugins/module_utils/deploy/adopt.py): the running argv parsed, its
size judged by the real sizing model (never stubbed), the passthrough classified, the config compared key by key,
the steps and the consent they need."""

from __future__ import annotations

from ansible_collections.inferops.gpu_inference.plugins.module_utils.deploy import adopt as a
from ansible_collections.inferops.gpu_inference.plugins.module_utils.deploy import sglang_request as rq

GIB = 2**30
SETTINGS = {
    "version": "0.5.9", "tp_size": 8, "pp_size": 1, "dp_size": 1, "enable_dp_attention": False,
    "nnodes": 1, "node_rank": 0, "model_preset": "kimi-k2", "kv_cache_dtype": "auto", "requested_gb": 0,
    "policy": {}, "plan_extra": {}, "extra_args": [], "host": "", "port": 30000, "api_key_set": True,
    "allow_unauthenticated": False, "model_path": "/models/kimi", "served_model_name": "",
    "dist_init_host": "", "dist_init_port": 50000,
}
GPUS = [{"index": i, "minor_number": i, "uuid": "GPU-%d" % i, "pci_bus_id": "00000000:%02X:00.0" % (0x10 + i),
         "memory_total_mib": 97887, "name": "NVIDIA RTX PRO 6000"} for i in range(8)]
INCIDENT_ARGV = ["/usr/bin/python3", "-m", "sglang.launch_server", "--model-path", "/models/kimi-k2.5",
                 "--tp-size", "8", "--enable-hierarchical-cache", "--hicache-size", "300", "--mem-fraction-static",
                 "0.93", "--port", "30000", "--host", "0.0.0.0"]
# The community-scripts way: every node bind-mounted and allowed by major.
RAW = [["lxc.cgroup2.devices.allow", "c 195:* rwm"], ["lxc.cgroup2.devices.allow", "c 509:* rwm"]] + [
    ["lxc.mount.entry", "/dev/nvidia%d dev/nvidia%d none bind,optional,create=file" % (i, i)] for i in range(8)] + [
    ["lxc.mount.entry", "/dev/nvidiactl dev/nvidiactl none bind,optional,create=file"],
    ["lxc.mount.entry", "/dev/nvidia-uvm dev/nvidia-uvm none bind,optional,create=file"]]
HAND_MADE = {"hostname": "kimi", "cores": "96", "memory": str(420 * 1024), "swap": "512", "features": "nesting=1,keyctl=1",
             "net0": "name=eth0,bridge=vmbr0,ip=dhcp,hwaddr=BC:24:11:00:00:01,type=veth", "mp0": "/tank/models,mp=/models",
             "rootfs": "local-lvm:vm-129-disk-0,size=200G", "lxc": RAW}


def incident_facts():
    return a.facts_for_running(449 * GIB, 445 * GIB, 0, 420 * 1024, GPUS)


# --- the running argv -----------------------------------------------------------------------------------------------

def test_the_incident_argv_is_read_as_sglang_with_its_size_layout_and_port():
    s = a.parse_server_argv(INCIDENT_ARGV, 4242, 4242)
    assert (s.tp_size, s.hicache_size_gb, s.hierarchical, s.port, s.host, s.model_path) == (
        8, 300, True, 30000, "0.0.0.0", "/models/kimi-k2.5")
    assert s.problems == []


def test_equals_forms_aliases_and_the_sglang_serve_cli_are_read():
    s = a.parse_server_argv(["/opt/venv/bin/sglang", "serve", "--tensor-parallel-size=4", "--hicache-size=52",
                             "--enable-hierarchical-cache", "--dp", "2"])
    assert (s.tp_size, s.dp_size, s.hicache_size_gb, s.port) == (4, 2, 52, a.SGLANG_DEFAULT_PORT)


def test_the_units_own_launcher_is_read_from_the_arguments_after_the_separator():
    s = a.parse_server_argv(["/opt/sglang/venv/bin/python3", "/usr/local/libexec/inferops/sglang-launch", "--launch",
                             "/etc/sglang/launch.json", "--api-key-file", "/etc/sglang/api-key", "--", "--model-path",
                             "/m", "--tp-size", "2", "--enable-hierarchical-cache", "--hicache-size", "1", "--port", "30001"])
    assert (s.tp_size, s.hicache_size_gb, s.port) == (2, 1, 30001)


def test_other_processes_and_garbled_numbers_are_not_taken_as_settings():
    assert a.parse_server_argv(["/usr/bin/python3", "-m", "http.server", "--port", "30000"]) is None
    assert a.parse_server_argv(["bash", "-c", "python3 -m sglang.launch_server"]) is None
    s = a.parse_server_argv(["python3", "-m", "sglang.launch_server", "--tp-size", "8; rm -rf /", "--hicache-size", "3e2"])
    assert s.tp_size == 1 and s.hicache_size_gb is None and len(s.problems) == 2
    judged = a.judge_running(rq.request(SETTINGS)["plan_base"], s, incident_facts())
    assert judged["fits"] is None and "could not all be read" in judged["verdict"]


def test_find_servers_takes_the_launcher_and_counts_its_renamed_ranks():
    procs = [{"pid": 100, "ppid": 1, "pgid": 100, "argv": INCIDENT_ARGV, "unit": ""}]
    procs += [{"pid": 101 + r, "ppid": 100, "pgid": 100, "argv": ["sglang::scheduler_TP%d" % r]} for r in range(8)]
    procs += [{"pid": 200, "ppid": 1, "pgid": 200, "argv": ["/usr/sbin/sshd", "-D"]}]
    servers = a.find_servers(procs)
    assert [s.pid for s in servers] == [100] and servers[0].children == list(range(101, 109))


# --- the running size, judged by the sizing model --------------------------------------------------------------------

def test_the_incident_container_is_named_overcommit_before_anything_changes():
    """449 GiB node, TP 8, a running --hicache-size 300: 2400 GB asked of a ~363 GB budget."""
    s = a.parse_server_argv(INCIDENT_ARGV, 4242, 4242)
    judged = a.judge_running(rq.request(SETTINGS)["plan_base"], s, incident_facts())
    assert judged["fits"] is False
    assert judged["verdict"].startswith("your running --hicache-size 300 x 8 ranks does not fit: 2400 GB vs 363 GB")
    assert "OVERCOMMIT" in judged["verdict"] and "45 GB per rank" in judged["verdict"]
    assert judged["plan"]["total_pinned_bytes"] > 6 * judged["plan"]["budget_bytes"]


def test_52_x_8_is_judged_with_the_figures_of_the_model():
    s = a.parse_server_argv(INCIDENT_ARGV[:9] + ["52"], 1, 1)
    judged = a.judge_running(rq.request(SETTINGS)["plan_base"], s, incident_facts())
    assert judged["fits"] is False and "--hicache-size 52 x 8 ranks does not fit: 416 GB vs 363 GB" in judged["verdict"]


def test_a_size_that_fits_is_said_to_fit():
    s = a.parse_server_argv(INCIDENT_ARGV[:9] + ["40"], 1, 1)
    judged = a.judge_running(rq.request(SETTINGS)["plan_base"], s, incident_facts())
    assert judged["fits"] is True and "40 x 8 ranks fits" in judged["verdict"]


def test_the_running_layout_not_the_inventorys_is_judged():
    s = a.parse_server_argv(["python3", "-m", "sglang.launch_server", "--tp-size", "4", "--enable-hierarchical-cache",
                             "--hicache-size", "80"], 1, 1)
    facts = a.facts_for_running(449 * GIB, 445 * GIB, 0, 420 * 1024, GPUS[:4])
    judged = a.judge_running(rq.request(SETTINGS)["plan_base"], s, facts)
    assert judged["plan"]["engine_ranks_per_host"] == 4 and "x 4 ranks" in judged["verdict"]


def test_a_server_without_a_host_cache_pins_nothing_of_hicache():
    s = a.parse_server_argv(["python3", "-m", "sglang.launch_server", "--tp-size", "8"], 1, 1)
    judged = a.judge_running(rq.request(SETTINGS)["plan_base"], s, incident_facts())
    assert judged["fits"] is None and "no host cache" in judged["verdict"]


def test_what_the_container_holds_counts_as_available_to_its_own_server():
    facts = a.facts_for_running(449 * GIB, 40 * GIB, 400 * GIB, 420 * 1024, GPUS)
    assert facts["mem_available_bytes"] == 440 * GIB and facts["gpu_count"] == 8


# --- GPU passthrough --------------------------------------------------------------------------------------------------

def test_raw_lines_are_read_as_the_passthrough_and_mapped_to_nvidia_smi_gpus():
    p = a.classify_passthrough(HAND_MADE, GPUS)
    assert p["method"] == "raw" and p["minors"] == list(range(8)) and p["mapped_twice"] == [] and p["problems"] == []
    assert p["gpus"][3]["pci_bus_id"] == "00000000:13:00.0" and p["gpus"][3]["via"] == ["lxc.mount.entry"]
    d = a.passthrough_decision(p, range(8))
    assert d == {"manage_devn": False, "restart": False, "refusal": None}


def test_raw_lines_for_other_gpus_are_refused_not_doubled_by_devn():
    p = a.classify_passthrough(HAND_MADE, GPUS)
    d = a.passthrough_decision(p, [0, 1])
    assert d["manage_devn"] is False and "does not add devN entries beside raw lines" in d["refusal"]


def test_a_device_mapped_by_devn_and_a_raw_line_is_mapped_twice():
    config = dict(HAND_MADE, dev0="/dev/nvidia0,gid=44")
    p = a.classify_passthrough(config, GPUS)
    assert p["method"] == "both" and p["mapped_twice"] == ["/dev/nvidia0"]
    assert "maps /dev/nvidia0 twice" in a.passthrough_decision(p, range(8))["refusal"]


def test_a_raw_mount_without_a_cgroup_rule_is_a_problem():
    config = {"lxc": [["lxc.mount.entry", "/dev/nvidia2 dev/nvidia2 none bind,optional,create=file"]]}
    p = a.classify_passthrough(config, GPUS)
    assert p["minors"] == [2] and "no lxc.cgroup2.devices.allow line" in p["problems"][0]


def test_devn_only_is_managed_and_a_change_restarts():
    config = {"dev0": "/dev/nvidia0", "dev1": "/dev/nvidiactl"}
    p = a.classify_passthrough(config, GPUS)
    assert p["method"] == "devN" and p["minors"] == [0]
    assert a.passthrough_decision(p, [0]) == {"manage_devn": True, "restart": False, "refusal": None}
    assert a.passthrough_decision(p, [0, 1])["restart"] is True


# --- config, key by key -----------------------------------------------------------------------------------------------

ROLES = {"hostname": "sglang-129", "cores": "8", "swap": "0", "features": "nesting=1", "memory": str(420 * 1024),
         "rootfs": "local-lvm:64"}


def test_the_operators_choices_stay_when_the_inventory_does_not_set_them():
    rows = a.config_rows(HAND_MADE, ROLES, [], consent=True)
    assert sorted(rows["omit"]) == ["cores", "features", "hostname", "rootfs", "swap"]
    by_key = {r["key"]: r for r in rows["rows"]}
    assert by_key["cores"]["current"] == "96" and by_key["cores"]["roles"] == "8" and by_key["cores"]["action"].startswith("kept")
    assert by_key["memory"]["action"] == "same"
    assert by_key["mp0"]["action"] == "kept (not managed)" and by_key["net0"]["action"] == "kept (not managed)"


def test_an_inventory_value_that_differs_is_applied_only_with_consent():
    rows = a.config_rows(HAND_MADE, ROLES, ["pve_gpu_container_cores"], consent=False)
    assert "cores" in rows["omit"] and "differs: kept until pve_gpu_container_adopt_interrupt=true" in [
        r["action"] for r in rows["rows"] if r["key"] == "cores"][0]
    rows = a.config_rows(HAND_MADE, ROLES, ["pve_gpu_container_cores"], consent=True)
    assert "cores" not in rows["omit"] and "hostname" in rows["omit"]


# --- the take-over ------------------------------------------------------------------------------------------------------

def test_a_hand_run_server_makes_the_take_over_interrupting_and_it_stops_without_consent():
    servers = a.find_servers([{"pid": 100, "ppid": 1, "pgid": 100, "argv": INCIDENT_ARGV, "starttime": 5}])
    rows = a.config_rows(HAND_MADE, ROLES, [], consent=False)
    steps = a.take_over(129, servers, {"refusal": None, "restart": False}, rows, 41, "sglang.service", False, False, True)
    assert steps["interrupts"] and "pve_gpu_container_adopt_interrupt=true" in steps["refusal"]
    assert "Nothing has been changed" in steps["refusal"]
    stop = [s for s in steps["steps"] if "stop your hand-run SGLang" in s["step"]]
    assert len(stop) == 1 and stop[0]["interrupts"] and "process group 100" in stop[0]["step"]
    assert "no baseline" in steps["recover"] and "never Clean" in steps["recover"]
    ok = a.take_over(129, servers, {"refusal": None, "restart": False}, rows, 41, "sglang.service", True, False, True)
    assert ok["refusal"] is None and ok["hand_run"] == [100]


def test_the_steps_follow_the_window_stop_then_baseline_then_config_then_unit():
    servers = a.find_servers([{"pid": 100, "ppid": 1, "pgid": 100, "argv": INCIDENT_ARGV, "starttime": 5}])
    rows = a.config_rows(HAND_MADE, {**ROLES, "cores": 8}, ["pve_gpu_container_cores"], consent=True)
    steps = a.take_over(129, servers, {"refusal": None, "restart": True}, rows, 41, "sglang.service", True, False, True)
    words = [s["step"] for s in steps["steps"]]

    def at(text):
        return [n for n, w in enumerate(words) if text in w][0]

    assert at("stop your hand-run SGLang") < at("take the baseline") < at("tag the container") < at("set cores") \
        < at("restart the container") < at("install the driver") < at("start sglang.service")
    assert "recovery ladder" in words[at("stop your hand-run SGLang")] and "Clean" in words[at("stop your hand-run")]
    assert "right after the stop" in words[at("take the baseline")]
    assert all(s["interrupts"] for s in steps["steps"])  # the server is down from the stop on
    assert "right after it stops your server" in a.take_over(
        129, servers, {"refusal": None, "restart": False}, rows, 41, "sglang.service", True, False, True)["recover"]


def test_the_stop_signals_the_launcher_and_its_ranks_only_if_still_the_same_processes():
    procs = [{"pid": 100, "ppid": 1, "pgid": 100, "starttime": 5, "vmid": 129},
             {"pid": 101, "ppid": 100, "pgid": 100, "starttime": 6, "vmid": 129},
             {"pid": 102, "ppid": 101, "pgid": 100, "starttime": 7, "vmid": 129},
             {"pid": 300, "ppid": 1, "pgid": 300, "starttime": 8, "vmid": 129}]
    got = a.stop_targets([{"pid": 100, "starttime": 5}], procs, 129)
    assert [p["pid"] for p in got["targets"]] == [100, 101, 102] and got["skipped"] == []
    got = a.stop_targets([{"pid": 100, "starttime": 4}], procs, 129)
    assert got["targets"] == [] and "another process now" in got["skipped"][0]
    got = a.stop_targets([{"pid": 100, "starttime": 5}], procs, 130)
    assert got["targets"] == []
    got = a.stop_targets([{"pid": 999, "starttime": 5}], procs, 129)
    assert got["targets"] == [] and "exited" in got["skipped"][0]


def test_a_passthrough_restart_needs_consent():
    rows = a.config_rows(HAND_MADE, ROLES, [], consent=False)
    steps = a.take_over(129, [], {"refusal": None, "restart": True}, rows, 41, "sglang.service", False, False, False)
    assert steps["interrupts"] and "pve_gpu_container_adopt_interrupt=true" in steps["refusal"]
    steps = a.take_over(129, [], {"refusal": None, "restart": True}, rows, 41, "sglang.service", True, False, False)
    assert steps["refusal"] is None


def test_a_container_without_a_server_is_taken_over_without_interruption():
    rows = a.config_rows(HAND_MADE, ROLES, [], consent=False)
    steps = a.take_over(129, [], {"refusal": None, "restart": False}, rows, 41, "sglang.service", False, False, False)
    assert not steps["interrupts"] and steps["refusal"] is None and "records it in this step" in steps["recover"]
    assert steps["record_baseline_now"] is True


def test_the_port_of_the_hand_run_server_is_your_server():
    servers = a.find_servers([{"pid": 100, "ppid": 1, "pgid": 100, "argv": INCIDENT_ARGV}])
    assert "held by your server" in a.port_owner(30000, servers, "sglang.service")
    assert a.port_owner(30001, servers, "sglang.service") is None
    servers[0].unit = "sglang.service"
    assert a.port_owner(30000, servers, "sglang.service") is None


def test_the_report_names_everything_for_the_incident():
    servers = a.find_servers([{"pid": 100, "ppid": 1, "pgid": 100, "argv": INCIDENT_ARGV}])
    judged = [a.judge_running(rq.request(SETTINGS)["plan_base"], s, incident_facts()) for s in servers]
    rows = a.config_rows(HAND_MADE, ROLES, [], consent=False)
    p = a.classify_passthrough(HAND_MADE, GPUS)
    steps = a.take_over(129, servers, a.passthrough_decision(p, range(8)), rows, 41, "sglang.service", False, False, True)
    text = "\n".join(a.report_lines(129, "ct129", rows, p, servers, judged, "The plan: 41 GB per rank", steps,
                                    a.port_owner(30000, servers, "sglang.service")))
    assert "does not fit: 2400 GB vs 363 GB" in text and "OVERCOMMIT" in text
    assert "raw lxc lines" in text and "nvidia-smi GPU 7" in text and "MAPPED TWICE" not in text
    assert "[INTERRUPTS the server]" in text and "STOP:" in text and "held by your server" in text


def test_a_group_is_signalled_whole_only_when_it_holds_nothing_but_the_server():
    server = [{"pid": 100, "pgid": 100}, {"pid": 101, "pgid": 100}]
    assert a.whole_groups(server, server + [{"pid": 5, "pgid": 5}]) is True
    assert a.whole_groups(server, server + [{"pid": 90, "pgid": 100}]) is False  # the operator's shell
