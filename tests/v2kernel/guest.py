#!/usr/bin/python3
"""The collection's own code against a real cgroup v2 kernel (runs inside the VM that tests/v2kernel/vmctl boots).

As root, with cgroup2 mounted at /sys/fs/cgroup by the VM's init (the only hierarchy: cgroup_no_v1=all), it lays out
a container as Proxmox VE 9 does (pve-container src/PVE/LXC.pm: lxc.cgroup.dir.container = lxc/<vmid> with
lxc.cgroup.dir.container.inner = ns, lxc.cgroup.dir.monitor = lxc.monitor/<vmid>, lxc.cgroup2.memory.max and
memory.high on lxc/<vmid>, Config.pm calculate_memory_constraints): a monitor process in lxc.monitor/<vmid>, the
container's init in its own PID, mount and cgroup namespaces rooted at lxc/<vmid>/ns, which moves itself into
init.scope and makes system.slice/sglang.service as systemd does; processes attached as lxc-attach (pct exec) does,
into ns/.lxc. Then it runs plugins/module_utils (recover_pve, recover_procs, recover_signals, recover_kernel,
gpu_facts) against it and checks each answer against what the kernel shows: cgroup.procs, memory.max, memory.current,
memory.stat, memory.events(.local), /dev/kmsg and the process table. Never the code's report about itself.

Each check is one JSON line in <out>/results.jsonl; the exit status is 1 when any failed.
"""
from __future__ import annotations

import ctypes
import json
import mmap
import os
import re
import signal
import subprocess
import sys
import time

GUEST = os.path.realpath(__file__)
CHECKOUT = os.path.dirname(os.path.dirname(os.path.dirname(GUEST)))
COLL = "/tmp/v2kernel-collections"
CG = "/sys/fs/cgroup"
VMID = 129
MIB = 1 << 20
# The container's memory setting as PVE takes it (MiB) and what pve-container writes for it (Config.pm
# calculate_memory_constraints: max = memory MiB, high = memory * 1016 KiB below 16 GiB).
MEMORY_MIB = 384
MEMORY_MAX = MEMORY_MIB * MIB
MEMORY_HIGH = MEMORY_MIB * 1024 * 1016
SHM_BYTES = 64 * MIB        # what the SGLang stand-in pins in /dev/shm (its host pool)
ANON_BYTES = 16 * MIB       # and holds as private memory
CACHE_BYTES = 40 * MIB      # page cache a reader leaves charged to the container (reclaimable: not "held")
OOM_ALLOC_BYTES = 512 * MIB  # more than the container's limit


def _import_collection():
    link = os.path.join(COLL, "ansible_collections", "inferops", "gpu_inference")
    if not os.path.exists(link):
        os.makedirs(os.path.dirname(link), exist_ok=True)
        os.symlink(CHECKOUT, link)
    sys.path.insert(0, COLL)


# --------------------------------------------------------------------------- small helpers


def read(path: str) -> str:
    with open(path) as f:
        return f.read()


def write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def cg(*parts: str) -> str:
    return os.path.join(CG, *parts)


def ct(*parts: str) -> str:
    return cg("lxc", str(VMID), *parts)


def keyed(text: str) -> dict[str, int]:
    return {k: int(v) for k, v in re.findall(r"^(\w+) (\d+)$", text, re.M)}


def procs_of(path: str) -> set[int]:
    return {int(x) for x in read(os.path.join(path, "cgroup.procs")).split()}


def procs_under(path: str) -> set[int]:
    """Every PID the kernel lists in cgroup.procs of ``path`` and the cgroups below it."""
    found: set[int] = set()
    for parent, _dirs, _files in os.walk(path):
        found |= procs_of(parent)
    return found


def state_of(pid: int) -> str | None:
    """The process table's state letter, None when the PID is gone."""
    try:
        text = read("/proc/%d/stat" % pid)
    except OSError:
        return None
    return text.rpartition(")")[2].split()[0]


def alive(pid: int) -> bool:
    return state_of(pid) not in (None, "Z", "X")


def host_and_ns_pid() -> tuple[int, int]:
    nspid = [int(x) for x in re.search(r"^NSpid:\s+(.*)$", read("/proc/self/status"), re.M).group(1).split()]
    return nspid[0], nspid[-1]


def wait_for(predicate, timeout_s: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


# --------------------------------------------------------------------------- roles run as other processes


def role_ct_init() -> None:
    """PID 1 of the container (started by `unshare --cgroup --pid --mount --fork` from lxc/<vmid>/ns, so its cgroup
    namespace is rooted there, as LXC's is): mounts its own cgroup2 view, moves itself into init.scope, and, once
    the monitor has left ns (told on stdin), enables the controllers below it and makes system.slice/sglang.service,
    as a container's systemd does. Then it reaps orphans until its stdin closes."""
    host_pid, ns_pid = host_and_ns_pid()
    # its own view of the hierarchy, as LXC mounts it for the container: the node's mount (copied into this mount
    # namespace) taken away first
    subprocess.run(["umount", "-l", CG], check=True)
    subprocess.run(["mount", "-t", "cgroup2", "cgroup2", CG], check=True)
    subprocess.run(["mount", "-t", "proc", "proc", "/proc"], check=True)  # its own PID namespace's /proc
    own = read("/proc/self/cgroup").strip()
    os.mkdir(cg("init.scope"))
    write(cg("init.scope", "cgroup.procs"), "0")
    print("ready %d %d %s" % (host_pid, ns_pid, own), flush=True)
    if sys.stdin.readline().strip() != "go":
        sys.exit(1)
    write(cg("cgroup.subtree_control"), "+memory +pids")
    for d in ("system.slice", "system.slice/sglang.service", "system.slice/other.service"):
        os.mkdir(cg(d))
    write(cg("system.slice", "cgroup.subtree_control"), "+memory +pids")
    signal.signal(signal.SIGCHLD, lambda *_: _reap())
    print("up", flush=True)
    sys.stdin.read()


def _reap() -> None:
    while True:
        try:
            pid, _status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def role_hold(shm_bytes: int, anon_bytes: int) -> None:
    """The SGLang stand-in's memory: its host pool in /dev/shm, written and mapped shared, half of it pinned
    (mlock: the unevictable list, as a pinned pool is), some private memory; then sleep."""
    pools = []
    for name, size in (("sgl_v2kernel_pool", shm_bytes // 2), ("sgl_v2kernel_pinned", shm_bytes - shm_bytes // 2)):
        fd = os.open("/dev/shm/" + name, os.O_RDWR | os.O_CREAT, 0o600)
        os.ftruncate(fd, size)
        pool = mmap.mmap(fd, size, mmap.MAP_SHARED)
        for off in range(0, size, mmap.PAGESIZE):
            pool[off] = 1
        pools.append(pool)
    libc = ctypes.CDLL(None, use_errno=True)
    address = ctypes.addressof(ctypes.c_char.from_buffer(pools[1]))
    if libc.mlock(ctypes.c_void_p(address), ctypes.c_size_t(len(pools[1]))) != 0:
        raise OSError(ctypes.get_errno(), "mlock")
    private = b"\1" * anon_bytes
    print("ready", flush=True)
    signal.pause()
    del private, pools


def role_read_cache(path: str, nbytes: int) -> None:
    """Read ``nbytes`` of a file on the node's disk share: page cache charged to this cgroup, left behind."""
    left = nbytes
    with open(path, "rb", buffering=0) as f:
        while left > 0:
            chunk = f.read(min(left, MIB))
            if not chunk:
                break
            left -= len(chunk)
    print("ready %d" % (nbytes - left), flush=True)


def role_alloc(nbytes: int) -> None:
    """Allocate and touch ``nbytes`` of private memory step by step (the kernel's OOM killer ends it)."""
    print("ready", flush=True)
    write("/proc/self/oom_score_adj", "500")  # the victim of choice: what is tested is the count, not the choice
    held = []
    for _ in range(nbytes // (8 * MIB)):
        held.append(b"\1" * (8 * MIB))
    print("survived", flush=True)
    signal.pause()


def role_group(workers: int) -> None:
    """A launcher and its workers in one process group (the one this process is in), then sleep."""
    for _ in range(workers):
        if os.fork() == 0:
            signal.pause()
            os._exit(0)
    print("ready", flush=True)
    signal.pause()


def role_facts() -> None:
    """What a module running inside the container reads of its own memory cgroup (gpu_facts)."""
    _import_collection()
    from ansible_collections.inferops.gpu_inference.plugins.module_utils import gpu_facts
    print(json.dumps({"facts": gpu_facts.collect_cgroup_memory("/"), "self_cgroup": read("/proc/self/cgroup").strip(),
                      "root_memory_max": read(cg("memory.max")).strip(),
                      "root_memory_current": int(read(cg("memory.current")))}), flush=True)
    sys.stdin.read()  # alive (and charged) until the host has read lxc/<vmid>/ns from its side


ROLES = {"ct-init": role_ct_init, "hold": lambda a, b: role_hold(int(a), int(b)),
         "read-cache": lambda path, n: role_read_cache(path, int(n)),
         "alloc": lambda n: role_alloc(int(n)), "group": lambda n: role_group(int(n)), "facts": role_facts,
         "sleep": signal.pause}


# --------------------------------------------------------------------------- the orchestrator


class Checks:
    def __init__(self, out: str):
        self.path = os.path.join(out, "results.jsonl")
        self.failed = 0
        open(self.path, "w").close()

    def check(self, name: str, ok: bool, detail: str = "") -> bool:
        rec = {"name": name, "ok": bool(ok), "detail": detail}
        with open(self.path, "a") as f:
            f.write(json.dumps(rec) + "\n")
        print(("ok    " if ok else "FAIL  ") + name + (": " + detail if detail else ""), flush=True)
        if not ok:
            self.failed += 1
        return bool(ok)


class Container:
    """The container's processes as the orchestrator starts them."""

    def __init__(self):
        self.procs: list[subprocess.Popen] = []
        self.monitor: subprocess.Popen | None = None
        self.init_pid = self.init_ns_pid = 0
        self.init_own_view = ""

    def start(self) -> None:
        for d in (cg("lxc"), ct(), ct("ns"), cg("lxc.monitor"), cg("lxc.monitor", str(VMID))):
            os.mkdir(d)
        write(cg("cgroup.subtree_control"), "+memory +pids")
        write(cg("lxc", "cgroup.subtree_control"), "+memory +pids")
        write(ct("cgroup.subtree_control"), "+memory +pids")
        # pve-container LXC.pm: lxc.cgroup2.memory.max / memory.high / memory.swap.max, on lxc/<vmid>
        write(ct("memory.max"), str(MEMORY_MAX))
        write(ct("memory.high"), str(MEMORY_HIGH))
        write(ct("memory.swap.max"), "0")
        self.monitor = subprocess.Popen(
            ["unshare", "--cgroup", "--pid", "--mount", "--fork", "--propagation", "private",
             sys.executable, GUEST, "ct-init"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            preexec_fn=lambda: write(ct("ns", "cgroup.procs"), "0"))
        ready = self.monitor.stdout.readline().split()
        if not ready or ready[0] != "ready":
            raise RuntimeError("the container's init did not start: %r" % ready)
        self.init_pid, self.init_ns_pid, self.init_own_view = int(ready[1]), int(ready[2]), ready[3]
        # LXC's monitor stays in lxc.monitor/<vmid>, outside the container's cgroup (LXC.pm: lxc.cgroup.dir.monitor)
        write(cg("lxc.monitor", str(VMID), "cgroup.procs"), str(self.monitor.pid))
        self.monitor.stdin.write("go\n")
        self.monitor.stdin.flush()
        if self.monitor.stdout.readline().strip() != "up":
            raise RuntimeError("the container's init did not make its cgroups")
        os.mkdir(ct("ns", ".lxc"))  # where lxc-attach (pct exec) puts what it runs when ns has children

    def run(self, rel_cgroup: str, *args: str, new_group: bool = True, where: str = "ct",
            stdin: int = subprocess.DEVNULL, argv: tuple[str, ...] = ()) -> subprocess.Popen:
        """Start ``guest.py <args>`` in the container's cgroup ``ns/<rel_cgroup>`` and namespaces (nsenter forks
        into its PID namespace; both nsenter and the role are in that cgroup), or on the host (``where="host"``)."""
        target = ct("ns", rel_cgroup, "cgroup.procs") if where == "ct" else cg(rel_cgroup, "cgroup.procs")

        def place():
            write(target, "0")
            if new_group:
                os.setpgid(0, 0)
        cmd = list(argv) if argv else [sys.executable, GUEST] + list(args)
        if where == "ct":
            cmd = ["nsenter", "-t", str(self.init_pid), "--pid", "--mount", "--cgroup", "--"] + cmd
        p = subprocess.Popen(cmd, stdin=stdin, stdout=subprocess.PIPE, text=True, preexec_fn=place)
        self.procs.append(p)
        return p

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        while True:  # what the checks killed and left to us (a group's members are our children's children)
            try:
                if os.waitpid(-1, os.WNOHANG)[0] == 0:
                    break
            except ChildProcessError:
                break
        if self.monitor is not None:
            self.monitor.stdin.close()
            try:
                self.monitor.wait(timeout=10)
            except subprocess.TimeoutExpired:
                print("the container's init did not end when told: %s; killed" % state_of(self.init_pid), flush=True)
                os.kill(self.init_pid, signal.SIGKILL)  # ends its PID namespace, every process in it
                self.monitor.wait(timeout=10)


def ready_line(p: subprocess.Popen) -> list[str]:
    line = p.stdout.readline().split()
    if not line or line[0] != "ready":
        raise RuntimeError("a helper process did not start: %r (exit %s)" % (line, p.poll()))
    return line[1:]


def main(out: str, deb: str) -> int:
    boot_s = float(read("/proc/uptime").split()[0])
    started = time.monotonic()
    os.makedirs(out, exist_ok=True)
    _import_collection()
    from ansible_collections.inferops.gpu_inference.plugins.module_utils import (
        recover_kernel as rk, recover_procs as rp, recover_pve as rpve, recover_signals as rsig)
    c = Checks(out)
    box = Container()
    try:
        run_checks(c, box, deb, rk, rp, rpve, rsig)
    except Exception as exc:  # noqa: BLE001 - every failure is a failed check, with its traceback on the console
        import traceback
        traceback.print_exc()
        c.check("the checks ran to the end", False, "%s: %s" % (type(exc).__name__, exc))
    finally:
        box.stop()
    with open(os.path.join(out, "timing.json"), "w") as f:
        json.dump({"boot_s": boot_s, "checks_s": time.monotonic() - started, "kernel": os.uname().release}, f)
    return 1 if c.failed else 0


def run_checks(c: Checks, box: Container, deb: str, rk, rp, rpve, rsig) -> None:
    mounts = read("/proc/self/mountinfo")
    c.check("the node is pure cgroup v2 (cgroup2 at /sys/fs/cgroup, no v1 hierarchy mounted or mountable)",
            " /sys/fs/cgroup " in mounts and " - cgroup " not in mounts
            and not os.makedirs("/tmp/v1", exist_ok=True)
            and subprocess.run(["mount", "-t", "cgroup", "-o", "memory", "cgroup", "/tmp/v1"],
                               capture_output=True).returncode != 0
            and read("/proc/self/cgroup").strip() == "0::/",
            "/proc/self/cgroup %r" % read("/proc/self/cgroup").strip())
    c.check("the code finds the node's cgroup2 mount (recover_pve.cgroup_mounts)", rpve.cgroup_mounts("/") == {"": CG},
            repr(rpve.cgroup_mounts("/")))
    box.start()
    init = box.init_pid
    init_cg = read("/proc/%d/cgroup" % init).strip()
    c.check("the container's init runs in lxc/%d/ns/init.scope, in its own cgroup namespace rooted at ns" % VMID,
            init_cg == "0::/lxc/%d/ns/init.scope" % VMID and box.init_own_view == "0::/" and box.init_ns_pid == 1
            and init in procs_of(ct("ns", "init.scope")),
            "host view %r, its own view %r, NSpid ...%d" % (init_cg, box.init_own_view, box.init_ns_pid))

    # ---- processes of the container, the monitor, the host, a tenant's own nested cgroups
    sglang = box.run("system.slice/sglang.service", "hold", str(SHM_BYTES), str(ANON_BYTES))
    ready_line(sglang)
    holder_pid = _children(sglang.pid)[0]  # nsenter's child, in the container's PID namespace
    other = box.run("system.slice/other.service", "sleep")
    for d in ("lxc", "lxc/130", "lxc.payload.131"):  # a tenant's own cgroups, named like other containers'
        os.mkdir(ct("ns", d))
    tenant130 = box.run("lxc/130", "sleep")
    tenant131 = box.run("lxc.payload.131", "sleep")
    host_sleeper = box.run("", "sleep", where="host")
    attach = box.run(".lxc", "sleep")  # pct exec's command, as lxc-attach places it
    started = ("system.slice/other.service", "lxc/130", "lxc.payload.131", ".lxc")
    # nsenter's child (the process in the container's PID namespace) beside nsenter in each of those cgroups
    if not wait_for(lambda: all(len(procs_of(ct("ns", d))) == 2 for d in started)):
        raise RuntimeError("the container's processes did not start: %r" % {d: procs_of(ct("ns", d)) for d in started})

    wrong = []
    for parent, _dirs, _files in os.walk(CG):
        rel = "/" if parent == CG else "/" + os.path.relpath(parent, CG)
        expect = VMID if rel == "/lxc/%d" % VMID or rel.startswith("/lxc/%d/" % VMID) else "host"
        for pid in procs_of(parent):
            got = rp.container_of_pid(pid)
            if got != expect and state_of(pid) is not None:
                wrong.append("%d in %s: %r" % (pid, rel, got))
    counted = len(procs_under(CG))
    c.check("container_of_pid attributes every process in cgroup.procs by the cgroup the kernel lists it in "
            "(lxc/%d/ns/** -> %d; lxc.monitor/%d, the host, a tenant's lxc/130 and lxc.payload.131 below ns -> "
            "theirs)" % (VMID, VMID, VMID), not wrong and counted > 10,
            "%d processes; wrong: %s" % (counted, "; ".join(wrong) or "none"))
    scan = rp.scan_processes(VMID)
    scanned = {p["pid"] for p in scan["container"] if p["state"] not in ("Z", "X")}
    kernel = {p for p in procs_under(ct()) if alive(p)}
    c.check("scan_processes finds exactly the processes the kernel lists under lxc/%d" % VMID, scanned == kernel,
            "scan %s, kernel %s" % (sorted(scanned), sorted(kernel)))
    monitor_cg = rp.parse_proc_cgroup(read("/proc/%d/cgroup" % box.monitor.pid))
    c.check("the monitor (lxc.monitor/%d) is not the container's: not attributed, not wholly in it" % VMID,
            box.monitor.pid in procs_of(cg("lxc.monitor", str(VMID))) and rp.container_of_pid(box.monitor.pid) == "host"
            and not rp.wholly_in_container(monitor_cg, VMID), repr(monitor_cg))
    sg_text = read("/proc/%d/cgroup" % holder_pid)
    c.check("in_unit finds sglang.service in the real /proc/PID/cgroup, not in init.scope's",
            rp.in_unit(sg_text, "sglang.service") and not rp.in_unit(init_cg, "sglang.service")
            and holder_pid in procs_of(ct("ns", "system.slice", "sglang.service")), sg_text.strip())

    # ---- memory: limit, usage, held bytes with pinned shared memory and page cache
    reader = box.run("system.slice/other.service", "read-cache", deb, str(CACHE_BYTES))
    read_bytes = int(ready_line(reader)[0])
    reader.wait()
    stat = keyed(read(ct("memory.stat")))
    current = int(read(ct("memory.current")))
    mem = rpve.container_memory(VMID, init)
    stat_after = keyed(read(ct("memory.stat")))
    current_after = int(read(ct("memory.current")))
    c.check("container_memory reads the container's cgroup: v2, /lxc/%d (cut from the init's cgroup)" % VMID,
            mem["cgroup_version"] == 2 and mem["path"] == "/lxc/%d" % VMID, repr(mem))
    c.check("memory_limit_bytes is lxc/%d's memory.max as pve-container writes it" % VMID,
            mem["memory_limit_bytes"] == int(read(ct("memory.max"))) == MEMORY_MAX
            and int(read(ct("memory.high"))) == MEMORY_HIGH,
            "code %r, memory.max %s, memory.high %s" % (
                mem["memory_limit_bytes"], read(ct("memory.max")).strip(), read(ct("memory.high")).strip()))
    lo, hi = min(current, current_after), max(current, current_after)
    c.check("memory_usage_bytes is lxc/%d's memory.current (hierarchical: init.scope, system.slice, .lxc)" % VMID,
            mem["memory_usage_bytes"] is not None and lo - MIB <= mem["memory_usage_bytes"] <= hi + MIB
            and current >= SHM_BYTES + ANON_BYTES + read_bytes // 2,
            "code %r, memory.current %d..%d" % (mem["memory_usage_bytes"], lo, hi))
    held = mem["memory_held_bytes"] or 0
    lru_file = min(stat["active_file"] + stat["inactive_file"], stat_after["active_file"] + stat_after["inactive_file"])
    pve_mem = current - stat["file"]  # what PVE's status API reports as `mem` (usage less file, shmem in file)
    c.check("the /dev/shm pool is charged to the container as shmem: the mapped half on the anon lists, the "
            "pinned half unevictable (memory.stat)",
            stat["shmem"] >= SHM_BYTES and stat["anon"] >= ANON_BYTES and stat["unevictable"] >= SHM_BYTES // 2
            and stat["active_anon"] + stat["inactive_anon"] >= SHM_BYTES // 2 + ANON_BYTES,
            "shmem %d, anon %d, *_anon %d, unevictable %d" % (stat["shmem"], stat["anon"], stat["active_anon"]
                                                              + stat["inactive_anon"], stat["unevictable"]))
    c.check("memory_held_bytes counts the pinned shared memory and the private memory",
            held >= SHM_BYTES + ANON_BYTES, "held %d, shm %d + anon %d" % (held, SHM_BYTES, ANON_BYTES))
    c.check("memory_held_bytes leaves out the reclaimable page cache the reader left (file LRU of memory.stat)",
            lru_file >= read_bytes // 2 and held <= hi - lru_file + MIB,
            "held %d, usage %d..%d, file LRU %d (read %d)" % (held, lo, hi, lru_file, read_bytes))
    c.check("PVE's own `mem` (usage less memory.stat file) misses the pool that memory_held_bytes counts",
            held - pve_mem >= SHM_BYTES - 2 * MIB, "held %d, usage-file %d" % (held, pve_mem))
    inside = box.run("system.slice/sglang.service", "facts", stdin=subprocess.PIPE)
    facts = json.loads(inside.stdout.readline())
    ns_current = int(read(ct("ns", "memory.current")))
    inside.stdin.close()
    inside.wait()
    f = facts["facts"]
    c.check("inside the container (its cgroup namespace and own cgroup2 mount) the limit is one level up, out of "
            "sight: memory.max at its root reads max, gpu_facts reports no limit rather than a wrong one",
            facts["root_memory_max"] == "max" and facts["self_cgroup"] == "0::/system.slice/sglang.service"
            and f["version"] == 2 and f["path"] == "/system.slice/sglang.service"
            and f["memory_limit_bytes"] is None and f["limit_cgroup"] is None,
            repr(facts))
    c.check("gpu_facts' usage inside the container is its namespace root's memory.current (lxc/%d/ns)" % VMID,
            f["memory_usage_bytes"] is not None
            and abs(f["memory_usage_bytes"] - facts["root_memory_current"]) <= 2 * MIB
            and abs(facts["root_memory_current"] - ns_current) <= 2 * MIB,
            "code %r, its root %d, lxc/%d/ns from the host %d" % (
                f["memory_usage_bytes"], facts["root_memory_current"], VMID, ns_current))

    tool = os.path.join(CHECKOUT, "roles", "sglang_server", "files", "sglang_memory.py")
    before_ns = int(read(ct("ns", "memory.current")))
    measured = box.run(".lxc", argv=("/usr/bin/python3", tool, "measure", "--unit", "sglang.service"))
    m = json.loads(measured.stdout.read())
    measured.wait()
    after_ns = int(read(ct("ns", "memory.current")))
    holder_ns_pid = int(re.search(r"^NSpid:.*\s(\d+)$", read("/proc/%d/status" % holder_pid), re.M).group(1))
    c.check("the role's sglang_memory.py, run as pct exec runs it (ns/.lxc), finds the unit's process by its "
            "cgroup, its pinned pool and private memory, and the container's usage (lxc/%d/ns memory.current)" % VMID,
            [p["pid"] for p in m["processes"]] == [holder_ns_pid] and m["unit_held_bytes"] >= SHM_BYTES + ANON_BYTES
            and m["processes"][0]["rss_shmem_bytes"] >= SHM_BYTES
            and min(before_ns, after_ns) - 16 * MIB <= m["cgroup_memory_usage_bytes"]
            <= max(before_ns, after_ns) + 16 * MIB,
            "processes %r, unit_held_bytes %r, usage %r; lxc/%d/ns memory.current %d..%d" % (
                [(p["pid"], p["rss_shmem_bytes"]) for p in m["processes"]], m["unit_held_bytes"],
                m["cgroup_memory_usage_bytes"], VMID, before_ns, after_ns))

    # ---- kill scope: a process group that straddles the container's cgroup (pct exec's caller on the host)
    straddle = box.run("", "group", "0", where="host", new_group=True)  # host process, its own group leader
    ready_line(straddle)
    host_leader = straddle.pid
    pgid = os.getpgid(host_leader)
    # a command it runs through lxc-attach: same process group, in the container's .lxc cgroup and namespaces
    member = subprocess.Popen(["nsenter", "-t", str(init), "--pid", "--mount", "--cgroup", "--", sys.executable, GUEST,
                               "group", "1"], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True,
                              preexec_fn=lambda: (os.setpgid(0, pgid), write(ct("ns", ".lxc", "cgroup.procs"), "0")))
    box.procs.append(member)
    ready_line(member)
    in_ct = [p for p in group_now(pgid) if p != host_leader]
    scan = rp.scan_processes(VMID)
    group_in_ct = [p for p in scan["container"] if p["pgid"] == pgid]
    plan = rsig.pids_to_signal(group_in_ct, scan["all"], VMID, init)
    c.check("a process group with a member on the host is not planned as a group, its container members are "
            "planned one by one (pids_to_signal)", not plan["groups"]
            and set(plan["pids"]) == {p["pid"] for p in group_in_ct} == set(in_ct) and len(in_ct) == 3
            and host_leader not in plan["pids"], "group %d: plan %r" % (pgid, {k: plan[k] for k in ("groups", "pids")}))
    sent = rsig.send_signal(plan, signal.SIGKILL)
    gone = wait_for(lambda: not any(alive(p) for p in plan["pids"]), 10)
    c.check("SIGKILL ends the container's members; the host's member of the same group lives (process table, "
            "cgroup.procs)", gone and alive(host_leader) and host_leader in procs_of(CG)
            and not procs_of(ct("ns", ".lxc")) - {attach.pid} - set(_children(attach.pid)),
            "sent %r; host leader %s, .lxc now %s" % (sent, state_of(host_leader), sorted(procs_of(ct("ns", ".lxc")))))

    # ---- kill scope: a group wholly in the container, and one whose member root moves out before the signal
    launcher = box.run("system.slice/sglang.service", "group", "2")
    ready_line(launcher)
    lpgid = launcher.pid
    role = _children(lpgid)[0]
    members = [lpgid, role] + _children(role)  # nsenter, the launcher, its two workers
    scan = rp.scan_processes(VMID)
    targets = [p for p in scan["container"] if p["pid"] == members[1]]
    plan = rsig.pids_to_signal(targets, scan["all"], VMID, init)
    c.check("a process group wholly in the container is planned as the group", plan["groups"] == [lpgid]
            and set(plan["members"][lpgid]) == {p["pid"] for p in scan["all"] if p["pgid"] == lpgid},
            repr({k: plan[k] for k in ("groups", "members", "pids")}))
    bystanders = [init, other.pid, tenant130.pid, tenant131.pid, holder_pid, host_sleeper.pid, box.monitor.pid]
    sent = rsig.send_signal(plan, signal.SIGKILL)
    ok = wait_for(lambda: not any(alive(p) for p in plan["members"][lpgid]), 10)
    c.check("SIGKILL to the group ends every member; the init, the other services, the tenant's nested cgroups, "
            "the monitor and the host live", ok and sent["groups"] == [lpgid] and all(alive(p) for p in bystanders)
            and not procs_of(ct("ns", "system.slice", "sglang.service")) & set(plan["members"][lpgid]),
            "sent %r; bystanders %s" % (sent, [state_of(p) for p in bystanders]))
    launcher = box.run("system.slice/sglang.service", "group", "2")
    ready_line(launcher)
    lpgid = launcher.pid
    role = _children(lpgid)[0]
    members = [lpgid, role] + _children(role)  # nsenter, the launcher, its two workers
    scan = rp.scan_processes(VMID)
    plan = rsig.pids_to_signal([p for p in scan["container"] if p["pid"] == members[1]], scan["all"], VMID, init)
    write(cg("lxc.monitor", str(VMID), "cgroup.procs"), str(members[2]))  # root moves one member out
    sent = rsig.send_signal(plan, signal.SIGKILL)
    wait_for(lambda: not any(alive(members[i]) for i in (0, 1, 3)), 10)
    c.check("a member root moved out of the container after the plan is not signalled; the group is refused "
            "and its other planned members are killed one by one", plan["groups"] == [lpgid]
            and alive(members[2]) and members[2] in procs_of(cg("lxc.monitor", str(VMID)))
            and not any(alive(members[i]) for i in (0, 1, 3)) and not sent["groups"]
            and any(r.get("pgid") == lpgid for r in sent["refused"]),
            "sent %r; moved member %s" % (sent, state_of(members[2])))
    if alive(members[2]):
        os.kill(members[2], signal.SIGKILL)

    # ---- a real OOM kill in the ns subtree, counted once
    sglang.kill()
    sglang.wait()
    os.unlink("/dev/shm/sgl_v2kernel_pool")
    os.unlink("/dev/shm/sgl_v2kernel_pinned")
    cursor = rk.read_kmsg()["cursor"]
    before = keyed(read(ct("memory.events")))["oom_kill"]
    code_before = rpve.container_memory(VMID, init)["oom_kills"]
    os.mkdir(ct("ns", "system.slice", "oomtest.service"))
    hog = box.run("system.slice/oomtest.service", "alloc", str(OOM_ALLOC_BYTES))
    ready_line(hog)
    hog_host_pid = _children(hog.pid)[0]
    rest = hog.stdout.read()
    hog.wait()
    events = keyed(read(ct("memory.events")))
    local_leaf = keyed(read(ct("ns", "system.slice", "oomtest.service", "memory.events.local")))
    local_top = keyed(read(ct("memory.events.local")))
    c.check("the kernel OOM-killed the allocator in lxc/%d/ns/system.slice/oomtest.service (memory.events)" % VMID,
            "survived" not in rest and hog.returncode == -signal.SIGKILL and events["oom_kill"] == before + 1
            and local_leaf["oom_kill"] == 1 and local_top["oom_kill"] == 0 and local_top["oom"] >= 1,
            "exit %s; lxc/%d memory.events oom_kill %d -> %d, .local %r; oomtest.service .local %r" % (
                hog.returncode, VMID, before, events["oom_kill"], local_top, local_leaf))
    mem = rpve.container_memory(VMID, init)
    c.check("oom_kills counts it once (lxc/%d memory.events oom_kill, hierarchical)" % VMID,
            code_before == before and mem["oom_kills"] == events["oom_kill"] == before + 1,
            "code %r -> %r, kernel %d -> %d" % (code_before, mem["oom_kills"], before, events["oom_kill"]))
    os.rmdir(ct("ns", "system.slice", "oomtest.service"))
    mem = rpve.container_memory(VMID, init)
    c.check("the count stays once the cgroup the kill ran in is removed", mem["oom_kills"] == before + 1
            == keyed(read(ct("memory.events")))["oom_kill"], "code %r" % mem["oom_kills"])
    kmsg = rk.read_kmsg()
    new = [r for r in kmsg["records"] if cursor is None or r["seq"] > cursor]
    kills = [k for k in (rk.parse_oom_kill(r["message"]) for r in new) if k is not None]
    parsed = rk.parse_kernel_log("\n".join(r["message"] for r in new), VMID)
    c.check("the kernel's oom-kill record names the victim's cgroup; recover_kernel attributes it to CT %d, once"
            % VMID, len(kills) == 1 and kills[0]["task_memcg"] == "/lxc/%d/ns/system.slice/oomtest.service" % VMID
            and kills[0]["vmid"] == VMID and kills[0]["pid"] == hog_host_pid and parsed["oom_kills_in_container"] == 1
            and (rk.last_oom_kill_seq(kmsg["records"], VMID) or -1) > (cursor or -1),
            "records %r" % [r["message"] for r in new if "oom" in r["message"].lower()][:4])

    # ---- the same on a node whose cgroup2 is mounted with memory_localevents (cgroup-v2.rst: memory.events then
    # counts only the cgroup's own events): not what systemd mounts on PVE 9, but a mount option a node may have
    subprocess.run(["mount", "-o", "remount,nsdelegate,memory_recursiveprot,memory_localevents", "cgroup2", CG],
                   check=True)
    try:
        top_before = keyed(read(ct("memory.events")))["oom_kill"]
        code_before = rpve.container_memory(VMID, init)["oom_kills"]
        os.mkdir(ct("ns", "system.slice", "oomtest2.service"))
        hog = box.run("system.slice/oomtest2.service", "alloc", str(OOM_ALLOC_BYTES))
        ready_line(hog)
        hog.stdout.read()
        hog.wait()
        local_sum = sum(keyed(read(os.path.join(d, "memory.events.local")))["oom_kill"] for d, _x, _y in os.walk(ct())
                        if os.path.exists(os.path.join(d, "memory.events.local")))  # not where memory is not enabled
        code_after = rpve.container_memory(VMID, init)["oom_kills"]
        c.check("with memory_localevents, a kill in ns/system.slice/oomtest2.service leaves lxc/%d's memory.events "
                "as it was, and oom_kills still counts it once (memory.events.local of the container's cgroups)" % VMID,
                hog.returncode == -signal.SIGKILL and keyed(read(ct("memory.events")))["oom_kill"] == top_before
                and keyed(read(ct("ns", "system.slice", "oomtest2.service", "memory.events.local")))["oom_kill"] == 1
                and code_before is not None and code_after == code_before + 1 == local_sum,
                "exit %s; lxc/%d memory.events oom_kill %d -> %d; code %r -> %r; sum of .local %d" % (
                    hog.returncode, VMID, top_before, keyed(read(ct("memory.events")))["oom_kill"], code_before,
                    code_after, local_sum))
    finally:
        subprocess.run(["mount", "-o", "remount,nsdelegate,memory_recursiveprot", "cgroup2", CG], check=True)


def group_now(pgid: int) -> list[int]:
    """The live processes of process group ``pgid`` in the process table."""
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                fields = read("/proc/%s/stat" % name).rpartition(")")[2].split()
            except OSError:
                continue
            if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
                found.append(int(name))
    return sorted(found)


def _children(pid: int) -> list[int]:
    try:
        return [int(x) for x in read("/proc/%d/task/%d/children" % (pid, pid)).split()]
    except OSError:
        return []


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] in ROLES:
        ROLES[sys.argv[1]](*sys.argv[2:])
        sys.exit(0)
    ARGV = sys.argv[1:]
    sys.exit(main(ARGV[ARGV.index("--out") + 1], ARGV[ARGV.index("--deb") + 1]))
