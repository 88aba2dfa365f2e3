#!/usr/bin/env python3
"""Unattended recovery on the lab, with the real ansible-rulebook (docs/recover.md, "Unattended recovery").

Runs extensions/eda/rulebooks/gpu_recover.yml (event source gpu_watch, run_playbook recover.yml) against the lab
with nobody running anything else, injects faults and checks the world, never the rulebook's or the role's word:

  1. at once: CT 129's server SIGKILLed with its GPU memory kept by the driver (held memory after a kill), a process
     of CT 132 stuck in D state in the driver holding GPU memory (a stuck process), and escaped GPU workers in CT 130
     (the bystander: in no group of the inventory);
     then: both inventory containers recovered unattended, one after the other (the node's process table, sampled
     every 0.25 s, never shows two recover.yml runs at once), CT 129 Clean and not relaunched (the inventory does
     not say so), CT 132 Clean and relaunched (the test's copy of the inventory sets gpu_recover_eda_relaunch on it),
     CT 130's workers and GPU 4's memory untouched and no run for CT 130;
  2. then a cgroup OOM kill in CT 129 (a process in a 64 MiB memory cgroup inside the container): a fault that came back
     after CT 129's one recovery of the budget (budget 1 per hour): an alert, and no second recover.yml run for it.

Needs root, the lab up, CTs 129 and 132 deployed and serving, and make eda-setup (.build/eda-venv). Prints and
writes reports/eda-unattended.json: the faults injected, those recovered unattended, detection latency and time to
Clean per fault. Exit 0 when every check held; 1 with what failed.
Used by molecule/recover (case eda, in make test) and benchmarks/eda_bench.py.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
LABCTL = os.path.join(ROOT, "tests", "lab", "labctl")
RULEBOOK_BIN = os.path.join(ROOT, ".build", "eda-venv", "bin", "ansible-rulebook")
SERVICE = "sglang.service"
CT, NEIGHBOUR, BYSTANDER = 129, 132, 130
BYSTANDER_GPU = 4
IDLE_TOLERANCE_MIB = 16
METRICS_DIR = "/var/lib/prometheus/node-exporter"


def sh(cmd: str, check: bool = True, timeout: int = 120) -> str:
    r = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=timeout)
    if check and r.returncode != 0:
        raise RuntimeError("%s: rc %d: %s" % (cmd, r.returncode, (r.stderr or r.stdout).strip()[-1500:]))
    return r.stdout


def cgroup_of(pid: int) -> str:
    try:
        with open("/proc/%d/cgroup" % pid) as f:
            return f.read()
    except OSError:
        return ""


def gpu_apps() -> list[tuple[int, int, int]]:
    """(host PID, GPU index, MiB) of every compute app, from nvidia-smi on the node."""
    idx = {}
    for line in sh("nvidia-smi --query-gpu=index,uuid --format=csv,noheader").splitlines():
        i, uuid = [x.strip() for x in line.split(",")]
        idx[uuid] = int(i)
    out = []
    for line in sh("nvidia-smi --query-compute-apps=pid,gpu_uuid,used_memory --format=csv,noheader,nounits").splitlines():
        if line.strip():
            pid, uuid, mib = [x.strip() for x in line.split(",")]
            out.append((int(pid), idx.get(uuid, -1), int(mib)))
    return out


def gpu_used_mib() -> dict[int, int]:
    out = {}
    for line in sh("nvidia-smi --query-gpu=index,memory.used --format=csv,noheader,nounits").splitlines():
        i, mib = [x.strip() for x in line.split(",")]
        out[int(i)] = int(mib) if mib.isdigit() else -1
    return out


def ct_gpus(vmid: int) -> list[int]:
    return sorted(int(m) for m in re.findall(r"^dev\d+: /dev/nvidia(\d+)\b", sh("pct config %d" % vmid), re.M))


def ct_apps(vmid: int) -> list[tuple[int, int, int]]:
    return [a for a in gpu_apps() if "/lxc/%d/" % vmid in cgroup_of(a[0])]


def service(vmid: int) -> dict[str, str]:
    out = sh("pct exec %d -- systemctl show %s -p ActiveState -p UnitFileState -p MainPID -p InvocationID" % (vmid, SERVICE), check=False)
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def d_state(vmid: int) -> list[int]:
    """Host PIDs of CT vmid's processes in D state."""
    pids = []
    for p in os.listdir("/proc"):
        if p.isdigit() and "/lxc/%d/" % vmid in cgroup_of(int(p)):
            try:
                with open("/proc/%s/stat" % p) as f:
                    if f.read().rsplit(")", 1)[1].split()[0] == "D":
                        pids.append(int(p))
            except (OSError, IndexError):
                pass
    return pids


def clean(vmid: int) -> tuple[bool, str]:
    """Clean from the world: no app of the container on a GPU, its GPUs back at idle, no process of it in D state."""
    gpus = ct_gpus(vmid)
    used = gpu_used_mib()
    apps = ct_apps(vmid)
    stuck = d_state(vmid)
    ok = not apps and all(0 <= used.get(g, -1) <= IDLE_TOLERANCE_MIB for g in gpus) and not stuck
    return ok, "GPUs %s used %s MiB, apps %s, D state %s" % (gpus, [used.get(g) for g in gpus], apps, stuck)


def deploy_metrics_mtime(vmid: int) -> float:
    """When deploy's verify last wrote its textfile on the node (0: never): the trace a relaunch leaves on the node."""
    try:
        return os.stat(os.path.join(METRICS_DIR, "inferops_deploy_%d.prom" % vmid)).st_mtime
    except OSError:
        return 0.0


def kmsg_mark(text: str) -> None:
    """A line of the test's own in the kernel log, to read what the kernel logged after it."""
    with open("/dev/kmsg", "w", encoding="utf-8") as f:
        f.write(text + "\n")


def oom_kills_after(vmid: int, mark: str) -> int:
    """OOM kills of the container's processes the kernel logged after ``mark`` (each kill's `oom-kill:` line names its
    task's memory cgroup, under /lxc/<vmid>/ wherever in the container it ran). Not a count of the whole log: a full
    ring buffer drops an old kill as a new one comes, and the count stays the same (CI, 2026-12-04: 9 -> 9)."""
    log = sh("dmesg")
    if mark not in log:
        return 0
    return len(re.findall(r"^.*oom-kill:.*task_memcg=/lxc/%d[/,]" % vmid, log.rsplit(mark, 1)[1], re.M))


# A cgroup OOM kill inside the container: a child memory cgroup of its own with a 64 MiB limit (the container may
# make one: its cgroup tree is delegated to it), a process that wants 512 MiB in it; the kernel kills it. (systemd-run
# -p MemoryMax= would do the same through the container's systemd, but needs D-Bus, which the template lacks.)
OOM_SCRIPT = """\
if [ -d /sys/fs/cgroup/memory ]; then d=/sys/fs/cgroup/memory/inferops-oom; f=memory.limit_in_bytes
else d=/sys/fs/cgroup/inferops-oom; f=memory.max; fi
mkdir -p "$d" && echo 67108864 > "$d/$f"
sh -c 'echo $$ > "$1/cgroup.procs" && exec python3 -c "b = bytearray(512 << 20)"' oom "$d"
rmdir "$d"
"""


class RecoverRuns(threading.Thread):
    """Samples the node's process table: every ansible-playbook running recover.yml that this run's rulebook started
    (a descendant of its process, set as ``root`` once it runs), its VMID from the extra-vars file ansible-runner
    passes it (-e @.../env/extravars), first and last seen. A recover.yml of anything else on the machine (another
    test, an operator) is not this run's and is not counted."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.root: int | None = None
        self.others: dict[int, str] = {}
        self.runs: dict[int, dict] = {}
        self.max_parallel = 0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            now, live = time.time(), []
            for p in os.listdir("/proc"):
                if not p.isdigit():
                    continue
                try:
                    with open("/proc/%s/cmdline" % p, "rb") as f:
                        argv = f.read().decode(errors="replace").split("\0")
                except OSError:
                    continue
                # The rulebook names the collection's playbook (run_playbook name inferops.gpu_inference.recover,
                # which ansible-runner passes as it is); recover.yml by path where a rulebook names the file.
                if not any(a.endswith("ansible-playbook") for a in argv[:2]) or not any(
                        a.endswith("recover.yml") or a == "inferops.gpu_inference.recover" for a in argv):
                    continue
                pid = int(p)
                if self._forked_worker(pid, argv):
                    continue
                if pid not in self.runs and not self._descends_from(pid, self.root):
                    self.others.setdefault(pid, " ".join(argv).strip()[:300])
                    continue
                if pid not in self.runs:
                    vmid = None
                    for a in argv:
                        if a.startswith("@") and a.endswith("extravars"):
                            try:
                                with open(a[1:]) as f:
                                    m = re.search(r"^recover_vmid:\s*'?(\d+)", f.read(), re.M)
                                vmid = int(m.group(1)) if m else None
                            except OSError:
                                pass
                    self.runs[pid] = {"vmid": vmid, "start": now, "end": now}
                self.runs[pid]["end"] = now
                live.append(pid)
            self.max_parallel = max(self.max_parallel, len(live))
            time.sleep(0.25)

    @staticmethod
    def _descends_from(pid: int, root: int | None) -> bool:
        """Whether ``root`` is an ancestor of ``pid`` (its parents read from /proc, at most 32 levels)."""
        for _level in range(32):
            if root is None or pid <= 1:
                return False
            try:
                with open("/proc/%d/stat" % pid) as f:
                    pid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                return False
            if pid == root:
                return True
        return False

    @staticmethod
    def _forked_worker(pid: int, argv: list) -> bool:
        """ansible-playbook's forked workers carry its argv: count a run once, by the process whose parent is not one."""
        try:
            with open("/proc/%d/stat" % pid) as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open("/proc/%d/cmdline" % ppid, "rb") as f:
                return f.read().decode(errors="replace").split("\0") == argv
        except (OSError, ValueError, IndexError):
            return False

    def of(self, vmid: int) -> list[dict]:
        return sorted((r for r in self.runs.values() if r["vmid"] == vmid), key=lambda r: r["start"])


def wait(what: str, pred, timeout: float, step: float = 1.0):
    end = time.time() + timeout
    while True:
        got = pred()
        if got:
            return got
        if time.time() > end:
            raise AssertionError("timed out after %d s waiting for %s" % (timeout, what))
        time.sleep(step)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--interval", type=float, default=5)
    # Debounce below the interval: a fault is acted on at its second sighting, so within 2 polls.
    ap.add_argument("--debounce", type=float, default=4)
    ap.add_argument("--out", default=os.path.join(ROOT, "reports", "eda-unattended.json"))
    ap.add_argument("--timeout", type=float, default=300, help="seconds to wait for both recoveries")
    a = ap.parse_args()
    if not os.access(RULEBOOK_BIN, os.X_OK):
        print("error: %s missing: run `make eda-setup`" % RULEBOOK_BIN, file=sys.stderr)
        return 2
    env = dict(os.environ)
    env["PATH"] = "%s:%s" % (os.path.join(ROOT, ".venv", "bin"), env.get("PATH", "/usr/bin:/bin"))
    env.setdefault("ANSIBLE_CONFIG", os.path.join(ROOT, "ansible.cfg"))
    env["ANSIBLE_COLLECTIONS_PATH"] = os.path.join(ROOT, ".collections")
    env.setdefault("ANSIBLE_VAULT_PASSWORD_FILE", "/var/lib/inferops-lab/vault-pass")
    env.setdefault("INFEROPS_REPORT_DIR", os.path.join(ROOT, "reports"))
    env.update(ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0")

    failures: list[str] = []

    def check(ok: bool, msg: str) -> None:
        print(("ok   " if ok else "FAIL ") + msg, flush=True)
        if not ok:
            failures.append(msg)

    # Preconditions, from the world.
    for vmid in (CT, NEIGHBOUR):
        s = service(vmid)
        if s.get("ActiveState") != "active" or not ct_apps(vmid):
            print("error: CT %d must be deployed and serving (service %s, GPU apps %s)" % (vmid, s, ct_apps(vmid)),
                  file=sys.stderr)
            return 2
    # A new start of the unit has a new InvocationID (a PID inside a restarted container can come back the same).
    neighbour_before = service(NEIGHBOUR).get("InvocationID")

    work = tempfile.mkdtemp(prefix="inferops-eda-")
    inv = os.path.join(work, "inventory")
    shutil.copytree(os.path.join(ROOT, "inventories", "lab"), inv)
    with open(os.path.join(inv, "host_vars", "ct%d.yml" % NEIGHBOUR), "a") as f:
        f.write("\n# The test's copy only: a recovery of this container relaunches it (deploy.yml).\n"
                "gpu_recover_eda_relaunch: true\n")
    vars_file = os.path.join(work, "vars.yml")
    with open(vars_file, "w") as f:
        json.dump({"gpu_watch_inventory": inv, "gpu_watch_interval_s": a.interval, "gpu_watch_debounce_s": a.debounce,
                   "gpu_watch_cooldown_s": 600, "gpu_watch_budget": 1, "gpu_watch_budget_window_s": 3600,
                   "gpu_watch_unreachable_polls": 3, "gpu_watch_read_timeout_s": 300,
                   "gpu_watch_metrics_file": os.path.join(work, "inferops-gpu-watch.prom")}, f)
    log_path = os.path.join(ROOT, "reports", "eda-rulebook.log")
    os.makedirs(os.path.dirname(log_path), exist_ok=True)
    log = open(log_path, "w")
    sampler = RecoverRuns()
    sampler.start()
    rb = subprocess.Popen([RULEBOOK_BIN, "-r", "inferops.gpu_inference.gpu_recover", "-i", inv, "--vars", vars_file, "-v"],
                          cwd=work, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    sampler.root = rb.pid

    def rb_log() -> str:
        with open(log_path, errors="replace") as f:
            return f.read()

    figures: dict = {"faults_injected": 0, "recovered_unattended": 0, "faults": []}
    t_inject = time.time()
    try:
        wait("the event source's first poll", lambda: "gpu_watch: watching" in rb_log() or rb.poll() is not None, 120)
        if rb.poll() is not None:
            raise AssertionError("ansible-rulebook exited (rc %s): %s" % (rb.returncode, rb_log()[-3000:]))
        # Two polls of healthy servers: no event, no run.
        time.sleep(2 * a.interval)
        check(not sampler.runs, "serving containers: no recover.yml run (%d seen)" % len(sampler.runs))

        # 1. Three faults at once.
        byst_before = sorted(p for p, g, m in gpu_apps() if "/lxc/%d/" % BYSTANDER in cgroup_of(p))
        sh("%s fault inject escaped-workers --vmid %d --gpus %d --mib 512" % (LABCTL, BYSTANDER, BYSTANDER_GPU))
        byst = sorted(p for p, g, m in gpu_apps() if "/lxc/%d/" % BYSTANDER in cgroup_of(p) and p not in byst_before)
        byst_mib = gpu_used_mib()[BYSTANDER_GPU]
        t_inject = time.time()
        sh("%s fault inject driver-held --vmid %d && pct exec %d -- sh -c 'systemctl disable -q %s; "
           "systemctl kill -s KILL %s; sleep 1; systemctl stop %s'" % (LABCTL, CT, CT, SERVICE, SERVICE, SERVICE))
        sh("%s fault inject stuck --vmid %d" % (LABCTL, NEIGHBOUR))
        figures["faults_injected"] += 3
        check(not clean(CT)[0] and bool(d_state(NEIGHBOUR)),
              "faults in place: CT %d %s; CT %d D-state PIDs %s" % (CT, clean(CT)[1], NEIGHBOUR, d_state(NEIGHBOUR)))

        def both_done():
            # CT 129: its recover.yml ended and it is Clean. CT 132: its recover.yml (and the relaunch in it) ended,
            # nothing of it in D state, and its server serves again.
            done = {}
            for vmid in (CT, NEIGHBOUR):
                runs = sampler.of(vmid)
                if not runs or time.time() - runs[-1]["end"] < 1.0:
                    return None
                if vmid == CT:
                    ok, why = clean(vmid)
                else:
                    apps, stuck = ct_apps(vmid), d_state(vmid)
                    ok = bool(apps) and not stuck and service(vmid).get("ActiveState") == "active"
                    why = "serving again: GPU apps %s, D state %s" % (apps, stuck)
                if not ok:
                    return None
                done[vmid] = (runs, why)
            return done

        done = wait("CT %d and CT %d recovered" % (CT, NEIGHBOUR), both_done, a.timeout, 2)
        t_done = time.time()
        for vmid, kind in ((CT, "held memory after a kill"), (NEIGHBOUR, "stuck process")):
            runs, why = done[vmid]
            check(len(runs) == 1, "CT %d (%s): one recover.yml run, %d seen" % (vmid, kind, len(runs)))
            check(True, "CT %d recovered, from the world: %s" % (vmid, why))
            figures["recovered_unattended"] += 1
            figures["faults"].append({"vmid": vmid, "fault": kind,
                                      "detection_s": round(runs[0]["start"] - t_inject, 1),
                                      "ladder_s": round(runs[0]["end"] - runs[0]["start"], 1),
                                      "fault_to_clean_s": round(runs[0]["end"] - t_inject, 1)})
        r129, r132 = done[CT][0][0], done[NEIGHBOUR][0][0]
        check(sampler.max_parallel == 1 and (r129["end"] <= r132["start"] or r132["end"] <= r129["start"]),
              "one recovery at a time on the node: at most %d recover.yml at once; CT %d %.1f-%.1f s, CT %d %.1f-%.1f s"
              % (sampler.max_parallel, CT, r129["start"] - t_inject, r129["end"] - t_inject,
                 NEIGHBOUR, r132["start"] - t_inject, r132["end"] - t_inject))
        s129, s132 = service(CT), service(NEIGHBOUR)
        check(s129.get("ActiveState") != "active" and deploy_metrics_mtime(CT) < t_inject,
              "CT %d not relaunched (the inventory does not say so): %s, no deploy verify since the fault" % (CT, s129))
        check(s132.get("ActiveState") == "active" and s132.get("InvocationID") not in (None, "", neighbour_before)
              and bool(ct_apps(NEIGHBOUR)) and r132["start"] <= deploy_metrics_mtime(NEIGHBOUR) <= r132["end"] + 1,
              "CT %d relaunched by deploy.yml (the inventory says so): service %s, InvocationID %s -> %s, GPU apps %s, "
              "deploy's verify wrote %s during its recover run"
              % (NEIGHBOUR, s132.get("ActiveState"), neighbour_before, s132.get("InvocationID"), ct_apps(NEIGHBOUR),
                 os.path.join(METRICS_DIR, "inferops_deploy_%d.prom" % NEIGHBOUR)))
        byst_now = sorted(p for p, g, m in gpu_apps() if "/lxc/%d/" % BYSTANDER in cgroup_of(p) and p not in byst_before)
        check(bool(byst) and byst_now == byst and gpu_used_mib()[BYSTANDER_GPU] == byst_mib
              and not [r for r in sampler.runs.values() if r["vmid"] not in (CT, NEIGHBOUR)],
              "bystander CT %d (not in the inventory): its workers %s still hold GPU %d (%d MiB), no run for it"
              % (BYSTANDER, byst_now, BYSTANDER_GPU, gpu_used_mib()[BYSTANDER_GPU]))
        figures["both_recovered_s"] = round(t_done - t_inject, 1)

        # 2. The fault comes back on CT 129 (a cgroup OOM kill inside it): its budget (1 per hour) is spent.
        mark = "inferops tests/eda/run_unattended.py: a cgroup OOM kill in CT %d follows (%d)" % (CT, os.getpid())
        kmsg_mark(mark)
        t_oom = time.time()
        subprocess.run(["pct", "exec", str(CT), "--", "sh", "-s"], input=OOM_SCRIPT, capture_output=True, text=True,
                       timeout=120, check=False)
        figures["faults_injected"] += 1
        check(oom_kills_after(CT, mark) > 0, "cgroup OOM kill in CT %d: none in the kernel log after %r" % (CT, mark))
        alert = "inferops gpu_watch ALERT: CT %d" % CT
        wait("the budget alert for CT %d" % CT, lambda: alert in rb_log(), 4 * a.interval + 60, 1)
        figures["alert_s"] = round(time.time() - t_oom, 1)
        time.sleep(2 * a.interval)
        check(len(sampler.of(CT)) == 1 and rb.poll() is None,
              "budget spent: alert after %.1f s, no second recover.yml for CT %d (%d run(s)), rulebook still running"
              % (figures["alert_s"], CT, len(sampler.of(CT))))
    except AssertionError as exc:
        check(False, str(exc))
    finally:
        sampler.stop.set()
        if rb.poll() is None:
            os.killpg(rb.pid, signal.SIGINT)
            try:
                rb.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(rb.pid, signal.SIGKILL)
                rb.wait()
        log.close()
        sh("%s fault clear --vmid %d" % (LABCTL, BYSTANDER), check=False)
        sh("%s fault clear --vmid %d" % (LABCTL, NEIGHBOUR), check=False)
        sh("%s fault clear --vmid %d" % (LABCTL, CT), check=False)
        shutil.rmtree(work, ignore_errors=True)
    text = open(log_path, errors="replace").read()
    polls = [float(x) for x in re.findall(r"gpu_watch: poll \d+ of \d+ container\(s\) took ([0-9.]+) s", text)]
    figures["poll_s_max"] = max(polls) if polls else None
    figures["polls"] = len(polls)
    figures["interval_s"] = a.interval
    # recover.yml runs on the machine that this run's rulebook did not start (not counted in any check).
    figures["other_recover_runs_ignored"] = len(sampler.others)
    figures["other_recover_runs"] = ["%d: %s" % kv for kv in sorted(sampler.others.items())]
    figures["debounce_s"] = a.debounce
    events = {}
    for t, vmid in re.findall(r"gpu_watch: event at ([0-9.]+): CT (\d+) on \S+ needs recovery", text):
        events.setdefault(int(vmid), float(t))
    for f in figures["faults"]:
        if f["vmid"] in events:
            f["event_s"] = round(events[f["vmid"]] - t_inject, 1)
    figures["failures"] = failures
    with open(a.out, "w") as f:
        json.dump(figures, f, indent=2)
    print(json.dumps(figures, indent=2))
    print("rulebook log: %s" % log_path)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
