# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# The options below are those of community.proxmox.proxmox_pct_remote 2.0.0 (Nils Stein, Ansible Project, GPL-3.0-or-later),
# which this plugin extends; pipelining and the quoted file transfers are new.
from __future__ import annotations

DOCUMENTATION = r"""
name: pct_remote
author: inferops team (@inferops)
short_description: Run tasks in a Proxmox VE LXC container with pct over SSH, with pipelining and quoted transfers
version_added: 0.2.0
requirements:
  - paramiko
  - community.proxmox >= 2.0.0
description:
  - community.proxmox.proxmox_pct_remote (paramiko SSH to the node, then C(pct exec VMID -- ...)) with pipelining.
  - With pipelining a module is sent on the standard input of one C(pct exec) instead of a temporary directory,
    a file copy, a chmod, the run and a clean-up (six C(pct exec) sessions for each task become one).
  - Pipelined input is sent without a PTY (as the ssh connection plugin does), so that the module arrives intact.
  - The node's SSH host key is checked against the keys the inventory pins (O(pinned_host_keys)), before
    authenticating, whatever C(ANSIBLE_HOST_KEY_CHECKING) or O(host_key_checking) say; known_hosts files are neither
    read nor written. With no pinned key the connection is refused before it is opened.
  - File transfers quote the container path (community.proxmox 2.0 puts it unquoted into C(sh -c 'cat > PATH'), so
    a path with a space, C($(...)) or a backquote broke the copy or ran as root in the container); a path with a NUL
    is refused. A file is created with umask 077 (mode 0600 at most) before any byte is written.
options:
  pinned_host_keys:
    description:
      - The node's public SSH host keys, lines of its C(/etc/ssh/ssh_host_*_key.pub) (C(TYPE BASE64 [comment])), as a
        list or one string of lines. Only a server that proves one of them is the node. Read them at the node's console
        (C(cat /etc/ssh/ssh_host_ed25519_key.pub)); C(ssh-keyscan) output is whatever answered on the network.
      - Only from the inventory (no environment variable or ansible.cfg entry can replace or disable it).
    type: raw
    vars:
      - name: proxmox_node_ssh_host_keys
  pipelining:
    description:
      - Send modules on the standard input of one C(pct exec). V(false) gives the behaviour of
        community.proxmox.proxmox_pct_remote.
    type: boolean
    default: true
    env:
      - name: ANSIBLE_PIPELINING
    ini:
      - section: defaults
        key: pipelining
      - section: connection
        key: pipelining
    vars:
      - name: ansible_pipelining
  remote_addr:
    description:
      - Address of the remote target.
    default: inventory_hostname
    type: string
    vars:
      - name: inventory_hostname
      - name: ansible_host
      - name: ansible_ssh_host
      - name: ansible_paramiko_host
  port:
    description: Remote port to connect to.
    type: int
    default: 22
    ini:
      - section: defaults
        key: remote_port
      - section: paramiko_connection
        key: remote_port
    env:
      - name: ANSIBLE_REMOTE_PORT
      - name: ANSIBLE_REMOTE_PARAMIKO_PORT
    vars:
      - name: ansible_port
      - name: ansible_ssh_port
      - name: ansible_paramiko_port
    keyword:
      - name: port
  remote_user:
    description:
      - User to login/authenticate as.
      - Can be set from the CLI via the C(--user) or C(-u) options.
    type: string
    vars:
      - name: ansible_user
      - name: ansible_ssh_user
      - name: ansible_paramiko_user
    env:
      - name: ANSIBLE_REMOTE_USER
      - name: ANSIBLE_PARAMIKO_REMOTE_USER
    ini:
      - section: defaults
        key: remote_user
      - section: paramiko_connection
        key: remote_user
    keyword:
      - name: remote_user
  password:
    description:
      - Secret used to either login the SSH server or as a passphrase for SSH keys that require it.
      - Can be set from the CLI via the C(--ask-pass) option.
    type: string
    vars:
      - name: ansible_password
      - name: ansible_ssh_pass
      - name: ansible_ssh_password
      - name: ansible_paramiko_pass
      - name: ansible_paramiko_password
  use_rsa_sha2_algorithms:
    description:
      - Whether or not to enable RSA SHA2 algorithms for pubkeys and hostkeys.
      - On paramiko versions older than 2.9, this only affects hostkeys.
      - For behavior matching paramiko<2.9 set this to V(false).
    vars:
      - name: ansible_paramiko_use_rsa_sha2_algorithms
    ini:
      - {key: use_rsa_sha2_algorithms, section: paramiko_connection}
    env:
      - {name: ANSIBLE_PARAMIKO_USE_RSA_SHA2_ALGORITHMS}
    default: true
    type: boolean
  host_key_auto_add:
    description: "Automatically add host keys to C(~/.ssh/known_hosts)."
    env:
      - name: ANSIBLE_PARAMIKO_HOST_KEY_AUTO_ADD
    ini:
      - key: host_key_auto_add
        section: paramiko_connection
    type: boolean
  look_for_keys:
    default: True
    description: "Set to V(false) to disable searching for private key files in C(~/.ssh/)."
    env:
      - name: ANSIBLE_PARAMIKO_LOOK_FOR_KEYS
    ini:
      - {key: look_for_keys, section: paramiko_connection}
    type: boolean
  proxy_command:
    default: ""
    description:
      - Proxy information for running the connection via a jumphost.
    type: string
    env:
      - name: ANSIBLE_PARAMIKO_PROXY_COMMAND
    ini:
      - {key: proxy_command, section: paramiko_connection}
    vars:
      - name: ansible_paramiko_proxy_command
  pty:
    default: True
    description: "C(sudo) usually requires a PTY, V(true) to give a PTY and V(false) to not give a PTY."
    env:
      - name: ANSIBLE_PARAMIKO_PTY
    ini:
      - section: paramiko_connection
        key: pty
    type: boolean
  record_host_keys:
    default: True
    description: "Save the host keys to a file."
    env:
      - name: ANSIBLE_PARAMIKO_RECORD_HOST_KEYS
    ini:
      - section: paramiko_connection
        key: record_host_keys
    type: boolean
  host_key_checking:
    description: "Set this to V(false) if you want to avoid host key checking by the underlying tools Ansible uses to connect to the host."
    type: boolean
    default: true
    env:
      - name: ANSIBLE_HOST_KEY_CHECKING
      - name: ANSIBLE_SSH_HOST_KEY_CHECKING
      - name: ANSIBLE_PARAMIKO_HOST_KEY_CHECKING
    ini:
      - section: defaults
        key: host_key_checking
      - section: paramiko_connection
        key: host_key_checking
    vars:
      - name: ansible_host_key_checking
      - name: ansible_ssh_host_key_checking
      - name: ansible_paramiko_host_key_checking
  use_persistent_connections:
    description: "Toggles the use of persistence for connections."
    type: boolean
    default: False
    env:
      - name: ANSIBLE_USE_PERSISTENT_CONNECTIONS
    ini:
      - section: defaults
        key: use_persistent_connections
  forward_agent:
    description: "Enable SSH agent forwarding."
    type: boolean
    default: False
    env:
      - name: ANSIBLE_PARAMIKO_FORWARD_AGENT
    ini:
      - section: paramiko_connection
        key: forward_agent
  banner_timeout:
    type: float
    default: 30
    description:
      - Configures, in seconds, the amount of time to wait for the SSH
        banner to be presented. This option is supported by paramiko
        version 1.15.0 or newer.
    ini:
      - section: paramiko_connection
        key: banner_timeout
    env:
      - name: ANSIBLE_PARAMIKO_BANNER_TIMEOUT
  timeout:
    type: int
    default: 10
    description: Number of seconds until the plugin gives up on failing to establish a TCP connection.
    ini:
      - section: defaults
        key: timeout
      - section: ssh_connection
        key: timeout
      - section: paramiko_connection
        key: timeout
    env:
      - name: ANSIBLE_TIMEOUT
      - name: ANSIBLE_SSH_TIMEOUT
      - name: ANSIBLE_PARAMIKO_TIMEOUT
    vars:
      - name: ansible_ssh_timeout
      - name: ansible_paramiko_timeout
    cli:
      - name: timeout
  lock_file_timeout:
    type: int
    default: 60
    description: Number of seconds until the plugin gives up on trying to write a lock file when writing SSH known host keys.
    vars:
      - name: ansible_lock_file_timeout
    env:
      - name: ANSIBLE_LOCK_FILE_TIMEOUT
  private_key_file:
    description:
      - Path to private key file to use for authentication.
    type: string
    ini:
      - section: defaults
        key: private_key_file
      - section: paramiko_connection
        key: private_key_file
    env:
      - name: ANSIBLE_PRIVATE_KEY_FILE
      - name: ANSIBLE_PARAMIKO_PRIVATE_KEY_FILE
    vars:
      - name: ansible_private_key_file
      - name: ansible_ssh_private_key_file
      - name: ansible_paramiko_private_key_file
    cli:
      - name: private_key_file
        option: "--private-key"
  vmid:
    description:
      - LXC Container ID
    type: int
    vars:
      - name: proxmox_vmid
  proxmox_become_method:
    description:
      - Become command used in proxmox
    type: str
    default: sudo
    vars:
      - name: proxmox_become_method
notes:
  - The container needs a shell and C(cat), as for community.proxmox.proxmox_pct_remote.
  - O(host_key_checking), O(host_key_auto_add) and O(record_host_keys) are accepted for compatibility and have no
    effect; the pinned keys decide.
  - Inside the container, C(python3) reads the module from its standard input.
"""

EXAMPLES = r"""
# inventory: a container of the node pve1, reached through the node's SSH
# ct129:
#   ansible_connection: inferops.gpu_inference.pct_remote
#   ansible_host: pve1.example.org
#   ansible_user: root
#   proxmox_vmid: 129
#   proxmox_node_ssh_host_keys:   # cat /etc/ssh/ssh_host_ed25519_key.pub, read at pve1's console
#     - ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAI... root@pve1
"""

import os  # noqa: E402
import shlex  # noqa: E402

from ansible.errors import AnsibleConnectionFailure, AnsibleError  # noqa: E402
from ansible.module_utils.common.text.converters import to_bytes, to_text  # noqa: E402
from ansible.utils.display import Display  # noqa: E402
from ansible_collections.community.proxmox.plugins.connection.proxmox_pct_remote import (  # noqa: E402
    Connection as _PctRemoteConnection,
)
from ansible_collections.inferops.gpu_inference.plugins.module_utils.deploy import ssh_host_keys  # noqa: E402

try:
    import paramiko
except ImportError:  # reported by the parent's _connect
    paramiko = None


class _HostKeyRefused(Exception):
    """The server proved a key the inventory does not pin."""


if paramiko is not None:
    class _PinnedKeyPolicy(paramiko.MissingHostKeyPolicy):
        """The client holds no known host key, so paramiko asks this policy about every server key; it accepts only a
        pinned one and adds nothing anywhere."""

        def __init__(self, keys, where, address):
            self._keys = keys
            self._where = where
            self._address = address

        def missing_host_key(self, client, hostname, key):
            try:
                ssh_host_keys.check_server_key(self._keys, key.get_name(), key.asbytes(), self._where, self._address)
            except ssh_host_keys.HostKeyError as exc:
                raise _HostKeyRefused(str(exc)) from None


display = Display()

# The container's shell gets the path as its first argument ("$1"), never as text of its script: no quoting of the
# path is parsed in the container. The node's shell parses the command line once (SSH runs it there), so the
# script and the path are each one shlex-quoted word. umask 077: the file is created 0600 at most, before any byte of
# a secret is written (the caller sets the final mode afterwards). Input redirection: a path starting with "-" is
# never an option of cat.
PUT_SCRIPT = 'umask 077 && exec cat > "$1"'
FETCH_SCRIPT = 'exec cat < "$1"'


def checked_path(path) -> str:
    """The container path of a transfer, refused when it cannot be one argument of a command (a NUL byte)."""
    text = to_text(path, errors="surrogate_or_strict")
    if "\0" in text:
        raise AnsibleError("refused to transfer %r: a path with a NUL byte cannot be passed to a command in the "
                           "container (nothing was sent)" % text)
    return text


def transfer_command(shell: str, script: str, path) -> str:
    """The command line run on the node (after `pct exec VMID --`) that gives ``path`` to ``script`` as "$1"."""
    text = checked_path(path)
    return " ".join([shlex.quote(shell), "-c", shlex.quote(script), "sh", shlex.quote(text)])


class Connection(_PctRemoteConnection):
    """community.proxmox.proxmox_pct_remote, with pipelining and file transfers that quote the container path."""

    transport = "inferops.gpu_inference.pct_remote"
    has_pipelining = True

    def _connect(self):
        """The parent's connect, with the node's host key checked against the pinned keys only (no known_hosts file,
        whatever host_key_checking says) and refused before authenticating."""
        if self._connected:
            return self
        if paramiko is None:
            return super()._connect()  # raises: paramiko is not installed
        address = "%s:%s" % (self.get_option("remote_addr"), self.get_option("port"))
        where = "CT %s (through the node at %s)" % (self.get_option("vmid"), address)
        try:
            keys = ssh_host_keys.parse(self.get_option("pinned_host_keys"), where)
        except ssh_host_keys.HostKeyError as exc:
            raise AnsibleConnectionFailure(str(exc)) from None
        port = self.get_option("port")
        ssh = paramiko.SSHClient()
        if self._log_channel is not None:
            ssh.set_log_channel(self._log_channel)
        # Only the pinned keys' algorithms may be negotiated (so a node that also has another key type proves the
        # pinned one), less what use_rsa_sha2_algorithms=false disables.
        disabled = self._build_paramiko_disabled_algorithms()
        allowed = ssh_host_keys.allowed_algorithms(keys)
        preferred = list(getattr(paramiko.Transport, "_preferred_keys", ()))
        disabled["keys"] = tuple(sorted(set(disabled.get("keys", ())) | {a for a in preferred if a not in allowed}))
        # No known_hosts file: the parent's close() then has no key to record.
        self.keyfile = os.path.expanduser("~/.ssh/known_hosts")
        ssh.set_missing_host_key_policy(_PinnedKeyPolicy(keys, where, address))
        try:
            self._paramiko_connect_ssh(ssh, port, disabled, self._parse_proxy_command(port))
        except _HostKeyRefused as exc:
            ssh.close()
            raise AnsibleConnectionFailure(str(exc)) from None
        self.ssh = ssh
        self._connected = True
        return self

    def _raise_paramiko_connect_exception(self, e, port):
        # The parent calls this for every connect error but does not define it (community.proxmox 2.0.0).
        if isinstance(e, _HostKeyRefused):
            raise e
        if isinstance(e, AnsibleError):
            raise e
        raise AnsibleConnectionFailure("paramiko could not connect to %s:%s: %s" % (self.get_option("remote_addr"), port, e)) from e

    def exec_command(self, cmd, in_data=None, sudoable=True):
        # A PTY would echo the pipelined module back and never pass on the end of its input: input goes without one.
        if in_data is not None:
            sudoable = False
        return super().exec_command(cmd, in_data=in_data, sudoable=sudoable)

    def _transfer(self, script, path, in_data=None):
        shell = getattr(self._shell, "executable", None) or "/bin/sh"
        rc, stdout, stderr = self.exec_command(transfer_command(shell, script, path), in_data=in_data, sudoable=False)
        if rc != 0:
            if b"cat: not found" in stderr:
                raise AnsibleError("cat not found in path of container: %s" % to_text(self.get_option("vmid")))
            raise AnsibleError("%s\n%s" % (to_text(stdout), to_text(stderr)))
        return stdout

    def put_file(self, in_path, out_path):
        """Copy a controller file to ``out_path`` in the container (created 0600 at most; the path quoted)."""
        display.vvv("PUT %r TO %r" % (in_path, out_path), host=self.get_option("remote_addr"))
        checked_path(out_path)  # refused before the file is read
        try:
            with open(to_bytes(in_path, errors="surrogate_or_strict"), "rb") as handle:
                data = handle.read()
            self._transfer(PUT_SCRIPT, out_path, in_data=data)
        except Exception as exc:
            raise AnsibleError("error occurred while putting file from %s to %r!\n%s" % (in_path, out_path, to_text(exc))) from exc

    def fetch_file(self, in_path, out_path):
        """Copy the container's ``in_path`` (quoted) to the controller's ``out_path``."""
        display.vvv("FETCH %r TO %r" % (in_path, out_path), host=self.get_option("remote_addr"))
        checked_path(in_path)
        try:
            data = self._transfer(FETCH_SCRIPT, in_path)
            with open(to_bytes(out_path, errors="surrogate_or_strict"), "wb") as handle:
                handle.write(data)
        except Exception as exc:
            raise AnsibleError("error occurred while fetching file from %r to %s!\n%s" % (in_path, out_path, to_text(exc))) from exc
