#!/usr/bin/env python
# -*- coding: utf-8 -*-
# Copyright: inferops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Memory facts and start guard for an SGLang systemd service (stdlib only, runs in the container).

  sglang_memory.py measure [--unit sglang.service]
      JSON on stdout: /proc/meminfo (bytes), the cgroup memory usage, and every process of the unit
      (name, RssAnon, RssShmem, RssFile in bytes), with totals for the unit and its scheduler ranks, and the unit's
      MainPID as systemd reports it (main_pid).
  sglang_memory.py preflight [--unit sglang.service] --model-config PATH
      measure's JSON plus what the deploy's preflight reads in the same call (issue 27): the container's addresses
      (`ip -4 -o addr show scope global`, lines), its listening TCP sockets (`ss -Hltnp`, lines) and whether
      PATH exists (model_config_present). A command that fails fails the script.
(The start guard is the unit's launcher, sglang_launch.py.)
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


def lines_of(argv: list) -> list:
    """stdout lines of a command that must succeed (the preflight refuses to plan on a read that failed)."""
    done = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, check=False,
                          env=dict(os.environ, LC_ALL="C"))
    if done.returncode != 0:
        raise SystemExit("%s failed (rc %d): %s" % (" ".join(argv), done.returncode, done.stderr.strip()))
    return done.stdout.splitlines()


def main_pid(unit: str):
    try:
        out = lines_of(["/usr/bin/systemctl", "show", "-p", "MainPID", "--value", unit])
    except (OSError, SystemExit):
        return None
    return int(out[0]) if out and out[0].strip().isdigit() else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("measure")
    m.add_argument("--unit", default="sglang.service")
    pre = sub.add_parser("preflight")
    pre.add_argument("--unit", default="sglang.service")
    pre.add_argument("--model-config", required=True)
    args = parser.parse_args()
    out = measure(args.unit)
    out["main_pid"] = main_pid(args.unit)
    if args.cmd == "preflight":
        out["addresses"] = lines_of(["/usr/sbin/ip", "-4", "-o", "addr", "show", "scope", "global"])
        out["listeners"] = lines_of(["/usr/bin/ss", "-Hltnp"])
        out["model_config_present"] = os.path.exists(args.model_config)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
