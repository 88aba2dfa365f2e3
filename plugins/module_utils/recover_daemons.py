# -*- coding: utf-8 -*-
# Copyright (c) 2026, inferops
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Host daemons that hold the GPUs' device files and block a GPU reset (rung 5).

nvidia-persistenced keeps /dev/nvidia* open so the driver keeps the GPUs initialised (NVIDIA, Driver
Persistence); any open client makes ``nvidia-smi -r`` fail with "In use by another client"
(NVIDIA/gpu-operator#118: "nvidia-persistenced keeps a handle on the GPU and blocks --gpu-reset"). Reset
sequences stop it first and start it again afterwards (NVIDIA ai-cloud-validation PR #603, IBM/CAST#551).

Rung 5 stops only the daemons listed here, on the host, and starts each again the way it ran: through its
systemd unit when it runs in one, else with its own command line. Every other host process that holds a GPU
(DCGM, exporters, a monitoring loop, another tenant) is a client: the reset of that GPU is refused and named.

No Ansible imports: unit-tested in tests/unit/plugins/module_utils/test_recover_daemons.py.
"""
from __future__ import annotations

import re
from typing import Any, Mapping, Optional, Sequence

# comm (the kernel keeps 15 characters) -> what the daemon is called.
STOPPABLE = {"nvidia-persiste": "nvidia-persistenced"}

_UNIT_RE = re.compile(r"/([^/]+\.service)$")


def unit_of(cgroup: Mapping[str, str]) -> Optional[str]:
    """The systemd service a process runs in, from /proc/PID/cgroup (v2 "" or v1 "name=systemd")."""
    for key in ("", "name=systemd"):
        path = cgroup.get(key)
        if path:
            m = _UNIT_RE.search(path)
            if m:
                return m.group(1)
    return None


def parse_cmdline(raw: bytes) -> list[str]:
    """/proc/PID/cmdline as argv."""
    return [a.decode("utf-8", "surrogateescape") for a in raw.split(b"\0") if a]


def split_host_holders(holders: Sequence[Mapping[str, Any]], gpus: Sequence[int],
                       stop_daemons: bool) -> dict[str, list[dict[str, Any]]]:
    """Split the processes holding any of ``gpus`` into daemons rung 5 may stop and clients that block the reset.

    holders: recover_procs.read_process dicts (pid, comm, starttime, vmid, cgroup, gpu_fds). A daemon is a host
    process (vmid None) whose comm is in STOPPABLE; inside a container the same name is a client like any other.
    """
    wanted = set(gpus)
    daemons: list[dict[str, Any]] = []
    clients: list[dict[str, Any]] = []
    for h in holders:
        held = sorted(wanted & set(h.get("gpu_fds") or []))
        if not held:
            continue
        name = STOPPABLE.get(h.get("comm") or "")
        if stop_daemons and name and h.get("vmid") is None:
            daemons.append({"name": name, "pid": h["pid"], "starttime": h.get("starttime"),
                            "unit": unit_of(h.get("cgroup") or {}), "gpus": sorted(h.get("gpu_fds") or [])})
        else:
            clients.append(dict(h, held=held))
    return {"daemons": daemons, "clients": clients}


def describe(daemon: Mapping[str, Any]) -> str:
    how = "systemd unit %s" % daemon["unit"] if daemon.get("unit") else "its own command line %s" % " ".join(
        daemon.get("argv") or [])
    return "%s (pid %s), started again through %s" % (daemon["name"], daemon["pid"], how)
