#!/usr/bin/env python3
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Capacity benchmark (not a test; pure Python, no lab): how much of a real host the plan gives the host KV pools.

The lab's containers are 12-18 GiB, where whole-GB steps hide what the OS reserve costs; this plans a grid of real
shapes instead: RAM 256 GiB to 4 TiB, two idle profiles, TP 1 to 16, plain DP, DP attention, PP, MLA (Kimi-K2) and
GQA (Llama-3-70B), every final SGLang release the model knows (0.4.9 to 0.5.23). Per shape and release:

  plan        the plan's per-rank size (hicache.plan, the collection under --root) and what SGLang then pins on
              the host, re-enacted by the independent oracle (tests/unit/plugins/sglang_oracle.py)
  sglang      the largest size SGLang's own start-up check accepts (MemAvailable after the processes loaded,
              less its 10 GiB, per rank up to 0.5.18, divided by tp x pp from 0.5.19) and what that pins
  safe        the safe budget: MemAvailable less the processes' overheads less SGLang's own 10 GiB reserve, and
              the largest size whose pools fit it (and that SGLang's check accepts): the reference

Reported: the plan's pinned total as a share of the safe budget (the goal: at least 95 % on exact-pinning releases,
0.5.5 and later, on hosts of 1 TiB and more), unsafe plans (the pools the oracle pins, the overheads and SGLang's
10 GiB above MemAvailable: must be 0), and false refusals (the plan's largest size below the reference: a size
SGLang runs within its own reserve that the plan refuses).

The overheads are the same on both sides (the plan is given them, as the deploy's verify offers them): by default
the plan's own budget, 8 GiB per rank and 8 GiB for the front-end (no measurement of real SGLang ranks exists;
--rank-overhead-gib / --frontend-overhead-gib take a measured figure).

    .venv/bin/python benchmarks/capacity_bench.py [--root CHECKOUT] [--out reports/bench-capacity.json] [--label L]

--root plans with another checkout's sizing code (for a before/after comparison: --root /path/to/main).
Writes the JSON and, with matplotlib (requirements-bench.txt), reports/bench-capacity.png.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

HERE = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
GIB = 1024 ** 3
GB = 10 ** 9
SGLANG_RESERVE = 10 * GIB
GPU_MEMORY_MIB = 143771  # an H200's memory.total (nvidia-smi)
RAMS_GIB = (256, 512, 1024, 2048, 4096)
# What the host uses idle (MemTotal - MemAvailable), two measured points: the incident's 449 GiB node idles at
# 3-4 GiB (free -g: used 3, available 445), the 2 TiB host of the capacity issue at 58 GiB (MemAvailable 1990 GiB).
IDLE = {"quiet": lambda ram: 4 * GIB, "busy": lambda ram: int(ram * 58 / 2048)}
LAYOUTS = [  # (name, tp, pp, dp, DP attention)
    ("tp1", 1, 1, 1, False), ("tp2", 2, 1, 1, False), ("tp4", 4, 1, 1, False), ("tp8", 8, 1, 1, False),
    ("tp16", 16, 1, 1, False), ("tp2-dp4", 2, 1, 4, False), ("tp8-dpa8", 8, 1, 8, True),
    ("tp4-pp2", 4, 2, 1, False), ("tp8-pp2", 8, 2, 1, False),
]
MODELS = {"mla": "kimi-k2", "gqa": "llama-3-70b"}
HIDDEN = {"gpu_sm": 90, "os_page": 4096}


def version_text(release) -> str:
    return ".".join(str(p) for p in release[:3])


def own_check_max_gb(release, avail_after_load: int, tp: int, pp: int) -> int:
    """The largest --hicache-size SGLang's own check accepts (sglang-hicache.md 2.4): each rank's requested bytes
    (H x 1e9, to within one page) against MemAvailable - 10 GiB, divided by tp x pp // nnodes from 0.5.19."""
    free = avail_after_load - SGLANG_RESERVE
    if release >= (0, 5, 19):
        free //= max(tp * pp, 1)
    return max(free // GB, 0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", default=HERE, help="the checkout whose sizing code plans (default: this one)")
    ap.add_argument("--out", default=os.path.join(HERE, "reports", "bench-capacity.json"))
    ap.add_argument("--label", default="")
    ap.add_argument("--rank-overhead-gib", type=float, default=8.0)
    ap.add_argument("--frontend-overhead-gib", type=float, default=8.0)
    ap.add_argument("--no-picture", action="store_true")
    ap.add_argument("--before", help="a JSON this bench wrote earlier (another --root): its worst case drawn beside")
    args = ap.parse_args()

    root = os.path.abspath(args.root)
    sys.path.insert(0, os.path.join(root, ".collections"))
    sys.path.insert(0, os.path.join(HERE, "tests", "unit", "plugins"))
    from ansible_collections.inferops.gpu_inference.plugins.module_utils.sizing import hicache  # noqa: E402
    import sglang_oracle as oracle  # noqa: E402  (this checkout's: the same truth for before and after)

    rank_oh, front_oh = int(args.rank_overhead_gib * GIB), int(args.frontend_overhead_gib * GIB)
    started = time.monotonic()
    rows = []
    for ram_gib in RAMS_GIB:
        ram = ram_gib * GIB
        for idle_name, idle_of in IDLE.items():
            avail = ram - idle_of(ram)
            for name, tp, pp, dp, dpa in LAYOUTS:
                for kind, preset in MODELS.items():
                    inp = {"mem_total_bytes": ram, "mem_available_bytes": avail, "gpu_count": tp * pp * (1 if dpa else dp),
                           "gpu_memory_mib": GPU_MEMORY_MIB, "tp_size": tp, "pp_size": pp, "dp_size": dp,
                           "enable_dp_attention": dpa, "model_preset": preset,
                           "rank_overhead_bytes": rank_oh, "frontend_overhead_bytes": front_oh}
                    for release in oracle.RELEASES:
                        rows.append(shape_row(hicache, oracle, dict(inp, sglang_version=version_text(release)), release,
                                              ram_gib, idle_name, name, kind, tp, pp))
    elapsed = time.monotonic() - started
    summary = summarise(rows)
    doc = {"label": args.label, "root": root, "overheads": {"rank_gib": args.rank_overhead_gib,
                                                            "frontend_gib": args.frontend_overhead_gib},
           "elapsed_s": round(elapsed, 1), "summary": summary, "rows": rows}
    print_table(rows, summary, args.label, elapsed)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=1)
    print("wrote %s" % args.out)
    if not args.no_picture:
        before = None
        if args.before:
            with open(args.before, encoding="utf-8") as f:
                before = json.load(f)
        picture(doc, os.path.splitext(args.out)[0] + ".png", before)
    return 0


def shape_row(hicache, oracle, inp, release, ram_gib, idle_name, layout, kind, tp, pp):
    plan = hicache.plan(inp)
    probe = oracle.outcome(inp, HIDDEN, release, 1)
    if probe.refused:
        return {"ram_gib": ram_gib, "idle": idle_name, "layout": layout, "model": kind, "release": version_text(release),
                "refused_by_sglang": probe.refused, "plan_fits": bool(plan["fits"])}
    processes = max(n.processes for n in probe.nodes)
    overheads = processes * inp["rank_overhead_bytes"] + inp["frontend_overhead_bytes"]
    avail = inp["mem_available_bytes"]
    safe_budget = avail - overheads - SGLANG_RESERVE

    def pinned(size_gb: int) -> int:
        if size_gb < 1:
            return 0
        return max(n.pinned_bytes for n in oracle.outcome(inp, HIDDEN, release, size_gb).nodes)

    def largest(ok) -> int:
        if not ok(1):
            return 0
        low, high = 1, 2
        while ok(high):
            low, high = high, high * 2
        while high - low > 1:
            mid = (low + high) // 2
            low, high = (mid, high) if ok(mid) else (low, mid)
        return low

    own_gb = own_check_max_gb(release, avail - overheads, tp, pp)
    safe_gb = largest(lambda h: h <= own_gb and pinned(h) <= safe_budget)
    plan_gb = int(plan["per_rank_gb"]) if plan["fits"] else 0
    plan_pinned = pinned(plan_gb)
    return {
        "ram_gib": ram_gib, "idle": idle_name, "layout": layout, "model": kind, "release": version_text(release),
        "exact": release >= (0, 5, 5), "mem_available_bytes": avail, "ranks": processes, "overheads_bytes": overheads,
        "plan_gb": plan_gb, "plan_pinned_bytes": plan_pinned, "plan_reserve_bytes": int(plan["reserve_bytes"]),
        "sglang_gb": own_gb, "sglang_pinned_bytes": pinned(own_gb),
        "safe_budget_bytes": safe_budget, "safe_gb": safe_gb, "safe_pinned_bytes": pinned(safe_gb),
        "used_of_safe": plan_pinned / safe_budget if safe_budget > 0 else 0.0,
        "unsafe": plan_gb > 0 and plan_pinned + overheads + SGLANG_RESERVE > avail,
        "sglang_refuses_plan": plan_gb > own_gb,
        "false_refusal": plan_gb < safe_gb,
        # The plan keeps more than SGLang's 10 GiB only for what the host measurably needs (or the fraction rule):
        # a false refusal with the reserve at SGLang's own floor has another cause.
        "reserve_above_sglang": int(plan["reserve_bytes"]) > SGLANG_RESERVE,
    }


def summarise(rows):
    planned = [r for r in rows if "plan_gb" in r]
    goal = [r for r in planned if r["exact"] and r["ram_gib"] >= 1024]
    used = [r["used_of_safe"] for r in goal]
    return {
        "shapes": len(planned),
        "refused_by_sglang": len(rows) - len(planned),
        "unsafe": sum(r["unsafe"] for r in planned),
        "plan_refused_by_sglang_check": sum(r["sglang_refuses_plan"] for r in planned),
        "false_refusals": sum(r["false_refusal"] for r in planned),
        "false_refusals_by_idle": {idle: sum(r["false_refusal"] for r in planned if r["idle"] == idle) for idle in IDLE},
        "false_refusals_reserve_at_sglang_floor": sum(r["false_refusal"] and not r["reserve_above_sglang"] for r in planned),
        "goal_shapes": len(goal),
        "goal_min_used": min(used) if used else None,
        "goal_median_used": statistics.median(used) if used else None,
        "goal_below_95": sum(u < 0.95 for u in used),
        "by_ram_exact_min_used": {str(g): min((r["used_of_safe"] for r in planned if r["exact"] and r["ram_gib"] == g), default=None)
                                  for g in RAMS_GIB},
        "by_ram_exact_median_used": {
            str(g): statistics.median([r["used_of_safe"] for r in planned if r["exact"] and r["ram_gib"] == g] or [0])
            for g in RAMS_GIB},
    }


def print_table(rows, summary, label, elapsed):
    print("Capacity grid%s: the plan's pinned total against SGLang's own check and the safe budget (MemAvailable less "
          "the overheads less SGLang's 10 GiB); SGLang 0.5.23 (exact pinning) and 0.5.4 (power of two)" %
          (" (%s)" % label if label else ""))
    head = "%-6s %-5s %-9s %-4s %-7s %6s %11s %13s %13s %13s %7s %s"
    print(head % ("RAM", "idle", "layout", "kv", "release", "ranks", "plan GB/rk", "plan pinned", "sglang accepts",
                  "safe budget", "used", "flags"))
    for r in rows:
        if "plan_gb" not in r or r["release"] not in ("0.5.23", "0.5.4"):
            continue
        flags = ",".join(f for f, on in (("UNSAFE", r["unsafe"]), ("false-refusal", r["false_refusal"]),
                                         ("sglang-refuses-plan", r["sglang_refuses_plan"])) if on)
        print(head % ("%dG" % r["ram_gib"], r["idle"], r["layout"], r["model"], r["release"], r["ranks"], r["plan_gb"],
                      "%.1f GB" % (r["plan_pinned_bytes"] / GB), "%.1f GB" % (r["sglang_pinned_bytes"] / GB),
                      "%.1f GB" % (r["safe_budget_bytes"] / GB), "%.1f%%" % (100 * r["used_of_safe"]), flags))
    s = summary
    print()
    print("%d shapes x releases planned (%d refused by SGLang itself) in %.1f s: unsafe %d, false refusals %d, plan's size "
          "refused by SGLang's own check %d"
          % (s["shapes"], s["refused_by_sglang"], elapsed, s["unsafe"], s["false_refusals"], s["plan_refused_by_sglang_check"]))
    print("false refusals by idle profile: %s; with the plan's reserve at SGLang's own 10 GiB: %d (the others keep what "
          "the host needs beyond it, or a fraction of RAM)" % (", ".join("%s %d" % kv for kv in s["false_refusals_by_idle"].items()),
                                                               s["false_refusals_reserve_at_sglang_floor"]))
    print("goal (exact pinning, 0.5.5+, RAM >= 1 TiB, %d cases): share of the safe budget pinned: min %.1f%%, median %.1f%%, "
          "below 95%%: %d" % (s["goal_shapes"], 100 * (s["goal_min_used"] or 0), 100 * (s["goal_median_used"] or 0),
                              s["goal_below_95"]))
    print("by RAM (exact releases): " + "; ".join("%s GiB min %.1f%% median %.1f%%" % (
        g, 100 * (s["by_ram_exact_min_used"][g] or 0), 100 * s["by_ram_exact_median_used"][g]) for g in s["by_ram_exact_min_used"]))


def _worst_by_ram(doc, idle, layout=None):
    by_ram = {}
    for r in doc["rows"]:
        if "plan_gb" in r and r["exact"] and r["idle"] == idle and (layout is None or r["layout"] == layout):
            by_ram.setdefault(r["ram_gib"], []).append(r["used_of_safe"])
    xs = sorted(by_ram)
    return xs, [100 * min(by_ram[x]) for x in xs]


def picture(doc, path, before=None):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("no matplotlib (requirements-bench.txt): no picture")
        return
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.8))
    for ax, idle in zip(axes, IDLE):
        for layout, _tp, _pp, _dp, _dpa in LAYOUTS:
            ax.plot(*_worst_by_ram(doc, idle, layout), marker="o", linewidth=1, label=layout)
        if before is not None:
            ax.plot(*_worst_by_ram(before, idle), color="black", linestyle=":", marker="x",
                    label="before, worst layout (%s)" % before.get("label", ""))
        ax.axhline(95, color="grey", linestyle="--", linewidth=1)
        ax.set_xscale("log", base=2)
        ax.set_xticks(list(RAMS_GIB))
        ax.set_xticklabels(["%d GiB" % g for g in RAMS_GIB])
        ax.set_ylim(50, 101)
        ax.set_ylabel("pinned, % of the safe budget")
        ax.set_title("%s host, idle use %s: worst of SGLang 0.5.5-0.5.23, MLA and GQA%s" % (
            idle, "4 GiB" if idle == "quiet" else "2.8 % of RAM", (" (%s)" % doc["label"]) if doc.get("label") else ""),
            fontsize=9)
        ax.legend(fontsize=7, ncol=2, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print("wrote %s" % path)


if __name__ == "__main__":
    sys.exit(main())
