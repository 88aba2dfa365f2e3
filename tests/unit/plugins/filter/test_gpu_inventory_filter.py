# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.inferops.gpu_inference.plugins.filter.gpu_inventory import FilterModule, gpu_inventory

GROUPS = {"all": ["pve1", "ct129"], "proxmox_nodes": ["pve1"], "sglang_containers": ["ct129"]}


def test_registered():
    assert FilterModule().filters()["gpu_inventory"] is gpu_inventory


def test_the_containers_by_host_and_by_node():
    out = gpu_inventory({"pve1": {}, "ct129": {"proxmox_vmid": "129"}}, GROUPS)
    assert out["by_host"]["ct129"]["vmid"] == 129 and out["containers"] == [out["by_host"]["ct129"]]
    assert out["nodes"] == {"pve1": {"name": "pve1", "containers": ["ct129"]}}


def test_a_bad_inventory_is_a_filter_error_naming_the_host():
    with pytest.raises(AnsibleFilterError, match="ct129: its VMID \\(proxmox_vmid\\) must be between 100"):
        gpu_inventory({"ct129": {"proxmox_vmid": 12}}, GROUPS)


def test_not_hostvars():
    with pytest.raises(AnsibleFilterError, match="the input must be hostvars, got list"):
        gpu_inventory([], GROUPS)


def test_the_run_s_containers():
    groups = dict(GROUPS, all=["pve1", "ct129", "ct140"])
    hostvars = {"pve1": {}, "ct129": {"proxmox_vmid": "x"}, "ct140": {"proxmox_vmid": 140}}
    out = gpu_inventory(hostvars, groups, containers=(h for h in ["ct140"]))  # any iterable, as Ansible gives lists
    assert [c["host"] for c in out["containers"]] == ["ct140"] and out["by_host"]["ct140"]["node_host"] == "pve1"
    with pytest.raises(AnsibleFilterError, match="ct129: its VMID"):
        gpu_inventory(hostvars, groups)
    with pytest.raises(AnsibleFilterError, match="the run's containers must be a list"):
        gpu_inventory(hostvars, groups, containers="ct140")
