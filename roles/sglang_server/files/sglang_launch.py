#!/usr/bin/env python
# -*- coding: utf-8 -*-
# Copyright: inferops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Start guard and launcher of the SGLang unit (stdlib only; it is the unit's ExecStart, run by the venv's python).

  <venv>/bin/python3 sglang-launch --launch /etc/sglang/launch.json [--api-key-file FILE] -- <SGLang arguments>

1. The guard checks the arguments it is about to run, not a copy of them: every flag the plan owns
   (--hicache-size, --tp-size, --host, --port) must carry the planned value from launch.json, read the way
   SGLang's argparse reads it (--flag value or --flag=value, unambiguous prefixes, the last occurrence wins).
   A unit edited by hand to another --hicache-size does not start.
2. No GPU visible here may hold more than the allowed memory, and MemAvailable must cover what the plan needs.
3. The API key is read from FILE (0640 root:<service group>) and appended to sys.argv inside this process, then
   sglang.launch_server runs here as __main__ (runpy): the key is never in any process's command line, which
   every user of the container can read in /proc/PID/cmdline. SGLang takes the key only as --api-key (0.5.x
   server_args.py has no environment variable for it).
Exit 1 with the reason on stderr (systemd's journal) when the guard refuses.
"""
from __future__ import annotations

import json
import runpy
import subprocess
import sys

OWNED = ("--hicache-size", "--tp-size", "--tensor-parallel-size", "--host", "--port")
CANONICAL = {"--tensor-parallel-size": "--tp-size"}


def refuse(msg: str) -> int:
    print(f"sglang start guard: refusing to start: {msg}", file=sys.stderr, flush=True)
    return 1


def owned_values(args: list[str]) -> dict:
    """The value SGLang would see for each owned flag (last occurrence wins; prefixes count)."""
    seen: dict = {}
    i = 0
    while i < len(args):
        arg = args[i]
        if arg.startswith("--") and arg != "--":
            option, eq, value = arg.partition("=")
            matches = [f for f in OWNED if f == option or (len(option) > 3 and f.startswith(option))]
            if matches:
                flag = CANONICAL.get(matches[0], matches[0])
                if not eq:
                    value = args[i + 1] if i + 1 < len(args) else ""
                    i += 1
                seen[flag] = value
        i += 1
    return seen


def meminfo_available() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no MemAvailable in /proc/meminfo")


def gpu_problems(smi: str, max_mib: int) -> list[str]:
    r = subprocess.run([smi, "--query-gpu=index,memory.used", "--format=csv,noheader,nounits"],
                       capture_output=True, text=True, check=False)
    if r.returncode != 0:
        return [f"cannot read GPU memory: {smi} exited {r.returncode}: {(r.stderr or r.stdout).strip()}"]
    problems = []
    for line in r.stdout.strip().splitlines():
        index, used = [x.strip() for x in line.split(",")[:2]]
        try:
            mib = int(float(used))
        except ValueError:
            problems.append(f"GPU {index} reports memory.used {used!r}: its state is unknown")
            continue
        if mib > max_mib:
            problems.append(f"GPU {index} still holds {mib} MiB (allowed {max_mib} MiB): a previous SGLang or a "
                            "leftover process has not released it")
    return problems


def main(argv: list[str]) -> int:
    if "--" not in argv:
        return refuse("usage: sglang-launch --launch FILE [--api-key-file FILE] -- <SGLang arguments>")
    split = argv.index("--")
    own, args = argv[:split], argv[split + 1:]
    opts = dict(zip(own[::2], own[1::2]))
    if len(own) % 2 or set(opts) - {"--launch", "--api-key-file"} or "--launch" not in opts:
        return refuse(f"bad launcher options {own!r}")
    try:
        with open(opts["--launch"]) as f:
            launch = json.load(f)
        guard = launch["guard"]
    except (OSError, ValueError, KeyError) as exc:
        return refuse(f"cannot read the plan {opts['--launch']}: {exc}")

    problems = []
    seen = owned_values(args)
    for flag, planned in sorted(guard["owned"].items()):
        if seen.get(flag) != str(planned):
            problems.append(f"the unit passes {flag} {seen.get(flag, '(missing)')} but the plan ({opts['--launch']}) "
                            f"says {planned}; redeploy with playbooks/deploy.yml instead of editing the unit")
    if "--api-key" in " ".join(args) or any(a.startswith("--api-k") for a in args):
        problems.append("an --api-key is on the command line, where every user can read it; use --api-key-file")
    problems += gpu_problems(guard.get("nvidia_smi", "/usr/bin/nvidia-smi"), int(guard.get("gpu_used_max_mib", 256)))
    need = int(guard["required_available_bytes"])
    avail = meminfo_available()
    if avail < need:
        problems.append(f"MemAvailable {avail / 1e9:.2f} GB is below the {need / 1e9:.2f} GB the plan needs "
                        f"(reserve + processes + host KV pools of --hicache-size {guard['hicache_size_gb']} per rank)")
    if problems:
        for p in problems:
            refuse(p)
        return 1

    key_args: list[str] = []
    if "--api-key-file" in opts:
        try:
            with open(opts["--api-key-file"]) as f:
                key = f.read().strip()
        except OSError as exc:
            return refuse(f"cannot read the API key file: {exc}")
        if not key:
            return refuse(f"the API key file {opts['--api-key-file']} is empty")
        # One token, `--api-key=KEY`: SGLang's argparse reads `--api-key KEY` with a key that starts with "-" (a
        # URL-safe random key does, one time in 64) as a missing value and exits 2 ("expected one argument").
        key_args = ["--api-key=" + key]
    print(f"sglang start guard: ok (--hicache-size {guard['hicache_size_gb']}, MemAvailable {avail / 1e9:.2f} GB, "
          f"needed {need / 1e9:.2f} GB)", file=sys.stderr, flush=True)
    sys.argv = [sys.argv[0]] + args + key_args
    runpy.run_module("sglang.launch_server", run_name="__main__", alter_sys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
