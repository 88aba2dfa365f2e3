#!/usr/bin/env python3
"""Self-checking device test of the recovery logic on a real NVIDIA GPU (see README.md). Never resets or
reconfigures the GPU: only nvidia-smi queries, a driver-API holder process, and signals to that holder.

Uses the collection's stdlib-only module_utils directly (gpu_facts, procfs, recover_procs, recover_signals), and, when ansible is
installed, the modules gpu_host_facts and gpu_recover_action through a local connection.
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
# run.sh links the checkout as .collections/ansible_collections/inferops/gpu_inference (module_utils import each
# other by that name).
sys.path.insert(0, os.path.join(ROOT, ".collections"))
from ansible_collections.inferops.gpu_inference.plugins.module_utils.host import gpu_facts  # noqa: E402
from ansible_collections.inferops.gpu_inference.plugins.module_utils.host import procfs  # noqa: E402
from ansible_collections.inferops.gpu_inference.plugins.module_utils.recover import recover_procs as rp  # noqa: E402
from ansible_collections.inferops.gpu_inference.plugins.module_utils.recover import recover_signals as rsig  # noqa: E402

VMID = int(os.environ.get("DEVICE_TEST_VMID", "9999"))
MIB = int(os.environ.get("DEVICE_TEST_MIB", "2048"))
results = []


def ok(name, cond, detail=""):
    results.append({"check": name, "ok": bool(cond), "detail": detail})
    print("%s %s %s" % ("PASS" if cond else "FAIL", name, detail), flush=True)
    return cond


def smi(*args):
    return subprocess.run(["timeout", "30", "nvidia-smi"] + list(args), capture_output=True, text=True)


def gpu_used(index):
    out = smi(*gpu_facts.gpu_query_args("x")[1:]).stdout
    for g in gpu_facts.parse_gpu_csv(out):
        if g["index"] == index:
            return g
    raise SystemExit("GPU %d not found" % index)


def start_holder(ignore_term):
    args = [sys.executable, os.path.join(HERE, "holder.py"), "--mib", str(MIB)] + (["--ignore-term"] if ignore_term else [])
    p = subprocess.Popen(args, stdout=subprocess.PIPE, text=True, start_new_session=True)
    line = p.stdout.readline().strip()
    if not line.startswith("READY"):
        raise SystemExit("holder did not start: %r (rc %s)" % (line, p.poll()))
    return p


def move_to_fake_container(pid):
    """Put the holder in a cgroup named like an LXC container (lxc.payload.<vmid>) so that the container scoping
    is exercised on a machine without LXC. Returns the cgroup path or None when cgroupfs is not writable."""
    base = "/sys/fs/cgroup"
    if not os.path.exists(os.path.join(base, "cgroup.controllers")):
        return None  # cgroup v1: skip (the lab covers v1)
    path = os.path.join(base, "lxc.payload.%d" % VMID)
    try:
        os.makedirs(path, exist_ok=True)
        with open(os.path.join(path, "cgroup.procs"), "w") as f:
            f.write(str(pid))
        return path
    except OSError as exc:
        print("note: cannot create %s (%s): container scoping checked on the pure logic only" % (path, exc))
        return None


def wait_freed(index, base_mib, timeout=90):
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        g = gpu_used(index)
        if g["memory_used_mib"] <= base_mib + 16:
            return time.monotonic() - t0, g["memory_used_mib"]
        time.sleep(1)
    return None, gpu_used(index)["memory_used_mib"]


def main():
    if not shutil.which("nvidia-smi"):
        print("SKIP: no nvidia-smi on this machine")
        return 77
    index = 0
    base = gpu_used(index)["memory_used_mib"]
    print("GPU %d: %s, %d MiB used before" % (index, gpu_used(index)["name"], base))

    # 1. facts: the holder is seen by the parser and by the fd scan
    holder = start_holder(ignore_term=True)
    time.sleep(1)
    g = gpu_used(index)
    ok("holder allocated memory", g["memory_used_mib"] >= base + MIB - 64, "%d MiB used" % g["memory_used_mib"])
    apps = gpu_facts.parse_compute_apps_csv(smi(*gpu_facts.compute_apps_query_args("x")[1:]).stdout)
    ok("nvidia-smi lists the holder (host PID)", any(a["pid"] == holder.pid for a in apps),
       "apps %s (an empty list means nvidia-smi runs in another PID namespace)" % [a["pid"] for a in apps])
    proc = rp.read_process(holder.pid, "/", rp.parse_proc_devices(procfs.read_text("/proc/devices")))
    ok("fd scan sees /dev/nvidia* open", proc and proc["holds_nvidia"], json.dumps(proc and proc["nvidia_fd_kinds"]))

    # 2. scoped kill rung: SIGTERM (ignored by the holder) then SIGKILL, by process group, only in the "container"
    cg = move_to_fake_container(holder.pid)
    proc = rp.read_process(holder.pid, "/")
    if cg:
        ok("cgroup maps the holder to the container", proc["vmid"] == VMID, str(proc["cgroup"]))
    procs = [p for p in (rp.read_process(x, "/") for x in rp.list_pids("/")) if p]
    target = dict(proc, vmid=VMID)  # without a writable cgroupfs: scope by our own decision, logic unchanged
    plan = rsig.pids_to_signal([target], [dict(p, vmid=VMID) if p["pgid"] == proc["pgid"] else p for p in procs], VMID, None)
    ok("plan is the holder's own process group", plan["groups"] == [proc["pgid"]] and not plan["skipped"], str(plan))
    used_ansible = False
    if cg and shutil.which("ansible"):
        env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=os.path.join(ROOT, ".collections"))
        r = subprocess.run(["ansible", "localhost", "-c", "local", "-m", "inferops.gpu_inference.gpu_host_facts"],
                           capture_output=True, text=True, env=env, timeout=120)
        ok("gpu_host_facts module runs", r.returncode == 0, r.stdout[-300:])
        r = subprocess.run(["ansible", "localhost", "-c", "local", "-m", "inferops.gpu_inference.gpu_recover_action",
                            "-a", "vmid=%d action=kill_holders term_grace=3 wait=30" % VMID],
                           capture_output=True, text=True, env=env, timeout=120)
        ok("gpu_recover_action kill_holders runs", r.returncode == 0, r.stdout[-600:])
        used_ansible = True
    else:
        rsig.send_signal(plan, signal.SIGTERM)
        time.sleep(3)
        ok("SIGTERM ignored by the holder (SIGKILL needed)", holder.poll() is None)
        rsig.send_signal(plan, signal.SIGKILL)
    try:
        holder.wait(timeout=30)
    except subprocess.TimeoutExpired:
        pass
    ok("holder is gone", holder.poll() is not None, "rc %s" % holder.poll())
    secs, used = wait_freed(index, base)
    ok("GPU memory freed after the kill", secs is not None, "%s MiB used, %.1f s" % (used, secs or -1))
    if cg:
        try:
            os.rmdir(cg)
        except OSError:
            pass
    summary = {"gpu": gpu_used(index)["name"], "ansible": used_ansible, "checks": results,
               "ok": all(r["ok"] for r in results)}
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, "device-check.json"), "w") as f:
            json.dump(summary, f, indent=2)
    print("RESULT: %s" % ("PASS" if summary["ok"] else "FAIL"))
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
