# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""What every stage action of the deploy (sglang_request, sglang_node_gate, sglang_launch, sglang_verify,
sglang_installer_check, sglang_restart_plan) shares: where it runs, what it refuses, its attributes."""

from __future__ import annotations


class ModuleDocFragment:
    DOCUMENTATION = r"""
options: {}
notes:
  - Like every action of the deploy, refuses extra variables (C(-e), survey answers) the run's entry playbook does not
    document (M(inferops.gpu_inference.extra_vars_check)'s allow-list) and private names of the roles' or playbooks'
    form (C(__sglang_server_*), C(__pve_gpu_container_*), ...) set in the inventory for the host.
  - Runs on the controller and contacts nothing. Used by the roles C(sglang_server) and C(pve_gpu_container); not
    meant to be called by playbooks directly.
attributes:
  check_mode:
    support: full
    details: The action only computes; it never changes anything.
  diff_mode:
    support: none
"""
