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
      PATH exists (model_config_present); with --venv, whether its pip is there (venv_pip_present: a run cut while
      making the virtualenv leaves none); the unit's `systemctl is-enabled` and `is-active` words (unit_enabled,
      unit_active); with --user, --user-home and --user-shell, whether that user exists with that home directory
      (there) and that shell (user_as_wanted); the version of sglang installed in --venv (its dist-info METADATA;
      sglang_installed_version, none when absent). A command that fails fails the script (systemctl's words are read
      whatever its status).
  sglang_memory.py verify [--unit sglang.service] --health-url URL [--info-path server_info] [--api-key-file F]
                          [--timeout 600]
      measure's JSON once URL/health answers 200 (polled every second, up to --timeout seconds; else it fails
      saying what it saw last), plus the server's own arguments (GET URL/<info-path> with the key of
      --api-key-file as a Bearer token) as server_info, without the keys that hold the API key (issue 27: one
      call where the deploy's verify made three).
(The start guard is the unit's launcher, sglang_launch.py.)
"""
from __future__ import annotations

import argparse
import json
import os
import pwd
import subprocess
import sys
import time
import urllib.error
import urllib.request

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


def systemctl_word(verb: str, unit: str):
    """`systemctl is-enabled|is-active UNIT`'s word (its exit status only says whether the word is the good one)."""
    try:
        done = subprocess.run(["/usr/bin/systemctl", verb, unit], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                              text=True, check=False, env=dict(os.environ, LC_ALL="C"))
    except OSError:
        return None
    return done.stdout.strip() or None


def user_as_wanted(name: str, home: str, shell: str) -> bool:
    """The service user as the role makes it: the name, its home directory (existing), its shell."""
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        return False
    return entry.pw_dir == home and entry.pw_shell == shell and os.path.isdir(home)


def installed_version(venv: str, name: str):
    """The Version of NAME's *.dist-info/METADATA in the virtualenv's site-packages (None when not installed)."""
    wanted = name.lower().replace("_", "-").replace(".", "-")
    lib = os.path.join(venv, "lib")
    for pyver in sorted(os.listdir(lib)) if os.path.isdir(lib) else []:
        site = os.path.join(lib, pyver, "site-packages")
        for entry in sorted(os.listdir(site)) if os.path.isdir(site) else []:
            if not entry.endswith(".dist-info"):
                continue
            meta = {}
            try:
                with open(os.path.join(site, entry, "METADATA"), encoding="utf-8", errors="replace") as f:
                    for line in f:
                        if not line.strip():
                            break
                        key, _sep, value = line.partition(":")
                        meta.setdefault(key.strip(), value.strip())
            except OSError:
                continue
            if meta.get("Name", "").lower().replace("_", "-").replace(".", "-") == wanted:
                return meta.get("Version")
    return None


def http_get(url: str, headers: dict, timeout: float):
    request = urllib.request.Request(url, headers=headers)
    with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310 (the container's own server)
        return response.status, response.read()


def wait_health(url: str, timeout: float) -> float:
    """Seconds until URL/health answered 200; SystemExit with the last answer after timeout seconds."""
    start = time.monotonic()
    last = "no answer yet"
    while True:
        try:
            status, _body = http_get(url.rstrip("/") + "/health", {}, 10)
            if status == 200:
                return round(time.monotonic() - start, 1)
            last = "HTTP %d" % status
        except urllib.error.HTTPError as exc:
            last = "HTTP %d" % exc.code
        except (OSError, ValueError) as exc:
            last = str(getattr(exc, "reason", exc))
        if time.monotonic() - start >= timeout:
            raise SystemExit("%s/health did not answer 200 within %d s (last: %s); see journalctl -u the unit"
                             % (url.rstrip("/"), timeout, last))
        time.sleep(1)


def server_info(url: str, path: str, key_file) -> dict:
    headers = {}
    if key_file:
        with open(key_file) as f:
            headers["Authorization"] = "Bearer " + f.read().strip()
    try:
        status, body = http_get(url.rstrip("/") + "/" + path.lstrip("/"), headers, 10)
        info = json.loads(body)
    except urllib.error.HTTPError as exc:
        raise SystemExit("%s/%s answered HTTP %d" % (url.rstrip("/"), path, exc.code))
    except (OSError, ValueError) as exc:
        raise SystemExit("%s/%s could not be read: %s" % (url.rstrip("/"), path, exc))
    if status != 200 or not isinstance(info, dict):
        raise SystemExit("%s/%s answered HTTP %d without a JSON object" % (url.rstrip("/"), path, status))
    # /server_info echoes the server's arguments, the API key among them: never printed.
    return {k: v for k, v in info.items() if "api_key" not in k}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("measure")
    m.add_argument("--unit", default="sglang.service")
    pre = sub.add_parser("preflight")
    pre.add_argument("--unit", default="sglang.service")
    pre.add_argument("--model-config", required=True)
    pre.add_argument("--venv")
    pre.add_argument("--user")
    pre.add_argument("--user-home")
    pre.add_argument("--user-shell")
    ver = sub.add_parser("verify")
    ver.add_argument("--unit", default="sglang.service")
    ver.add_argument("--health-url", required=True)
    ver.add_argument("--info-path")
    ver.add_argument("--api-key-file")
    ver.add_argument("--timeout", type=float, default=600)
    args = parser.parse_args()
    extra = {}
    if args.cmd == "verify":
        extra["health_waited_s"] = wait_health(args.health_url, args.timeout)
        extra["server_info"] = server_info(args.health_url, args.info_path, args.api_key_file) if args.info_path else None
    out = measure(args.unit)
    out.update(extra)
    out["main_pid"] = main_pid(args.unit)
    if args.cmd == "preflight":
        out["addresses"] = lines_of(["/usr/sbin/ip", "-4", "-o", "addr", "show", "scope", "global"])
        out["listeners"] = lines_of(["/usr/bin/ss", "-Hltnp"])
        out["model_config_present"] = os.path.exists(args.model_config)
        out["venv_pip_present"] = os.path.exists(os.path.join(args.venv, "bin", "pip")) if args.venv else None
        out["user_as_wanted"] = (user_as_wanted(args.user, args.user_home, args.user_shell)
                                 if args.user and args.user_home and args.user_shell else None)
        out["sglang_installed_version"] = installed_version(args.venv, "sglang") if args.venv else None
        out["unit_enabled"] = systemctl_word("is-enabled", args.unit)
        out["unit_active"] = systemctl_word("is-active", args.unit)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (OSError, ValueError, KeyError) as exc:
        # A container stopped under the run, a vanished /proc entry: one line for the operator, never a traceback.
        sys.exit("sglang-memory: %s: %s" % (type(exc).__name__, exc))
