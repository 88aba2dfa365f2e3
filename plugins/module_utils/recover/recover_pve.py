# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""What Proxmox VE and systemd say about a container, as the recovery ladder reads them from the node: the texts
of ``pct status``, ``pct config``, ``pct list`` and ``systemctl show``, and the container's memory cgroup (found
from its init's /proc/PID/cgroup and the node's cgroup mounts, so no layout is hard-coded).

No Ansible imports; read-only. Unit-tested in tests/unit/plugins/module_utils/recover/test_recover_pve.py.
"""

from __future__ import annotations

import os
import re
from typing import Any, Mapping, Optional

from ansible_collections.inferops.gpu_inference.plugins.module_utils.host.gpu_facts import ParseError, parse_cgroup_memory_value
from ansible_collections.inferops.gpu_inference.plugins.module_utils.host.procfs import (
    cgroup_path_of, join_root, parse_proc_cgroup, read_text)
from ansible_collections.inferops.gpu_inference.plugins.module_utils.pve.pve_gpu_devices import config_gpus
from ansible_collections.inferops.gpu_inference.plugins.module_utils.recover.recover_procs import parse_mountinfo


# --------------------------------------------------------------------------- pct and systemctl


def parse_pct_status(text: Optional[str]) -> dict[str, Any]:
    """``pct status <vmid> --verbose`` (or without --verbose): status and init pid."""
    result: dict[str, Any] = {"status": None, "pid": None}
    for line in (text or "").splitlines():
        key, sep, value = line.partition(":")
        if not sep:
            continue
        key, value = key.strip(), value.strip()
        if key == "status":
            result["status"] = value
        elif key == "pid" and value.isdigit():
            result["pid"] = int(value)
    return result


def parse_pct_config_gpus(text: Optional[str]) -> list[int]:
    """GPU device minors (N of /dev/nvidiaN: recover_smi.gpu_numbering turns them into nvidia-smi indexes) passed to
    a container, from ``pct config`` text: ``devN: /dev/nvidiaX[,opts]`` (or
    ``path=/dev/nvidiaX``) entries and raw ``lxc.mount.entry: /dev/nvidiaX ...`` lines, read by
    pve_gpu_devices.config_gpus (the node plan's reading). Snapshot and [pending] sections are ignored."""
    config: dict[str, Any] = {}
    raw_lines: list[list[str]] = []
    for raw in (text or "").splitlines():
        line = raw.strip()
        if line.startswith("["):
            break  # a snapshot or [pending] section: not the current config
        key, sep, value = line.partition(":")
        if not sep:
            continue
        if key.strip().startswith("lxc."):
            raw_lines.append([key.strip(), value.strip()])
        else:
            config[key.strip()] = value.strip()
    config["lxc"] = raw_lines
    return config_gpus(config)


def parse_pct_config_tags(text: Optional[str]) -> list[str]:
    """The PVE tags of a container from ``pct config`` text (``tags: a;b``; PVE also accepts ',' and spaces between
    tags, pve-container's ``tags`` format). Snapshot and [pending] sections are ignored."""
    for raw in (text or "").splitlines():
        line = raw.strip()
        if line.startswith("["):
            break
        key, sep, value = line.partition(":")
        if sep and key.strip() == "tags":
            return [t for t in re.split(r"[;, ]+", value.strip()) if t]
    return []


_LIST_ROW = re.compile(r"^\s*(\d+)\s+(\S+)(?:\s|$)")


def parse_pct_list(text: Optional[str]) -> dict[int, str]:
    """{VMID: status} from ``pct list`` (VMID Status Lock Name; the header and blank lines skipped)."""
    rows: dict[int, str] = {}
    for line in (text or "").splitlines():
        match = _LIST_ROW.match(line)
        if match:
            rows[int(match.group(1))] = match.group(2)
    return rows


def parse_systemctl_show(text: Optional[str]) -> dict[str, str]:
    result: dict[str, str] = {}
    for line in (text or "").splitlines():
        key, sep, value = line.partition("=")
        if sep:
            result[key.strip()] = value.strip()
    return result


# --------------------------------------------------------------------------- the container's memory cgroup


def cgroup_mounts(root: str = "/") -> dict[str, str]:
    """{"" : v2 mount point, "memory": v1 memory mount point, ...} from /proc/self/mountinfo."""
    mounts: dict[str, str] = {}
    for m in parse_mountinfo(read_text(join_root(root, "/proc/self/mountinfo"))):
        if m["fstype"] == "cgroup2":
            mounts.setdefault("", m["mount_point"])
        elif m["fstype"] == "cgroup":
            for opt in m["super_options"].split(","):
                if opt in ("memory", "pids", "cpu", "cpuacct", "devices", "freezer") or opt.startswith("name="):
                    mounts.setdefault(opt, m["mount_point"])
    return mounts


def cgroup2_options(root: str = "/") -> set[str]:
    """The super options of the node's cgroup v2 mount (/proc/self/mountinfo), e.g. nsdelegate, memory_recursiveprot,
    memory_localevents; empty without one."""
    for m in parse_mountinfo(read_text(join_root(root, "/proc/self/mountinfo"))):
        if m["fstype"] == "cgroup2":
            return set(m["super_options"].split(","))
    return set()


def container_cgroup_dir(init_cgroup: Mapping[str, str], vmid: int, controller: str) -> Optional[str]:
    """The container's top cgroup path (``/lxc/<vmid>`` on PVE, ``/lxc.payload.<vmid>`` on plain LXC) in one
    hierarchy, cut from the init's cgroup path (so no layout is hard-coded)."""
    path = cgroup_path_of(init_cgroup, controller)
    parts = (path or "").split("/")
    for i, part in enumerate(parts):
        if part == "lxc.payload.%d" % vmid or (part == str(vmid) and i > 0 and parts[i - 1] in ("lxc", "lxc.payload")):
            return "/".join(parts[: i + 1]) or "/"
    return None


def held_bytes(usage: Optional[int], stat_text: Optional[str], version: int) -> Optional[int]:
    """What the cgroup holds that the kernel cannot reclaim as page cache: its usage less the file LRU lists
    (``active_file`` + ``inactive_file``; v1: the hierarchical ``total_*``). Shared memory (tmpfs, MAP_SHARED
    anonymous: SGLang's host pools from 0.5.15, and up to 0.5.4) is swap-backed and sits on the anon lists, so it
    stays in (Documentation/admin-guide/cgroup-v2.rst, memory.stat: ``file`` includes shmem, the LRU lists are
    split by swap-backed or not). PVE's own ``mem`` (usage less ``file``/``total_cache``) leaves shmem out, so it
    misses the pinned pools. None when the usage or the file lists cannot be read."""
    if usage is None or not stat_text:
        return None
    prefix = "total_" if version == 1 else ""
    stat = dict(re.findall(r"^(\w+) (\d+)$", stat_text, re.M))
    try:
        lru_file = int(stat[prefix + "active_file"]) + int(stat[prefix + "inactive_file"])
    except KeyError:
        return None
    return max(0, usage - lru_file)


def oom_kills_under(cgroup_dir: str, events_file: str, version: int, local_events: bool = False) -> Optional[int]:
    """OOM kills of a container's processes, wherever in its cgroup tree they ran. v2: ``memory.events``'
    ``oom_kill``, hierarchical already (``memory.events.local`` is the local one: Documentation/admin-guide/
    cgroup-v2.rst), so a kill in a cgroup since removed still counts. v1: ``memory.oom_control``'s ``oom_kill`` counts
    only kills in that memcg (seen on the lab's hybrid host: a kill in ``/lxc/129/ns/<child>`` left ``/lxc/129``'s
    counter at 0), so the counters of the container's cgroup and every cgroup below it are added up. The same for v2
    when the hierarchy is mounted with ``memory_localevents`` (``local_events``): ``memory.events`` then counts only
    the cgroup's own events (seen on a real kernel: a kill in ``ns/system.slice/<unit>`` left ``/lxc/<vmid>``'s
    counter as it was), so ``memory.events.local`` of every cgroup of the container is added up; a kill in a cgroup
    since removed is then lost, as on v1. None when the container's own counter is unreadable."""
    if version == 2 and local_events:
        events_file = "memory.events.local"

    def one(d: str) -> Optional[int]:
        m = re.search(r"^oom_kill (\d+)", read_text(d + "/" + events_file) or "", re.M)
        return int(m.group(1)) if m else None

    total = one(cgroup_dir)
    if total is None or (version == 2 and not local_events):
        return total
    for parent, dirs, _files in os.walk(cgroup_dir):
        for name in dirs:
            total += one(os.path.join(parent, name)) or 0
    return total


def container_memory(vmid: int, init_pid: Optional[int], root: str = "/") -> dict[str, Any]:
    """Memory limit, usage, what it holds beyond reclaimable page cache (:func:`held_bytes`) and OOM-kill count of
    the container's cgroup (v2 or v1), None when stopped."""
    result: dict[str, Any] = {"cgroup_version": None, "path": None, "memory_limit_bytes": None,
                              "memory_usage_bytes": None, "memory_held_bytes": None, "oom_kills": None}
    if not init_pid:
        return result
    cg = parse_proc_cgroup(read_text(join_root(root, "/proc/%d/cgroup" % init_pid)))
    mounts = cgroup_mounts(root)

    def num(text: Optional[str]) -> Optional[int]:
        try:
            return parse_cgroup_memory_value(text)
        except ParseError:
            return None

    # (version, controller, limit file, usage file, file with the oom_kill counter); v2 first, as on PVE 7+
    layouts = ((2, "", "memory.max", "memory.current", "memory.events"),
               (1, "memory", "memory.limit_in_bytes", "memory.usage_in_bytes", "memory.oom_control"))
    for version, controller, limit_file, usage_file, events_file in layouts:
        path = container_cgroup_dir(cg, vmid, controller)
        if not path or controller not in mounts:
            continue
        d = join_root(root, mounts[controller] + path)
        if not os.path.exists(d + "/" + limit_file):
            continue
        usage = num(read_text(d + "/" + usage_file))
        result.update(cgroup_version=version, path=path, memory_limit_bytes=num(read_text(d + "/" + limit_file)),
                      memory_usage_bytes=usage, memory_held_bytes=held_bytes(usage, read_text(d + "/memory.stat"), version),
                      oom_kills=oom_kills_under(d, events_file, version,
                                                local_events=version == 2 and "memory_localevents" in cgroup2_options(root)))
        break
    return result
