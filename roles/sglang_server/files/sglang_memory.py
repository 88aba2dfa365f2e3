#!/usr/bin/env python
# -*- coding: utf-8 -*-
# Copyright: inferops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Memory facts and start guard for an SGLang systemd service (stdlib only, runs in the container).

  sglang_memory.py measure [--unit sglang.service]
      JSON on stdout: /proc/meminfo (bytes), the cgroup memory usage, and every process of the unit
      (name, RssAnon, RssShmem, RssFile in bytes), with totals for the unit and its scheduler ranks.
  sglang_memory.py guard --launch /etc/sglang/launch.json
      Exit 0 when SGLang may start: no GPU visible here holds more than the allowed memory, and
      MemAvailable covers what the plan needs. Otherwise print why and exit 1 (systemd ExecStartPre=).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

KIB = 1024


def meminfo() -> dict:
    out = {}
    with open("/proc/meminfo") as f:
        for line in f:
            key, _sep, rest = line.partition(":")
            parts = rest.split()
            if not parts:
                continue
            value = int(parts[0]) * (KIB if len(parts) > 1 and parts[1] == "kB" else 1)
            out[key.strip()] = value
    return {
        "mem_total_bytes": out.get("MemTotal", 0),
        "mem_available_bytes": out.get("MemAvailable", 0),
        "shmem_bytes": out.get("Shmem", 0),
        "mlocked_bytes": out.get("Mlocked", 0),
    }


def cgroup_usage() -> int | None:
    for path in ("/sys/fs/cgroup/memory.current", "/sys/fs/cgroup/memory/memory.usage_in_bytes"):
        try:
            with open(path) as f:
                return int(f.read().strip())
        except (OSError, ValueError):
            continue
    return None


def unit_pids(unit: str) -> list[int]:
    pids = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/cgroup") as f:
                text = f.read()
        except OSError:
            continue
        if any(line.rstrip().endswith("/" + unit) or ("/" + unit + "/") in line for line in text.splitlines()):
            pids.append(int(name))
    return sorted(pids)


def proc_info(pid: int) -> dict | None:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
        status = {}
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                key, _sep, rest = line.partition(":")
                status[key] = rest.strip()
    except OSError:
        return None

    def kb(key: str) -> int:
        value = status.get(key, "0 kB").split()
        return int(value[0]) * KIB if value else 0

    name = argv[0].decode(errors="replace").strip() if argv and argv[0] else status.get("Name", "")
    return {
        "pid": pid,
        "name": name,
        "rss_anon_bytes": kb("RssAnon"),
        "rss_shmem_bytes": kb("RssShmem"),
        "rss_file_bytes": kb("RssFile"),
    }


def measure(unit: str) -> dict:
    procs = [p for p in (proc_info(pid) for pid in unit_pids(unit)) if p]
    ranks = [p for p in procs if p["name"].startswith("sglang::scheduler")]

    def held(items):
        return sum(p["rss_anon_bytes"] + p["rss_shmem_bytes"] for p in items)

    return {
        "unit": unit,
        "meminfo": meminfo(),
        "cgroup_memory_usage_bytes": cgroup_usage(),
        "processes": procs,
        "unit_held_bytes": held(procs),
        "rank_count": len(ranks),
        "ranks_held_bytes": held(ranks),
        "ranks_shmem_bytes": sum(p["rss_shmem_bytes"] for p in ranks),
    }


def gpu_used_mib(smi: str) -> list[tuple[str, int]]:
    r = subprocess.run([smi, "--query-gpu=index,memory.used", "--format=csv,noheader,nounits"],
                       capture_output=True, text=True, check=False)
    if r.returncode != 0:
        raise RuntimeError(f"{smi} failed ({r.returncode}): {(r.stderr or r.stdout).strip()}")
    rows = []
    for line in r.stdout.strip().splitlines():
        index, used = [x.strip() for x in line.split(",")[:2]]
        rows.append((index, int(float(used))))
    return rows


def guard(launch_path: str) -> int:
    with open(launch_path) as f:
        launch = json.load(f)
    g = launch.get("guard", {})
    problems = []
    try:
        for index, used in gpu_used_mib(g.get("nvidia_smi", "/usr/bin/nvidia-smi")):
            if used > int(g.get("gpu_used_max_mib", 256)):
                problems.append(f"GPU {index} still holds {used} MiB (allowed {g.get('gpu_used_max_mib', 256)} MiB): "
                                "a previous SGLang or a leftover process has not released it")
    except (RuntimeError, OSError, ValueError) as exc:
        problems.append(f"cannot read GPU memory: {exc}")
    need = int(g.get("required_available_bytes", 0))
    avail = meminfo()["mem_available_bytes"]
    if g.get("memory_check", True) and need and avail < need:
        problems.append(f"MemAvailable {avail / 1e9:.2f} GB is below the {need / 1e9:.2f} GB the plan needs "
                        f"(reserve + processes + {launch.get('plan', {}).get('ranks_per_host', '?')} host KV pools)")
    elif not g.get("memory_check", True):
        print("sglang start guard: WARNING: memory check disabled (sglang_server_hicache_guard=false)", file=sys.stderr)
    if problems:
        for p in problems:
            print(f"sglang start guard: refusing to start: {p}", file=sys.stderr)
        return 1
    print(f"sglang start guard: ok (MemAvailable {avail / 1e9:.2f} GB, needed {need / 1e9:.2f} GB)")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("measure")
    m.add_argument("--unit", default="sglang.service")
    gp = sub.add_parser("guard")
    gp.add_argument("--launch", default="/etc/sglang/launch.json")
    args = parser.parse_args()
    if args.cmd == "measure":
        print(json.dumps(measure(args.unit)))
        return 0
    return guard(args.launch)


if __name__ == "__main__":
    sys.exit(main())
