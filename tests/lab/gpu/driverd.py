#!/usr/bin/python3
"""Simulated NVIDIA kernel driver for the inferops lab (see docs/lab.md, "Simulated GPUs and driver").

Owns the GPU state and serves the driver socket protocol on /run/nvidia-lab/driver.sock:
one JSON object per line in, one JSON reply per line out.

The caller is identified with SO_PEERCRED (the kernel gives the host PID even for a caller inside a
container).  An allocation belongs to the calling process; it stays allocated while that process
(any live thread of it) keeps a /dev/nvidiaN node for that GPU open, and is released when the process
is really gone (exited, zombie, PID reused) or has closed the node -- unless the "driver_held" fault
is set for the caller's PID namespace, in which case the memory is retained by the "driver" until no
process of that namespace is left (container stopped from the host) or the GPU is reset.  With the flag's
"until": "reset" (fault "driver-leak") the retained memory outlives the namespace: only a GPU reset frees it.
With "until": "seconds" (fault "slow-teardown") the driver's teardown of an exited client's memory takes that
many seconds (gpu-recovery.md 1.2 g: it looks like a leak until it is done); a GPU reset also ends it.

No polling thread: liveness is re-evaluated lazily on every request (the only way anyone can observe
GPU memory is a request), so the daemon costs nothing while idle.

Stdlib only; runs with /usr/bin/python3 (3.11).
"""
import hashlib
import json
import os
import selectors
import signal
import socket
import stat
import struct
import sys
import time

NVIDIA_MAJOR = 195
NVIDIACTL_MINOR = 255
MIB = 1024 * 1024

SOCK_DIR = "/run/nvidia-lab"
SOCK_PATH = SOCK_DIR + "/driver.sock"
RUN_DIR = "/run/inferops-lab/gpu"
STATE_PATH = RUN_DIR + "/driverd-state.json"
DEV_DIR = "/dev"
# The values nvidia-smi prints for gpu_recovery_action (NVML nvmlDeviceGpuRecoveryAction_t, NVIDIA's Error Recovery
# and Response Flags, docs.nvidia.com/deploy/a100-gpu-mem-error-mgmt: None, Reset, Reboot, Drain P2P, and
# Drain and Reset from NVML's enum).
RECOVERY_ACTIONS = ("None", "Reset", "Reboot", "Drain P2P", "Drain and Reset")
CONFIG_PATH = "/var/lib/inferops-lab/gpu/config.json"

# PCI bus numbers of a typical 8-GPU PCIe server (2 sockets x 4 GPUs).
_BUSES = ["18", "2A", "3A", "5D", "9A", "AB", "BA", "DB"]

DEFAULTS = {
    "gpu_count": 8,
    "name": "NVIDIA RTX PRO 6000 Blackwell Server Edition",
    "memory_total_mib": 97887,
    "memory_reserved_mib": 0,
    "driver_version": "580.95.05",
    "cuda_version": "13.0",
    "other_driver_version": "580.82.07",
    "persistence_mode": "Enabled",
    "uvm_major": 510,
    # What `nvidia-smi topo -m` shows: "pcie" (2 sockets x 4 GPUs, no NVLink, as _BUSES) or "nvswitch" (an HGX
    # board: every GPU pair joined by 18 NVLinks through the NVSwitches).
    "topology": "pcie",
    # The GPUs of the lab's second PVE node (docs/lab.md, "GPUs of pve2"): a driver daemon of their own.
    "pve2_gpu_count": 4,
}
_ENV = {
    "gpu_count": ("LABGPU_COUNT", int),
    "name": ("LABGPU_NAME", str),
    "memory_total_mib": ("LABGPU_MEMORY_MIB", int),
    "memory_reserved_mib": ("LABGPU_RESERVED_MIB", int),
    "driver_version": ("LABGPU_DRIVER_VERSION", str),
    "cuda_version": ("LABGPU_CUDA_VERSION", str),
    "other_driver_version": ("LABGPU_OTHER_DRIVER_VERSION", str),
    "persistence_mode": ("LABGPU_PERSISTENCE_MODE", str),
    "uvm_major": ("LABGPU_UVM_MAJOR", int),
    "topology": ("LABGPU_TOPOLOGY", str),
    "pve2_gpu_count": ("LABGPU_PVE2_COUNT", int),
}


def node_paths(node):
    """Where the driver of a lab node keeps its socket, state and device nodes, as the daemon (on the machine's
    own mount namespace) sees them. pve1 is the machine's own node; another node's directory is what its mount
    namespace shows at /run/nvidia-lab and its nodes what it shows at /dev/nvidia* (tests/lab/pve/nodens.py)."""
    if node == "pve1":
        return {"sock_dir": SOCK_DIR, "state": STATE_PATH, "dev_dir": DEV_DIR}
    root = "/run/inferops-lab/" + node
    return {"sock_dir": root + "/nvidia-lab", "state": RUN_DIR + "/driverd-state-%s.json" % node,
            "dev_dir": root + "/dev"}


def node_config(cfg, node):
    """The daemon configuration of one node: pve1 has gpu_count GPUs, pve2 pve2_gpu_count."""
    out = dict(cfg, node=node)
    if node != "pve1":
        out["gpu_count"] = int(cfg["pve2_gpu_count"])
    return out


def load_config(path=None):
    """Defaults < /var/lib/inferops-lab/gpu/config.json < LABGPU_* environment variables."""
    cfg = dict(DEFAULTS)
    path = path or os.environ.get("LABGPU_CONFIG", CONFIG_PATH)
    if os.path.exists(path):
        with open(path) as f:
            data = json.load(f)
        for k, v in data.items():
            if k in cfg:
                cfg[k] = v
    for k, (env, typ) in _ENV.items():
        if os.environ.get(env):
            cfg[k] = typ(os.environ[env])
    pm = str(cfg["persistence_mode"]).lower()
    cfg["persistence_mode"] = "Enabled" if pm in ("1", "on", "enabled", "true") else "Disabled"
    return cfg


def gpu_static(cfg, index):
    if index < len(_BUSES):
        bus = _BUSES[index]
    else:
        bus = "%02X" % ((0xC0 + index) & 0xFF)
    # Another node's GPUs sit at the same bus ids (the same server model) but are other boards: their own UUIDs.
    node = cfg.get("node", "pve1")
    seed = "inferops-lab-gpu-%d-%s" % (index, cfg["name"]) if node == "pve1" else \
        "inferops-lab-gpu-%s-%d-%s" % (node, index, cfg["name"])
    h = hashlib.sha256(seed.encode()).hexdigest()
    uuid = "GPU-%s-%s-%s-%s-%s" % (h[0:8], h[8:12], h[12:16], h[16:20], h[20:32])
    return {
        "index": index,
        "uuid": uuid,
        "name": cfg["name"],
        "pci_bus_id": "00000000:%s:00.0" % bus,
        "serial": "%013d" % (1650325000000 + int(h[:6], 16) % 1000000),
        "memory_total_mib": int(cfg["memory_total_mib"]),
        "memory_reserved_mib": int(cfg["memory_reserved_mib"]),
    }


# --------------------------------------------------------------------------- /proc helpers

def proc_stat(pid):
    """(state, starttime, flags) from /proc/PID/stat, or None if the process is gone."""
    try:
        with open("/proc/%d/stat" % pid, "rb") as f:
            data = f.read().decode("utf-8", "replace")
    except OSError:
        return None
    rest = data[data.rindex(")") + 2:].split()
    # rest[0] is field 3 (state); field 9 is flags, field 22 is starttime
    return rest[0], int(rest[19]), int(rest[6])


def pidns_of(pid):
    try:
        return os.stat("/proc/%d/ns/pid" % pid).st_ino
    except OSError:
        return None


def userns_of(pid):
    try:
        return os.stat("/proc/%d/ns/user" % pid).st_ino
    except OSError:
        return None


def process_name(pid):
    """What NVML shows as the process name: argv[0] as the process left it (setproctitle-aware)."""
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            raw = f.read()
        if raw:
            argv0 = raw.split(b"\0")[0]
            if b" " in argv0 and raw.count(b"\0") <= 1:  # setproctitle writes one long string
                argv0 = argv0.split(b" ")[0]
            if argv0:
                return argv0.decode("utf-8", "replace")
        with open("/proc/%d/comm" % pid) as f:
            return f.read().strip()
    except OSError:
        return "[Not Found]"


def node_id(st):
    """What identifies a GPU's device node: the node file itself (filesystem and inode), which bind mounts keep.
    Two lab nodes on one machine have GPU nodes with the same numbers (195:N), so the number alone cannot say whose
    GPU a process holds; on one node, where each GPU has one node file, this is the same as matching st_rdev."""
    return (st.st_dev, st.st_ino)


def _fd_holds(fd_dir, rdevs):
    """Set of node ids (from `rdevs`, see node_id) that some fd in fd_dir points at."""
    found = set()
    try:
        names = os.listdir(fd_dir)
    except OSError:
        return found
    for n in names:
        p = fd_dir + "/" + n
        try:
            target = os.readlink(p)
        except OSError:
            continue
        if "nvidia" not in target:  # never stat other fds (a hung FUSE file would hang us)
            continue
        try:
            st = os.stat(p)
        except OSError:
            continue
        if stat.S_ISCHR(st.st_mode) and node_id(st) in rdevs:
            found.add(node_id(st))
    return found


def held_rdevs(pid, start, rdevs):
    """Which of `rdevs` (node ids) the process (pid, start) still holds open through a live (non-zombie) task.

    A zombie leader whose other threads still live keeps the files (threads share the fd table),
    which is why the tasks are examined one by one."""
    st = proc_stat(pid)
    if st is None or st[1] != start:
        return set()
    try:
        tids = os.listdir("/proc/%d/task" % pid)
    except OSError:
        return set()
    for tid in tids:
        tst = proc_stat_task(pid, tid)
        if tst is None or tst in ("Z", "X", "x"):
            continue
        return _fd_holds("/proc/%d/task/%s/fd" % (pid, tid), rdevs)
    return set()


def proc_stat_task(pid, tid):
    try:
        with open("/proc/%d/task/%s/stat" % (pid, tid), "rb") as f:
            data = f.read().decode("utf-8", "replace")
    except OSError:
        return None
    return data[data.rindex(")") + 2:].split()[0]


def all_pids():
    for n in os.listdir("/proc"):
        if n.isdigit():
            yield int(n)


def pidns_populated(ino):
    for pid in all_pids():
        if pidns_of(pid) == ino:
            st = proc_stat(pid)
            if st and st[0] not in ("Z", "X"):
                return True
    return False


def device_openers(rdev):
    """Host PIDs of live processes with the device node open (what the kernel driver counts)."""
    out = []
    me = os.getpid()
    for pid in all_pids():
        if pid == me:
            continue
        st = proc_stat(pid)
        if st is None or st[0] in ("Z", "X"):
            continue
        if held_rdevs(pid, st[1], {rdev}):
            out.append(pid)
    return out


def cap_sys_admin(pid):
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("CapEff:"):
                    return bool(int(line.split()[1], 16) & (1 << 21))
    except OSError:
        pass
    return False


# --------------------------------------------------------------------------- the driver

class Driver:
    def __init__(self, cfg):
        self.cfg = cfg
        self.paths = node_paths(cfg.get("node", "pve1"))
        self.gpus = [gpu_static(cfg, i) for i in range(int(cfg["gpu_count"]))]
        self.pm = [cfg["persistence_mode"]] * len(self.gpus)
        self.allocs = {}          # handle -> dict
        self.driver_held = {}     # str(pidns inode) -> {"since": t, "label": str}
        # gpu_recovery_action per GPU (NVML nvmlDeviceGpuRecoveryAction_t): "None" unless a fault set it; a GPU
        # reset clears "Reset" (NVIDIA, Error Recovery and Response Flags: reset with nvidia-smi -r, then usable).
        self.recovery = ["None"] * len(self.gpus)
        # GPU faults by index (str): "lost" (fallen off the bus, Xid 79), "memory_na" (memory figures [N/A]),
        # "xid_on_exit" (the Xid the driver logs when a client of that GPU goes away).
        # "minor_map": {str(index): minor} for the GPUs whose device minor is not their index (fault "minor-swap"):
        # on some servers NVML's enumeration order (the nvidia-smi index) and the driver's minor numbers (/dev/nvidiaN,
        # nvidia-smi -q "Minor Number") differ. The set of minors stays the set of indexes: the device nodes are the
        # same, only which GPU each one is changes.
        # "util_latch": {str(index): since}: the GPU reports 100 % utilisation with no process and no memory of its
        # own (fault "util-latch"): Blackwell's latched "engine busy" counter after a process died mid-kernel, which
        # persistence mode keeps; a fresh client's clean open and close on the GPU clears it (Datura-ai/lium-io PR
        # #1142), and so does a reset, which persistence mode refuses (op_reset; lium-io PR #1140).
        self.gpu_faults = {"lost": [], "memory_na": [], "xid_on_exit": {}, "minor_map": {}, "util_latch": {}}
        # GPU resets done per GPU (lab evidence: which GPU a reset really hit).
        self.resets = [0] * len(self.gpus)
        self.seq = 0
        self.my_pidns = pidns_of(os.getpid())
        self.my_userns = userns_of(os.getpid())
        self.load()

    # ---- persistence of state across a daemon restart
    def load(self):
        try:
            with open(self.paths["state"]) as f:
                s = json.load(f)
        except (OSError, ValueError):
            return
        if s.get("driver_version") != self.cfg["driver_version"] or len(s.get("pm", [])) != len(self.gpus):
            return
        self.pm = s["pm"]
        self.allocs = s.get("allocs", {})
        self.driver_held = s.get("driver_held", {})
        self.seq = s.get("seq", 0)
        if len(s.get("recovery", [])) == len(self.gpus):
            self.recovery = s["recovery"]
        if isinstance(s.get("gpu_faults"), dict):
            self.gpu_faults.update(s["gpu_faults"])
        if len(s.get("resets", [])) == len(self.gpus):
            self.resets = s["resets"]

    def save(self):
        os.makedirs(RUN_DIR, exist_ok=True)
        tmp = self.paths["state"] + ".tmp"
        with open(tmp, "w") as f:
            json.dump({"driver_version": self.cfg["driver_version"], "pm": self.pm, "allocs": self.allocs,
                       "driver_held": self.driver_held, "seq": self.seq, "recovery": self.recovery,
                       "gpu_faults": self.gpu_faults, "resets": self.resets}, f)
        os.replace(tmp, self.paths["state"])

    def minor_of(self, gpu):
        """The device minor of GPU index gpu: /dev/nvidia<minor> (the index unless fault minor-swap says otherwise)."""
        return int(self.gpu_faults.get("minor_map", {}).get(str(gpu), gpu))

    def index_of_minor(self, minor):
        for g in self.gpus:
            if self.minor_of(g["index"]) == minor:
                return g["index"]
        return None

    def gpu_node(self, gpu):
        """The node id (node_id) of this driver's device node of GPU index gpu: the node file in its node's device
        directory, 195:<minor>; None when there is none (the GPU cannot be opened)."""
        minor = self.minor_of(gpu)
        try:
            st = os.stat("%s/nvidia%d" % (self.paths["dev_dir"], minor))
        except OSError:
            return None
        if not stat.S_ISCHR(st.st_mode) or st.st_rdev != os.makedev(NVIDIA_MAJOR, minor):
            return None
        return node_id(st)

    # ---- liveness
    def log_xid(self, gpu, xid, pid, text):
        """What the kernel driver prints for an Xid (NVIDIA, Xid Errors: 'NVRM: Xid (PCI:dddd:bb:dd): N, pid=...,
        name=..., text'), written to the kernel log. Writes from userspace carry the LOG_USER facility."""
        bus = self.gpus[gpu]["pci_bus_id"]            # 00000000:18:00.0
        line = "<4>NVRM: Xid (PCI:%s:%s): %d, pid=%s, name=%s, %s\n" % (
            bus[4:8], bus[9:14], xid, pid if pid else "'<unknown>'", "<unknown>", text)
        try:
            with open("/dev/kmsg", "w") as f:
                f.write(line)
        except OSError as exc:
            print("driverd: cannot write the kernel log: %s" % exc, file=sys.stderr)

    def sweep(self):
        changed = False
        cache = {}
        logged = set()
        nodes = {g["index"]: self.gpu_node(g["index"]) for g in self.gpus}
        want = {n for n in nodes.values() if n is not None}
        for h, a in list(self.allocs.items()):
            if a.get("retained"):
                continue
            key = (a["pid"], a["start"])
            if key not in cache:
                cache[key] = held_rdevs(a["pid"], a["start"], want)
            if nodes.get(a["gpu"]) in cache[key]:
                continue
            changed = True
            if str(a["pidns"]) in self.driver_held:
                held = self.driver_held[str(a["pidns"])]
                a["retained"] = True
                a["retained_since"] = time.time()
                a["retained_until"] = held.get("until", "namespace")
                if a["retained_until"] == "seconds":
                    a["retained_seconds"] = float(held.get("seconds", 0))
            else:
                del self.allocs[h]
            xid = self.gpu_faults["xid_on_exit"].get(str(a["gpu"]))
            if xid is not None and (a["pid"], a["gpu"]) not in logged:
                logged.add((a["pid"], a["gpu"]))
                self.log_xid(a["gpu"], int(xid), a["pid"], "Channel teardown after the client exited")
        now = time.time()
        for h, a in list(self.allocs.items()):
            if a.get("retained_until") == "seconds" and now >= a["retained_since"] + a.get("retained_seconds", 0):
                del self.allocs[h]  # the slow teardown is done
                changed = True
        retained_ns = {a["pidns"] for a in self.allocs.values()
                       if a.get("retained") and a.get("retained_until") != "seconds"}
        for ns in retained_ns:
            if not pidns_populated(ns):
                changed = True
                for h, a in list(self.allocs.items()):
                    if a.get("retained") and a["pidns"] == ns and a.get("retained_until", "namespace") == "namespace":
                        del self.allocs[h]
        for ns in list(self.driver_held):
            if ns not in {str(x) for x in retained_ns} and not pidns_populated(int(ns)):
                # container stopped: the flag goes with its namespace
                del self.driver_held[ns]
                changed = True
        if changed:
            self.save()

    def used_mib(self, gpu):
        b = sum(a["bytes"] for a in self.allocs.values() if a["gpu"] == gpu)
        return -(-b // MIB)

    # ---- requests
    def handle(self, req, peer):
        pid, uid, _gid = peer
        in_container = pidns_of(pid) != self.my_pidns
        op = req.get("op")
        if op == "version":
            return {"ok": True, "driver_version": self.cfg["driver_version"], "cuda_version": self.cfg["cuda_version"]}
        self.sweep()
        if op == "query":
            return self.op_query(in_container)
        if op == "alloc":
            return self.op_alloc(req, pid)
        if op == "free":
            return self.op_free(req, pid, uid, in_container)
        if op == "set_pm":
            return self.op_set_pm(req, pid, uid, in_container)
        if op == "reset":
            return self.op_reset(req, uid, in_container)
        if op in ("fault_set", "fault_clear", "fault_list", "allocations"):
            if in_container or uid != 0:
                return {"ok": False, "error": "Insufficient Permissions", "code": 4}
            return getattr(self, "op_" + op)(req)
        return {"ok": False, "error": "unknown op %r" % (op,), "code": 2}

    def op_query(self, in_container):
        gpus = []
        for g in self.gpus:
            i = g["index"]
            procs = {}
            retained = 0
            for a in self.allocs.values():
                if a["gpu"] != i:
                    continue
                if a.get("retained"):
                    retained += a["bytes"]
                    continue
                p = procs.setdefault(a["pid"], {"pid": a["pid"], "bytes": 0})
                p["bytes"] += a["bytes"]
            plist = []
            if not in_container:
                for p in sorted(procs.values(), key=lambda x: x["pid"]):
                    plist.append({"pid": p["pid"], "name": process_name(p["pid"]),
                                  "used_memory_mib": -(-p["bytes"] // MIB), "type": "C"})
            used = self.used_mib(i)
            d = dict(g)
            d.update({"minor": self.minor_of(i), "resets": self.resets[i], "memory_used_mib": used,
                      "memory_free_mib": max(0, g["memory_total_mib"] - g["memory_reserved_mib"] - used),
                      "persistence_mode": self.pm[i], "recovery_action": self.recovery[i], "processes": plist,
                      "lost": i in self.gpu_faults["lost"], "memory_na": i in self.gpu_faults["memory_na"],
                      "utilization_gpu": 100 if str(i) in self.gpu_faults.get("util_latch", {}) else 0})
            if not in_container:
                d["driver_retained_mib"] = -(-retained // MIB)
            gpus.append(d)
        return {"ok": True, "driver_version": self.cfg["driver_version"], "cuda_version": self.cfg["cuda_version"],
                "in_container": in_container, "gpus": gpus,
                "topology": "nvswitch" if str(self.cfg.get("topology")).lower() == "nvswitch" else "pcie"}

    def op_alloc(self, req, pid):
        try:
            gpu = int(req["gpu"])
            nbytes = int(req["bytes"])
            # A client names the GPU by the device node it opened (its minor); "gpu" alone is taken as the index.
            if req.get("minor") is not None:
                found = self.index_of_minor(int(req["minor"]))
                gpu = -1 if found is None else found
        except (KeyError, TypeError, ValueError):
            return {"ok": False, "error": "invalid argument: need integer 'gpu' and 'bytes'", "code": 2}
        if not 0 <= gpu < len(self.gpus) or nbytes < 0:
            return {"ok": False, "error": "invalid device ordinal (cudaErrorInvalidDevice)", "code": 2}
        st = proc_stat(pid)
        if st is None:
            return {"ok": False, "error": "caller vanished"}
        node = self.gpu_node(gpu)
        if node is None or node not in held_rdevs(pid, st[1], {node}):
            return {"ok": False, "error": "no CUDA-capable device is detected (cudaErrorNoDevice): the calling "
                    "process (host pid %d) has no open /dev/nvidia%d" % (pid, gpu)}
        if gpu in self.gpu_faults["lost"]:
            return {"ok": False, "error": "unspecified launch failure: GPU %d has fallen off the bus" % gpu}
        g = self.gpus[gpu]
        free_b = (g["memory_total_mib"] - g["memory_reserved_mib"]) * MIB - sum(
            a["bytes"] for a in self.allocs.values() if a["gpu"] == gpu)
        if nbytes > free_b:
            return {"ok": False, "error": "CUDA error: out of memory (cudaErrorMemoryAllocation): tried to allocate "
                    "%d MiB on GPU %d with %d MiB free" % (-(-nbytes // MIB), gpu, max(0, free_b) // MIB)}
        self.seq += 1
        h = "h-%x-%d" % (pid, self.seq)
        self.allocs[h] = {"gpu": gpu, "bytes": nbytes, "tag": str(req.get("tag", "")), "pid": pid,
                          "start": st[1], "pidns": pidns_of(pid), "created": time.time()}
        self.save()
        return {"ok": True, "handle": h}

    def op_free(self, req, pid, uid, in_container):
        h = req.get("handle")
        a = self.allocs.get(h)
        if a is None or a.get("retained"):
            return {"ok": False, "error": "invalid resource handle (cudaErrorInvalidResourceHandle)"}
        if a["pid"] != pid and a["pidns"] != pidns_of(pid) and not (uid == 0 and not in_container):
            return {"ok": False, "error": "invalid resource handle (cudaErrorInvalidResourceHandle)"}
        del self.allocs[h]
        latch = self.gpu_faults.get("util_latch", {})
        if str(a["gpu"]) in latch and a.get("created", 0) > latch[str(a["gpu"])]:
            # a client that came after the latch closed cleanly: the busy counter is reset (lium-io PR #1142)
            del latch[str(a["gpu"])]
        self.save()
        return {"ok": True}

    def _targets(self, req):
        gpus = req.get("gpus")
        if gpus is None:
            return list(range(len(self.gpus)))
        return [int(x) for x in gpus]

    def op_set_pm(self, req, pid, uid, in_container):
        mode = "Enabled" if int(req.get("mode", 1)) else "Disabled"
        allowed = uid == 0 and (not in_container or (userns_of(pid) == self.my_userns and cap_sys_admin(pid)))
        results = []
        for i in self._targets(req):
            bus = self.gpus[i]["pci_bus_id"]
            if not allowed:
                return {"ok": False, "code": 4, "error": "Insufficient Permissions", "results": results,
                        "failed": {"index": i, "pci_bus_id": bus}}
            results.append({"index": i, "pci_bus_id": bus, "already": self.pm[i] == mode})
            self.pm[i] = mode
        self.save()
        return {"ok": True, "mode": mode, "results": results}

    def op_reset(self, req, uid, in_container):
        targets = self._targets(req)
        if in_container or uid != 0:
            return {"ok": False, "code": 4, "error": "Insufficient Permissions",
                    "failed": [{"index": i, "pci_bus_id": self.gpus[i]["pci_bus_id"],
                                "reason": "Insufficient Permissions"} for i in targets]}
        failed = []
        for i in targets:
            if i in self.gpu_faults["lost"]:
                failed.append({"index": i, "pci_bus_id": self.gpus[i]["pci_bus_id"],
                               "reason": "GPU is lost. Reboot the system to recover this GPU", "pids": []})
                continue
            node = self.gpu_node(i)
            users = device_openers(node) if node is not None else []
            users += [a["pid"] for a in self.allocs.values() if a["gpu"] == i and not a.get("retained")]
            if self.pm[i] == "Enabled" or users:
                failed.append({"index": i, "pci_bus_id": self.gpus[i]["pci_bus_id"],
                               "reason": "In use by another client", "pids": sorted(set(users)),
                               "persistence_mode": self.pm[i]})
        if failed:
            return {"ok": False, "code": 255, "error": "In use by another client", "failed": failed}
        for h, a in list(self.allocs.items()):
            if a["gpu"] in targets:
                del self.allocs[h]
        for i in targets:
            if self.recovery[i] in ("Reset", "Drain and Reset"):
                self.recovery[i] = "None"
            self.gpu_faults.get("util_latch", {}).pop(str(i), None)
            self.resets[i] += 1
        self.save()
        return {"ok": True, "reset": [{"index": i, "pci_bus_id": self.gpus[i]["pci_bus_id"]} for i in targets]}

    # ---- lab-only ops (host root only), used by fault.py
    def op_fault_set(self, req):
        if req.get("fault") == "minor_map":
            # {str(index): minor}: a permutation of some GPUs' minors among themselves (the device nodes stay).
            mapping = req.get("map")
            n = len(self.gpus)
            if not isinstance(mapping, dict) or not all(
                    str(k).isdigit() and int(k) < n and isinstance(v, int) and 0 <= v < n for k, v in mapping.items()) \
                    or sorted(int(k) for k in mapping) != sorted(mapping.values()):
                return {"ok": False, "error": "need map {index: minor} permuting indexes 0..%d among themselves" % (n - 1)}
            self.gpu_faults["minor_map"] = {str(int(k)): int(v) for k, v in mapping.items() if int(k) != int(v)}
            self.save()
            return {"ok": True}
        if req.get("fault") == "recovery_action":
            gpu, action = req.get("gpu"), req.get("action")
            if not isinstance(gpu, int) or not 0 <= gpu < len(self.gpus) or action not in RECOVERY_ACTIONS:
                return {"ok": False, "error": "need gpu 0..%d and action in %s" % (len(self.gpus) - 1, RECOVERY_ACTIONS)}
            self.recovery[gpu] = action
            self.save()
            return {"ok": True}
        if req.get("fault") in ("gpu_lost", "memory_na", "xid_on_exit", "xid", "util_latch"):
            gpu = req.get("gpu")
            if not isinstance(gpu, int) or not 0 <= gpu < len(self.gpus):
                return {"ok": False, "error": "need gpu 0..%d" % (len(self.gpus) - 1)}
            fault = req["fault"]
            if fault == "gpu_lost":
                if gpu not in self.gpu_faults["lost"]:
                    self.gpu_faults["lost"].append(gpu)
                self.log_xid(gpu, 79, None, "GPU has fallen off the bus.")
            elif fault == "memory_na":
                if gpu not in self.gpu_faults["memory_na"]:
                    self.gpu_faults["memory_na"].append(gpu)
            elif fault == "util_latch":
                self.gpu_faults.setdefault("util_latch", {})[str(gpu)] = time.time()
            else:
                xid = req.get("xid")
                if not isinstance(xid, int) or xid <= 0:
                    return {"ok": False, "error": "need a positive integer xid"}
                if fault == "xid":
                    self.log_xid(gpu, xid, None, str(req.get("text") or "Graphics Exception"))
                else:
                    self.gpu_faults["xid_on_exit"][str(gpu)] = xid
            self.save()
            return {"ok": True}
        if req.get("fault") != "driver_held":
            return {"ok": False, "error": "unknown fault"}
        until = req.get("until", "namespace")
        if until not in ("namespace", "reset", "seconds"):
            return {"ok": False, "error": "until must be namespace, reset or seconds"}
        held = {"since": time.time(), "label": str(req.get("label", "")), "until": until}
        if until == "seconds":
            seconds = req.get("seconds")
            if not isinstance(seconds, (int, float)) or seconds <= 0:
                return {"ok": False, "error": "until seconds needs a positive number of seconds"}
            held["seconds"] = float(seconds)
        self.driver_held[str(int(req["pidns"]))] = held
        self.save()
        return {"ok": True}

    def op_fault_clear(self, req):
        """Drop driver_held flags (all, or one pidns) and the memory they retain; recovery actions of the given
        GPUs (all GPUs when none are given)."""
        for i in req.get("gpus") or (range(len(self.gpus)) if req.get("pidns") is None else []):
            self.recovery[int(i)] = "None"
            for key in ("lost", "memory_na"):
                if int(i) in self.gpu_faults[key]:
                    self.gpu_faults[key].remove(int(i))
            self.gpu_faults["xid_on_exit"].pop(str(int(i)), None)
            self.gpu_faults.setdefault("util_latch", {}).pop(str(int(i)), None)
        if req.get("gpus") is None and req.get("pidns") is None:
            self.gpu_faults["minor_map"] = {}
        ns = req.get("pidns")
        for k in list(self.driver_held):
            if ns is None or k == str(ns):
                del self.driver_held[k]
        for h, a in list(self.allocs.items()):
            if a.get("retained") and (ns is None or str(a["pidns"]) == str(ns)):
                del self.allocs[h]
        self.save()
        return {"ok": True}

    def op_fault_list(self, req):
        return {"ok": True, "driver_held": self.driver_held, "recovery_action": self.recovery,
                "gpu_faults": self.gpu_faults}

    def op_allocations(self, req):
        return {"ok": True, "allocations": self.allocs}


# --------------------------------------------------------------------------- server

def serve(cfg):
    drv = Driver(cfg)
    sock_dir = drv.paths["sock_dir"]
    sock_path = sock_dir + "/driver.sock"
    os.makedirs(sock_dir, exist_ok=True)
    os.chmod(sock_dir, 0o755)
    try:
        os.unlink(sock_path)
    except FileNotFoundError:
        pass
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0)
    srv.bind(sock_path)
    os.umask(old)
    os.chmod(sock_path, 0o666)
    srv.listen(64)
    srv.setblocking(False)
    sel = selectors.DefaultSelector()
    sel.register(srv, selectors.EVENT_READ, None)
    bufs = {}
    running = [True]

    def stop(*_):
        # select() is restarted after a handler that returns (PEP 475): raise to leave the loop.
        running[0] = False
        raise SystemExit(0)
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    sys.stdout.write("driverd: serving %d GPU(s) of %s, driver %s, on %s\n" % (
        len(drv.gpus), cfg.get("node", "pve1"), cfg["driver_version"], sock_path))
    sys.stdout.flush()
    try:
        loop(srv, sel, bufs, drv, running)
    except SystemExit:
        pass
    try:
        os.unlink(sock_path)
    except OSError:
        pass
    drv.save()


def loop(srv, sel, bufs, drv, running):
    while running[0]:
        try:
            events = sel.select(timeout=None)
        except InterruptedError:
            continue
        for key, _ in events:
            if key.data is None:
                try:
                    conn, _ = srv.accept()
                except OSError:
                    continue
                conn.setblocking(False)
                cred = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
                peer = struct.unpack("3i", cred)
                bufs[conn] = [b"", peer]
                sel.register(conn, selectors.EVENT_READ, "c")
                continue
            conn = key.fileobj
            try:
                chunk = conn.recv(65536)
            except (BlockingIOError, InterruptedError):
                continue
            except OSError:
                chunk = b""
            if not chunk:
                sel.unregister(conn)
                conn.close()
                bufs.pop(conn, None)
                continue
            st = bufs[conn]
            st[0] += chunk
            while b"\n" in st[0]:
                line, st[0] = st[0].split(b"\n", 1)
                if not line.strip():
                    continue
                try:
                    req = json.loads(line)
                    if not isinstance(req, dict):
                        raise ValueError("not an object")
                    rep = drv.handle(req, st[1])
                except Exception as e:  # noqa: BLE001 - a bad request must not kill the driver
                    rep = {"ok": False, "error": "bad request: %s" % e, "code": 2}
                try:
                    conn.setblocking(True)
                    conn.settimeout(5)
                    conn.sendall(json.dumps(rep).encode() + b"\n")
                    conn.setblocking(False)
                except OSError:
                    break


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--config":
        with open(sys.argv[2]) as f:
            _cfg = dict(DEFAULTS)
            _cfg.update(json.load(f))
    else:
        _cfg = load_config()
    serve(_cfg)
