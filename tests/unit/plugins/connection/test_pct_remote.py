# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""inferops.gpu_inference.pct_remote: community.proxmox.proxmox_pct_remote with pipelining.

What reaches the node is checked on a fake paramiko channel: one `pct exec` per pipelined module, the module on
its standard input, and no PTY for it (a PTY echoes the input back and never passes on its end)."""
from __future__ import annotations

import io
import os

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


# --- file transfers: the container path is one quoted argument -------------------------------------------------

HOSTILE_PATHS = ["/opt/m/$(touch /tmp/pwned)", "/opt/m/a b", "/opt/m/`id`", "/opt/m/it's", "/opt/m/x\ny", "/opt/m/-n"]


@pytest.mark.parametrize("path", HOSTILE_PATHS)
def test_put_file_gives_the_path_as_one_argument_of_a_fixed_script(conn, tmp_path, path):
    import shlex
    c, channels = conn
    src = tmp_path / "src"
    src.write_bytes(b"DATA\x00\n")
    c.put_file(str(src), path)
    assert len(channels) == 1
    # What the node's shell makes of the command line: pct's argv, the container's sh, its fixed script, the path as $1.
    argv = shlex.split(channels[0].cmd.decode())
    assert argv == ["/usr/sbin/pct", "exec", "129", "--", "/bin/sh", "-c", 'umask 077 && exec cat > "$1"', "sh", path]
    assert channels[0].sent == b"DATA\x00\n" and channels[0].eof and not channels[0].pty


@pytest.mark.parametrize("path", HOSTILE_PATHS)
def test_fetch_file_gives_the_path_as_one_argument_of_a_fixed_script(conn, tmp_path, path):
    import shlex
    c, channels = conn
    c.fetch_file(path, str(tmp_path / "out"))
    argv = shlex.split(channels[0].cmd.decode())
    assert argv == ["/usr/sbin/pct", "exec", "129", "--", "/bin/sh", "-c", 'exec cat < "$1"', "sh", path]
    assert (tmp_path / "out").read_bytes() == b'{"ok": true}' and not channels[0].pty


def test_a_path_with_a_nul_is_refused_before_anything_is_sent(conn, tmp_path):
    from ansible.errors import AnsibleError
    c, channels = conn
    (tmp_path / "src").write_text("x")
    with pytest.raises(AnsibleError, match="NUL byte cannot be passed"):
        c.put_file(str(tmp_path / "src"), "/opt/a\x00b")
    with pytest.raises(AnsibleError, match="NUL byte cannot be passed"):
        c.fetch_file("/opt/a\x00b", str(tmp_path / "out"))
    assert channels == [] and not (tmp_path / "out").exists()


def test_the_transfer_command_runs_in_a_real_shell_without_running_the_name(tmp_path):
    """The same command line, parsed by a real sh as the node's shell would and run as in the container."""
    import subprocess
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    for name in ("$(touch pwned)", "`touch pwned2`", "a b", "x\ny;touch pwned3"):
        path = str(tmp_path / name)
        cmd = pct_remote.transfer_command("/bin/sh", pct_remote.PUT_SCRIPT, path)
        r = subprocess.run(["/bin/sh", "-c", cmd], input=name.encode(), cwd=cwd, capture_output=True, check=False)
        assert r.returncode == 0, r.stderr
        assert open(path).read() == name
        r = subprocess.run(["/bin/sh", "-c", pct_remote.transfer_command("/bin/sh", pct_remote.FETCH_SCRIPT, path)],
                           cwd=cwd, capture_output=True, check=False)
        assert r.returncode == 0 and r.stdout == name.encode()
    assert os.listdir(cwd) == []
