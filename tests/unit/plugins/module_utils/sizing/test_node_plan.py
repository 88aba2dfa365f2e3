"""node_plan.plan_node: every container of a node planned together against its RAM and GPUs (issue 21)."""
from __future__ import annotations

import pytest

from ansible_collections.inferops.gpu_inference.plugins.module_utils.sizing import node_plan as npl
from ansible_collections.inferops.gpu_inference.plugins.module_utils.pve import pve_gpu_devices
from ansible_collections.inferops.gpu_inference.plugins.module_utils.deploy import sglang_request as rq

GIB = 1 << 30
# The incident's node: 8 x H100 NVL (97887 MiB), 449 GiB RAM.
NODE = {
    "mem_total_bytes": 449 * GIB, "mem_available_bytes": 445 * GIB,
    "gpus": [{"index": i, "minor_number": i, "memory_total_mib": 97887} for i in range(8)],
    "device_paths": ["/dev/nvidia%d" % i for i in range(8)] + ["/dev/nvidiactl", "/dev/nvidia-uvm"],
}
SETTINGS = {
    "version": "0.5.9", "tp_size": 4, "model_preset": "kimi-k2", "api_key_set": True, "model_path": "/models/kimi",
    "plan_extra": {"device_pool_tokens_per_rank": 116000},
}


def request(**overrides):
    return rq.request(dict(SETTINGS, **overrides))


def ct(host, vmid, gpus, memory_gib):
    return {"host": host, "vmid": vmid, "gpus": gpus, "memory_mib": memory_gib * 1024}


def guest(vmid, status="stopped", maxmem_gib=0, mem_gib=0, gpus=(), name="", kind="lxc"):
    return {"vmid": vmid, "type": kind, "name": name, "status": status, "maxmem_bytes": maxmem_gib * GIB,
            "mem_bytes": mem_gib * GIB, "gpus": list(gpus)}


def plan(containers, guests=(), requests=None, others_count="limit", node=None):
    requests = requests or {c["host"]: request() for c in containers}
    return npl.plan_node(requests, containers, node or NODE, list(guests), 4 * GIB, others_count, "pve1")


# ---------------------------------------------------------------- the node's RAM


def test_two_400_gib_containers_each_fitting_alone_are_refused_together_with_the_table():
    # The case: each plan alone fits its 400 GiB container; together they would pin the incident again.
    a = [ct("ct129", 129, [0, 1, 2, 3], 400)]
    b = [ct("ct130", 130, [4, 5, 6, 7], 400)]
    alone_a, alone_b = plan(a), plan(b)
    assert alone_a["fits"] and alone_b["fits"]
    with pytest.raises(rq.DeployError) as err:
        plan(a + b)
    text = str(err.value)
    # The second is planned against what the first leaves of MemAvailable, and the refusal says so.
    assert text.startswith("CT 130: refused before any change, the HiCache plan does not fit. It is planned against "
                           "the node's MemAvailable 445.0 GiB less ")
    assert "that the containers planned before it on this node will still pin and hold" in text


def test_the_second_container_is_planned_against_what_the_first_leaves():
    # Two 200 GiB containers on 449 GiB: both fit, and the second's plan sees the first's committed memory.
    both = plan([ct("ct129", 129, [0, 1, 2, 3], 200), ct("ct130", 130, [4, 5, 6, 7], 200)])
    first, second = both["containers"]
    assert both["fits"] and both["committed_bytes"] <= NODE["mem_total_bytes"]
    assert first["committed_bytes"] + second["committed_bytes"] + 4 * GIB == both["committed_bytes"]
    # The arithmetic the table shows is the gates' own plans.
    assert both["gates"]["ct129"]["plan"]["ceiling_bytes"] == first["committed_bytes"]
    assert [line.split()[0:2] for line in both["table"][1:3]] == [["CT", "129"], ["CT", "130"]]


def test_the_table_names_each_unit_of_the_pools():
    # 4 x 93 GB beside 346.5 GiB read as arithmetic that does not add up: each unit is named, and both totals shown.
    lines = plan([ct("ct129", 129, [0, 1, 2, 3], 400)])["table"]
    assert lines[0].startswith("guest") and lines[0].endswith("(GiB = 2^30 bytes, GB = 10^9 bytes)")
    row = next(line for line in lines if line.startswith("CT 129"))
    assert "4 ranks x 93 GB -> 372.0 GB = 346.5 GiB" in row


def overflow(version):
    # 128 GiB node, two 60 GiB containers pinning 2 x 10 GB each: each fits, and so does what MemAvailable leaves the
    # second; a stopped 48 GiB guest counted by its limit puts the node over.
    small = dict(NODE, mem_total_bytes=128 * GIB, mem_available_bytes=127 * GIB)
    containers = [ct("ct129", 129, [0, 1], 60), ct("ct130", 130, [2, 3], 60)]
    backup = (guest(140, maxmem_gib=48, name="backup"),)

    def run(gb, guests=backup):
        requests = {c["host"]: request(tp_size=2, requested_gb=gb, version=version) for c in containers}
        return plan(containers, list(guests), requests=requests, node=small)
    assert run(10, ())["fits"]
    with pytest.raises(rq.DeployError) as err:
        run(10)
    text = str(err.value)
    assert text.startswith("refused before any change: the containers' plans fit each container, but together they "
                           "overflow node pve1.")
    assert "CT 140 backup (stopped)" in text and "48.0 GiB" in text
    assert "node pve1 RAM 128.0 GiB" in text and "OVER by 9.26 GiB" in text
    return text, run


def test_a_node_that_overflows_shows_the_table_and_sizes_that_were_planned_again_and_fit():
    text, run = overflow("0.5.21")
    assert "ct129: sglang_server_hicache_requested_gb=7; ct130: sglang_server_hicache_requested_gb=7" in text
    # The advice is checked here by planning the node with it, not taken from the refusal's word.
    assert run(7)["fits"]
    with pytest.raises(rq.DeployError):
        run(8)


def test_no_size_is_advised_where_the_release_refuses_every_size_that_would_fit():
    # 0.5.9 asserts the host pool is larger than the device pool (116,000 tokens of Kimi-K2 per rank: about 8 GB), so
    # the 7 GB that fits the node's RAM is refused by SGLang: advising it would send the operator into that refusal.
    text, run = overflow("0.5.9")
    assert "No per-rank size of the host KV pools fits the node (not even 1 GB per rank)" in text
    assert "sglang_server_hicache_requested_gb=" not in text
    for gb in (9, 8, 7, 1):
        with pytest.raises(rq.DeployError):
            run(gb)


def test_other_guests_count_by_their_limit_by_default_and_by_their_use_when_asked():
    containers = [ct("ct129", 129, [0, 1, 2, 3], 300)]
    other = guest(140, status="stopped", maxmem_gib=200, name="db")
    with pytest.raises(rq.DeployError) as err:
        plan(containers, [other])
    assert "CT 140 db (stopped)" in str(err.value)
    assert "not managed" in str(err.value)
    measured = plan(containers, [other], others_count="measured")
    assert measured["fits"] and measured["others"][0]["counted_bytes"] == 0
    assert "not managed, its use now" in "\n".join(measured["table"])


def test_others_count_must_be_known():
    with pytest.raises(rq.DeployError, match="pve_gpu_container_node_others_count must be one of limit, measured"):
        plan([ct("ct129", 129, [0, 1, 2, 3], 300)], others_count="guess")


def test_a_rerun_with_the_containers_running_plans_the_same_sizes():
    containers = [ct("ct129", 129, [0, 1, 2, 3], 200), ct("ct130", 130, [4, 5, 6, 7], 200)]
    first = plan(containers)
    held = {r["vmid"]: r["committed_bytes"] for r in first["containers"]}
    # After the deploy: both run and hold what they committed; MemAvailable has dropped by as much.
    node = dict(NODE, mem_available_bytes=NODE["mem_available_bytes"] - sum(held.values()))
    guests = [guest(v, status="running", maxmem_gib=200, mem_gib=0) for v in held]
    for g in guests:
        g["mem_bytes"] = held[g["vmid"]]
    again = plan(containers, guests, node=node)
    assert [r["per_rank_gb"] for r in again["containers"]] == [r["per_rank_gb"] for r in first["containers"]]
    assert again["committed_bytes"] == first["committed_bytes"]


# ---------------------------------------------------------------- GPUs are owned once


def test_a_gpu_another_container_holds_is_refused_naming_it_running_or_stopped():
    for status in ("running", "stopped"):
        with pytest.raises(rq.DeployError) as err:
            plan([ct("ct133", 133, [0, 1, 2, 3], 100)], [guest(129, status=status, maxmem_gib=14, gpus=[0, 1], name="ct129")])
        assert "CT 133 (ct133) asks for GPU 0, which CT 129 ct129 (%s) already has as a devN passthrough" % status in str(err.value)
        assert "not held by any guest: 4,5,6,7" in str(err.value)


def test_two_inventory_containers_asking_for_one_gpu_are_refused():
    with pytest.raises(rq.DeployError) as err:
        plan([ct("ct129", 129, [0, 1, 2, 3], 100), ct("ct130", 130, [3, 4, 5, 6], 100)])
    assert "CT 129 (ct129) and CT 130 (ct130) both ask for GPU 3" in str(err.value)


def test_a_managed_containers_own_gpus_are_not_a_conflict():
    running = guest(129, status="running", maxmem_gib=100, mem_gib=1, gpus=[0, 1, 2, 3], name="ct129")
    assert plan([ct("ct129", 129, [0, 1, 2, 3], 100)], [running])["fits"]


def test_config_gpus_reads_nvidia_devn_entries_only():
    config = {"dev0": "/dev/nvidia3,mode=0666", "dev1": "path=/dev/nvidia10", "dev2": "/dev/nvidiactl",
              "dev3": "/dev/nvidia-uvm", "dev4": "/dev/dri/card0", "memory": "1024", "net0": "name=eth0"}
    assert pve_gpu_devices.config_gpus(config) == [3, 10]


# ---------------------------------------------------------------- plan.yml -e plan_node: the node's plan offline


def test_the_node_planned_offline_needs_its_ram_and_names_what_it_did_not_read():
    containers = [ct("ct129", 129, [0, 1, 2, 3], 200), ct("ct131", 131, [4, 5, 6, 7], 200)]
    requests = {c["host"]: request() for c in containers}
    with pytest.raises(rq.DeployError, match="plan_node=pve1 needs the node's RAM"):
        npl.calculate_node({}, requests, containers, "pve1", 4 * GIB)
    with pytest.raises(rq.DeployError, match="may give only the node's facts"):
        npl.calculate_node({"mem_total_bytes": 449 * GIB, "tp_size": 8}, requests, containers, "pve1", 4 * GIB)
    result = npl.calculate_node({"mem_total_bytes": 449 * GIB, "mem_available_bytes": 445 * GIB, "gpu_memory_mib": 97887},
                                requests, containers, "pve1", 4 * GIB)
    # The same plan as deploy's node stage makes with the same facts and no other guest.
    online = plan(containers)
    assert result["node_plan"]["containers"] == online["containers"]
    assert "The node's other guests are not read here" in result["notes"][0]


def test_the_node_planned_offline_refuses_a_release_whose_start_up_check_needs_the_gpu_memory():
    containers = [ct("ct129", 129, [0, 1, 2, 3], 200)]
    requests = {"ct129": rq.request(dict(SETTINGS, plan_extra={}))}
    with pytest.raises(rq.DeployError, match="checks at start-up that the host pool holds more tokens"):
        npl.calculate_node({"mem_total_bytes": 449 * GIB}, requests, containers, "pve1", 4 * GIB)


def test_a_node_without_containers_is_refused():
    with pytest.raises(rq.DeployError, match="the inventory places no container host on it"):
        npl.calculate_node({"mem_total_bytes": 449 * GIB}, {}, [], "pve1", 4 * GIB)


def test_config_gpus_reads_raw_lxc_mount_entries_as_the_api_returns_them():
    # The pre-devN way: lxc.cgroup2.devices.allow + lxc.mount.entry (GET .../config returns raw lines as lxc pairs).
    config = {"memory": "4096", "lxc": [["lxc.cgroup2.devices.allow", "c 195:* rwm"],
                                        ["lxc.mount.entry", "/dev/nvidia2 dev/nvidia2 none bind,optional,create=file"],
                                        ["lxc.mount.entry", "/dev/nvidiactl dev/nvidiactl none bind,optional,create=file"]]}
    assert pve_gpu_devices.config_gpus(config) == [2]


def test_a_gpu_held_by_a_raw_mount_entry_is_refused_too():
    other = guest(150, status="stopped", maxmem_gib=8, name="legacy",
                  gpus=pve_gpu_devices.config_gpus({"lxc": [["lxc.mount.entry", "/dev/nvidia2 dev/nvidia2 none bind"]]}))
    with pytest.raises(rq.DeployError, match="asks for GPU 2, which CT 150 legacy"):
        plan([ct("ct129", 129, [0, 1, 2, 3], 100)], [other])


def test_each_containers_own_spec_is_checked_before_ownership():
    # A GPU listed twice, a VMID below 100: the container's own error, not an ownership conflict with itself.
    with pytest.raises(rq.DeployError, match="CT 129: pve_gpu_container_gpus lists a GPU twice"):
        plan([ct("ct129", 129, [0, 0], 100)])
    with pytest.raises(rq.DeployError, match="must be between 100"):
        plan([ct("ct129", 99, [0, 1, 2, 3], 100)], [guest(129, status="running", gpus=[0, 1])])
    with pytest.raises(rq.DeployError, match="VMID 129 is declared by more than one inventory host"):
        plan([ct("ct129", 129, [0, 1, 2, 3], 100), ct("ct129b", 129, [4, 5, 6, 7], 100)])


def test_a_running_container_of_ours_not_in_this_run_counts_by_its_use_so_one_relaunch_plans_as_all():
    # deploy_containers=ct129 (recover's relaunch): CT 131 is ours (owner tag), running, outside this run.
    containers = [ct("ct129", 129, [0, 1, 2, 3], 200), ct("ct131", 131, [4, 5, 6, 7], 200)]
    both = plan(containers)
    used = both["containers"][1]["committed_bytes"]
    ours = dict(guest(131, status="running", maxmem_gib=400, gpus=[4, 5, 6, 7], name="ct131"), mem_bytes=used, tags=["inferops-gpu"])
    node = dict(NODE, containers_memory={"131": {"memory_held_bytes": used}})
    one = npl.plan_node({"ct129": request()}, containers[:1], node, [ours], 4 * GIB, "limit", "pve1", "inferops-gpu")
    assert one["others"][0]["counted_bytes"] == one["others"][0]["held_bytes"] == used and one["notes"] == []
    assert one["others"][0]["basis"] == "ours, not in this run: its use now"
    # Without the tag (another tool's container) the same guest counts by its 400 GiB limit and overflows the node.
    with pytest.raises(rq.DeployError, match="not managed, its limit"):
        npl.plan_node({"ct129": request()}, containers[:1], node, [dict(ours, tags=[])], 4 * GIB, "limit", "pve1", "inferops-gpu")


def test_a_gpu_the_node_lacks_is_named_before_two_containers_asking_for_it():
    # -e pve_gpu_container_gpus=[0,9] reaches every container of the run: the node's lack of GPU 9 is the cause.
    with pytest.raises(rq.DeployError, match="CT 129 asks for GPUs 0,9 but the node has 8 GPU"):
        plan([ct("ct129", 129, [0, 9], 100), ct("ct132", 132, [0, 9], 100)])


# ---------------------------------------------------------------- running containers count what they hold


def running_node(held_extra_bytes, **settings):
    """Two 200 GiB containers deployed and running: each holds its pools plus ``held_extra_bytes`` of process memory
    (less than the overhead budget, as a real server's ranks often do), read from its cgroup; the PVE API's mem
    leaves the shared-memory pools out."""
    containers = [ct("ct129", 129, [0, 1, 2, 3], 200), ct("ct130", 130, [4, 5, 6, 7], 200)]
    first = plan(containers, requests={c["host"]: request(**settings) for c in containers})
    pools = {r["vmid"]: r["pinned_bytes"] for r in first["containers"]}
    held = {v: pools[v] + held_extra_bytes for v in pools}
    node = dict(NODE, mem_available_bytes=NODE["mem_available_bytes"] - sum(held.values()),
                containers_memory={str(v): {"memory_held_bytes": held[v]} for v in held})
    guests = [dict(guest(v, status="running", maxmem_gib=200), mem_bytes=held_extra_bytes, tags=["inferops-gpu"]) for v in held]
    return containers, first, node, guests, held


def test_a_rerun_of_one_container_or_of_all_plans_the_same_and_counts_what_they_hold():
    containers, first, node, guests, held = running_node(2 * GIB)

    def run(cts):
        return npl.plan_node({c["host"]: request() for c in cts}, cts, node, guests, 4 * GIB, "limit", "pve1", "inferops-gpu")
    both, one, other = run(containers), run(containers[:1]), run(containers[1:])
    sizes = {r["host"]: r["per_rank_gb"] for r in both["containers"]}
    assert sizes == {r["host"]: r["per_rank_gb"] for r in first["containers"]}
    assert sizes["ct129"] == one["containers"][0]["per_rank_gb"] and sizes["ct130"] == other["containers"][0]["per_rank_gb"]
    # In the run or not, a running container counts what its cgroup holds (pools included), not PVE's mem.
    assert [r["committed_bytes"] for r in both["containers"]] == [held[129], held[130]]
    assert both["committed_bytes"] == one["committed_bytes"] == other["committed_bytes"] == sum(held.values()) + 4 * GIB
    assert [o["counted_bytes"] for o in one["others"]] == [held[130]]
    assert "running: what it holds now" in both["table"][1]


def test_a_running_container_that_will_pin_more_commits_its_new_ceiling():
    containers, first, node, guests, held = running_node(0, requested_gb=30)
    requests = {"ct129": request(requested_gb=31), "ct130": request(requested_gb=30)}
    got = npl.plan_node(requests, containers, node, guests, 4 * GIB, "limit", "pve1", "inferops-gpu")
    row = got["containers"][0]
    assert row["pinned_bytes"] > held[129] and row["committed_bytes"] == row["ceiling_bytes"] and not row["counted_in_use"]
    # ... and the one that stays as it runs counts what it holds
    assert got["containers"][1]["counted_in_use"] and got["containers"][1]["committed_bytes"] == held[130]


def test_held_memory_is_the_cgroup_reading_for_containers_and_pve_mem_for_vms():
    measured = {"129": {"memory_held_bytes": 5 * GIB}, "200": {"memory_held_bytes": 9 * GIB}}
    assert npl.held_bytes(guest(129, status="running", mem_gib=1), measured) == 5 * GIB
    assert npl.held_bytes(guest(129, status="stopped", mem_gib=1), measured) == 0
    assert npl.held_bytes(guest(131, status="running", mem_gib=1), measured) == GIB  # not read on the node
    assert npl.held_bytes(guest(200, status="running", mem_gib=3, kind="qemu"), measured) == 3 * GIB


def test_a_running_container_whose_cgroup_was_not_read_is_counted_conservatively_and_said():
    # The PVE API's mem leaves SGLang's shared-memory pools out: without the cgroup reading, an "ours" guest counts
    # its limit, a container of the run commits its ceiling (not "what it holds now"), and each is named in a note.
    containers, first, node, guests, held = running_node(2 * GIB)
    node = dict(node, containers_memory={"129": node["containers_memory"]["129"]})  # CT 130 not read
    one = npl.plan_node({"ct129": request()}, containers[:1], node, guests, 4 * GIB, "limit", "pve1", "inferops-gpu")
    other = one["others"][0]
    assert other["counted_bytes"] == 200 * GIB and other["basis"] == "ours, not in this run: its limit (cgroup not read)"
    assert len(one["notes"]) == 1 and one["notes"][0].startswith("CT 130 (running): its memory cgroup was not read")
    assert "counted its memory limit, 200.0 GiB" in one["notes"][0]
    both = npl.plan_node({c["host"]: request() for c in containers}, containers, node, guests, 4 * GIB, "limit", "pve1",
                         "inferops-gpu")
    rows = {r["vmid"]: r for r in both["containers"]}
    assert rows[129]["counted_in_use"] and not rows[130]["counted_in_use"]
    assert rows[130]["committed_bytes"] == rows[130]["ceiling_bytes"]
    assert [n.split(":")[0] for n in both["notes"]] == ["CT 130 (running)"]
    # A stopped guest or a VM is never "unread".
    assert not npl.cgroup_unread(guest(131, status="stopped"), {}) and not npl.cgroup_unread(guest(200, status="running", kind="qemu"), {})


@pytest.mark.parametrize("requested", [300, "300", 0])
def test_the_node_planned_offline_refuses_a_requested_size_instead_of_dropping_it(requested):
    # The incident's mistake through the node mode: -e plan_node=pve1 -e plan_requested_gb=300 planned each container
    # with its own inventory size, said "fits" and dropped the 300 without a word.
    containers = [ct("ct129", 129, [0, 1, 2, 3], 200), ct("ct131", 131, [4, 5, 6, 7], 200)]
    requests = {c["host"]: request() for c in containers}
    facts = {"mem_total_bytes": 449 * GIB, "gpu_memory_mib": 97887}
    with pytest.raises(rq.DeployError, match=r"plan_requested_gb='?%s'? is one container's per-rank size.*ct129, ct131.*"
                       r"-e plan_host=ct129 -e plan_requested_gb='?%s" % (requested, requested)):
        npl.calculate_node(facts, requests, containers, "pve1", 4 * GIB, requested)
    for blank in (None, "", " "):
        assert npl.calculate_node(facts, requests, containers, "pve1", 4 * GIB, blank)["node_plan"]["containers"]
