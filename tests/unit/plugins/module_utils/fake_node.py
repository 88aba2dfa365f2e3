# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A node's /proc and /sys laid out under a temporary directory, for the recover code's ``root`` argument."""
from __future__ import annotations


def fake_proc(tmp_path, pid, files):
    """/proc/<pid>/<name> files with the given texts; returns the /proc/<pid> directory."""
    base = tmp_path / "proc" / str(pid)
    for rel, content in files.items():
        p = base / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(content)
    return base


def v2_container(tmp_path, init_pid, vmid, files):
    """A PVE container on a pure cgroup v2 node: its init in lxc/<vmid>/ns, the cgroup2 mount, and the container's
    cgroup files (memory.max, ...) with the given texts."""
    fake_proc(tmp_path, init_pid, {"cgroup": "0::/lxc/%d/ns/init.scope\n" % vmid})
    fake_proc(tmp_path, "self", {"mountinfo": "26 25 0:23 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw,nsdelegate\n"})
    d = tmp_path / ("sys/fs/cgroup/lxc/%d" % vmid)
    d.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (d / name).write_text(text)
    return d
