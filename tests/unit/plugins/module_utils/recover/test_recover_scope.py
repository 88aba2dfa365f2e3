# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

import pytest

from ansible_collections.inferops.gpu_inference.plugins.module_utils.common import gpu_inventory as gi
from ansible_collections.inferops.gpu_inference.plugins.module_utils.recover import recover_scope as rs

DECLARED = [
    {"host": "ct129", "vmid": 129, "node_host": "pve1"},
    {"host": "ct131", "vmid": "131", "node_host": "pve2"},
    {"host": "broken", "vmid": None, "node_host": "pve1"},
]


def test_declared_on_node_only_this_node():
    assert rs.declared_on_node(DECLARED, "pve1") == {129: "ct129"}
    assert rs.declared_on_node(DECLARED, "pve2") == {131: "ct131"}
    assert rs.declared_on_node([], "pve1") == {}


def test_declared_target_is_taken():
    assert rs.check_target(129, "pve1", DECLARED, False) == {"vmid": 129, "declared_as": "ct129", "override": False,
                                                             "adopt": False}


@pytest.mark.parametrize("vmid,node", [(130, "pve1"), (131, "pve1"), (129, "pve2")])
def test_undeclared_target_is_refused_with_the_override_named(vmid, node):
    with pytest.raises(rs.ScopeError) as exc:
        rs.check_target(vmid, node, DECLARED, False)
    msg = str(exc.value)
    assert "CT %d is not a GPU container the inventory declares on %s" % (vmid, node) in msg
    assert "recover_allow_undeclared=true" in msg and "Nothing has been changed" in msg


def test_override_names_an_undeclared_target():
    assert rs.check_target(130, "pve1", DECLARED, True) == {"vmid": 130, "declared_as": None, "override": True, "adopt": False}


def test_gpus_come_from_pct_config_now():
    assert rs.container_gpus(129, 0, [1, 0, 1], "", [0, 1], "/b/129.json") == {"gpus": [0, 1], "from": "pct config devN"}
    # No baseline (or one without GPUs): pct config alone.
    assert rs.container_gpus(129, 0, [3], "", None, "/b/129.json")["gpus"] == [3]
    assert rs.container_gpus(129, 0, [], "", [], "/b/129.json")["gpus"] == []


def test_stale_baseline_is_refused_with_how_to_rerecord():
    with pytest.raises(rs.ScopeError) as exc:
        rs.container_gpus(129, 0, list(range(8)), "", [0, 1], "/var/lib/inferops/baseline/129.json")
    msg = str(exc.value)
    assert "stale" in msg and "[0, 1]" in msg and "[0, 1, 2, 3, 4, 5, 6, 7]" in msg
    assert "playbooks/deploy.yml" in msg and "-e recover_record_baseline=true" in msg


def test_failed_pct_config_is_refused_not_an_empty_gpu_list():
    with pytest.raises(rs.ScopeError) as exc:
        rs.container_gpus(129, 2, [], "CT is locked (backup)\n", [0, 1], "/b/129.json")
    assert "pct config 129 failed (CT is locked (backup))" in str(exc.value)
    assert "unknown is not clean" in str(exc.value)


def test_reset_conflicts_refuse_a_group_with_another_containers_gpu():
    # An NVSwitch node: GPU 0's group is all eight; CT 130 has GPU 2.
    groups = [[0, 1, 2, 3, 4, 5, 6, 7]]
    conflicts = rs.reset_conflicts(groups, 129, {130: [2], 129: [0, 1]})
    assert conflicts == [{"gpus": groups[0], "containers": {130: [2]}}]
    assert "CT 130 (GPU 2)" in rs.describe_conflict(conflicts[0])
    # PCIe node: groups of one; CT 130's GPU is not among them.
    assert rs.reset_conflicts([[0], [1]], 129, {130: [2]}) == []
    # The target's own devN never conflicts with itself.
    assert rs.reset_conflicts([[0]], 129, {129: [0]}) == []


# recover_targets: a container of a multi-node server brings the whole server (docs/recover.md, "A server on several nodes")
# Its input is the inventory model's containers (module_utils/common/gpu_inventory.py), built here from an inventory.
KIMI = ["ct201", "ct202"]
GROUPS = {"all": ["pve1", "pve2", "pve3", "ct129", "ct201", "ct202"], "proxmox_nodes": ["pve1", "pve2", "pve3"],
          "sglang_containers": ["ct129", "ct201", "ct202"], "kimi_tp16": KIMI}
HOSTVARS = {"ct129": {"proxmox_vmid": 129},
            "ct201": {"proxmox_vmid": "201", "pve_gpu_container_node_host": "pve2", "sglang_server_cluster_group": "kimi_tp16"},
            "ct202": {"proxmox_vmid": 202, "pve_gpu_container_node_host": "pve3", "sglang_server_cluster_group": "kimi_tp16"}}
INVENTORY = gi.gpu_inventory(GROUPS, HOSTVARS).as_dict()["containers"]


def test_a_single_container_is_its_own_target():
    assert rs.recover_targets(INVENTORY, "129") == {
        "group": None, "targets": [{"host": "ct129", "vmid": 129, "node_host": "pve1", "node_rank": 0}],
        "vmid_by_node": {"pve1": 129}, "vmid_problem": None}


@pytest.mark.parametrize("vmid", [201, 202])
def test_either_half_of_a_server_brings_every_container_in_node_rank_order(vmid):
    assert rs.recover_targets(INVENTORY, vmid) == {"group": "kimi_tp16", "targets": [
        {"host": "ct201", "vmid": 201, "node_host": "pve2", "node_rank": 0},
        {"host": "ct202", "vmid": 202, "node_host": "pve3", "node_rank": 1}],
        "vmid_by_node": {"pve2": 201, "pve3": 202}, "vmid_problem": None}


def test_a_group_of_one_is_a_single_container():
    one = [dict(INVENTORY[1], cluster=["ct201"])]
    assert rs.recover_targets(one, 201)["group"] is None


def test_an_undeclared_vmid_has_no_target():
    assert rs.recover_targets(INVENTORY, 130) == {"group": None, "targets": [], "vmid_by_node": {}, "vmid_problem": None}


@pytest.mark.parametrize("vmid, says", [("", "must be an integer"), ("abc", "must be an integer"),
                                        (99, "must be between 100 and 999999999"), (None, "is required"),
                                        ("12x", "must be an integer")])
def test_a_bad_vmid_has_no_target_and_says_why(vmid, says):
    out = rs.recover_targets(INVENTORY, vmid)
    assert out["targets"] == [] and out["vmid_problem"].startswith("recover_vmid ") and says in out["vmid_problem"]


def test_an_inventory_the_model_refuses_never_reaches_recover_targets():
    # A VMID declared twice, a server member that is not a GPU container: refused once, by the inventory model.
    with pytest.raises(gi.InventoryError, match=r"ct201, ct201b: VMID 201 is declared by each of them"):
        gi.gpu_inventory(dict(GROUPS, sglang_containers=GROUPS["sglang_containers"] + ["ct201b"],
                              all=GROUPS["all"] + ["ct201b"]), dict(HOSTVARS, ct201b={"proxmox_vmid": 201}))
    with pytest.raises(gi.InventoryError, match=r"the server kimi_tp16 has member\(s\) ct203 that are not GPU containers"):
        gi.gpu_inventory(dict(GROUPS, kimi_tp16=KIMI + ["ct203"]), HOSTVARS)


def test_relaunch_only_when_every_node_is_clean():
    plan = rs.recover_targets(INVENTORY, 201)
    clean = {"pve2": "Clean", "pve3": "Clean"}
    assert rs.relaunch_hosts(plan, clean, relaunch=True, one_node=False, check_mode=False) == ["ct201", "ct202"]
    # one node not clean, or without a verdict (failed, unreachable): nothing comes back, a half server is not a server
    assert rs.relaunch_hosts(plan, dict(clean, pve3="Not clean"), True, False, False) == []
    assert rs.relaunch_hosts(plan, dict(clean, pve3=None), True, False, False) == []
    assert rs.relaunch_hosts(plan, {}, True, False, False) == []
    # not asked, or a check run: nothing
    assert rs.relaunch_hosts(plan, clean, False, False, False) == [] and rs.relaunch_hosts(plan, clean, True, False, True) == []
    # recover_node named: that node's container only
    one = rs.recover_targets(INVENTORY, 129)
    assert rs.relaunch_hosts(one, {"pve1": "Clean"}, True, True, False) == ["ct129"]


def test_two_members_on_one_node_are_refused_with_what_to_do():
    same = [INVENTORY[1], dict(INVENTORY[2], node_host="pve2")]
    with pytest.raises(rs.ScopeError) as exc:
        rs.recover_targets(same, 202)
    assert "two containers on node pve2 (ct201 and ct202)" in str(exc.value)
    assert "-e recover_node=pve2" in str(exc.value)


def test_a_container_without_the_owner_tag_is_refused_unless_adopted():
    assert rs.check_owner(129, "pve1", ["inferops-gpu", "x"], "inferops-gpu", False)["tagged"] is True
    assert rs.check_owner(129, "pve1", [], "inferops-gpu", True) == {
        "tag": "inferops-gpu", "tagged": False, "adopted": True}
    with pytest.raises(rs.ScopeError, match=r"does not carry the PVE tag 'inferops-gpu' .*\(its tags: web\)"):
        rs.check_owner(129, "pve1", ["web"], "inferops-gpu", False)


def test_adopt_comes_from_the_declaring_host_only():
    declared = [{"host": "ct129", "vmid": 129, "node_host": "pve1", "adopt": True},
                {"host": "ct130", "vmid": 130, "node_host": "pve1"}]
    assert rs.check_target(129, "pve1", declared, False)["adopt"] is True
    assert rs.check_target(130, "pve1", declared, False)["adopt"] is False
    assert rs.check_target(131, "pve1", declared, True)["adopt"] is False
