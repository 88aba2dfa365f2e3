# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""deploy.yml's first play reads the run's containers from the inventory model once: each container's description
(the node play's input) carries the model's VMID, node and PVE node name, and an inventory the model cannot use is
refused with every problem at once, before the node play starts.

Only tasks tagged `always` run (`--tags` names no other): the first play (variables only) and the node and container
plays' checks. Every host's address is unreachable (127.0.0.9, port 9), so nothing is contacted even by mistake.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
NOWHERE = ("{ansible_host: 127.0.0.9, ansible_port: 9, ansible_connection: ssh, ansible_python_interpreter: %(py)s, "
           "sglang_server_model_path: /opt/models/m")
INVENTORY = """
all:
  children:
    proxmox_nodes:
      hosts:
        pve1: %(nowhere)s, proxmox_node: pve-one}
        pve2.lan: %(nowhere)s}
    sglang_containers:
      hosts:
        ct940: %(nowhere)s, proxmox_vmid: 940}
        ct941: %(nowhere)s, pve_gpu_container_vmid: 941, pve_gpu_container_node_host: pve2.lan}
"""


def deploy(tmp_path, inventory, *args):
    inv = tmp_path / "hosts.yml"
    inv.write_text((inventory % {"nowhere": NOWHERE}) % {"py": sys.executable})
    env = dict(os.environ, ANSIBLE_NOCOLOR="1", ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"),
               INFEROPS_REPORT_DIR=str(tmp_path / "reports"), ANSIBLE_STDOUT_CALLBACK="ansible.builtin.default",
               ANSIBLE_CALLBACK_RESULT_FORMAT="json")
    playbook = os.path.join(os.path.dirname(sys.executable), "ansible-playbook")
    r = subprocess.run([playbook, "-i", str(inv), os.path.join(ROOT, "playbooks", "deploy.yml"), "--tags", "inferops_none",
                        "-v"] + list(args), capture_output=True, text=True, env=env, cwd=ROOT, timeout=300, check=False)
    return r.returncode, r.stdout + r.stderr


def specs(out):
    """Each container's description as the first play set it (-v prints set_fact's facts)."""
    found = {}
    for m in re.finditer(r"^ok: \[(\S+)\] => (\{.*\})$", out, re.M):
        facts = json.loads(m.group(2)).get("ansible_facts") or {}
        if "__pve_gpu_container_spec" in facts:
            found[m.group(1)] = facts["__pve_gpu_container_spec"]
    return found


def test_each_container_s_description_carries_the_model_s_vmid_and_node(tmp_path):
    rc, out = deploy(tmp_path, INVENTORY)
    got = {h: (s["vmid"], s["node_host"], s["node"], s["hostname"]) for h, s in specs(out).items()}
    assert got == {"ct940": (940, "pve1", "pve-one", "sglang-940"),
                   "ct941": (941, "pve2.lan", "pve2", "sglang-941")}, out[-3000:]
    # the first play passed; the node play stops at its pinned host keys (none here): nothing was contacted
    assert "PLAY [Proxmox VE node" in out and "no SSH host key is pinned for the node" in out


def test_every_problem_of_the_run_is_refused_at_once_before_the_node_play(tmp_path):
    bad = INVENTORY.replace("proxmox_vmid: 940}", "proxmox_vmid: ct940}").replace(
        "pve_gpu_container_node_host: pve2.lan}", "pve_gpu_container_node_host: pve3}")
    rc, out = deploy(tmp_path, bad)
    flat = " ".join(out.split())
    assert rc != 0
    assert "ct940: its VMID (proxmox_vmid) must be an integer between 100 and 999999999, got 'ct940'" in flat, flat[-3000:]
    assert "ct941: pve_gpu_container_node_host 'pve3' is not a host of the inventory" in flat
    assert "Nothing has been changed." in flat
    assert "PLAY [Proxmox VE node" not in out and specs(out) == {}
    assert "Traceback" not in out


def test_the_run_is_deploy_containers_not_the_whole_group(tmp_path):
    bad = INVENTORY.replace("proxmox_vmid: 940}", "proxmox_vmid: 94}")
    rc, out = deploy(tmp_path, bad, "-e", "deploy_containers=ct941")
    assert {h: s["vmid"] for h, s in specs(out).items()} == {"ct941": 941}, out[-3000:]
    assert "ct940" not in out.split("PLAY [Proxmox VE node")[0]
    # the same inventory with both containers in the run: ct940's VMID is refused
    rc, out = deploy(tmp_path, bad)
    assert rc != 0 and "ct940: its VMID (proxmox_vmid) must be between 100" in " ".join(out.split()), out[-3000:]
