# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Reading the machine's /proc, /sys and /dev under a ``root`` prefix, and the one /proc/PID/cgroup parser.

Shared by gpu_facts (the facts of the machine it runs on) and the recover code (the node's view of a container).
Every reader takes a path already joined with ``join_root``, so the unit tests can lay out a fake ``/proc`` and
``/sys`` under a temporary directory. No Ansible imports.
"""

from __future__ import annotations

import os
from typing import Mapping, Optional


def join_root(root: str, path: str) -> str:
    """``path`` (absolute, as on the machine) below ``root``: join_root("/tmp/x", "/proc/1") is /tmp/x/proc/1."""
    return os.path.join(root, path.lstrip("/"))


def read_text(path: str) -> Optional[str]:
    """The file's text (undecodable bytes replaced), or None when it cannot be read (gone, no permission)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read()
    except OSError:
        return None


def parse_proc_cgroup(text: Optional[str]) -> dict[str, str]:
    """/proc/PID/cgroup as {controllers: path}: "" is the cgroup v2 line (``0::/path``), a v1 hierarchy is keyed by
    its controller list (``memory``, ``cpu,cpuacct``, ``name=systemd``). Lines of another shape are skipped."""
    result: dict[str, str] = {}
    for line in (text or "").splitlines():
        parts = line.strip().split(":", 2)
        if len(parts) == 3:
            result[parts[1]] = parts[2]
    return result


def cgroup_path_of(cgroup: Mapping[str, str], controller: str) -> Optional[str]:
    """The path of the hierarchy that holds ``controller`` ("" for cgroup v2) in a parsed /proc/PID/cgroup."""
    for controllers, path in cgroup.items():
        if controller in (controllers.split(",") if controllers else [""]):
            return path
    return None
