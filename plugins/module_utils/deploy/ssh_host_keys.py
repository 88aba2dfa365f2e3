# -*- coding: utf-8 -*-
# Copyright: inferops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The node's SSH host keys as the inventory pins them, and what each connection does with them.

The collection sends the node (and, through ``pct exec``, its containers) the API key, the environment files and
root's commands. A machine that answers at the node's address is the node only if it proves a host key the operator
read on the node itself; ``ANSIBLE_HOST_KEY_CHECKING=False`` (AWX sets it for every job) must not change that. So the
keys come from the inventory (``proxmox_node_ssh_host_keys``), never from what a first connection or ``ssh-keyscan``
was answered, and both connections check them:

- ``ansible.builtin.ssh`` (the node play): a known_hosts file holding only the pinned keys under one alias, and ssh
  options that come first on ssh's command line (ssh takes the first value of each option), set as the play's
  ``ansible_ssh_args``;
- ``inferops.gpu_inference.pct_remote`` (paramiko, the container play): the server's key compared with the pinned
  keys in the connection itself, before authenticating.

No Ansible imports: the action plugin ``pin_host_keys`` and the connection plugin call these functions.
"""
from __future__ import annotations

import base64
import binascii
import hashlib
import re
import shlex
import struct
from typing import Any, Dict, List, NamedTuple, Sequence
from ansible_collections.inferops.gpu_inference.plugins.module_utils.common.errors import InferopsError

VARIABLE = "proxmox_node_ssh_host_keys"

# Host key types OpenSSH's sshd offers (certificates and security-key types are not host keys of a PVE node).
KEY_TYPES = ("ssh-ed25519", "ecdsa-sha2-nistp256", "ecdsa-sha2-nistp384", "ecdsa-sha2-nistp521", "ssh-rsa")
# The host key algorithms a key of each type is proved with (what ssh and paramiko negotiate).
KEY_ALGORITHMS = {
    "ssh-ed25519": ("ssh-ed25519",),
    "ecdsa-sha2-nistp256": ("ecdsa-sha2-nistp256",),
    "ecdsa-sha2-nistp384": ("ecdsa-sha2-nistp384",),
    "ecdsa-sha2-nistp521": ("ecdsa-sha2-nistp521",),
    "ssh-rsa": ("rsa-sha2-512", "rsa-sha2-256", "ssh-rsa"),
}
# The single name the pinned keys are filed under in the controller's known_hosts file (ssh -o HostKeyAlias): the
# file holds one node's keys, so whatever address or port the inventory gives, only these keys are looked up.
ALIAS = "inferops-pinned-node"

CONSOLE_HINT = (
    "Read the keys on the node itself, at its console (keyboard and screen, IPMI/iKVM, or a shell you already trust "
    "on it): `cat /etc/ssh/ssh_host_ed25519_key.pub` prints the line to pin (all of them: `cat "
    "/etc/ssh/ssh_host_*_key.pub`; a fingerprint to compare: `ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub`), and "
    "set %s in the inventory to those lines (docs/deploy.md, \"Pinned SSH host keys\"). Do not pin what "
    "`ssh-keyscan` or a first connection shows: that is whatever answered on the network, the very thing the pin is "
    "there to check." % VARIABLE)


class HostKeyError(InferopsError):
    """The inventory's pinned keys are missing or malformed, or the server proved another key."""


class PinnedKey(NamedTuple):
    key_type: str
    blob: bytes  # the key in SSH wire format (the base64 field of a .pub line, decoded)

    @property
    def base64(self) -> str:
        return base64.b64encode(self.blob).decode("ascii")

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.blob)


def fingerprint(blob: bytes) -> str:
    """OpenSSH's SHA256 fingerprint of a key blob (what `ssh-keygen -lf` prints)."""
    return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode("ascii").rstrip("=")


def _blob_type(blob: bytes) -> str:
    if len(blob) < 4:
        return ""
    (n,) = struct.unpack(">I", blob[:4])
    if n > 64 or len(blob) < 4 + n:
        return ""
    try:
        return blob[4:4 + n].decode("ascii")
    except UnicodeDecodeError:
        return ""


def _entries(value: Any, where: str) -> List[str]:
    if value is None:
        return []
    if isinstance(value, str):
        items: Sequence[Any] = value.splitlines()
    elif isinstance(value, (list, tuple)):
        items = value
    else:
        raise HostKeyError("%s: %s must be a list of public key lines (or one string of them), got %s. %s"
                           % (where, VARIABLE, type(value).__name__, CONSOLE_HINT))
    out = []
    for item in items:
        if not isinstance(item, str):
            raise HostKeyError("%s: %s must hold public key lines (text), got %r. %s" % (where, VARIABLE, item, CONSOLE_HINT))
        for line in item.splitlines():
            line = line.strip()
            if line and not line.startswith("#"):
                out.append(line)
    return out


def parse(value: Any, where: str) -> List[PinnedKey]:
    """The pinned keys of ``value`` (the inventory's ``proxmox_node_ssh_host_keys`` for host ``where``).

    Each entry is a line of ``/etc/ssh/ssh_host_*_key.pub``: ``TYPE BASE64 [comment]``. A missing or empty value,
    a fingerprint, a known_hosts line with a host pattern or marker, or a key whose type does not match its base64
    is refused with what to do."""
    lines = _entries(value, where)
    if not lines:
        raise HostKeyError(
            "%s: no SSH host key is pinned for the node (%s is %s). The collection connects to a node only when it can "
            "check the node's host key against keys from the inventory, whatever ANSIBLE_HOST_KEY_CHECKING says "
            "(AWX sets it to False). Nothing was sent to the node. %s"
            % (where, VARIABLE, "not set" if value is None else "empty", CONSOLE_HINT))
    keys: List[PinnedKey] = []
    for line in lines:
        fields = line.split()
        if fields[0].startswith("SHA256:") or fields[0].startswith("MD5:") or re.fullmatch(r"\d+", fields[0]):
            raise HostKeyError("%s: %s holds a fingerprint (%r), not a key: pin the public key line itself. %s"
                               % (where, VARIABLE, line[:80], CONSOLE_HINT))
        if fields[0] not in KEY_TYPES:
            raise HostKeyError(
                "%s: %s entry %r does not start with a host key type (%s): give the lines of the node's "
                "/etc/ssh/ssh_host_*_key.pub as they are, without a host name or a known_hosts marker. %s"
                % (where, VARIABLE, line[:80], ", ".join(KEY_TYPES), CONSOLE_HINT))
        if len(fields) < 2:
            raise HostKeyError("%s: %s entry %r has no key after its type. %s" % (where, VARIABLE, line[:80], CONSOLE_HINT))
        try:
            blob = base64.b64decode(fields[1].encode("ascii"), validate=True)
        except (binascii.Error, UnicodeEncodeError, ValueError):
            raise HostKeyError("%s: %s entry %r: the key is not valid base64. %s"
                               % (where, VARIABLE, line[:80], CONSOLE_HINT)) from None
        if _blob_type(blob) != fields[0]:
            raise HostKeyError("%s: %s entry %r: the key says it is %r, the line says %s: the line is damaged. %s"
                               % (where, VARIABLE, line[:80], _blob_type(blob) or "unreadable", fields[0], CONSOLE_HINT))
        key = PinnedKey(fields[0], blob)
        if key not in keys:
            keys.append(key)
    return keys


SSH_CONNECTIONS = ("ssh", "ansible.builtin.ssh")
LOCAL_CONNECTIONS = ("local", "ansible.builtin.local")


def node_connection(connection: Any, where: str) -> str:
    """'ssh' or 'local' for the node's connection plugin: ssh is pinned here; local (the controller is the node) has no
    host key to check. Any other plugin (paramiko_ssh auto-adds keys when ANSIBLE_HOST_KEY_CHECKING is False) is
    refused: its host key would not be checked against the pin."""
    name = str(connection or "ssh")
    if name in SSH_CONNECTIONS:
        return "ssh"
    if name in LOCAL_CONNECTIONS:
        return "local"
    raise HostKeyError("%s: ansible_connection=%s: the node is reached with ansible.builtin.ssh, whose host key the "
                       "collection checks against %s; another connection plugin would not check it. Use "
                       "ansible_connection: ssh." % (where, name, VARIABLE))


def known_hosts_text(keys: Sequence[PinnedKey]) -> str:
    """The controller's known_hosts file for one node: the pinned keys, each under :data:`ALIAS`."""
    return "".join("%s %s %s\n" % (ALIAS, k.key_type, k.base64) for k in keys)


def known_hosts_name(keys: Sequence[PinnedKey]) -> str:
    """A file name that changes with the keys: runs of different inventories never share or rewrite one file."""
    return "known_hosts-%s" % hashlib.sha256(known_hosts_text(keys).encode("ascii")).hexdigest()[:24]


def control_path(directory: str, keys: Sequence[PinnedKey], address: Any, port: Any, user: Any) -> str:
    """ssh's ControlPath for connections shared under these keys to this address, port and user: a directory of the pin's
    own and a short name (a socket path must stay under 108 bytes; ssh appends 17 while it makes one). Two inventory
    hosts never share a connection, even if the same key were pinned for both by mistake."""
    ident = "\0".join([known_hosts_text(keys), str(address or ""), str(port or ""), str(user or "")])
    return "%s/%s" % (directory, hashlib.sha256(ident.encode("utf-8")).hexdigest()[:16])


def ssh_args(known_hosts_path: str, control: str) -> str:
    """``ansible_ssh_args`` for the node: ansible.builtin.ssh puts ssh_args first on ssh's command line, and ssh
    takes the first value of each option, so neither its own ``-o StrictHostKeyChecking=no`` (added when
    host_key_checking is false), nor ansible_ssh_common_args/extra_args, nor ~/.ssh/config can undo these. The
    compression and connection sharing of ansible's default ssh_args are kept; the shared connections live under
    :func:`control_path`, so a connection opened earlier without these options (ansible's own ~/.ansible/cp) is never
    reused."""
    opts = [
        "-C", "-o", "ControlMaster=auto", "-o", "ControlPersist=60s",
        "-o", "ControlPath=%s" % control,
        "-o", "StrictHostKeyChecking=yes",
        "-o", "UserKnownHostsFile=%s" % known_hosts_path,
        "-o", "GlobalKnownHostsFile=/dev/null",
        "-o", "HostKeyAlias=%s" % ALIAS,
        "-o", "CheckHostIP=no",
        "-o", "UpdateHostKeys=no",
    ]
    return " ".join(shlex.quote(o) for o in opts)


def allowed_algorithms(keys: Sequence[PinnedKey]) -> List[str]:
    """The host key algorithms paramiko may negotiate: those of the pinned keys, so a node that also has a key of
    another type proves the pinned one."""
    out: List[str] = []
    for k in keys:
        for a in KEY_ALGORITHMS[k.key_type]:
            if a not in out:
                out.append(a)
    return out


def check_server_key(keys: Sequence[PinnedKey], key_type: str, blob: bytes, where: str, address: str) -> None:
    """Accept the key the server proved only if it is one of the pinned keys; refuse it with both fingerprints."""
    if any(k.blob == blob for k in keys):
        return
    raise HostKeyError(
        "%s: the SSH server at %s proved host key %s %s, which is not one the inventory pins for the node (%s: %s). "
        "Refused before authenticating: nothing was sent. If the node's keys really changed (reinstall), read the "
        "new ones at the node's console and pin them; otherwise something else answers at the node's address. %s"
        % (where, address, key_type, fingerprint(blob), VARIABLE,
           ", ".join("%s %s" % (k.key_type, k.fingerprint) for k in keys), CONSOLE_HINT))


def describe(keys: Sequence[PinnedKey]) -> List[Dict[str, str]]:
    return [{"type": k.key_type, "fingerprint": k.fingerprint} for k in keys]
