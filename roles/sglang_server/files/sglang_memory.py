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
      measure's JSON plus what the deploy's preflight reads in the same call: the container's addresses
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
      --api-key-file as a Bearer token) as server_info, without the keys that hold the API key (one
      call where the deploy's verify made three).
  sglang_memory.py contract --unit sglang.service --state FILE --venv DIR --file F [--file F ...] [--tree DIR]
                            (--record | --compare)
      The launch contract: a digest of every file the server's start reads (the unit, the launch record, the
      environment and API key files, the launcher), of the virtualenv's installed distributions (*.dist-info names)
      and, with --tree, of a directory's files (path, size, mtime). --record (the unit's ExecStartPre, as root) writes
      it to FILE (0600 root) with systemd's $INVOCATION_ID of this start. --compare prints JSON: which parts differ
      from the record, systemd's ActiveState, InvocationID and NeedDaemonReload of the unit, and restart_reasons
      (empty: what runs was started from what is installed; the deploy restarts the server otherwise). No digest is
      printed (the API key file is one of the parts).
(The start guard is the unit's launcher, sglang_launch.py.)
"""
from __future__ import annotations

import argparse
import hashlib
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


def file_digest(path: str) -> str:
    """sha256 of a file's bytes, "absent" when there is no such file."""
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    except FileNotFoundError:
        return "absent"
    return digest.hexdigest()


def venv_distributions(venv: str) -> list:
    """The *.dist-info directory names (name-version) in the virtualenv's site-packages, sorted."""
    lib = os.path.join(venv, "lib")
    names = []
    for pyver in sorted(os.listdir(lib)) if os.path.isdir(lib) else []:
        site = os.path.join(lib, pyver, "site-packages")
        names += [e for e in (os.listdir(site) if os.path.isdir(site) else []) if e.endswith(".dist-info")]
    return sorted(names)


def tree_fingerprint(root: str) -> str:
    """sha256 over every file under root (relative path, size, mtime in ns; links not followed), "absent" when root
    is not a directory. The model's bytes are not read: a copy that replaces a file gives it a new mtime."""
    if not os.path.isdir(root):
        return "absent"
    digest = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames):
            path = os.path.join(dirpath, name)
            try:
                st = os.lstat(path)
            except OSError:
                continue
            digest.update(("%s\0%d\0%d\n" % (os.path.relpath(path, root), st.st_size, st.st_mtime_ns)).encode(
                "utf-8", "surrogateescape"))
    return digest.hexdigest()


def contract_parts(files: list, venv: str, trees: list) -> dict:
    """Each part of the launch contract by name (file:PATH, venv:DIR, tree:DIR) and its digest."""
    parts = {"file:" + path: file_digest(path) for path in files}
    parts["venv:" + venv] = hashlib.sha256("\n".join(venv_distributions(venv)).encode()).hexdigest()
    for root in trees:
        parts["tree:" + root] = tree_fingerprint(root)
    return parts


def contract_digest(parts: dict) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def unit_show(unit: str) -> dict:
    """systemd's ActiveState, InvocationID, NeedDaemonReload and MainPID of the unit (None each when unreadable)."""
    keys = ("ActiveState", "InvocationID", "NeedDaemonReload", "MainPID")
    out = dict.fromkeys(keys)
    try:
        done = subprocess.run(["/usr/bin/systemctl", "show", unit] + ["--property=" + k for k in keys],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, check=False,
                              env=dict(os.environ, LC_ALL="C"), timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return out
    for line in done.stdout.splitlines():
        key, sep, value = line.partition("=")
        if sep and key in out:
            out[key] = value.strip()
    return out


def restart_reasons(parts: dict, record, unit: dict) -> list:
    """Why the running server is not the one the installed files describe (empty: it is; no restart).

    parts: the contract as installed now (contract_parts); record: what the unit's ExecStartPre recorded at the last
    start ({"parts", "invocation_id"}) or None; unit: unit_show's read. Unknown is never taken as equal."""
    state = unit.get("ActiveState")
    if state not in ("active", "reloading"):
        return ["the unit is %s, not active" % (state or "unreadable")]
    reasons = []
    if unit.get("NeedDaemonReload") != "no":
        reasons.append("systemd runs another version of the unit file than the one installed (NeedDaemonReload=%s)"
                       % (unit.get("NeedDaemonReload") or "unreadable"))
    if not isinstance(record, dict) or not isinstance(record.get("parts"), dict):
        reasons.append("no record of what the running server was started with (started before the unit recorded it, "
                       "or the record is unreadable)")
        return reasons
    if not record.get("invocation_id") or record.get("invocation_id") != unit.get("InvocationID"):
        reasons.append("the record is of another start of the unit than the one running")
    changed = sorted(k for k in set(parts) | set(record["parts"]) if parts.get(k) != record["parts"].get(k))
    if changed:
        reasons.append("installed since the running server started: %s" % ", ".join(changed))
    return reasons


def write_record(path: str, parts: dict, invocation_id: str) -> None:
    """The record of this start, root's only (0600 in a 0700 directory: a digest of the API key file is in it),
    written whole (a temporary file renamed into place)."""
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, mode=0o700, exist_ok=True)
    tmp = "%s.%d.tmp" % (path, os.getpid())
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({"parts": parts, "digest": contract_digest(parts), "invocation_id": invocation_id,
                   "recorded_at": time.time()}, f)
    os.replace(tmp, path)


def read_record(path: str):
    try:
        with open(path) as f:
            record = json.load(f)
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def contract(args) -> dict:
    parts = contract_parts(args.file, args.venv, args.tree)
    if args.record:
        invocation = os.environ.get("INVOCATION_ID", "")
        write_record(args.state, parts, invocation)
        return {"recorded": args.state, "invocation_id": invocation}
    record = read_record(args.state)
    unit = unit_show(args.unit)
    reasons = restart_reasons(parts, record, unit)
    changed = (sorted(k for k in set(parts) | set(record["parts"]) if parts.get(k) != record["parts"].get(k))
               if record and isinstance(record.get("parts"), dict) else None)
    return {"unit": unit, "record_present": record is not None, "changed_parts": changed,
            "restart_reasons": reasons, "restart": bool(reasons)}


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
    con = sub.add_parser("contract")
    con.add_argument("--unit", default="sglang.service")
    con.add_argument("--state", required=True)
    con.add_argument("--venv", required=True)
    con.add_argument("--file", action="append", default=[])
    con.add_argument("--tree", action="append", default=[])
    mode = con.add_mutually_exclusive_group(required=True)
    mode.add_argument("--record", action="store_true")
    mode.add_argument("--compare", action="store_true")
    args = parser.parse_args()
    if args.cmd == "contract":
        print(json.dumps(contract(args)))
        return 0
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
