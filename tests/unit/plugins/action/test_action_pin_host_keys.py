# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The action pin_host_keys: the inventory's pinned keys written to the controller user's own known_hosts file (mode
0600 in a 0700 directory), the ssh options naming it, a local node with no key, another connection plugin refused
(plugins/action/pin_host_keys.py). Keys are made by ssh-keygen."""
from __future__ import annotations

import os
import stat
import subprocess

from ansible_collections.inferops.gpu_inference.plugins.action import pin_host_keys
from ansible_collections.inferops.gpu_inference.tests.unit.plugins.action import harness


def keygen(tmp_path, name):
    path = tmp_path / name
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "root@pve1", "-f", str(path)], check=True)
    return (tmp_path / (name + ".pub")).read_text().strip()


def run(tmp_path, args):
    return harness.make(pin_host_keys, args, tmp_path).run(task_vars={"inventory_hostname": "pve1"})


def test_the_pinned_key_is_written_for_ssh_and_only_it(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    line = keygen(tmp_path, "k")
    result = run(tmp_path, {"host_keys": [line], "connection": "ssh", "address": "10.0.0.1", "port": 22, "user": "root"})
    assert not result.get("failed"), result
    path = result["known_hosts"]
    assert path.startswith(str(tmp_path / "home" / ".ansible" / "inferops-ssh") + os.sep)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode) == 0o700
    written = open(path).read().split()
    assert written[1:] == line.split()[:2]
    assert path in result["ssh_args"] and "StrictHostKeyChecking=yes" in result["ssh_args"]
    printed = subprocess.run(["ssh-keygen", "-lf", str(tmp_path / "k.pub")], check=True, capture_output=True,
                             text=True).stdout.split()[1]
    assert [f["fingerprint"] for f in result["fingerprints"]] == [printed]


def test_a_local_node_has_no_key_and_another_plugin_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    local = run(tmp_path, {"host_keys": None, "connection": "local"})
    assert not local.get("failed") and local["known_hosts"] == "" and not (tmp_path / "home").exists()
    other = run(tmp_path, {"host_keys": [keygen(tmp_path, "k")], "connection": "paramiko"})
    assert other["failed"] and "ansible_connection=paramiko" in other["msg"]


def test_no_pinned_key_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    result = run(tmp_path, {"host_keys": None, "connection": "ssh"})
    assert result["failed"] and "proxmox_node_ssh_host_keys" in result["msg"]
    assert not (tmp_path / "home" / ".ansible" / "inferops-ssh").exists() or not os.listdir(
        tmp_path / "home" / ".ansible" / "inferops-ssh")
