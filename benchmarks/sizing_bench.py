#!/usr/bin/env python3
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Sizing benchmark (not a test): the per-rank --hicache-size of five rules, launched for real in a lab container.

For each configuration of the grid (container memory limit, TP/PP/DP, DP attention, nnodes, SGLang release, MLA
or GQA model, one or two engines) the SGLang stand-in is first launched without HiCache (the memory measured
without the pools), then once per rule with that rule's size:

  plan        this collection's plan (plugins/module_utils/sizing/hicache.py) from facts read in the container
  incident    the incident's reading: the plan's whole budget, in GB, given as the per-rank value
  sglang-max  the largest size the release's own start-up check lets through (sglang-hicache.md 2.4, computed
              from the container's MemAvailable and cgroup, stepped down until the release starts it)
  ram80       0.8 x RAM (the container's `free -g` total) / tp
  default     --enable-hierarchical-cache with no size: the release's default (--hicache-ratio, 0.5.21 auto-size)

Each launch records: refused (by SGLang's check or by the plan) or started, OOM-killed (the container's memory
cgroup oom_kill counter, read on the node) at start-up or during a load phase, the bytes pinned (the cgroup's
non-file memory while it runs minus the same without the pools: measured, not computed), their share of the safe
budget (the container limit minus the memory measured without the pools) and of the usable budget (that minus
SGLang's own 10 GiB reserve, which every release documents and 0.5.19+ enforces: no rule can start above it there),
and the host tokens per rank the ranks allocated.

Needs the lab (make lab) and CT 129 deployed (make demo, or benchmarks/deploy_bench.py). It stops CT 129's
sglang.service, gives the container all eight lab GPUs, and restores its configuration and service at the end; the
sglang.service of another running container that passes a GPU (CT 132, which the EDA bench deploys) is stopped for
the run and started again at the end.
    .venv/bin/python benchmarks/sizing_bench.py [--grid quick|full] [--repeat N] [--only name,name]
Writes reports/bench-sizing.json.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import subprocess
import sys
import threading
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.join(ROOT, ".collections"))  # make setup links this checkout there as the collection
# The collection's pure-Python sizing model (no Ansible imports).
from ansible_collections.inferops.gpu_inference.plugins.module_utils.sizing import hicache, hicache_pools, sizing_values  # noqa: E402
# The collection's one reading of which GPUs a container's config passes through.
from ansible_collections.inferops.gpu_inference.plugins.module_utils.recover.recover_pve import parse_pct_config_gpus  # noqa: E402

VMID = 129
PACKAGES = "/var/lib/inferops-lab/packages"
CGROUP = "/sys/fs/cgroup/memory/lxc/%d" % VMID
GIB = 1024 ** 3
SGLANG_RESERVE = 10 * GIB
PAGE = 64
MAX_TOTAL_TOKENS = 16384  # the device pool per rank (SGLang's --max-total-tokens): small, so 0.5.14's assert is met
POLICY = {"page_size": PAGE}
MODELS = {  # the lab's tiny models' geometry (tests/lab/sglang_standin/build_wheels.py), weights scaled to 1 GiB
    "mla": {"src": "kimi-k2-tiny", "preset": "kimi-k2"},
    "gqa": {"src": "llama-3-70b-tiny", "preset": "llama-3-70b"},
}
RULES = ["plan", "incident", "sglang-max", "ram80", "default"]


def cfg(name, version, model, tp, mem_gib, pp=1, dp=1, dpa=False, nnodes=1, engines=1):
    return {"name": name, "version": version, "model": model, "tp": tp, "pp": pp, "dp": dp, "dp_attention": dpa,
            "nnodes": nnodes, "engines": engines, "mem_gib": mem_gib}


# Releases on both sides of 0.5.4/0.5.5 (power-of-two pinning), 0.5.14/0.5.15 (assert host > device; PP minimum),
# 0.5.18/0.5.19 (the guard divides by the ranks) and 0.5.21+ (cgroup bound, auto-size).
GRID = [
    cfg("mla-tp1-0.5.4", "0.5.4", "mla", 1, 14),
    cfg("mla-tp1-0.5.5", "0.5.5", "mla", 1, 14),
    cfg("gqa-tp2-0.5.4", "0.5.4", "gqa", 2, 16),
    cfg("gqa-tp2-0.5.5", "0.5.5", "gqa", 2, 16),
    cfg("mla-tp2-pp2-0.5.9", "0.5.9", "mla", 2, 14, pp=2),
    cfg("mla-tp2-0.5.14", "0.5.14", "mla", 2, 14),
    cfg("mla-tp2-0.5.15", "0.5.15", "mla", 2, 14),
    cfg("gqa-tp2-pp2-0.5.14", "0.5.14", "gqa", 2, 16, pp=2),
    cfg("gqa-tp2-pp2-0.5.15", "0.5.15", "gqa", 2, 16, pp=2),
    cfg("mla-tp4-0.5.18", "0.5.18", "mla", 4, 16),
    cfg("mla-tp4-0.5.19", "0.5.19", "mla", 4, 16),
    cfg("mla-tp8-0.5.18", "0.5.18", "mla", 8, 18),
    cfg("mla-tp8-0.5.19", "0.5.19", "mla", 8, 18),
    cfg("gqa-tp2-dp2-0.5.18", "0.5.18", "gqa", 2, 16, dp=2),
    cfg("gqa-tp2-dp2-0.5.19", "0.5.19", "gqa", 2, 16, dp=2),
    cfg("mla-tp4-dp2-dpattn-0.5.19", "0.5.19", "mla", 4, 16, dp=2, dpa=True),
    cfg("mla-tp4-dp4-dpattn-0.5.21", "0.5.21", "mla", 4, 18, dp=4, dpa=True),
    cfg("mla-tp4-nnodes2-0.5.19", "0.5.19", "mla", 4, 14, nnodes=2),
    cfg("mla-tp2-x2engines-0.5.19", "0.5.19", "mla", 2, 16, engines=2),
    cfg("gqa-tp2-0.5.21", "0.5.21", "gqa", 2, 12),
    cfg("mla-tp1-0.5.21", "0.5.21", "mla", 1, 18),
    cfg("gqa-tp4-0.5.23", "0.5.23", "gqa", 4, 16),
]


# `make bench` by default (under 15 minutes in all, issue 27): one configuration on each side of the rules that
# matter most (0.5.4's power-of-two pinning, 0.5.15's assert, 0.5.19's per-rank guard, 0.5.21's cgroup bound).
# The whole GRID: --grid full (`make bench BENCH_FULL=1`, about 12 minutes for this script alone).
QUICK = ["mla-tp1-0.5.4", "mla-tp2-0.5.15", "mla-tp4-0.5.19", "gqa-tp2-0.5.21"]


def vt(version: str):
    return tuple(int(x) for x in version.split("."))


def sh(args, check=True, **kw) -> subprocess.CompletedProcess:
    r = subprocess.run(args, capture_output=True, text=True, **kw)
    if check and r.returncode != 0:
        raise SystemExit("failed: %s\n%s%s" % (" ".join(args), r.stdout[-2000:], r.stderr[-2000:]))
    return r


def ct(cmd: str, check=True, **kw) -> subprocess.CompletedProcess:
    return sh(["/usr/sbin/pct", "exec", str(VMID), "--", "sh", "-c", cmd], check=check, **kw)


def push(path: str, dest: str) -> None:
    with open(path, "rb") as f:
        subprocess.run(["/usr/sbin/pct", "exec", str(VMID), "--", "sh", "-c", "cat > '%s'" % dest], stdin=f, check=True)


# -- the container's memory cgroup, read on the node ------------------------------------------------------------------

def cg_stat() -> dict:
    with open(os.path.join(CGROUP, "memory.stat")) as f:
        return {k: int(v) for k, v in (line.split() for line in f)}


def used_bytes() -> int:
    """Non-file memory of the container: usage minus the (reclaimable) file page cache."""
    with open(os.path.join(CGROUP, "memory.usage_in_bytes")) as f:
        usage = int(f.read())
    st = cg_stat()
    return usage - st.get("total_inactive_file", 0) - st.get("total_active_file", 0)


def oom_kills() -> int:
    """OOM kills in the container's memory cgroup and below: cgroup v1 counts a kill in the victim's own cgroup
    (the container's processes live in /lxc/<vmid>/ns/...), the kernel log names the container's as oom_memcg."""
    total = 0
    for d, _, files in os.walk(CGROUP):
        if "memory.oom_control" in files:
            with open(os.path.join(d, "memory.oom_control")) as f:
                total += sum(int(line.split()[1]) for line in f if line.startswith("oom_kill "))
    return total


def limit_bytes() -> int:
    with open(os.path.join(CGROUP, "memory.limit_in_bytes")) as f:
        return int(f.read())


def meminfo() -> dict:
    out = {}
    for line in ct("cat /proc/meminfo").stdout.splitlines():
        k, _, v = line.partition(":")
        out[k] = int(v.split()[0]) * 1024
    return out


# -- set-up and restore ---------------------------------------------------------------------------------------------

def wait_exec() -> None:
    for _ in range(120):
        if ct("true", check=False).returncode == 0:
            return
        time.sleep(1)
    raise SystemExit("CT %d does not answer pct exec" % VMID)


def gpu_tenants() -> list:
    """The node's other running containers whose config passes an NVIDIA GPU and whose sglang.service is active (the
    lab's second tenant, CT 132, after the EDA bench deployed it): their ranks hold memory on GPUs the grid gives
    CT 129, where the driver refuses an allocation that does not fit, so a second `make bench` failed its TP 4 runs."""
    tenants = []
    for line in sh(["/usr/sbin/pct", "list"]).stdout.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 2 or not fields[0].isdigit() or int(fields[0]) == VMID or fields[1] != "running":
            continue
        gpus = parse_pct_config_gpus(sh(["/usr/sbin/pct", "config", fields[0]]).stdout)
        if gpus and sh(["/usr/sbin/pct", "exec", fields[0], "--", "systemctl", "is-active", "-q", "sglang.service"],
                       check=False).returncode == 0:
            tenants.append((int(fields[0]), gpus))
    return tenants


def tenants_stop() -> list:
    stopped = []
    for vmid, gpus in gpu_tenants():
        print("sizing bench: CT %d's sglang.service holds GPU(s) %s, which the grid gives CT %d: stopped until the end"
              % (vmid, ",".join(map(str, gpus)), VMID), flush=True)
        sh(["/usr/sbin/pct", "exec", str(vmid), "--", "systemctl", "stop", "sglang.service"])
        stopped.append(vmid)
    return stopped


def tenants_start(stopped: list) -> None:
    for vmid in stopped:
        sh(["/usr/sbin/pct", "exec", str(vmid), "--", "systemctl", "start", "sglang.service"])


def setup(versions) -> str:
    conf_path = "/etc/pve/lxc/%d.conf" % VMID
    if not os.path.exists(conf_path):
        raise SystemExit("CT %d does not exist: run `make demo` (or benchmarks/deploy_bench.py) first" % VMID)
    original = open(conf_path).read()
    ct("systemctl disable -q --now sglang.service", check=False)
    have = {line.split(": ", 1)[1].split(",")[0] for line in original.splitlines() if line.startswith("dev")}
    keys = sorted(int(line[3:line.index(":")]) for line in original.splitlines() if line.startswith("dev"))
    nxt = (keys[-1] + 1) if keys else 0
    add = []
    for gpu in range(8):
        if "/dev/nvidia%d" % gpu not in have:
            add += ["--dev%d" % nxt, "/dev/nvidia%d" % gpu]
            nxt += 1
    if add:
        sh(["/usr/sbin/pct", "set", str(VMID)] + add)
        sh(["/usr/sbin/pct", "reboot", str(VMID)])
        wait_exec()
    ct("systemctl disable -q --now sglang.service; mkdir -p /root/bench/wheels /root/bench/models", check=False)
    push(os.path.join(ROOT, "benchmarks", "sizing_probe.py"), "/root/bench/sizing_probe.py")
    for key, spec in MODELS.items():
        src = os.path.join(PACKAGES, "models", spec["src"], "config.json")
        ct("mkdir -p /root/bench/models/%s" % key)
        push(src, "/root/bench/models/%s/config.json" % key)
        index = {"metadata": {"total_size": GIB}, "weight_map": {"model.embed_tokens.weight": "model-00001-of-00001.safetensors"}}
        subprocess.run(["/usr/sbin/pct", "exec", str(VMID), "--", "sh", "-c",
                        "cat > /root/bench/models/%s/model.safetensors.index.json" % key],
                       input=json.dumps(index).encode(), check=True)
    spt = sorted(glob.glob(os.path.join(PACKAGES, "setproctitle-*-cp311-*.whl")))[:1]
    for version in versions:
        if ct("test -x /root/bench/venv-%s/bin/python3" % version, check=False).returncode == 0:
            continue
        for path in [os.path.join(PACKAGES, "sglang-%s-py3-none-any.whl" % version)] + spt:
            push(path, "/root/bench/wheels/" + os.path.basename(path))
        ct("python3 -m venv /root/bench/venv-{v} && /root/bench/venv-{v}/bin/pip install -q --no-index "
           "--find-links /root/bench/wheels sglang=={v}".format(v=version))
    return original


def restore(original: str) -> None:
    """Back to what deploy.yml left: the container's own devN entries and memory, its service running."""
    conf = open("/etc/pve/lxc/%d.conf" % VMID).read()
    orig_devs = {line.split(":")[0] for line in original.splitlines() if line.startswith("dev")}
    extra = [line.split(":")[0] for line in conf.splitlines() if line.startswith("dev") and line.split(":")[0] not in orig_devs]
    mem = next(line.split(": ")[1] for line in original.splitlines() if line.startswith("memory:"))
    args = ["--memory", mem] + (["--delete", ",".join(extra)] if extra else [])
    sh(["/usr/sbin/pct", "set", str(VMID)] + args)
    if extra:
        sh(["/usr/sbin/pct", "reboot", str(VMID)])
        wait_exec()
    for _ in range(60):  # pct exec answers before the container's systemd does
        if ct("systemctl is-system-running --wait >/dev/null 2>&1; systemctl enable -q --now sglang.service",
              check=False).returncode == 0:
            return
        time.sleep(1)
    raise SystemExit("CT %d: sglang.service did not start again after the bench" % VMID)


# -- one launch ------------------------------------------------------------------------------------------------------

def launch_args(c: dict, size, hicache: bool, engine: int) -> list:
    a = ["--model-path", "/root/bench/models/%s" % c["model"], "--tp-size", str(c["tp"]), "--host", "127.0.0.1",
         "--port", str(30100 + engine), "--page-size", str(PAGE), "--max-total-tokens", str(MAX_TOTAL_TOKENS)]
    if c["pp"] > 1:
        a += ["--pp-size", str(c["pp"])]
    if c["dp"] > 1:
        if c["dp_attention"] and vt(c["version"]) >= (0, 5, 22):
            a += ["--attn-dp-size", str(c["dp"])]
        else:
            a += ["--dp-size", str(c["dp"])] + (["--enable-dp-attention"] if c["dp_attention"] else [])
    if c["nnodes"] > 1:
        a += ["--nnodes", str(c["nnodes"]), "--node-rank", "0", "--dist-init-addr", "127.0.0.1:5757"]
    if engine:
        a += ["--base-gpu-id", str(engine * c["tp"] * c["pp"] * (1 if c["dp_attention"] else c["dp"]))]
    if hicache:
        a += ["--enable-hierarchical-cache"]
        if size is not None:
            a += ["--hicache-size", str(size)]
    return a


def run_launch(c: dict, size, hicache: bool, load_seconds: float) -> dict:
    spec = {"engines": [{"python": "/root/bench/venv-%s/bin/python3" % c["version"], "port": 30100 + e,
                         "args": launch_args(c, size, hicache, e)} for e in range(c["engines"])],
            "env": {"SGLANG_STANDIN_WARMUP_SECONDS": "0.2", "SGLANG_STANDIN_FORCE_TOUCH": "1"},
            "load_seconds": load_seconds, "start_timeout": 180}
    ooms0 = oom_kills()
    samples, window = [], {"on": False, "stop": False}

    def sampler():
        while not window["stop"]:
            if window["on"]:
                samples.append(used_bytes())
            time.sleep(0.2)

    th = threading.Thread(target=sampler, daemon=True)
    th.start()
    t0 = time.monotonic()
    proc = subprocess.Popen(["/usr/sbin/pct", "exec", str(VMID), "--", "python3", "/root/bench/sizing_probe.py",
                             json.dumps(spec)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    result = None
    for line in proc.stdout:
        try:
            ev = json.loads(line)
        except ValueError:
            continue
        if ev.get("event") == "healthy":
            window["on"] = True
        elif ev.get("event") == "result":
            window["on"] = False
            result = ev
    proc.wait()
    window["stop"] = True
    th.join()
    # The driver and the kernel may still be freeing: wait until the container is back near its idle level.
    for _ in range(100):
        if not ct("pgrep -f '[s]glang.launch_server'", check=False).stdout.strip():
            break
        time.sleep(0.3)
    if result is None:
        raise SystemExit("the probe in CT %d gave no result: %s" % (VMID, proc.stderr.read()[-2000:]))
    ooms = oom_kills() - ooms0
    refusal = next((e.get("refusal") for e in result["engines"] if e.get("refusal")), None)
    if ooms:
        outcome = "OOM-killed"
    elif result["started"] and result.get("survived_load"):
        outcome = "started"
    elif refusal:
        outcome = "refused"
    else:
        outcome = "failed"
    tokens = [t for e in result["engines"] for t in e.get("host_tokens_per_rank", [])]
    return {"outcome": outcome, "oom_kills": ooms, "refusal": refusal,
            "used_bytes": int(statistics.median(samples)) if samples and outcome == "started" else None,
            "host_tokens_per_rank": min(tokens) if tokens else None, "seconds": round(time.monotonic() - t0, 1),
            "log_tail": None if outcome == "started" else [e.get("log_tail") for e in result["engines"]]}


# -- the rules -------------------------------------------------------------------------------------------------------

def plan_input(c: dict, mi: dict, limit: int, gpu_mib: int, baseline: int) -> dict:
    """The plan's facts as gpu_host_facts reads them in the container, and the process overheads as docs/sizing.md
    asks an operator to set them: measured (here the container's memory without the pools, split over its
    processes, plus a quarter)."""
    ranks = hicache_pools.engine_ranks_per_host(c["tp"], c["pp"], c["dp"], c["dp_attention"], c["nnodes"]) * c["engines"]
    per_process = max(baseline * 5 // 4 // (ranks + c["engines"]), 32 * 1024 ** 2)
    policy = dict(POLICY, rank_overhead_bytes=per_process, frontend_overhead_bytes=per_process * c["engines"])
    return dict(policy, sglang_version=c["version"], mem_total_bytes=mi["MemTotal"], mem_available_bytes=mi["MemAvailable"],
                mem_limit_bytes=limit, gpu_count=8, gpu_memory_mib=gpu_mib, tp_size=c["tp"], pp_size=c["pp"],
                dp_size=c["dp"], enable_dp_attention=c["dp_attention"], nnodes=c["nnodes"],
                model_preset=MODELS[c["model"]]["preset"], device_pool_tokens_per_rank=MAX_TOTAL_TOKENS,
                other_engine_ranks=(c["engines"] - 1) * c["tp"] * c["pp"])


def bytes_per_token(c: dict) -> int:
    """Per rank, of the stage with the most layers (sglang-hicache.md: MLA replicated, GQA sharded)."""
    if c["model"] == "mla":
        layers, per_layer = 61, (512 + 64) * 2
    else:
        attn_tp = c["tp"] // c["dp"] if c["dp_attention"] else c["tp"]
        layers, per_layer = 80, 2 * 128 * max(1, 8 // attn_tp) * 2
    stage_layers = -(-layers // c["pp"])
    return stage_layers * per_layer


def sglang_max(c: dict, mi: dict, limit: int, used: int) -> int:
    """The largest --hicache-size the release's own check lets through on this container (sglang-hicache.md 2.4)."""
    v = vt(c["version"])
    avail = mi["MemAvailable"]
    if v >= (0, 5, 21):
        avail = min(avail, limit - used)
    free = avail - SGLANG_RESERVE
    divisor = 1 if v <= (0, 5, 18) else max(c["tp"] * c["pp"] // c["nnodes"], 1)
    per_rank = free // divisor
    bpt = bytes_per_token(c)
    best = 0
    for h in range(1, 200):
        t = int(h * 1e9 // bpt)
        t = t - t % PAGE if v <= (0, 5, 5) else (t // PAGE + 1) * PAGE
        if t * bpt > per_rank:
            break
        best = h
    return best


def one_config(c: dict, repeat: int, load_seconds: float) -> dict:
    sh(["/usr/sbin/pct", "set", str(VMID), "--memory", str(c["mem_gib"] * 1024)])
    time.sleep(1)
    limit = limit_bytes()
    mi = meminfo()
    gpu_mib = int(ct("nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1").stdout.split()[0])
    base_runs = [run_launch(c, None, False, load_seconds) for _ in range(repeat)]
    if any(r["outcome"] != "started" for r in base_runs):
        return {"config": c, "error": "the server did not start without HiCache", "baseline": base_runs}
    baseline = int(statistics.median(r["used_bytes"] for r in base_runs))
    safe = limit - baseline
    usable = safe - SGLANG_RESERVE
    try:
        plan = hicache.plan(plan_input(c, mi, limit, gpu_mib, baseline))
    except hicache.PlanError as e:
        return {"config": c, "error": "plan refused the input: %s" % e}
    sizes = {
        "plan": plan["per_rank_gb"] if plan["fits"] else None,
        "incident": max(int(plan["budget_bytes"] // 10 ** 9), 1),
        "sglang-max": sglang_max(c, mi, limit, baseline),
        "ram80": max(int(0.8 * (mi["MemTotal"] // GIB) / c["tp"]), 1),
        "default": "default",
    }
    rows = {}
    cache = {}

    def launches(gb):
        if gb not in cache:
            cache[gb] = [run_launch(c, None if gb == "default" else gb, True, load_seconds) for _ in range(repeat)]
        return cache[gb]

    for rule in RULES:
        size = sizes[rule]
        row = {"rule": rule, "size_gb": size}
        if size is None or size == 0:
            row.update(outcome="refused by the plan" if rule == "plan" else "nothing to launch", runs=[])
            rows[rule] = row
            continue
        runs = launches(size)
        # sglang-max: step down while the release's check refuses (it reads memory after the front-end and the
        # ranks' processes started, and up to 0.5.18 after the peers that were faster pinned theirs)
        while rule == "sglang-max" and isinstance(size, int) and size > 1 and runs[0]["outcome"] == "refused":
            size -= 1
            runs = launches(size)
        row["size_gb"] = size
        outcomes = sorted({r["outcome"] for r in runs})
        row["outcome"] = "/".join(outcomes)
        pinned = [r["used_bytes"] - baseline for r in runs if r["outcome"] == "started"]
        if pinned:
            med = statistics.median(pinned)
            row.update(pinned_bytes_median=int(med), pinned_bytes_spread=int(max(pinned) - min(pinned)),
                       share_of_safe=round(med / safe, 3), share_of_usable=round(med / usable, 3) if usable > 0 else None)
        row["host_tokens_per_rank"] = next((r["host_tokens_per_rank"] for r in runs if r["host_tokens_per_rank"]), None)
        row["refusal"] = next((r["refusal"] for r in runs if r["refusal"]), None)
        row["oom_kills"] = sum(r["oom_kills"] for r in runs)
        row["seconds"] = [r["seconds"] for r in runs]
        rows[rule] = row
    out = {"config": c, "limit_bytes": limit, "mem_available_bytes": mi["MemAvailable"], "baseline_used_bytes": baseline,
           "baseline_spread_bytes": int(max(r["used_bytes"] for r in base_runs) - min(r["used_bytes"] for r in base_runs)),
           "safe_budget_bytes": safe, "usable_budget_bytes": usable, "plan_budget_bytes": plan["budget_bytes"],
           "plan_ranks": plan["ranks_per_host"], "rows": rows}
    out["plan_explained"] = explain_plan(c, out, plan)
    return out


def explain_plan(c: dict, res: dict, plan: dict) -> str | None:
    """Why the plan's row is below 80% of the usable budget, in numbers (None when it is not)."""
    row = res["rows"]["plan"]
    share = row.get("share_of_usable")
    if share is not None and share >= 0.8:
        return None
    if not plan["fits"]:
        refusal = [line for line in plan["explain"] if "refuse" in line or "does not" in line or "assert" in line]
        return "the plan refuses this configuration: %s" % (refusal[-1] if refusal else plan["explain"][-1])
    ranks = plan["ranks_per_host"]
    h = plan["per_rank_gb"]
    if vt(c["version"]) <= (0, 5, 4) and h:
        return ("power-of-two pinning (<= 0.5.4): %d GB per rank pins %s, so %d GB would pin twice as much and %d x that "
                "does not fit %s" % (h, sizing_values.fmt_gib(plan["pinned_per_rank_bytes"]), h + 1, ranks,
                                     sizing_values.fmt_gb(plan["budget_bytes"])))
    per_rank_budget = plan["budget_bytes"] / max(ranks, 1) / 1e9
    return ("whole GB per rank: the plan's budget %s over %d ranks is %.2f GB each, so %d GB per rank (%s in all); %d GB "
            "would not fit. The plan also keeps %s for %d processes where %s was measured"
            % (sizing_values.fmt_gb(plan["budget_bytes"]), ranks, per_rank_budget, h, sizing_values.fmt_gb(h * ranks * 10 ** 9), h + 1,
               sizing_values.fmt_gb(plan["overhead_bytes"]), ranks + 1, sizing_values.fmt_gb(res["baseline_used_bytes"])))


def best_whole_gb_bytes(r: dict) -> int | None:
    """What the best whole-GB --hicache-size can pin within the usable budget, for this configuration's ranks
    (--hicache-size is an int of GB: no rule can do better than this step allows)."""
    ranks = r["plan_ranks"]
    usable = r["usable_budget_bytes"]
    best = 0
    for h in range(1, 1000):
        per_rank = hicache_pools.pow2_ceil(h * 10 ** 9) if vt(r["config"]["version"]) <= (0, 5, 4) else h * 10 ** 9
        if per_rank * ranks > usable:
            break
        best = per_rank * ranks
    return best or None


def with_derived(results: list) -> list:
    """Each started row's share of the best whole-GB size (best_whole_gb_bytes)."""
    for r in results:
        if "rows" not in r:
            continue
        r["best_whole_gb_pinned_bytes"] = best = best_whole_gb_bytes(r)
        for row in r["rows"].values():
            if row.get("pinned_bytes_median") is not None and best:
                row["share_of_best_whole_gb"] = round(row["pinned_bytes_median"] / best, 3)
    return results


def summarize(results: list) -> dict:
    out = {}
    for rule in RULES:
        rows = [r["rows"][rule] for r in results if "rows" in r]
        oom = sum(1 for r in rows if "OOM" in r.get("outcome", ""))
        refused = sum(1 for r in rows if "refused" in r.get("outcome", ""))
        started = [r for r in rows if r.get("outcome") == "started"]
        shares = [r["share_of_safe"] for r in started]
        ushares = [r["share_of_usable"] for r in started if r.get("share_of_usable") is not None]
        bshares = [r["share_of_best_whole_gb"] for r in started if r.get("share_of_best_whole_gb") is not None]
        exact = [r["rows"][rule]["share_of_usable"] for r in results if "rows" in r and vt(r["config"]["version"]) >= (0, 5, 5)
                 and r["rows"][rule].get("outcome") == "started" and r["rows"][rule].get("share_of_usable") is not None]
        # A configuration that does not start, or is OOM-killed, gives its operator no cache at all: 0 in the means.
        all_u = [r.get("share_of_usable") if r.get("outcome") == "started" else 0.0 for r in rows]
        out[rule] = {"configs": len(rows), "started": len(started), "oom_killed": oom, "refused": refused,
                     "mean_share_of_safe_started": round(statistics.mean(shares), 3) if shares else None,
                     "min_share_of_safe_started": min(shares) if shares else None,
                     "mean_share_of_usable_started": round(statistics.mean(ushares), 3) if ushares else None,
                     "min_share_of_usable_started": min(ushares) if ushares else None,
                     "mean_share_of_usable_all": round(statistics.mean(x or 0.0 for x in all_u), 3) if all_u else None,
                     "mean_share_of_usable_exact_pin_releases": round(statistics.mean(exact), 3) if exact else None,
                     "mean_share_of_best_whole_gb_started": round(statistics.mean(bshares), 3) if bshares else None,
                     "min_share_of_best_whole_gb_started": min(bshares) if bshares else None}
    return out


def gb(x):
    return "-" if x is None else "%.2f" % (x / 1e9)


def pct(x):
    return "-" if x is None else "%d%%" % round(100 * x)


HEADER = "%-27s %4s %6s %6s  %-10s %4s %-19s %7s %5s %5s %6s %7s" % (
    "configuration", "GiB", "safe", "usable", "rule", "GB", "outcome", "pinned", "safe", "usbl", "bestGB", "tokens")


def print_config(r: dict) -> None:
    c = r["config"]
    if "error" in r:
        print("%-27s ERROR %s" % (c["name"], r["error"]))
        return
    for rule in RULES:
        row = r["rows"][rule]
        print("%-27s %4d %6s %6s  %-10s %4s %-19s %7s %5s %5s %6s %7s" % (
            c["name"], c["mem_gib"], gb(r["safe_budget_bytes"]), gb(r["usable_budget_bytes"]), rule,
            row["size_gb"] if row["size_gb"] not in (None, "default") else ("dflt" if row["size_gb"] else "-"),
            row["outcome"][:19], gb(row.get("pinned_bytes_median")), pct(row.get("share_of_safe")),
            pct(row.get("share_of_usable")), pct(row.get("share_of_best_whole_gb")), row.get("host_tokens_per_rank") or "-"))
    if r["plan_explained"]:
        print("%-27s   plan below 80%% of usable: %s" % ("", r["plan_explained"]))
    sys.stdout.flush()


def print_summary(summary: dict) -> None:
    print("\nsafe = container limit - memory measured without the pools; usable = safe - SGLang's own 10 GiB reserve;"
          "\nbestGB = share of the most a whole-GB --hicache-size can pin within usable. A refused or OOM-killed"
          "\nconfiguration gives no cache: it counts 0 in 'all'.")
    for rule, s in summary.items():
        print("  %-10s %2d configs: %2d started, %2d OOM-killed, %2d refused; of usable: mean %s started, %s all, min %s; "
              "exact-pin releases %s; of the best whole GB: mean %s, min %s; of safe: mean %s" % (
                  rule, s["configs"], s["started"], s["oom_killed"], s["refused"], pct(s["mean_share_of_usable_started"]),
                  pct(s["mean_share_of_usable_all"]), pct(s["min_share_of_usable_started"]),
                  pct(s["mean_share_of_usable_exact_pin_releases"]), pct(s["mean_share_of_best_whole_gb_started"]),
                  pct(s["min_share_of_best_whole_gb_started"]), pct(s["mean_share_of_safe_started"])))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=1, help="launches per (configuration, size); median and spread")
    ap.add_argument("--load-seconds", type=float, default=2.0)
    ap.add_argument("--only", default="", help="comma-separated configuration names (overrides --grid)")
    ap.add_argument("--grid", choices=["quick", "full"], default="quick",
                    help="quick: the %d configurations of QUICK (default); full: all %d of GRID" % (len(QUICK), len(GRID)))
    ap.add_argument("--from-json", metavar="PATH", help="print the tables and summary of an earlier run, launch nothing")
    args = ap.parse_args()
    out_path = os.path.join(ROOT, "reports", "bench-sizing.json")
    if args.from_json:
        with open(args.from_json, encoding="utf-8") as f:
            doc = json.load(f)
        doc["results"] = with_derived(doc["results"])
        doc["summary"] = summarize(doc["results"])
        print(HEADER)
        for r in doc["results"]:
            print_config(r)
        print_summary(doc["summary"])
    else:
        names = args.only.split(",") if args.only else (QUICK if args.grid == "quick" else [c["name"] for c in GRID])
        unknown = sorted(set(names) - {c["name"] for c in GRID})
        if unknown:
            raise SystemExit("unknown configuration(s): %s" % ", ".join(unknown))
        grid = [c for c in GRID if c["name"] in names]
        t0 = time.monotonic()
        stopped = tenants_stop()
        results = []
        try:
            original = setup(sorted({c["version"] for c in grid}, key=vt))
            try:
                print(HEADER)
                for c in grid:
                    results.append(with_derived([one_config(c, args.repeat, args.load_seconds)])[0])
                    print_config(results[-1])
            finally:
                restore(original)
        finally:
            tenants_start(stopped)
        summary = summarize(results)
        print_summary(summary)
        doc = {"when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
               "machine": "%s, %d CPUs, %.0f GiB" % (os.uname().nodename, os.cpu_count() or 0,
                                                   os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GIB),
               "repeat": args.repeat, "grid": "only" if args.only else args.grid,
               "seconds": round(time.monotonic() - t0, 1), "summary": summary, "results": results}
    os.makedirs(os.path.dirname(out_path), exist_ok=True)
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=2)
        f.write("\n")
    print("wrote reports/bench-sizing.json%s" % (" (%.0f s)" % doc["seconds"] if not args.from_json else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
