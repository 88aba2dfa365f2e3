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
    "ct132": {"proxmox_vmid": "999", "pve_gpu_container_vmid": "132", "pve_gpu_container_adopt": "yes",
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
