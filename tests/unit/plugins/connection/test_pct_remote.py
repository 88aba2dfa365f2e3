# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""inferops.gpu_inference.pct_remote: community.proxmox.proxmox_pct_remote with pipelining.

What reaches the node is checked on a fake paramiko channel: one `pct exec` per pipelined module, the module on
its standard input, and no PTY for it (a PTY echoes the input back and never passes on its end)."""
from __future__ import annotations

import io

import pytest

from ansible.playbook.play_context import PlayContext
from ansible.plugins.loader import connection_loader

from ansible_collections.inferops.gpu_inference.plugins.connection import pct_remote

NAME = "inferops.gpu_inference.pct_remote"


class FakeChannel:
    def __init__(self, log):
        self.log = log
        self.sent = b""
        self.eof = False
        self.pty = False

    def get_pty(self, **_kw):
        self.pty = True

    def exec_command(self, cmd):
        self.log.append(self)
        self.cmd = cmd

    def send(self, data):
        self.sent += data
        return len(data)

    def shutdown_write(self):
        self.eof = True

    def makefile(self, *_a):
        return io.BytesIO(b'{"ok": true}')

    def makefile_stderr(self, *_a):
        return io.BytesIO(b"")

    def recv_exit_status(self):
        return 0


@pytest.fixture
def conn(monkeypatch):
    # What the plugin loader does when it loads the plugin by name: read its DOCUMENTATION into the config manager.
    connection_loader._load_config_defs(NAME, pct_remote, pct_remote.__file__)
    c = pct_remote.Connection(PlayContext(), io.StringIO())
    c._load_name = NAME
    c.set_options(var_options={"proxmox_vmid": 129, "ansible_host": "pve1", "ansible_user": "root"})
    channels = []
    monkeypatch.setattr(c, "_open_exec_channel", lambda: FakeChannel(channels))
    monkeypatch.setattr(c, "_connect", lambda: c)
    c._connected = True
    return c, channels


def test_pipelining_is_on_by_default(conn):
    c = conn[0]
    assert c.has_pipelining
    assert c.get_option("pipelining") is True
    assert c.is_pipelining_enabled()


def test_pipelined_module_goes_on_stdin_of_one_pct_exec_without_a_pty(conn):
    c, channels = conn
    rc, out, err = c.exec_command("/bin/sh -c /usr/bin/python3", in_data=b"MODULE" * 5000)
    assert rc == 0 and out == b'{"ok": true}' and err == b""
    assert len(channels) == 1
    ch = channels[0]
    assert ch.cmd == b"/usr/sbin/pct exec 129 -- /bin/sh -c /usr/bin/python3"
    assert ch.sent == b"MODULE" * 5000 and ch.eof
    assert not ch.pty


def test_a_plain_command_keeps_the_parents_pty(conn):
    c, channels = conn
    c.exec_command("/bin/sh -c 'echo ~root'")
    assert channels[0].pty  # proxmox_pct_remote's default (pty: true) for sudoable commands without input


def test_pipelining_can_be_turned_off(conn):
    c = conn[0]
    c.set_options(var_options={"proxmox_vmid": 129, "ansible_host": "pve1", "ansible_pipelining": False})
    assert not c.is_pipelining_enabled()
