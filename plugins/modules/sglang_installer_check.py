#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: inferops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# The work is done by the action plugin of the same name (plugins/action/sglang_installer_check.py) on the controller.
from __future__ import annotations

DOCUMENTATION = r"""
module: sglang_installer_check
short_description: Refuse an NVIDIA installer the inventory does not vouch for, and check what it installed
version_added: "0.1.0"
author:
  - inferops team (@inferops)
description:
  - Before the installer runs as root in the container, its sha256 as read there must be the one the inventory gives
    (C(sglang_server_nvidia_installer_sha256)); after it ran, nvidia-smi in the container must report the node's
    driver version (C(module_utils/deploy/supply_chain.py)).
options:
  expected_sha256:
    description: (before) The sha256 M(inferops.gpu_inference.sglang_launch) returned for the installer.
    type: str
  sha256:
    description: (before) The installer's sha256 as read in the container.
    type: str
  path:
    description: (before) The installer's path in the container, for the message.
    type: str
  node_driver_version:
    description: (after) The node's driver version; given, the check is the one after the installer ran.
    type: str
  nvidia_smi_stdout:
    description: (after) nvidia-smi's C(--query-gpu=driver_version) output in the container.
    type: str
extends_documentation_fragment:
  - inferops.gpu_inference.attributes
  - inferops.gpu_inference.deploy_stage
"""

EXAMPLES = r"""
- name: Refuse an installer whose sha256 is not the inventory's
  inferops.gpu_inference.sglang_installer_check:
    expected_sha256: "{{ __sglang_server_installer_sha256 }}"
    sha256: "{{ __sglang_server_installer_stat.stat.checksum | default('') }}"
    path: /root/NVIDIA-Linux-x86_64-580.95.05.run
"""

RETURN = r"""
sha256:
  description: (before) The sha256 checked.
  type: str
  returned: before the installer runs
driver_version:
  description: (after) The container's userspace driver version, the node's.
  type: str
  returned: after the installer ran
"""
