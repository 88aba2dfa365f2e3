"""Container state: LXC's view of a CT, its cgroups and their pressure, vm_status.

Part of the simulated PVE node (tests/lab/pve/__init__.py).
"""
from __future__ import annotations

import contextlib
import os
import re
import subprocess

from pve import ctconfig, pvenode, pvetasks


def lxc_info(vmid: int) -> tuple[str, int | None]:
    r = subprocess.run(["lxc-info", "-n", str(vmid), "-s", "-p"], capture_output=True, text=True)
    if r.returncode != 0:
        return "stopped", None
    info = {}
    for line in r.stdout.splitlines():
        k, _, v = line.partition(":")
        info[k.strip()] = v.strip()
    pid = int(info["PID"]) if info.get("PID", "").isdigit() else None
    return ("running" if info.get("State") == "RUNNING" else "stopped"), pid


def lxc_raw_state(vmid: int) -> str:
    """LXC's own state name (RUNNING, STOPPING, STOPPED, ...); STOPPED when lxc-info knows no such CT."""
    r = subprocess.run(["lxc-info", "-n", str(vmid), "-s"], capture_output=True, text=True)
    m = re.search(r"State:\s*(\S+)", r.stdout or "")
    return m.group(1) if r.returncode == 0 and m else "STOPPED"


def is_running(vmid: int) -> bool:
    return lxc_info(vmid)[0] == "running"


def cgroup_dir(pid: int, controller: str = "memory") -> str | None:
    """The container's limiting cgroup (lxc/<vmid>, the parent of the CT's inner 'ns')."""
    try:
        with open(f"/proc/{pid}/cgroup") as f:
            for line in f:
                _, ctrls, path = line.rstrip("\n").split(":", 2)
                if controller in ctrls.split(","):
                    m = re.match(r"^(/lxc/\d+)(/|$)", path)  # the CT's own tree lives below lxc/<vmid>/ns
                    return f"/sys/fs/cgroup/{controller}{m.group(1) if m else path}"
    except OSError:
        pass
    return None


def _read_int(path: str, default: int = 0) -> int:
    try:
        with open(path) as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return default


# PVE 9 (pve-container src/PVE/LXC.pm vmstatus, running CTs only): `pressure<type><some|full>` = the avg10 of
# /sys/fs/cgroup/lxc/<vmid>/<type>.pressure (pve-common ProcFSTools read_cgroup_pressure, parse_pressure: the
# regex capture, so a JSON string such as "0.00"); a file or line that is missing leaves the value undefined
# (JSON null). The lab host's cgroups are v1 hybrid: the same files live in its v2 tree, /sys/fs/cgroup/unified.
PRESSURE_KEYS = [(t, kind) for t in ("cpu", "io", "memory") for kind in ("some", "full")]
_PRESSURE_RE = re.compile(r"^(some|full)\s+avg10=(\d+\.\d+)\s+avg60=(\d+\.\d+)\s+avg300=(\d+\.\d+)\s+total=(\d+)")


def cgroup_pressure(vmid: int) -> dict:
    base = next((d for d in ("/sys/fs/cgroup/unified", "/sys/fs/cgroup") if os.path.isdir(f"{d}/lxc/{int(vmid)}")),
                "/sys/fs/cgroup/unified")
    found: dict = {}
    for typ in ("cpu", "io", "memory"):
        with contextlib.suppress(OSError):
            with open(f"{base}/lxc/{int(vmid)}/{typ}.pressure") as f:
                for line in f:
                    m = _PRESSURE_RE.match(line)
                    if m:
                        found[(typ, m.group(1))] = m.group(2)
    return {f"pressure{t}{kind}": found.get((t, kind)) for t, kind in PRESSURE_KEYS}


def vm_status(vmid: int, node: str | None = None) -> dict:
    conf = ctconfig.load_config(vmid, node)
    state, pid = lxc_info(vmid)
    mem = int(conf.get("memory", 512)) * pvenode.MIB
    swap = int(conf.get("swap", 512)) * pvenode.MIB
    res = {"vmid": int(vmid), "name": conf.get("hostname", f"CT{vmid}"), "status": state, "type": "lxc",
           "maxmem": mem, "maxswap": swap, "mem": 0, "swap": 0, "cpus": int(conf.get("cores", 1) or 1),
           "cpu": 0, "uptime": 0, "maxdisk": 8 * 1024 ** 3, "disk": 0, "netin": 0, "netout": 0,
           "diskread": 0, "diskwrite": 0, "ha": {"managed": 0}, "tags": conf.get("tags", "")}
    if conf.get("lock"):
        res["lock"] = conf["lock"]
    if conf.get("template") == "1":
        res["template"] = 1
    if state == "running" and pid:
        res["pid"] = pid
        cg = cgroup_dir(pid)
        if cg:
            usage = _read_int(f"{cg}/memory.usage_in_bytes")
            cache = 0
            with contextlib.suppress(OSError):
                for line in open(f"{cg}/memory.stat"):
                    k, v = line.split()
                    if k == "total_cache":
                        cache = int(v)
            # PVE: mem = usage minus page cache (pve-common CGroup.pm get_memory_stat), cgroup v1 analogue
            res["mem"] = max(0, usage - cache)
            res["swap"] = max(0, _read_int(f"{cg}/memory.memsw.usage_in_bytes") - usage)
        res.update(cgroup_pressure(vmid))
        st = pvetasks.proc_starttime(pid)
        if st is not None:
            hz = os.sysconf("SC_CLK_TCK")
            with open("/proc/uptime") as f:
                up = float(f.read().split()[0])
            res["uptime"] = max(0, int(up - st / hz))
    return res


def list_cts(node: str | None = None) -> list[int]:
    d = pvenode.conf_dir(node)
    if not os.path.isdir(d):
        return []
    return sorted(int(n[:-5]) for n in os.listdir(d) if re.fullmatch(r"\d+\.conf", n))
