# -*- coding: utf-8 -*-
# Copyright: inferops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Role variables renamed for their unit, and the deprecation said while the old name is still read (no Ansible
imports).

A variable in seconds ends in ``_s``, a share of one in ``_fraction``, as the Python reading it does. The old name keeps working for one release: the
new name's default in the role's defaults/main.yml is the old name's value when set; the action of the stage that
reads the role's settings says, each run, that the old name is deprecated and which name replaces it.
"""
from __future__ import annotations

from typing import Dict, Iterable, List

#: The collection's release from which the old names are no longer read.
REMOVED_IN = "0.3.0"
COLLECTION = "inferops.gpu_inference"

#: Old name -> new name.
RENAMED: Dict[str, str] = {
    "sglang_server_stop_timeout": "sglang_server_stop_timeout_s",
    "sglang_server_health_timeout": "sglang_server_health_timeout_s",
    "sglang_server_release_timeout": "sglang_server_release_timeout_s",
    "pve_gpu_container_api_timeout": "pve_gpu_container_api_timeout_s",
    "pve_gpu_container_task_timeout": "pve_gpu_container_task_timeout_s",
    "pve_gpu_container_baseline_wait": "pve_gpu_container_baseline_wait_s",
    "sglang_server_verify_memory_tolerance": "sglang_server_verify_memory_tolerance_fraction",
}


def deprecations(names: Iterable[str], prefix: str = "") -> List[Dict[str, str]]:
    """One deprecation (as a module's result carries them: msg, version, collection_name) for each old name among
    ``names`` (the variables the run gives the host) that starts with ``prefix`` (a role's)."""
    out = []
    for old in sorted(set(str(n) for n in names)):
        if old in RENAMED and old.startswith(prefix):
            out.append({
                "msg": "%s is renamed %s (named with its unit): the old name is still read when the new one "
                       "is not set, until %s %s; set %s instead" % (old, RENAMED[old], COLLECTION, REMOVED_IN, RENAMED[old]),
                "version": REMOVED_IN,
                "collection_name": COLLECTION,
            })
    return out
