# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""gpu_inventory: the inventory's GPU containers, built and checked once."""
from __future__ import annotations

import pytest

from ansible_collections.inferops.gpu_inference.plugins.module_utils.common import gpu_inventory as gi

GROUPS = {
    "all": ["pve1", "pve2.example.org", "ct129", "ct132", "ct201", "ct202"],
    "proxmox_nodes": ["pve1", "pve2.example.org"],
    "sglang_containers": ["ct129", "ct132", "ct201", "ct202"],
    "kimi": ["ct201", "ct202"],
}
HOSTVARS = {
    "pve1": {"proxmox_node": "pve-one"},
    "pve2.example.org": {},
    "ct129": {"proxmox_vmid": 129},
    "ct132": {"proxmox_vmid": "", "pve_gpu_container_vmid": "132", "pve_gpu_container_adopt": "yes",
              "gpu_recover_eda_relaunch": True},
    "ct201": {"proxmox_vmid": 201, "sglang_server_cluster_group": "kimi"},
    "ct202": {"proxmox_vmid": 202, "pve_gpu_container_node_host": "pve2.example.org", "sglang_server_cluster_group": "kimi"},
}


def build(**hv):
    hostvars = {h: dict(v) for h, v in HOSTVARS.items()}
    for host, values in hv.items():
        hostvars.setdefault(host, {}).update(values)
    return gi.gpu_inventory(GROUPS, hostvars)


def test_each_container_once_with_its_vmid_node_server_and_flags():
    inv = build()
    assert [(c.host, c.vmid, c.node_host, c.node) for c in inv.containers] == [
        ("ct129", 129, "pve1", "pve-one"), ("ct132", 132, "pve1", "pve-one"), ("ct201", 201, "pve1", "pve-one"),
        ("ct202", 202, "pve2.example.org", "pve2")]
    ct201, ct202 = inv.host("ct201"), inv.host("ct202")
    assert (ct201.cluster_group, ct201.cluster, ct201.node_rank, ct201.nnodes) == ("kimi", ("ct201", "ct202"), 0, 2)
    assert (ct202.node_rank, inv.host("ct129").cluster, inv.host("ct129").nnodes) == (1, (), 1)
    assert (inv.host("ct132").adopt, inv.host("ct132").eda_relaunch, inv.host("ct129").adopt) == (True, True, False)
    assert [c.host for c in inv.on_node("pve2.example.org")] == ["ct202"]
    assert inv.nodes == {"pve1": "pve-one", "pve2.example.org": "pve2"}


def test_as_dict_is_what_the_filter_returns():
    d = build().as_dict()
    assert d["by_host"]["ct202"] == {"host": "ct202", "vmid": 202, "node_host": "pve2.example.org", "node": "pve2",
                                     "cluster_group": "kimi", "cluster": ["ct201", "ct202"], "node_rank": 1,
                                     "nnodes": 2, "adopt": False, "eda_relaunch": False}
    assert d["nodes"]["pve1"] == {"name": "pve-one", "containers": ["ct129", "ct132", "ct201"]}
    assert [c["host"] for c in d["containers"]] == ["ct129", "ct132", "ct201", "ct202"]


def test_the_node_name_rule_is_the_role_default():
    assert gi.node_name("pve3.lan", {}) == "pve3"
    assert gi.node_name("pve3.lan", {"proxmox_node": "p3"}) == "p3"
    assert gi.node_name("pve3.lan", {"proxmox_node": "p3", "pve_gpu_container_pve_node": "n3"}) == "n3"
    assert gi.node_name("pve3.lan", {"proxmox_node": "", "pve_gpu_container_pve_node": None}) == "pve3"


def test_blank_is_not_given():
    assert build(ct129={"pve_gpu_container_vmid": "", "pve_gpu_container_node_host": None}).host("ct129").vmid == 129


@pytest.mark.parametrize("value, says", [
    (99, "ct129: its VMID (proxmox_vmid) must be between 100 and 999999999 (a Proxmox VE guest ID), got 99: set proxmox_vmid"),
    ("ct129", "ct129: its VMID (proxmox_vmid) must be an integer between 100 and 999999999, got 'ct129'"),
    (True, "must be an integer"),
    (1000000000, "got 1000000000"),
    (12.5, "must be an integer"),
])
def test_a_bad_vmid_names_the_host_and_the_variable(value, says):
    with pytest.raises(gi.InventoryError) as err:
        build(ct129={"proxmox_vmid": value})
    assert says in str(err.value) and str(err.value).endswith("Nothing has been changed.")


def test_two_vmids_that_differ_are_refused():
    # pct_remote enters proxmox_vmid's container; the role would configure pve_gpu_container_vmid's.
    with pytest.raises(gi.InventoryError) as err:
        build(ct129={"pve_gpu_container_vmid": 131})
    assert ("ct129: pve_gpu_container_vmid is 131 but proxmox_vmid is 129: the node would configure CT 131 while the "
            "connection (pct_remote) enters CT 129") in str(err.value)
    assert build(ct129={"pve_gpu_container_vmid": "129"}).host("ct129").vmid == 129


def test_every_problem_at_once():
    with pytest.raises(gi.InventoryError) as err:
        build(ct129={"proxmox_vmid": None}, ct132={"pve_gpu_container_vmid": 201, "pve_gpu_container_adopt": "maybe"},
              ct202={"pve_gpu_container_node_host": "pve9"})
    msg = str(err.value)
    assert "ct129: no VMID: set proxmox_vmid (or pve_gpu_container_vmid)" in msg
    assert "ct132, ct201: VMID 201 is declared by each of them" in msg
    assert "ct132: pve_gpu_container_adopt must be true or false, got 'maybe'" in msg
    assert "ct202: pve_gpu_container_node_host 'pve9' is not a host of the inventory" in msg


def test_no_node():
    with pytest.raises(gi.InventoryError, match="ct1: no node: set pve_gpu_container_node_host"):
        gi.gpu_inventory({"all": ["ct1"], "sglang_containers": ["ct1"]}, {"ct1": {"proxmox_vmid": 101}})


def test_the_server_s_group_is_checked():
    with pytest.raises(gi.InventoryError, match="ct201: sglang_server_cluster_group 'kimmi' is not a group"):
        build(ct201={"sglang_server_cluster_group": "kimmi"})
    with pytest.raises(gi.InventoryError, match=r"ct129: it is not in its sglang_server_cluster_group kimi \(ct201, ct202\)"):
        build(ct129={"sglang_server_cluster_group": "kimi"})
    groups = dict(GROUPS, kimi=["ct201", "pve1", "ct202"])
    with pytest.raises(gi.InventoryError) as err:
        gi.gpu_inventory(groups, HOSTVARS)
    assert str(err.value).count("member(s) pve1 that are not GPU containers") == 1


def test_no_containers_is_an_empty_inventory():
    assert gi.gpu_inventory({"all": ["pve1"], "proxmox_nodes": ["pve1"]}, {}).containers == ()
    with pytest.raises(gi.InventoryError, match="ct7 is not a host of the group sglang_containers"):
        build().host("ct7")


def test_vmid_helper():
    assert gi.vmid("129") == 129 and gi.vmid(100) == 100
    assert gi.vmid_problem(999999999) is None and gi.vmid_problem(" 130 ") is None
    with pytest.raises(gi.InventoryError, match="recover_vmid must be between 100"):
        gi.vmid(42, "recover_vmid")


def test_groups_from_ansible_inventory_list():
    listed = {
        "_meta": {"hostvars": {"ct129": {"proxmox_vmid": 129}, "ct140": {"proxmox_vmid": 140}}},
        "all": {"children": ["ungrouped", "proxmox_nodes", "sglang_containers"]},
        "proxmox_nodes": {"hosts": ["pve1"]},
        "sglang_containers": {"hosts": ["ct129"], "children": ["more"]},
        "more": {"hosts": ["ct140"]},
    }
    groups, hostvars = gi.groups_from_list(listed)
    assert groups["sglang_containers"] == ["ct129", "ct140"] and set(groups["all"]) == {"pve1", "ct129", "ct140"}
    assert [(c.host, c.vmid, c.node_host) for c in gi.gpu_inventory(groups, hostvars).containers] == [
        ("ct129", 129, "pve1"), ("ct140", 140, "pve1")]


def test_a_run_reads_its_own_containers_and_checks_only_those():
    # ct129's VMID is broken, but the run is ct202 alone (deploy_containers=ct202): ct202 is read and checked, and its
    # server's other member ct201 is a container of the group, outside the run
    hostvars = dict(HOSTVARS, ct129={"proxmox_vmid": "x"})
    inv = gi.gpu_inventory(GROUPS, hostvars, containers=["ct202"])
    assert [(c.host, c.vmid, c.node_host, c.node, c.cluster, c.node_rank) for c in inv.containers] == [
        ("ct202", 202, "pve2.example.org", "pve2", ("ct201", "ct202"), 1)]
    with pytest.raises(gi.InventoryError, match="ct129: its VMID .proxmox_vmid. must be an integer"):
        gi.gpu_inventory(GROUPS, hostvars, containers=["ct202", "ct129"])


def test_a_run_may_name_containers_outside_the_group():
    groups = dict(GROUPS, all=GROUPS["all"] + ["gpu7", "gpu8"], mine=["gpu7", "gpu8"])
    hostvars = dict(HOSTVARS, gpu7={"proxmox_vmid": 307, "sglang_server_cluster_group": "mine"},
                    gpu8={"pve_gpu_container_vmid": 308, "sglang_server_cluster_group": "mine",
                          "pve_gpu_container_node_host": "pve2.example.org"})
    inv = gi.gpu_inventory(groups, hostvars, containers=["gpu7", "gpu8", "gpu7"])
    assert [(c.host, c.vmid, c.node_host, c.node_rank, c.nnodes) for c in inv.containers] == [
        ("gpu7", 307, "pve1", 0, 2), ("gpu8", 308, "pve2.example.org", 1, 2)]
    assert inv.as_dict()["nodes"]["pve1"] == {"name": "pve-one", "containers": ["gpu7"]}
    # a member that is neither in the group nor in the run is not a GPU container
    with pytest.raises(gi.InventoryError, match="gpu7: the server mine has member.s. gpu8 that are not GPU containers"):
        gi.gpu_inventory(groups, hostvars, containers=["gpu7"])


def test_every_problem_of_the_run_at_once_each_with_its_host():
    hostvars = dict(HOSTVARS, ct129={"proxmox_vmid": 99}, ct132={"proxmox_vmid": 99, "pve_gpu_container_vmid": None})
    with pytest.raises(gi.InventoryError) as err:
        gi.gpu_inventory(GROUPS, hostvars, containers=["ct129", "ct132", "pve1"])
    msg = str(err.value)
    assert msg.count("its VMID (proxmox_vmid) must be between 100") == 2 and "ct129: " in msg and "ct132: " in msg
    assert "pve1: no VMID: set proxmox_vmid" in msg and msg.endswith("Nothing has been changed.")


@pytest.mark.parametrize("containers", ["ct129", {"ct129": 1}, 7])
def test_the_run_s_containers_must_be_a_list(containers):
    with pytest.raises(gi.InventoryError, match="the run's containers must be a list of inventory hosts"):
        gi.gpu_inventory(GROUPS, HOSTVARS, containers=containers)


class _Reads(dict):
    """A host's variables that record every name read."""

    def __init__(self, values, log):
        super().__init__(values)
        self.log = log

    def get(self, key, default=None):
        self.log.add(key)
        return super().get(key, default)

    def __getitem__(self, key):
        self.log.add(key)
        return super().__getitem__(key)


def test_the_model_reads_exactly_the_names_it_declares():
    # every name read is declared (the allow-list and the inventory check take them from INVENTORY_NAMES) ...
    log: set = set()
    everything = {n: None for n in gi.INVENTORY_NAMES}
    hostvars = {h: _Reads(dict(everything, **v), log) for h, v in HOSTVARS.items()}
    gi.gpu_inventory(GROUPS, hostvars)
    assert log == set(gi.INVENTORY_NAMES)
    # ... and each declared name changes what the model gives
    base = build().as_dict()
    changed = {
        "pve_gpu_container_vmid": {"ct132": {"pve_gpu_container_vmid": 139}},
        "proxmox_vmid": {"ct129": {"proxmox_vmid": 139}},
        "pve_gpu_container_node_host": {"ct129": {"pve_gpu_container_node_host": "pve2.example.org"}},
        "pve_gpu_container_pve_node": {"pve1": {"pve_gpu_container_pve_node": "other"}},
        "proxmox_node": {"pve2.example.org": {"proxmox_node": "other"}},
        "sglang_server_cluster_group": {"ct201": {"sglang_server_cluster_group": None},
                                        "ct202": {"sglang_server_cluster_group": None}},
        "pve_gpu_container_adopt": {"ct129": {"pve_gpu_container_adopt": True}},
        "gpu_recover_eda_relaunch": {"ct129": {"gpu_recover_eda_relaunch": True}},
    }
    assert set(changed) == set(gi.INVENTORY_NAMES)
    for name, hv in changed.items():
        assert build(**hv).as_dict() != base, name
