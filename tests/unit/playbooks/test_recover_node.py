# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""recover.yml given only -e recover_vmid finds the node from the inventory (the container host's
pve_gpu_container_node_host, else the first proxmox_nodes host), as deploy.yml places the container.

The VMIDs used exist nowhere (on a machine with the lab too), so the run stops at the role's first check, whose
message names the node it ran on; only `pct status` is read.
"""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
INVENTORY = """
all:
  children:
    proxmox_nodes:
      hosts:
        pve1: {ansible_connection: local, ansible_python_interpreter: %(py)s}
        pve2: {ansible_connection: local, ansible_python_interpreter: %(py)s}
    sglang_containers:
      hosts:
        ct941: {proxmox_vmid: 941, pve_gpu_container_node_host: pve2}
        ct940: {proxmox_vmid: 940}
      children:
        # one server over two containers on two nodes (node ranks by position: ct951 = 0, ct952 = 1)
        tp_group:
          hosts:
            ct951: {proxmox_vmid: 951, sglang_server_cluster_group: tp_group}
            ct952: {proxmox_vmid: 952, pve_gpu_container_node_host: pve2, sglang_server_cluster_group: tp_group}
"""


def recover(tmp_path, *args):
    return recover_with(tmp_path, INVENTORY, *args)


def recover_with(tmp_path, inventory, *args):
    inv = tmp_path / "hosts.yml"
    inv.write_text(inventory % {"py": sys.executable})
    env = dict(os.environ, ANSIBLE_NOCOLOR="1", ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"),
               INFEROPS_REPORT_DIR=str(tmp_path / "reports"))
    playbook = os.path.join(os.path.dirname(sys.executable), "ansible-playbook")
    r = subprocess.run([playbook, "-i", str(inv), os.path.join(ROOT, "playbooks", "recover.yml")] + list(args),
                       capture_output=True, text=True, env=env, cwd=ROOT, timeout=300, check=False)
    return r.returncode, " ".join((r.stdout + r.stderr).split())


@pytest.mark.parametrize("vmid, node", [("941", "pve2"), ("940", "pve1")])
def test_the_node_comes_from_the_inventory(tmp_path, vmid, node):
    rc, out = recover(tmp_path, "-e", "recover_vmid=%s" % vmid)
    assert rc != 0 and "CT %s is not a container of %s" % (vmid, node) in out, out[-2000:]
    assert "changed=0" in out


def test_recover_node_still_wins(tmp_path):
    rc, out = recover(tmp_path, "-e", "recover_vmid=941", "-e", "recover_node=pve1")
    assert rc != 0 and "CT 941 is not a container of pve1" in out, out[-2000:]


def test_a_vmid_the_inventory_does_not_place_needs_the_node_named(tmp_path):
    rc, out = recover(tmp_path, "-e", "recover_vmid=942")
    assert rc != 0 and "recover.yml targets one container on one node" in out and "on 2 node(s)" in out, out[-2000:]


@pytest.mark.parametrize("vmid", ["951", "952"])
def test_either_container_of_a_multi_node_server_recovers_both_each_on_its_node(tmp_path, vmid):
    rc, out = recover(tmp_path, "-e", "recover_vmid=%s" % vmid)
    # each node's ladder is scoped to its own container of the server: the first check of each names both
    assert rc != 0 and "CT 951 is not a container of pve1" in out and "CT 952 is not a container of pve2" in out, out[-2000:]
    assert "pve1 : ok=" in out and "pve2 : ok=" in out and "changed=0" in out


def test_with_recover_node_only_that_node_s_container(tmp_path):
    rc, out = recover(tmp_path, "-e", "recover_vmid=952", "-e", "recover_node=pve2")
    assert rc != 0 and "CT 952 is not a container of pve2" in out, out[-2000:]
    assert "CT 951 is not a container" not in out and "pve1 : ok=" not in out


def test_relaunching_half_a_server_is_refused(tmp_path):
    rc, out = recover(tmp_path, "-e", "recover_vmid=952", "-e", "recover_node=pve2", "-e", "recover_relaunch=true")
    assert rc != 0 and "one container of the multi-node server tp_group (ct951, ct952)" in out, out[-2000:]
    assert "relaunching it alone would start half a server" in out and "Nothing has been changed" in out


def test_a_server_with_two_containers_on_one_node_is_refused_before_any_node_is_touched(tmp_path):
    inv = INVENTORY.replace("ct952: {proxmox_vmid: 952, pve_gpu_container_node_host: pve2,", "ct952: {proxmox_vmid: 952,")
    rc, out = recover_with(tmp_path, inv, "-e", "recover_vmid=951")
    assert rc != 0 and "the server tp_group has two containers on node pve1 (ct951 and ct952)" in out, out[-2000:]
    assert "is not a container of" not in out and "PLAY [Recover the GPUs" not in out  # refused before any node
