# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""module_utils/deploy/ssh_host_keys.py: the inventory's pinned node keys, checked whatever ANSIBLE_HOST_KEY_CHECKING says.

Keys are made by ssh-keygen (the .pub lines an operator reads at a node's console), fingerprints compared with
ssh-keygen -lf's; the ssh options are checked against ssh -G, which prints what ssh would use."""
from __future__ import annotations

import base64
import os
import shlex
import subprocess

import pytest

from ansible_collections.inferops.gpu_inference.plugins.module_utils.deploy import ssh_host_keys as hk


def keygen(tmp_path, name, kind="ed25519"):
    path = tmp_path / name
    subprocess.run(["ssh-keygen", "-q", "-t", kind, "-N", "", "-C", "root@pve1", "-f", str(path)], check=True)
    return (tmp_path / (name + ".pub")).read_text().strip(), str(path) + ".pub"


def test_a_pub_line_is_parsed_and_fingerprinted_as_ssh_keygen_does(tmp_path):
    line, pub = keygen(tmp_path, "k")
    keys = hk.parse([line], "pve1")
    assert [k.key_type for k in keys] == ["ssh-ed25519"]
    printed = subprocess.run(["ssh-keygen", "-lf", pub], check=True, capture_output=True, text=True).stdout.split()[1]
    assert keys[0].fingerprint == printed


def test_a_string_of_lines_a_list_comments_and_duplicates(tmp_path):
    a, _pub = keygen(tmp_path, "a")
    b, _pub = keygen(tmp_path, "b", "ecdsa")
    keys = hk.parse("# pve1, read at its console\n%s\n\n%s\n%s\n" % (a, b, a), "pve1")
    assert [k.key_type for k in keys] == ["ssh-ed25519", "ecdsa-sha2-nistp256"]
    assert hk.parse([a + "\n" + b], "pve1") == keys


@pytest.mark.parametrize("value", [None, "", [], "  \n# nothing\n"])
def test_no_key_is_a_refusal_that_says_how_to_read_it_at_the_console(value):
    with pytest.raises(hk.HostKeyError) as e:
        hk.parse(value, "pve1")
    msg = str(e.value)
    assert "pve1" in msg and "proxmox_node_ssh_host_keys" in msg and "Nothing was sent" in msg
    assert "cat /etc/ssh/ssh_host_ed25519_key.pub" in msg and "ssh-keygen -lf" in msg and "console" in msg
    assert "ssh-keyscan" in msg and "not set" in msg if value is None else True


def test_malformed_entries_are_refused(tmp_path):
    line, _pub = keygen(tmp_path, "k")
    typ, b64 = line.split()[:2]
    other_typ = "ecdsa-sha2-nistp256"
    for bad, says in [
        (["[127.0.0.1]:2222 " + line], "does not start with a host key type"),     # a known_hosts line
        (["@cert-authority * " + line], "does not start with a host key type"),
        (["SHA256:abcdefghijklmnop"], "fingerprint"),
        ([typ], "no key"),
        (["%s %s!!" % (typ, b64)], "not valid base64"),
        (["%s %s" % (other_typ, b64)], "damaged"),                                  # type does not match the blob
        ([typ + " " + base64.b64encode(b"junk").decode()], "damaged"),
        ([42], "public key lines"),
        ({"k": line}, "must be a list"),
    ]:
        with pytest.raises(hk.HostKeyError, match=says):
            hk.parse(bad, "pve1")


def test_server_key_accepted_only_if_pinned(tmp_path):
    a, _pub = keygen(tmp_path, "a")
    b, _pub = keygen(tmp_path, "b")
    pinned = hk.parse([a], "pve1")
    other = hk.parse([b], "x")[0]
    hk.check_server_key(pinned, "ssh-ed25519", pinned[0].blob, "pve1", "10.0.0.1:22")
    with pytest.raises(hk.HostKeyError) as e:
        hk.check_server_key(pinned, "ssh-ed25519", other.blob, "pve1", "10.0.0.1:22")
    assert other.fingerprint in str(e.value) and pinned[0].fingerprint in str(e.value)
    assert "nothing was sent" in str(e.value)


def test_algorithms_are_those_of_the_pinned_keys(tmp_path):
    a, _pub = keygen(tmp_path, "a")
    r, _pub = keygen(tmp_path, "r", "rsa")
    assert hk.allowed_algorithms(hk.parse([a], "n")) == ["ssh-ed25519"]
    assert hk.allowed_algorithms(hk.parse([r, a], "n")) == ["rsa-sha2-512", "rsa-sha2-256", "ssh-rsa", "ssh-ed25519"]


def test_known_hosts_file_is_read_by_ssh_keygen_under_the_alias(tmp_path):
    a, _pub = keygen(tmp_path, "a")
    keys = hk.parse([a], "n")
    kh = tmp_path / hk.known_hosts_name(keys)
    kh.write_text(hk.known_hosts_text(keys))
    found = subprocess.run(["ssh-keygen", "-F", hk.ALIAS, "-f", str(kh)], capture_output=True, text=True, check=False)
    assert found.returncode == 0 and keys[0].base64 in found.stdout
    assert hk.known_hosts_name(keys) != hk.known_hosts_name(hk.parse([keygen(tmp_path, "b")[0]], "n"))


def test_ssh_options_win_over_what_ansible_adds_after_them(tmp_path):
    """ssh -G prints the options ssh would use: the pinned ones come first, so a later StrictHostKeyChecking=no (what
    ansible adds for ANSIBLE_HOST_KEY_CHECKING=False) or UserKnownHostsFile=/dev/null changes nothing."""
    args = shlex.split(hk.ssh_args(str(tmp_path / "kh"),
                                   hk.control_path(str(tmp_path), hk.parse([keygen(tmp_path, "a")[0]], "n"), "pve1", 22, "root")))
    cfg = tmp_path / "config"
    cfg.write_text("StrictHostKeyChecking no\nUserKnownHostsFile /dev/null\n")
    out = subprocess.run(["ssh", "-F", str(cfg), "-G"] + args
                         + ["-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "pve1.example.org"],
                         check=True, capture_output=True, text=True, env=dict(os.environ)).stdout.lower().splitlines()
    assert "stricthostkeychecking true" in out
    assert "userknownhostsfile %s" % str(tmp_path / "kh").lower() in out
    assert "globalknownhostsfile /dev/null" in out
    assert "hostkeyalias %s" % hk.ALIAS in out
    assert any(line.startswith("controlpath %s/" % str(tmp_path).lower()) for line in out)


def test_node_connection_is_ssh_or_local():
    assert hk.node_connection(None, "pve1") == "ssh"
    assert hk.node_connection("ansible.builtin.ssh", "pve1") == "ssh"
    assert hk.node_connection("local", "pve1") == "local"
    for other in ("paramiko_ssh", "ansible.builtin.paramiko_ssh", "community.general.chroot"):
        with pytest.raises(hk.HostKeyError, match="would not check it"):
            hk.node_connection(other, "pve1")


def test_control_path_is_short_and_per_host(tmp_path):
    keys = hk.parse([keygen(tmp_path, "a")[0]], "n")
    a = hk.control_path("/root/.ansible/inferops-ssh", keys, "pve1.example.org", 22, "root")
    assert len(a) + 17 < 108   # ssh appends 17 characters while it makes the socket
    assert a != hk.control_path("/root/.ansible/inferops-ssh", keys, "pve2.example.org", 22, "root")
    assert a != hk.control_path("/root/.ansible/inferops-ssh", keys, "pve1.example.org", 2222, "root")
    assert a != hk.control_path("/root/.ansible/inferops-ssh", hk.parse([keygen(tmp_path, "b")[0]], "n"),
                                "pve1.example.org", 22, "root")
