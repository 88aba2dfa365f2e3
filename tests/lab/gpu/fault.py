#!/usr/bin/python3
"""Fault injection for the lab's simulated GPUs (`labctl fault ...` execs this).  See docs/lab.md.

    fault.py list
    fault.py inject sigterm-ignored  --vmid 129
    fault.py inject escaped-workers  --vmid 129 [--gpus 0,1] [--mib 1024] [--names pt_main_thread,python3]
    fault.py inject driver-held      --vmid 129
    fault.py inject slow-teardown    --vmid 129 [--seconds 30]
    fault.py inject stuck            --vmid 129 [--gpu 0] [--mib 4096]
    fault.py inject stuck-on-stop    --vmid 129
    fault.py inject recovery-action  --vmid 129 [--gpu 0] [--action Reset]
    fault.py inject gpu-lost         --vmid 129 [--gpu 0]
    fault.py inject memory-na        --vmid 129 [--gpu 0]
    fault.py inject util-latch       --vmid 129 [--gpu 0]
    fault.py inject xid-on-exit      --vmid 129 [--gpu 0] [--xid 45]
    fault.py clear [--vmid 129]
    fault.py minor-map [--node pve1] 5=6,6=5     (GPU index=device minor; "" or "none": minor = index again)

Containers are LXC containers named by VMID (entered with lxc-attach; `--lxcpath` or LABGPU_LXCPATH
for a non-default lxc path).  Injected faults are recorded in /run/inferops-lab/gpu/faults.json.
A CT of pve2 (its config in /etc/pve/nodes/pve2/lxc) has pve2's GPUs: its faults go to pve2's driver daemon.
"""
import argparse
import glob
import json
import os
import signal
import socket
import subprocess
import sys
import time

from gpu import driverd

HERE = os.path.dirname(os.path.abspath(__file__))

STATE = "/run/inferops-lab/gpu/faults.json"
WORKER = "/run/nvidia-lab/lab-worker.py"
STANDIN_FAULTS = "/run/sglang-standin/faults.json"
STUCK_MNT = "/run/lab-stuckfs"
FUSECTL = "/sys/fs/fuse/connections"

FAULTS = {
    "sigterm-ignored": "the SGLang stand-in ignores SIGTERM (writes %s in the CT)" % STANDIN_FAULTS,
    "escaped-workers": "GPU-holding processes named pt_main_thread/python3, reparented to the CT's PID 1 and "
                       "moved to its init cgroup (sglang#23627, vllm#6766)",
    "driver-held": "the driver keeps the CT's GPU memory after its processes exit; released only when no "
                   "process of the CT is left (CT stopped from the host) or by a GPU reset from the host",
    "driver-leak": "like driver-held, but the memory outlives the CT's processes and the CT itself: only a GPU "
                   "reset from the host frees it (NVIDIA: leftover memory with no process is a driver issue, "
                   "nvidia-docker#572; nvidia-smi -r clears state that would otherwise need a reboot)",
    "slow-teardown": "the driver's teardown of the CT's exited clients takes --seconds (30): their GPU memory stays "
                     "used, with no process listed, then is freed (gpu-recovery.md 1.2 g: a slow teardown looks like "
                     "a leak; Slurm waits UnkillableStepTimeout, 60 s by default, for processes to go after SIGKILL)",
    "recovery-action": "the driver sets gpu_recovery_action of one of the CT's GPUs (default Reset), as after an "
                       "uncorrectable error; a GPU reset clears Reset and Drain and Reset (NVIDIA, Error Recovery and "
                       "Response Flags: terminate the GPU's processes, nvidia-smi -r, then it can be used again)",
    "gpu-lost": "one of the CT's GPUs falls off the bus: the driver logs Xid 79, nvidia-smi fails with 'GPU is lost. "
                "Reboot the system to recover this GPU' and rc 15, the GPU can be neither used nor reset (NVIDIA Xid "
                "catalogue: 79; nvidia-smi(1) return value 15)",
    "memory-na": "nvidia-smi prints [N/A] for one GPU's memory.used/memory.free and its apps' used memory (a value "
                 "NVML does not return)",
    "util-latch": "one GPU of the CT reports 100 percent utilisation with no process and no memory of its own: the "
                  "latched 'engine busy' counter of Blackwell GPUs after a process died mid-kernel (Datura-ai/lium-io PR "
                  "#1142: 0 MiB, zero processes, survives under persistence mode; 580.x to 595.x). A client that opens "
                  "and cleanly closes the GPU afterwards clears it (same PR), and so does a GPU reset, which persistence "
                  "mode refuses (lium-io PR #1140: the state persists because persistence mode keeps the device "
                  "initialised)",
    "xid-on-exit": "the driver logs an Xid (default 45, 'Robust Channel Preemptive Removal') for one GPU of the CT "
                   "when a client of that GPU goes away (NVIDIA Xid catalogue)",
    "stuck": "a GPU-holding process in D state on a never-answering FUSE read; SIGKILL cannot end it until "
             "the FUSE connection is aborted from the host (gpu-recovery.md §1.2 b, Rung 3)",
    "stuck-on-stop": "the SGLang stand-in's ranks, on SIGTERM, read a file of the never-answering FUSE filesystem of "
                     "`stuck` (mounted in the CT, no worker): the read waits, and a SIGKILL then leaves each rank in D "
                     "state holding its GPU memory until the FUSE connection is aborted from the host (a server whose "
                     "model or cache lives on a FUSE mount that stops answering; gpu-recovery.md §1.2 b, Rung 3)",
}

LXCPATH = os.environ.get("LABGPU_LXCPATH")


class FaultError(Exception):
    pass


# --------------------------------------------------------------------------- helpers

def lxc_args(vmid):
    return (["-P", LXCPATH] if LXCPATH else []) + ["-n", str(vmid)]


def init_pid(vmid):
    r = subprocess.run(["lxc-info"] + lxc_args(vmid) + ["-p", "-H"], capture_output=True, text=True)
    out = r.stdout.strip()
    if r.returncode != 0 or not out.isdigit():
        raise FaultError("container %s is not running (lxc-info: %s)" % (vmid, (r.stderr or out).strip()))
    return int(out)


def attach(vmid, cmd, stdin=None, check=True, timeout=60):
    r = subprocess.run(["lxc-attach"] + lxc_args(vmid) + ["--clear-env", "--"] + cmd, input=stdin,
                       capture_output=True, text=True, timeout=timeout,
                       env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"})
    if check and r.returncode != 0:
        raise FaultError("lxc-attach %s %s failed (%d): %s" % (vmid, " ".join(cmd), r.returncode,
                                                               (r.stderr + r.stdout).strip()))
    return r


def node_of(vmid):
    """The PVE node whose config lists the CT (the node whose GPUs it has), pve1 when none does."""
    found = glob.glob("/etc/pve/nodes/*/lxc/%s.conf" % vmid)
    return found[0].split("/")[4] if found else "pve1"


def driver(req, node="pve1"):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(30)
    try:
        s.connect(driverd.node_paths(node)["sock_dir"] + "/driver.sock")
    except OSError as e:
        raise FaultError("the simulated driver of %s is not running (%s); run `tests/lab/labctl gpu up`" % (node, e))
    s.sendall(json.dumps(req).encode() + b"\n")
    buf = b""
    while not buf.endswith(b"\n"):
        c = s.recv(65536)
        if not c:
            break
        buf += c
    s.close()
    rep = json.loads(buf)
    if not rep.get("ok"):
        raise FaultError("driver: %s" % rep.get("error"))
    return rep


def load():
    try:
        with open(STATE) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {"faults": []}


def save(st):
    os.makedirs(os.path.dirname(STATE), exist_ok=True)
    with open(STATE + ".tmp", "w") as f:
        json.dump(st, f, indent=1)
    os.replace(STATE + ".tmp", STATE)


def host_pid(ns_ino, nspid):
    """Host PID of the process whose innermost PID is nspid in the PID namespace ns_ino."""
    for pid in driverd.all_pids():
        if driverd.pidns_of(pid) != ns_ino:
            continue
        try:
            with open("/proc/%d/status" % pid) as f:
                for line in f:
                    if line.startswith("NSpid:") and line.split()[-1] == str(nspid):
                        return pid
        except OSError:
            pass
    return None


def pid_ref(pid):
    st = driverd.proc_stat(pid)
    return {"pid": pid, "start": st[1] if st else None}


def same_process(ref):
    st = driverd.proc_stat(ref["pid"])
    return st is not None and st[1] == ref["start"]


def visible_gpus(ipid):
    out = []
    for i in range(64):
        try:
            st = os.stat("/proc/%d/root/dev/nvidia%d" % (ipid, i))
        except OSError:
            continue
        if os.major(st.st_rdev) == 195 and os.minor(st.st_rdev) == i:
            out.append(i)
    return out


def move_to_cgroups_of(pid, model_pid):
    """Put pid in every cgroup (v1 hierarchies and v2) that model_pid is in."""
    mounts = {}
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, right = line.split(" - ", 1)
            fstype, _src, sopts = right.split()[:3]
            mp = left.split()[4]
            if fstype == "cgroup2":
                mounts.setdefault("", mp)
            elif fstype == "cgroup":
                for o in sopts.split(","):
                    if o not in ("rw", "ro") and "=" not in o or o.startswith("name="):
                        mounts.setdefault(o, mp)
    with open("/proc/%d/cgroup" % model_pid) as f:
        lines = f.read().splitlines()
    for line in lines:
        _hid, ctrls, path = line.split(":", 2)
        mp = mounts.get(ctrls.split(",")[0] if ctrls else "")
        if not mp:
            continue
        try:
            with open(os.path.join(mp, path.lstrip("/"), "cgroup.procs"), "w") as f:
                f.write(str(pid))
        except OSError:
            pass


def start_worker(vmid, ipid, args):
    r = attach(vmid, ["/usr/bin/python3", WORKER, "--daemonize"] + args, check=False)
    try:
        rep = json.loads(r.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise FaultError("lab-worker in CT %s failed: %s" % (vmid, (r.stderr + r.stdout).strip()))
    if not rep.get("ok"):
        raise FaultError("lab-worker in CT %s: %s" % (vmid, rep.get("error")))
    hp = None
    for _ in range(50):
        hp = host_pid(driverd.pidns_of(ipid), rep["pid"])
        if hp:
            break
        time.sleep(0.1)
    if hp is None:
        raise FaultError("cannot find the host PID of CT %s pid %s" % (vmid, rep["pid"]))
    return hp, rep


# --------------------------------------------------------------------------- faults

def inject_sigterm_ignored(vmid, ipid, a):
    code = ("import json,os\np=%r\nos.makedirs(os.path.dirname(p),exist_ok=True)\n"
            "try:\n d=json.load(open(p))\nexcept Exception:\n d={}\n"
            "d['ignore_sigterm']=True\nt=p+'.tmp'\njson.dump(d,open(t,'w'))\nos.replace(t,p)\n" % STANDIN_FAULTS)
    attach(vmid, ["/usr/bin/python3", "-c", code])
    return {"file": STANDIN_FAULTS}


def clear_sigterm_ignored(vmid, rec, key="ignore_sigterm"):
    code = ("import json,os\np=%r\ntry:\n d=json.load(open(p))\nexcept Exception:\n raise SystemExit(0)\n"
            "d.pop(%r,None)\n"
            "if d:\n json.dump(d,open(p+'.tmp','w')); os.replace(p+'.tmp',p)\nelse:\n os.unlink(p)\n" % (STANDIN_FAULTS, key))
    attach(vmid, ["/usr/bin/python3", "-c", code], check=False)


def inject_escaped_workers(vmid, ipid, a):
    gpus = [int(x) for x in a.gpus.split(",")] if a.gpus else visible_gpus(ipid)
    if not gpus:
        raise FaultError("CT %s has no /dev/nvidiaN" % vmid)
    names = a.names.split(",")
    procs = []
    for k, g in enumerate(gpus):
        name = names[k % len(names)]
        hp, rep = start_worker(vmid, ipid, ["--gpus", str(g), "--mib", str(a.mib), "--name", name,
                                            "--tag", "fault:escaped-workers"])
        move_to_cgroups_of(hp, ipid)
        ref = pid_ref(hp)
        ref.update({"gpu": g, "name": name, "ct_pid": rep["pid"]})
        procs.append(ref)
    return {"processes": procs}


def clear_processes(rec):
    for ref in rec.get("processes", []):
        if same_process(ref):
            try:
                os.kill(ref["pid"], signal.SIGKILL)
            except OSError:
                pass


def inject_driver_held(vmid, ipid, a, until="namespace"):
    ns = driverd.pidns_of(ipid)
    req = {"op": "fault_set", "fault": "driver_held", "pidns": ns, "label": "CT %s" % vmid, "until": until}
    if until == "seconds":
        req["seconds"] = a.seconds
    driver(req, node_of(vmid))
    return {"pidns": ns}


def clear_driver_held(vmid, rec):
    driver({"op": "fault_clear", "pidns": rec["pidns"]}, rec.get("node", "pve1"))


def index_of_minor(minor, node):
    """The GPU index of device minor ``minor`` (/dev/nvidia<minor>) as the node's driver numbers them (fault
    minor-map); the minor itself with a driver that does not say."""
    for g in driver({"op": "query"}, node).get("gpus", []):
        if g.get("minor", g["index"]) == minor:
            return g["index"]
    return minor


def inject_recovery_action(vmid, ipid, a):
    gpus = [a.gpu] if a.gpu is not None else [index_of_minor(m, node_of(vmid)) for m in visible_gpus(ipid)[:1]]
    if not gpus:
        raise FaultError("CT %s has no /dev/nvidiaN" % vmid)
    rep = driver({"op": "fault_set", "fault": "recovery_action", "gpu": gpus[0], "action": a.action}, node_of(vmid))
    if not rep.get("ok"):
        raise FaultError(rep.get("error", "driver refused"))
    return {"gpu": gpus[0], "action": a.action}


def clear_recovery_action(vmid, rec):
    driver({"op": "fault_clear", "gpus": [rec["gpu"]]}, rec.get("node", "pve1"))


def inject_gpu_fault(fault):
    def inject(vmid, ipid, a):
        gpus = [a.gpu] if a.gpu is not None else [index_of_minor(m, node_of(vmid)) for m in visible_gpus(ipid)[:1]]
        if not gpus:
            raise FaultError("CT %s has no /dev/nvidiaN" % vmid)
        req = {"op": "fault_set", "fault": fault, "gpu": gpus[0]}
        if fault == "xid_on_exit":
            req["xid"] = a.xid
        rep = driver(req, node_of(vmid))
        if not rep.get("ok"):
            raise FaultError(rep.get("error", "driver refused"))
        return {"gpu": gpus[0]} if fault != "xid_on_exit" else {"gpu": gpus[0], "xid": a.xid}
    return inject


def ensure_fusectl():
    if not os.path.ismount(FUSECTL):
        subprocess.run(["mount", "-t", "fusectl", "fusectl", FUSECTL], check=False)


def mount_stuckfs(vmid, ipid):
    """stuckfs.py mounted in the CT's mount namespace at STUCK_MNT: its record (server, connection, abort file)."""
    ensure_fusectl()
    status = "/run/inferops-lab/gpu/stuckfs-%s.json" % vmid
    try:
        os.unlink(status)
    except OSError:
        pass
    log = open("/run/inferops-lab/gpu/stuckfs-%s.log" % vmid, "a")
    srv = subprocess.Popen([sys.executable, os.path.join(HERE, "stuckfs.py"), "--target-pid", str(ipid),
                            "--mountpoint", STUCK_MNT, "--status", status], stdin=subprocess.DEVNULL,
                           stdout=log, stderr=log, start_new_session=True, close_fds=True)
    for _ in range(100):
        if os.path.exists(status) or srv.poll() is not None:
            break
        time.sleep(0.05)
    if not os.path.exists(status):
        raise FaultError("stuckfs failed to mount in CT %s (see %s)" % (vmid, log.name))
    info = json.load(open(status))
    return {"server": pid_ref(srv.pid), "conn": info["conn"], "abort": info["abort"], "mountpoint": STUCK_MNT}


def inject_stuck(vmid, ipid, a):
    gpus = [a.gpu] if a.gpu is not None else visible_gpus(ipid)[:1]
    if not gpus:
        raise FaultError("CT %s has no /dev/nvidiaN" % vmid)
    rec = mount_stuckfs(vmid, ipid)
    hp, rep = start_worker(vmid, ipid, ["--gpus", str(gpus[0]), "--mib", str(a.mib), "--name", "python3",
                                        "--tag", "fault:stuck", "--stuck-file", STUCK_MNT + "/blob"])
    ref = pid_ref(hp)
    ref.update({"gpu": gpus[0], "name": "python3", "ct_pid": rep["pid"]})
    rec["processes"] = [ref]
    for _ in range(100):
        st = driverd.proc_stat(hp)
        if st and st[0] == "D":
            break
        time.sleep(0.05)
    else:
        rec["warning"] = "worker did not reach D state"
    return rec


def inject_stuck_on_stop(vmid, ipid, a):
    rec = mount_stuckfs(vmid, ipid)
    code = ("import json,os\np=%r\nos.makedirs(os.path.dirname(p),exist_ok=True)\n"
            "try:\n d=json.load(open(p))\nexcept Exception:\n d={}\n"
            "d['read_on_sigterm']=%r\nt=p+'.tmp'\njson.dump(d,open(t,'w'))\nos.replace(t,p)\n"
            % (STANDIN_FAULTS, STUCK_MNT + "/blob"))
    attach(vmid, ["/usr/bin/python3", "-c", code])
    rec.update({"file": STANDIN_FAULTS, "processes": []})
    return rec


def clear_stuck_on_stop(vmid, rec):
    clear_sigterm_ignored(vmid, rec, key="read_on_sigterm")
    clear_stuck(vmid, rec)


def clear_stuck(vmid, rec):
    try:
        with open(rec["abort"], "w") as f:
            f.write("1")
    except OSError:
        pass
    clear_processes(rec)
    srv = rec.get("server")
    for sig in (None, signal.SIGTERM, signal.SIGKILL):
        if not (srv and same_process(srv)):
            break
        if sig:
            try:
                os.kill(srv["pid"], sig)
            except OSError:
                pass
        for _ in range(60):  # after the abort the server unmounts and exits by itself
            if not same_process(srv):
                break
            time.sleep(0.05)
    try:
        from gpu import stuckfs
        stuckfs.unmount(init_pid(vmid), rec["mountpoint"])
    except (FaultError, OSError):
        pass


CLEAR = {"sigterm-ignored": lambda v, r: clear_sigterm_ignored(v, r),
         "escaped-workers": lambda v, r: clear_processes(r),
         "driver-held": clear_driver_held,
         "driver-leak": clear_driver_held,
         "slow-teardown": clear_driver_held,
         "recovery-action": clear_recovery_action,
         "gpu-lost": clear_recovery_action,
         "memory-na": clear_recovery_action,
         "util-latch": clear_recovery_action,
         "xid-on-exit": clear_recovery_action,
         "stuck": clear_stuck,
         "stuck-on-stop": clear_stuck_on_stop}
INJECT = {"sigterm-ignored": inject_sigterm_ignored, "escaped-workers": inject_escaped_workers,
          "driver-held": inject_driver_held, "stuck": inject_stuck, "recovery-action": inject_recovery_action,
          "stuck-on-stop": inject_stuck_on_stop,
          "driver-leak": lambda v, i, a: inject_driver_held(v, i, a, until="reset"),
          "slow-teardown": lambda v, i, a: inject_driver_held(v, i, a, until="seconds"),
          "gpu-lost": inject_gpu_fault("gpu_lost"), "memory-na": inject_gpu_fault("memory_na"),
          "util-latch": inject_gpu_fault("util_latch"),
          "xid-on-exit": inject_gpu_fault("xid_on_exit")}


# --------------------------------------------------------------------------- commands

def cmd_inject(a):
    ipid = init_pid(a.vmid)
    details = INJECT[a.name](a.vmid, ipid, a)
    st = load()
    rec = {"name": a.name, "vmid": str(a.vmid), "node": node_of(a.vmid), "since": time.time()}
    rec.update(details)
    st["faults"].append(rec)
    save(st)
    print(json.dumps(rec))
    return 0


def cmd_clear(a):
    st = load()
    keep, errors = [], []
    vmid = str(a.vmid) if a.vmid is not None else None
    for rec in st["faults"]:
        if vmid is not None and rec["vmid"] != vmid:
            keep.append(rec)
            continue
        try:
            CLEAR[rec["name"]](rec["vmid"], rec)
        except (FaultError, OSError, subprocess.SubprocessError) as e:
            errors.append("%s/%s: %s" % (rec["vmid"], rec["name"], e))
        print("cleared %s on CT %s" % (rec["name"], rec["vmid"]))
    if vmid is not None:  # also what was injected outside our records
        try:
            clear_sigterm_ignored(vmid, {})
            clear_sigterm_ignored(vmid, {}, key="read_on_sigterm")
        except (FaultError, subprocess.SubprocessError):
            pass
        try:
            driver({"op": "fault_clear", "pidns": driverd.pidns_of(init_pid(vmid))}, node_of(vmid))
        except FaultError:
            pass
    else:
        for node in ("pve1", "pve2"):
            try:
                driver({"op": "fault_clear"}, node)
            except FaultError:
                pass
    st["faults"] = keep
    save(st)
    for e in errors:
        print("warning: " + e, file=sys.stderr)
    return 0


def cmd_minor_map(a):
    """Which device minor each GPU index has on a node (NVIDIA: /dev/nvidia<Minor Number>, nvidia-smi -q; the index is
    NVML's enumeration order, and the two differ on some servers). Cleared by `fault.py clear` (no --vmid) too."""
    text = (a.map or "").strip()
    mapping = {}
    if text and text != "none":
        for item in text.split(","):
            index, sep, minor = item.partition("=")
            if not sep or not index.strip().isdigit() or not minor.strip().isdigit():
                raise FaultError("minor-map takes INDEX=MINOR[,INDEX=MINOR...], got %r" % item)
            mapping[index.strip()] = int(minor)
    rep = driver({"op": "fault_set", "fault": "minor_map", "map": mapping}, a.node)
    if not rep.get("ok"):
        raise FaultError(rep.get("error", "driver refused"))
    print(json.dumps({"node": a.node, "minor_map": mapping}))
    return 0


def cmd_list(a):
    print("Faults:")
    for n, d in FAULTS.items():
        print("  %-16s %s" % (n, d))
    st = load()
    print("Injected:" + ("" if st["faults"] else " none"))
    for rec in st["faults"]:
        extra = {k: v for k, v in rec.items() if k not in ("name", "vmid", "since")}
        print("  CT %s %s %s" % (rec["vmid"], rec["name"], json.dumps(extra)))
    return 0


def main(argv):
    ap = argparse.ArgumentParser(prog="fault.py", description="GPU fault injection for the inferops lab")
    ap.add_argument("--lxcpath")
    sub = ap.add_subparsers(dest="cmd", required=True)
    pi = sub.add_parser("inject")
    pi.add_argument("name", choices=sorted(FAULTS))
    pi.add_argument("--vmid", required=True)
    pi.add_argument("--gpus", help="escaped-workers: GPU indexes (default: every GPU the CT has)")
    pi.add_argument("--gpu", type=int, help="stuck, recovery-action, gpu-lost, memory-na, util-latch, xid-on-exit: GPU index (default: the CT's first GPU)")
    pi.add_argument("--action", default="Reset", choices=driverd.RECOVERY_ACTIONS[1:],
                    help="recovery-action: the value the driver reports (Reset)")
    pi.add_argument("--seconds", type=float, default=30.0, help="slow-teardown: how long the teardown takes (30)")
    pi.add_argument("--xid", type=int, default=45, help="xid-on-exit: the Xid the driver logs (45)")
    pi.add_argument("--mib", type=int, default=None, help="MiB per worker (1024; stuck: 4096)")
    pi.add_argument("--names", default="pt_main_thread,python3", help="escaped-workers: process names")
    pc = sub.add_parser("clear")
    pc.add_argument("--vmid")
    sub.add_parser("list")
    pm = sub.add_parser("minor-map")
    pm.add_argument("map", nargs="?", default="", help="INDEX=MINOR,...: a permutation of GPUs' device minors")
    pm.add_argument("--node", default="pve1")
    a = ap.parse_args(argv)
    global LXCPATH
    LXCPATH = a.lxcpath or LXCPATH
    if a.cmd == "inject" and a.mib is None:
        a.mib = 4096 if a.name == "stuck" else 1024
    if os.geteuid() != 0:
        print("fault.py: must run as root", file=sys.stderr)
        return 1
    try:
        return {"inject": cmd_inject, "clear": cmd_clear, "list": cmd_list, "minor-map": cmd_minor_map}[a.cmd](a)
    except FaultError as e:
        print("fault.py: %s" % e, file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
