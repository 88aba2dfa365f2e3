#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: inferops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# The work is done by the action plugin of the same name (plugins/action/pin_host_keys.py) on the controller.
from __future__ import annotations

DOCUMENTATION = r"""
module: pin_host_keys
short_description: Check the node's pinned SSH host keys and give the ssh options that accept only them
version_added: "0.3.0"
author:
  - inferops team (@inferops)
description:
  - Runs on the controller and contacts nothing. Refuses a node with no pinned host key (or a malformed one),
    saying how to read the keys at the node's console; C(ssh-keyscan) output is not proof of the node.
  - Writes the keys to a known_hosts file of the controller user (C(~/.ansible/inferops-ssh/), directory mode 0700,
    file mode 0600, written atomically) and returns C(ssh_args), which the node plays of C(deploy.yml) and
    C(recover.yml) set as C(ansible_ssh_args) with C(ansible_host_key_checking=true); ssh then accepts only those
    keys whatever C(ANSIBLE_HOST_KEY_CHECKING) says (AWX sets it to C(False)).
  - The container connection (inferops.gpu_inference.pct_remote) checks the same variable itself.
options:
  host_keys:
    description:
      - The node's public host keys, lines of its C(/etc/ssh/ssh_host_*_key.pub) (C(TYPE BASE64 [comment])); a list,
        or one string of lines. The playbooks pass C(proxmox_node_ssh_host_keys).
    type: raw
    required: true
  connection:
    description:
      - The node's connection plugin (the playbooks pass C(ansible_connection)). C(ssh) is pinned; C(local) (the
        controller is the node) needs no key; any other plugin is refused, since it would not check the pin.
    type: str
    default: ssh
  address:
    description: The node's address (C(ansible_host)); with O(port) and O(user) it names the shared ssh connection.
    type: str
  port:
    description: The node's SSH port (C(ansible_port)).
    type: raw
  user:
    description: The SSH user (C(ansible_user)).
    type: str
extends_documentation_fragment:
  - inferops.gpu_inference.attributes
attributes:
  check_mode:
    support: full
    details: The known_hosts file is written in check mode too; the connection needs it.
  diff_mode:
    support: none
"""

EXAMPLES = r"""
- name: Pin the node's SSH host keys
  inferops.gpu_inference.pin_host_keys:
    host_keys: "{{ proxmox_node_ssh_host_keys | default(none) }}"
    connection: "{{ ansible_connection | default('ssh') }}"
  register: __node_host_keys
"""

RETURN = r"""
ssh_args:
  description: The ssh options (for C(ansible_ssh_args)) that accept only the pinned keys.
  returned: success
  type: str
known_hosts:
  description: The controller's known_hosts file holding the pinned keys.
  returned: success
  type: str
fingerprints:
  description: Type and SHA256 fingerprint of each pinned key.
  returned: success
  type: list
  elements: dict
"""
