#!/usr/bin/env python3
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Draw the benchmarks' picture from their JSON (reports/bench-{sizing,deploy,recover}.json) into reports/bench.png.

    .venv/bin/python benchmarks/plot.py [--out reports/bench.png]

A panel is drawn for each JSON file present; a missing one is named in its panel.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
REPORTS = os.path.join(ROOT, "reports")
RULES = ["plan", "incident", "sglang-max", "ram80", "default"]
COLOURS = {"plan": "#1b9e77", "incident": "#d95f02", "sglang-max": "#7570b3", "ram80": "#e7298a", "default": "#66a61e"}


def load(name: str):
    path = os.path.join(REPORTS, "bench-%s.json" % name)
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def sizing_panel(ax, doc) -> None:
    if doc is None:
        ax.text(0.5, 0.5, "no reports/bench-sizing.json", ha="center", transform=ax.transAxes)
        return
    results = [r for r in doc["results"] if "rows" in r]
    width = 0.8 / len(RULES)
    top = 2.0
    for j, rule in enumerate(RULES):
        xs, ys, oom, refused = [], [], [], []
        for i, r in enumerate(results):
            row = r["rows"][rule]
            x = i + (j - (len(RULES) - 1) / 2) * width
            if row.get("outcome") == "started" and row.get("share_of_usable") is not None:
                xs.append(x)
                ys.append(min(row["share_of_usable"], top))
            elif "OOM" in row.get("outcome", ""):
                oom.append(x)
            else:
                refused.append(x)
        ax.bar(xs, ys, width, color=COLOURS[rule], label=rule)
        ax.scatter(oom, [0.06] * len(oom), marker="X", s=60, color=COLOURS[rule], edgecolors="black", linewidths=0.8)
        ax.scatter(refused, [0.03] * len(refused), marker="|", s=40, color=COLOURS[rule])
    ax.axhline(1.0, color="black", linewidth=1)
    ax.text(len(results) - 0.5, 1.02, "usable budget (limit - measured - SGLang's 10 GiB)", ha="right", va="bottom", fontsize=8)
    ax.set_xticks(range(len(results)))
    ax.set_xticklabels(["%s\n%d GiB" % (r["config"]["name"], r["config"]["mem_gib"]) for r in results], rotation=60,
                       ha="right", fontsize=7)
    ax.set_ylim(0, top)
    ax.set_ylabel("pinned / usable budget (measured)")
    ax.set_title("Sizing: host KV pinned per rule, %s (X = OOM-killed, | = refused or nothing started; bars capped at %d%%)"
                 % (doc["when"][:10], top * 100), fontsize=10)
    ax.legend(ncol=len(RULES), fontsize=8, loc="upper left")


def deploy_panel(ax, doc) -> None:
    if doc is None:
        ax.text(0.5, 0.5, "no reports/bench-deploy.json", ha="center", transform=ax.transAxes)
        return
    names = ["full deploy", "no-change re-run"]
    med = [doc["deploy_wall_s"], doc["rerun_wall_s"]]
    spread = [doc.get("deploy_spread_s", 0), doc.get("rerun_spread_s", 0)]
    ax.bar(names, med, yerr=[[s / 2 for s in spread], [s / 2 for s in spread]], color=["#999999", "#1b9e77"], capsize=4)
    ax.axhline(0.2 * med[0], color="black", linestyle="--", linewidth=1)
    ax.text(1.4, 0.2 * med[0], "20% of full", va="bottom", ha="right", fontsize=8)
    ax.set_ylabel("seconds (median)")
    ax.set_title("Deploy: re-run / full = %.2f" % doc["rerun_to_deploy_ratio"], fontsize=10)


def recover_panel(ax, doc) -> None:
    if doc is None:
        ax.text(0.5, 0.5, "no reports/bench-recover.json", ha="center", transform=ax.transAxes)
        return
    rows = doc["results"]
    xs = range(len(rows))
    ax.bar(xs, [r["to_verdict_seconds"] for r in rows], color="#bbbbbb", label="time to verdict")
    ax.bar(xs, [r["working_rung_seconds"] for r in rows], color="#7570b3", label="in the working rung")
    ax.scatter(xs, [r["target_seconds"] if r["target_seconds"] is not None else 0 for r in rows], marker="_", s=200,
               color="black", label="target 1.2 x rung + 10 s")
    ax.set_xticks(list(xs))
    ax.set_xticklabels(["%s\n%s" % (r["fault"], r["verdict"]) for r in rows], rotation=60, ha="right", fontsize=7)
    ax.set_ylabel("seconds (median)")
    ax.set_title("Recover: per lab fault", fontsize=10)
    ax.legend(fontsize=8)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(REPORTS, "bench.png"))
    args = ap.parse_args()
    fig = plt.figure(figsize=(16, 11))
    grid = fig.add_gridspec(2, 3, height_ratios=[1.1, 1])
    sizing_panel(fig.add_subplot(grid[0, :]), load("sizing"))
    deploy_panel(fig.add_subplot(grid[1, 0]), load("deploy"))
    recover_panel(fig.add_subplot(grid[1, 1:]), load("recover"))
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    fig.savefig(args.out, dpi=110)
    print("picture: %s" % os.path.relpath(args.out, ROOT))
    return 0


if __name__ == "__main__":
    sys.exit(main())
