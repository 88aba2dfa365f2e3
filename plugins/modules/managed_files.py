#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: inferops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# The work is done by the action plugin of the same name (plugins/action/managed_files.py).
from __future__ import annotations

DOCUMENTATION = r"""
module: managed_files
short_description: Copy many controller files to a target, comparing all of them in one command
version_added: "0.1.0"
author:
  - inferops team (@inferops)
description:
  - Takes the controller's SHA-256 of every file it manages (O(files), and every regular file under each O(trees)
    directory), reads the target's digest, mode and owner of all of them with one command (the target's Python),
    and copies only the files whose content differs or is missing (one transfer each, to a temporary file beside
    the destination, then one command checks each copy's digest, sets owner and mode and renames it into place).
    A file whose content is the same but whose mode or owner differs is fixed in that command too.
  - A run that changes nothing costs one command on the target, however many files it manages.
  - Missing parent directories of a copied file are made with O(directory_mode), O(owner) and O(group).
  - A destination that exists and is not a regular file (a directory, a symlink) is refused; nothing is changed.
  - A destination with a line break or another control character (tree files included) is refused before any
    change; any other character (spaces, C($), quotes) is carried exactly.
  - Each copy goes into a temporary file made empty with mode 0600 before the transfer writes into it (a leftover or
    a symlink at that name is removed, never followed); its final owner and mode are set only once it is complete,
    so a secret is never readable by a group or other user, even when a run dies between the two steps.
  - Files on the target that the task does not name are left alone (as the copy module does).
options:
  files:
    description: Files to manage. C(src) is looked up as the copy module does (a role's C(files/), or a path on the
      controller), or C(content) a string rendered on the controller (staged in a private temporary file, never
      returned); C(dest) is the full path on the target (ending in C(/) it is a directory, where the file keeps its name);
      C(mode), C(owner) and C(group) override O(mode), O(owner) and O(group) for that file; C(validate) is a command
      run on the new file (C(%s) is its temporary path beside the destination) before any file of the task is renamed
      into place, as the copy module's C(validate); when it fails, every new file is removed and nothing is changed.
      Set C(no_log) on a task whose contents are secret (the result names paths and digests only).
    type: list
    elements: dict
    default: []
  srcs:
    description: Controller files (looked up as O(files)' C(src)) copied into O(dest_dir) under their own names.
    type: list
    elements: path
    default: []
  dest_dir:
    description: The target directory O(srcs) go into (required with O(srcs)).
    type: path
  trees:
    description: Controller directories (C(src)) whose regular files are managed at the same relative paths under
      C(dest) (the copy module's C(src) ending in C(/)).
    type: list
    elements: dict
    default: []
  directories:
    description: Directories that must exist with O(directory_mode), O(owner) and O(group) (made, with their
      missing parents, or their mode and owner set), read in the same command as the files.
    type: list
    elements: path
    default: []
  owner:
    description: Owner of every managed file (a user name on the target); null leaves it to the connection's user
      (a file on the controller, written by whoever runs the playbook).
    type: str
    default: root
  group:
    description: Group of every managed file (a group name on the target); null leaves it as made.
    type: str
    default: root
  mode:
    description: Mode of the files (a quoted octal string).
    type: str
    default: "0644"
  directory_mode:
    description: Mode of the directories it makes, and of O(directories) (a quoted octal string).
    type: str
    default: "0755"
  python:
    description: The target's Python 3 (stdlib only) that reads and installs the files.
    type: path
    default: /usr/bin/python3
extends_documentation_fragment:
  - inferops.gpu_inference.attributes
attributes:
  check_mode:
    support: full
    details: Reads the target's state and reports what it would copy or fix; changes nothing.
  diff_mode:
    support: full
    details: Per file that changes, its digest, mode and owner before and after (contents may be binary); for
      C(content) given inline, also its text before and after (up to 256 KiB); per directory made or fixed, its mode.
"""

EXAMPLES = r"""
- name: Install the launcher and its memory tool, and the model
  inferops.gpu_inference.managed_files:
    files:
      - {src: sglang_launch.py, dest: /usr/local/libexec/sglang/sglang_launch.py, mode: "0755"}
    trees:
      - {src: /srv/models/tiny/, dest: /opt/models/tiny}

- name: Install a systemd unit rendered on the controller, checked before it replaces the old one
  inferops.gpu_inference.managed_files:
    directories: [/etc/sglang]
    files:
      - content: "{{ lookup('ansible.builtin.template', 'sglang.service.j2') }}"
        dest: /etc/systemd/system/sglang.service
        validate: /usr/bin/systemd-analyze verify %s:sglang.service
"""

RETURN = r"""
directories_made:
  description: Directories of O(directories) that were (or would be) made.
  type: list
  elements: str
  returned: always
copied:
  description: Destinations whose content was (or, in check mode, would be) copied.
  type: list
  elements: str
  returned: always
attributes_fixed:
  description: Destinations whose content was the same and whose mode or owner was (or would be) set.
  type: list
  elements: str
  returned: always
unchanged:
  description: How many managed files were already as asked.
  type: int
  returned: always
bytes_copied:
  description: Bytes of the copied files.
  type: int
  returned: always
"""
