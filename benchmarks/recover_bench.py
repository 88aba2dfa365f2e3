#!/usr/bin/env python3
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Recovery benchmark (not a test): per fault, one run of playbooks/recover.yml against the lab's CT 129.

For each fault: set it up, time the playbook from start to its verdict (Clean, or for the faults no rung can
clear an honest Not clean) (the report's own clock, and the
wall clock of the ansible-playbook process), and the share of that time spent in the rung that did the work.
Prints a table and writes reports/bench-recover.json.

Needs the lab (make lab) and CT 129 deployed by deploy.yml (make demo, or benchmarks/deploy_bench.py, which
`make bench` runs first). The last fault, the incident's OOM, is replayed by hand (labctl incident).
Run as root from the checkout:
    .venv/bin/python benchmarks/recover_bench.py [--faults stuck,escaped-workers]
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
# The runs below write their reports where this script reads them (the roles default to ~/.local/state).
os.environ.setdefault("INFEROPS_REPORT_DIR", os.path.join(ROOT, "reports"))
LABCTL = os.path.join(ROOT, "tests", "lab", "labctl")
VMID = 129
# The unit's StartLimitBurst (3 starts in 600 s) would refuse the fifth start of a --repeat run: each start here is
# deliberate, so its counter is reset first (as the role's restart does).
START = ("pct exec %d -- systemctl reset-failed sglang.service 2>/dev/null; pct exec %d -- systemctl enable --now sglang.service "
         "&& sleep 6" % (VMID, VMID))
FAULTS = {
    "service-running": {"setup": START},
    "sigterm-ignored": {"setup": START + " && %s fault inject sigterm-ignored --vmid %d" % (LABCTL, VMID),
                        "extra": ["-e", "gpu_recover_service_stop_timeout_s=10", "-e", "gpu_recover_release_grace_s=10"]},
    "escaped-workers": {"setup": "%s fault inject escaped-workers --vmid %d" % (LABCTL, VMID)},
    "stuck": {"setup": "%s fault inject stuck --vmid %d" % (LABCTL, VMID)},
    "driver-held": {"setup": START + " && %s fault inject driver-held --vmid %d && pct exec %d -- sh -c "
                             "'systemctl disable -q sglang; systemctl kill -s KILL sglang; sleep 1; systemctl stop sglang'"
                             % (LABCTL, VMID, VMID)},
    # Memory the driver keeps after the CT is stopped: only a GPU reset (rung 5) frees it.
    "driver-leak": {"setup": START + " && %s fault inject driver-leak --vmid %d && pct exec %d -- sh -c "
                             "'systemctl disable -q sglang; systemctl kill -s KILL sglang; sleep 1; systemctl stop sglang'"
                             % (LABCTL, VMID, VMID)},
    # The driver takes 30 s to free what SIGKILLed holders leave: rung 2's verification waits for it (release grace).
    "slow-teardown": {"setup": "%s fault inject escaped-workers --vmid %d && %s fault inject slow-teardown --vmid %d "
                               "--seconds 30" % (LABCTL, VMID, LABCTL, VMID)},
    # The driver asks for a GPU reset (gpu_recovery_action Reset) while the server runs: rungs 4 then 5.
    "recovery-action": {"setup": START + " && %s fault inject recovery-action --vmid %d --gpu 0" % (LABCTL, VMID)},
    # The incident replayed by hand (labctl incident) on the shared lab node (CT 132 holds GPUs 2-3): TP 4 on
    # CT 129's GPUs and the free ones, SGLang 0.5.4 (pools pinned at the power of two above the request), x
    # --hicache-size 3 in the 14 GiB container; the cgroup OOM-kills a rank (molecule/recover/verify.yml says why).
    # deploy.yml refuses this configuration, so the bench launches it the way the operator did.
    # The replay gave CT 129 four GPUs by hand, so recover refuses deploy's two-GPU baseline as stale; the bench
    # does what that refusal says: once no process of the CT is left on a GPU, recover_record_baseline=true.
    # Faults that end Not clean, by design: the time to an honest verdict is what is measured.
    "memory-na": {"setup": "pct exec %d -- systemctl disable -q --now sglang.service; %s fault inject memory-na --vmid %d "
                           "--gpu 0" % (VMID, LABCTL, VMID), "expect": "Not clean"},
    "gpu-lost": {"setup": "%s fault inject gpu-lost --vmid %d --gpu 1" % (LABCTL, VMID), "expect": "Not clean"},
    "xid-on-exit": {"setup": "%s fault inject escaped-workers --vmid %d && %s fault inject xid-on-exit --vmid %d --gpu 0 "
                             "--xid 13" % (LABCTL, VMID, LABCTL, VMID),
                    "expect": "Not clean"},
    "oom": {"setup": "%s incident --vmid %d --tp 4 --hicache-size 3 --version 0.5.4 >/dev/null && "
                     "for i in $(seq 90); do [ -z \"$(for p in $(nvidia-smi --query-compute-apps=pid --format=csv,noheader); "
                     "do grep -qs /lxc/%d/ /proc/$p/cgroup && echo $p; done)\" ] && break; sleep 1; done" % (LABCTL, VMID, VMID),
            "extra": ["-e", "recover_record_baseline=true"]},
}


# The ladder's own waits (docs/recover.md, "How long a fault takes"): a rung-1 stop that runs out of its timeout
# (only its end says the service ignores SIGTERM) and a verification that waits out a grace (memory held with no
# process, or stuck processes, may still be a teardown in progress). They count toward a fault's target when a rung
# before the working one had them: no faster code can remove them without changing the setting.
GRACE_RE = re.compile(r"\((?:release |stuck )?grace (\d+(?:\.\d+)?) s\)")


def setting(spec: dict, name: str) -> float:
    """gpu_recover_<name> for this fault (a number of seconds: gpu_recover_<name>_s, or its name before the unit
    suffix): the bench's -e, else the role's default."""
    extra = spec.get("extra", [])
    for arg in extra:
        key, sep, value = arg.partition("=")
        if sep and key in ("gpu_recover_" + name, "gpu_recover_%s_s" % name):
            return float(value)
    with open(os.path.join(ROOT, "roles", "gpu_recover", "defaults", "main.yml"), encoding="utf-8") as handle:
        for line in handle:
            m = re.match(r"gpu_recover_%s(?:_s)?:\s*(\d+(?:\.\d+)?)" % re.escape(name), line)
            if m:
                return float(m.group(1))
    raise KeyError(name)


def ladder_waits(rows: list, working: int, spec: dict) -> tuple[float, list]:
    """Seconds of the ladder's own waits in the rungs before the working one, and what they were."""
    total, what = 0.0, []
    for row in rows:
        if row.get("name") == "start_container" or row["rung"] >= working:
            continue
        if row["rung"] == 1 and any(c.get("timed_out") for c in (row.get("action") or {}).get("commands") or []):
            wait = setting(spec, "service_stop_timeout")
            total += wait
            what.append("rung 1 stop timeout %.0f s" % wait)
        m = GRACE_RE.search(row.get("settled_reason") or "")
        if m:
            total += float(m.group(1))
            what.append("rung %d grace %s s" % (row["rung"], m.group(1)))
    return total, what


# --log-dir: each run's ansible-playbook output (its tasks' times with ANSIBLE_CALLBACKS_ENABLED=ansible.posix.profile_tasks).
LOG_DIR = None


def sh(cmd: str) -> None:
    subprocess.run(cmd, shell=True, check=True, stdout=subprocess.DEVNULL)


def run_one(name: str, spec: dict) -> dict:
    report_path = os.path.join(ROOT, "reports", "pve1", "recover-%d.json" % VMID)
    if os.path.exists(report_path):
        os.unlink(report_path)
    sh(spec["setup"])
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"),
               ANSIBLE_VAULT_PASSWORD_FILE="/var/lib/inferops-lab/vault-pass")
    t0 = time.monotonic()
    proc = subprocess.run([os.path.join(ROOT, ".venv", "bin", "ansible-playbook"), "-i", "inventories/lab/hosts.yml",
                           "playbooks/recover.yml", "-e", "recover_vmid=%d" % VMID] + spec.get("extra", []),
                          cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.monotonic() - t0
    subprocess.run([LABCTL, "fault", "clear", "--vmid", str(VMID)], capture_output=True)
    if LOG_DIR:
        with open(os.path.join(LOG_DIR, "recover-%s.log" % name), "a", encoding="utf-8") as handle:
            handle.write(proc.stdout + proc.stderr)
    if not os.path.exists(report_path):  # refused before the ladder: no report
        return {"fault": name, "rc": proc.returncode, "verdict": "refused", "expected": spec.get("expect", "Clean"),
                "cleared_by_rung": None, "rungs": [], "playbook_wall_seconds": round(wall, 1),
                "to_verdict_seconds": round(wall, 1), "working_rung_seconds": 0.0, "outside_rung_seconds": round(wall, 1),
                "ladder_wait_seconds": 0.0, "ladder_waits": [], "simple_target_seconds": None,
                "target_seconds": None, "within_target": None, "working_rung_share": None, "rung_rows": []}
    with open(report_path, encoding="utf-8") as handle:
        report = json.load(handle)
    rung = report.get("cleared_by_rung")
    # The rung that did the work: the one that cleared it, or for a Not clean verdict the last one climbed.
    working = rung if rung is not None else (report["rungs"][-1]["rung"] if report["rungs"] else None)
    worked = [r for r in report["rungs"] if r["rung"] == working and r.get("name") != "start_container"]
    rung_seconds = sum(float(r["seconds"]) for r in worked)
    total = float(report["seconds"])
    # The target: at most 1.2 x the working rung + 10 s (diagnosis, waiting and verification included), plus the
    # ladder's own waits in the rungs before it (ladder_waits; docs/recover.md, "How long a fault takes").
    waits, waited = ladder_waits(report["rungs"], working, spec) if working is not None else (0.0, [])
    simple = 1.2 * rung_seconds + 10
    target = simple + waits
    return {"fault": name, "rc": proc.returncode, "verdict": report["verdict"], "expected": spec.get("expect", "Clean"),
            "cleared_by_rung": rung, "rungs": [r["rung"] for r in report["rungs"]],
            "playbook_wall_seconds": round(wall, 1), "to_verdict_seconds": total,
            "working_rung_seconds": round(rung_seconds, 1), "outside_rung_seconds": round(total - rung_seconds, 1),
            "ladder_wait_seconds": round(waits, 1), "ladder_waits": waited,
            "simple_target_seconds": round(simple, 1), "target_seconds": round(target, 1), "within_target": total <= target,
            "working_rung_share": round(rung_seconds / total, 2) if total else None,
            "rung_rows": [{k: r.get(k) for k in ("rung", "name", "seconds", "action_seconds", "settled_reason")}
                          for r in report["rungs"]]}


def aggregate(name: str, runs: list) -> dict:
    """The medians of one fault's runs, with their spread (max - min)."""
    def med(key):
        vals = [r[key] for r in runs if r[key] is not None]
        return round(statistics.median(vals), 1) if vals else None

    def spr(key):
        vals = [r[key] for r in runs if r[key] is not None]
        return round(max(vals) - min(vals), 1) if vals else None

    verdicts = sorted({r["verdict"] for r in runs})
    rung_s, total, waits = med("working_rung_seconds"), med("to_verdict_seconds"), med("ladder_wait_seconds") or 0.0
    simple = None if runs[0]["target_seconds"] is None else round(1.2 * rung_s + 10, 1)
    target = None if simple is None else round(simple + waits, 1)
    return {"fault": name, "runs": len(runs), "verdict": "/".join(verdicts), "expected": runs[0]["expected"],
            "cleared_by_rung": sorted({str(r["cleared_by_rung"]) for r in runs}),
            "rungs": runs[0]["rungs"], "to_verdict_seconds": total, "to_verdict_spread_seconds": spr("to_verdict_seconds"),
            "playbook_wall_seconds": med("playbook_wall_seconds"), "working_rung_seconds": rung_s,
            "outside_rung_seconds": med("outside_rung_seconds"), "ladder_wait_seconds": waits,
            "ladder_waits": runs[0]["ladder_waits"], "simple_target_seconds": simple, "target_seconds": target,
            "within_target": None if target is None else total <= target,
            "working_rung_share": round(rung_s / total, 2) if total else None, "each_run": runs}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--faults", default=",".join(FAULTS), help="comma-separated subset of %s" % ", ".join(FAULTS))
    ap.add_argument("--repeat", type=int, default=1, help="runs per fault (median and spread; BENCH_FULL=1: 2)")
    ap.add_argument("--log-dir", help="write each run's ansible-playbook output to DIR/recover-<fault>.log")
    args = ap.parse_args()
    global LOG_DIR  # pylint: disable=global-statement
    if args.log_dir:
        os.makedirs(args.log_dir, exist_ok=True)
        LOG_DIR = args.log_dir
    results = []
    print("%-16s %-9s %-10s %7s %6s %8s %6s %8s %7s %9s %16s" % (
        "fault", "verdict", "rungs", "verdict", "spread", "in rung", "share", "outside", "waits", "1.2x+10", "target"))
    for name in args.faults.split(","):
        results.append(aggregate(name, [run_one(name, FAULTS[name]) for _ in range(args.repeat)]))
        r = results[-1]
        print("%-16s %-9s %-10s %6.1fs %5.1fs %7.1fs %6s %7.1fs %6.1fs %9s %16s" % (
            r["fault"], r["verdict"], ",".join(str(x) for x in r["rungs"]) or "-", r["to_verdict_seconds"],
            r["to_verdict_spread_seconds"] or 0.0, r["working_rung_seconds"],
            "%d%%" % (100 * r["working_rung_share"]) if r["working_rung_share"] is not None else "-",
            r["outside_rung_seconds"], r["ladder_wait_seconds"],
            "-" if r["simple_target_seconds"] is None else "%.1fs" % r["simple_target_seconds"],
            "-" if r["target_seconds"] is None else "%.1fs %s" % (
                r["target_seconds"], "met" if r["within_target"] else "MISSED")))
        if r["ladder_waits"]:
            print("%-16s   ladder's own waits before the working rung: %s" % ("", "; ".join(r["ladder_waits"])))
        sys.stdout.flush()
    met = [r for r in results if r["within_target"]]
    judged = [r for r in results if r["within_target"] is not None]
    print("recover: %d of %d faults within 1.2 x the working rung + 10 s + the ladder's own waits before it; "
          "medians of %d runs each" % (len(met), len(judged), args.repeat))
    os.makedirs(os.path.join(ROOT, "reports"), exist_ok=True)
    with open(os.path.join(ROOT, "reports", "bench-recover.json"), "w", encoding="utf-8") as handle:
        json.dump({"vmid": VMID, "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "repeat": args.repeat,
                   "results": results}, handle, indent=2)
    return 0 if all(r["verdict"] == r["expected"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
