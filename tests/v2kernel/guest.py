#!/usr/bin/python3
"""The collection's own code against a real cgroup v2 kernel (runs inside the VM that tests/v2kernel/vmctl boots).

As root, with cgroup2 mounted at /sys/fs/cgroup by the VM's init (the only hierarchy: cgroup_no_v1=all), it starts a
container with LXC (the node's lxc 5.0, run from its /usr) configured with the cgroup keys pve-container writes on
PVE 9 (src/PVE/LXC.pm update_lxc_config: lxc.cgroup.dir.container = lxc/<vmid>, .inner = ns,
lxc.cgroup.dir.monitor = lxc.monitor/<vmid>, lxc.cgroup2.memory.max and memory.high from Config.pm
calculate_memory_constraints), whose init (ct-init below) moves itself into init.scope and makes
system.slice/sglang.service as systemd does; commands run through lxc-attach, as pct exec runs them. Then it runs
plugins/module_utils (recover_pve, recover_procs, recover_signals, recover_kernel, gpu_facts) and the role's
sglang_memory.py against it and checks each answer against what the kernel shows: cgroup.procs, memory.max,
memory.current, memory.stat, memory.events(.local), /dev/kmsg and the process table. Never the code's report about
itself.

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
ATTACH_LOG = "/tmp/lxc-attach.log"
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
    """PID 1 of the container (LXC's lxc.init.cmd; LXC starts it in lxc/<vmid>/ns, its cgroup namespace rooted
    there): moves itself into init.scope, and, once told on stdin, enables
    the controllers below it and makes system.slice/sglang.service, as a container's systemd does. Then it reaps
    orphans until its stdin closes."""
    host_pid, ns_pid = host_and_ns_pid()
    # /sys/fs/cgroup is LXC's mount of the container's own view (lxc.mount.auto cgroup:mixed, as PVE's common.conf)
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
    from ansible_collections.inferops.gpu_inference.plugins.module_utils.host import gpu_facts
    print(json.dumps({"facts": gpu_facts.collect_cgroup_memory("/"), "self_cgroup": read("/proc/self/cgroup").strip(),
                      "root_memory_max": read(cg("memory.max")).strip(),
                      "root_memory_current": int(read(cg("memory.current")))}), flush=True)
    sys.stdin.read()  # alive (and charged) until the host has read lxc/<vmid>/ns from its side


def role_in_cgroup(rel: str, own_group: str, _token: str, *rest: str) -> None:
    """Run by lxc-attach inside the container: move into ``/sys/fs/cgroup/<rel>`` of the container's own view (made
    when missing, as systemd or a tenant makes its cgroups), into a new process group when ``own_group`` is 1, then
    ``role <name> args`` of this file or exec ``rest``. ``_token`` marks the command line for the node's side."""
    if rel != "-":
        os.makedirs(cg(rel), exist_ok=True)
        write(cg(rel, "cgroup.procs"), "0")
    if own_group == "1":
        os.setpgid(0, 0)
    if rest[0] == "role":
        ROLES[rest[1]](*rest[2:])
        sys.exit(0)
    sys.stdout.flush()
    os.execv(rest[0], list(rest))


ROLES = {"ct-init": role_ct_init, "in-cgroup": role_in_cgroup, "hold": lambda a, b: role_hold(int(a), int(b)),
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
    """CT 129, made by LXC itself (the node's lxc 5.0, shared from its /usr) with the cgroup keys pve-container writes
    on PVE 9 (src/PVE/LXC.pm update_lxc_config), and its processes as the checks start them."""

    def __init__(self):
        self.procs: list[subprocess.Popen] = []
        self.monitor: subprocess.Popen | None = None
        self.init_pid = self.init_ns_pid = 0
        self.init_own_view = ""
        self.serial = 0

    def start(self) -> None:
        write(cg("cgroup.subtree_control"), "+memory +pids")  # as systemd enables them on the node
        rootfs = "/tmp/ct%d-rootfs" % VMID  # the node's /usr and /etc and the checkout, read-only
        for d in ("usr", "etc", "proc", "sys", "dev", "tmp", "root", CHECKOUT.lstrip("/")):
            os.makedirs(os.path.join(rootfs, d), exist_ok=True)
        for link in ("bin", "sbin", "lib", "lib64"):
            os.symlink("usr/" + link, os.path.join(rootfs, link))
        os.makedirs("/var/lib/lxc/%d" % VMID)
        os.makedirs("/run/lxc", exist_ok=True)
        write("/var/lib/lxc/%d/config" % VMID, "\n".join([
            "lxc.uts.name = CT%d" % VMID,
            "lxc.rootfs.path = dir:" + rootfs,
            "lxc.mount.entry = /usr usr none bind,ro 0 0",
            "lxc.mount.entry = /etc etc none bind,ro 0 0",
            "lxc.mount.entry = %s %s none bind,ro 0 0" % (CHECKOUT, CHECKOUT.lstrip("/")),
            "lxc.mount.entry = tmpfs tmp tmpfs defaults 0 0",
            "lxc.mount.entry = tmpfs dev/shm tmpfs defaults,create=dir 0 0",
            "lxc.mount.auto = proc:mixed sys:mixed cgroup:mixed",
            "lxc.autodev = 1",
            "lxc.net.0.type = empty",
            "lxc.apparmor.profile = unconfined",
            "lxc.tty.max = 0",
            "lxc.console.path = none",
            # pve-container src/PVE/LXC.pm update_lxc_config, as written for a PVE 9 node:
            "lxc.cgroup.relative = 0",
            "lxc.cgroup.dir.monitor = lxc.monitor/%d" % VMID,
            "lxc.cgroup.dir.container = lxc/%d" % VMID,
            "lxc.cgroup.dir.container.inner = ns",
            "lxc.monitor.unshare = 1",
            "lxc.cgroup2.memory.max = %d" % MEMORY_MAX,
            "lxc.cgroup2.memory.high = %d" % MEMORY_HIGH,
            "lxc.cgroup2.memory.swap.max = 0",
            "lxc.init.cmd = %s %s ct-init" % (sys.executable, GUEST),
            "lxc.environment = PYTHONDONTWRITEBYTECODE=1",
            "lxc.log.file = /tmp/lxc-%d.log" % VMID, "lxc.log.level = WARN", ""]))
        # `lxc-start -F` stays as the monitor (PVE's pve-container@.service runs it with -F); the init's stdin and
        # stdout are its own (no console), the handshake below
        self.monitor = subprocess.Popen(["lxc-start", "-n", str(VMID), "-F"], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, text=True)
        ready = self.monitor.stdout.readline().split()
        if not ready or ready[0] != "ready":
            raise RuntimeError("the container's init did not start: %r; LXC's log: %s" % (
                ready, _tail("/tmp/lxc-%d.log" % VMID)))
        self.init_ns_pid, self.init_own_view = int(ready[2]), ready[3]
        self.monitor.stdin.write("go\n")
        self.monitor.stdin.flush()
        if self.monitor.stdout.readline().strip() != "up":
            raise RuntimeError("the container's init did not make its cgroups")
        info = subprocess.run(["lxc-info", "-n", str(VMID), "-p", "-H"], capture_output=True, text=True, check=True)
        self.init_pid = int(info.stdout.strip())

    def run(self, rel_cgroup: str, *args: str, own_group: bool = False, stdin: int = subprocess.DEVNULL,
            argv: tuple[str, ...] = (), pgid: int | None = None) -> tuple[subprocess.Popen, str]:
        """``lxc-attach -n <vmid> -- guest.py in-cgroup <rel> ...`` (what `pct exec` runs): the command, moved into
        ``ns/<rel_cgroup>`` from inside the container when ``rel_cgroup`` is set (as systemd places a service),
        in its own process group when ``own_group``; ``lxc-attach`` itself stays on the host, in process group
        ``pgid`` when given (else its own). Returns the lxc-attach process and a token in the command's argv."""
        self.serial += 1
        token = "v2kernel-%d" % self.serial
        cmd = list(argv) if argv else ["role"] + list(args)
        cmd = ["lxc-attach", "-n", str(VMID), "--", sys.executable, GUEST, "in-cgroup", rel_cgroup or "-",
               "1" if own_group else "0", token] + cmd
        # no terminal on any of its fds, as over pct exec's SSH channel (else lxc-attach allocates a pty)
        with open(ATTACH_LOG, "a") as log:
            p = subprocess.Popen(cmd, stdin=stdin, stdout=subprocess.PIPE, stderr=log, text=True,
                                 preexec_fn=lambda: os.setpgid(0, pgid or 0))
        self.procs.append(p)
        return p, token

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        if self.monitor is not None:
            self.monitor.stdin.close()  # the init returns: LXC stops the container, every process in it
            try:
                self.monitor.wait(timeout=30)
            except subprocess.TimeoutExpired:
                subprocess.run(["lxc-stop", "-n", str(VMID), "-k"], check=False)
                self.monitor.wait(timeout=30)


def in_container(token: str) -> int:
    found: list[int] = []
    if not wait_for(lambda: bool(found.extend(_carriers(token)) or found)):
        raise RuntimeError("no process in the container carries %s" % token)
    return found[0]


def in_container_all(token: str) -> list[int]:
    found = _carriers(token)
    if not found:
        raise RuntimeError("no process in the container carries %s" % token)
    return found


def _carriers(token: str) -> list[int]:
    """The host PIDs of the processes in the container whose argv carries ``token`` (a command and what it forked;
    lxc-attach's own argv carries it too, on the host: told apart by the cgroup the kernel lists each in)."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            argv = open("/proc/%s/cmdline" % name, "rb").read().split(b"\0")
            where = read("/proc/%s/cgroup" % name)
        except OSError:
            continue
        if (token.encode() in argv and where.startswith("0::/lxc/%d/" % VMID)
                and state_of(int(name)) not in ("Z", "X")):
            found.append(int(name))
    return sorted(found)


def _tail(path: str) -> str:
    try:
        return read(path)[-1500:]
    except OSError:
        return "(none)"


def ready_line(p: subprocess.Popen) -> list[str]:
    line = p.stdout.readline().split()
    if not line or line[0] != "ready":
        raise RuntimeError("a helper process did not start: %r (exit %s); lxc-attach's stderr: %s" % (
            line, p.poll(), _tail(ATTACH_LOG)))
    return line[1:]


def main(out: str, deb: str) -> int:
    boot_s = float(read("/proc/uptime").split()[0])
    started = time.monotonic()
    os.makedirs(out, exist_ok=True)
    _import_collection()
    from ansible_collections.inferops.gpu_inference.plugins.module_utils.recover import (
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

    monitor_pid = box.monitor.pid
    c.check("LXC placed its monitor in lxc.monitor/%d and wrote memory.max and memory.high on lxc/%d from the "
            "lxc.cgroup2.* keys pve-container writes" % (VMID, VMID),
            procs_of(cg("lxc.monitor", str(VMID))) == {monitor_pid} and not procs_of(ct())
            and int(read(ct("memory.max"))) == MEMORY_MAX and int(read(ct("memory.high"))) == MEMORY_HIGH,
            "lxc.monitor/%d: %s; memory.max %s, memory.high %s" % (
                VMID, sorted(procs_of(cg("lxc.monitor", str(VMID)))), read(ct("memory.max")).strip(),
                read(ct("memory.high")).strip()))

    # ---- processes of the container, the monitor, the host, a tenant's own nested cgroups
    sglang, tok = box.run("system.slice/sglang.service", "hold", str(SHM_BYTES), str(ANON_BYTES))
    ready_line(sglang)
    holder_pid = in_container(tok)
    _other, tok = box.run("system.slice/other.service", "sleep")
    other_pid = in_container(tok)
    # a tenant's own cgroups, made inside the container and named like other containers'
    _tenant130, tok = box.run("lxc/130", "sleep")
    tenant130_pid = in_container(tok)
    _tenant131, tok = box.run("lxc.payload.131", "sleep")
    tenant131_pid = in_container(tok)
    host_sleeper = subprocess.Popen([sys.executable, GUEST, "sleep"], stdin=subprocess.DEVNULL)
    box.procs.append(host_sleeper)
    attach, tok = box.run("", "sleep")  # pct exec's command, where lxc-attach places it
    attach_pid = in_container(tok)
    attach_cg = read("/proc/%d/cgroup" % attach_pid).strip()
    c.check("lxc-attach (pct exec) runs its command below lxc/%d/ns; lxc-attach itself stays on the host" % VMID,
            attach_cg.startswith("0::/lxc/%d/ns/" % VMID) and attach_pid in procs_of(CG + attach_cg[3:])
            and attach.pid in procs_of(CG),
            "the command in %s, lxc-attach in %s" % (attach_cg, read("/proc/%d/cgroup" % attach.pid).strip()))

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
    monitor_cg = rp.parse_proc_cgroup(read("/proc/%d/cgroup" % monitor_pid))
    c.check("the monitor (lxc.monitor/%d) is not the container's: not attributed, not wholly in it" % VMID,
            monitor_pid in procs_of(cg("lxc.monitor", str(VMID))) and rp.container_of_pid(monitor_pid) == "host"
            and not rp.wholly_in_container(monitor_cg, VMID), repr(monitor_cg))
    sg_text = read("/proc/%d/cgroup" % holder_pid)
    c.check("in_unit finds sglang.service in the real /proc/PID/cgroup, not in init.scope's",
            rp.in_unit(sg_text, "sglang.service") and not rp.in_unit(init_cg, "sglang.service")
            and holder_pid in procs_of(ct("ns", "system.slice", "sglang.service")), sg_text.strip())

    # ---- memory: limit, usage, held bytes with pinned shared memory and page cache
    reader, _tok = box.run("system.slice/other.service", "read-cache", deb, str(CACHE_BYTES))
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
    inside, _tok = box.run("system.slice/sglang.service", "facts", stdin=subprocess.PIPE)
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
    measured, _tok = box.run("", argv=("/usr/bin/python3", tool, "measure", "--unit", "sglang.service"))
    m = json.loads(measured.stdout.read())
    measured.wait()
    after_ns = int(read(ct("ns", "memory.current")))
    holder_ns_pid = int(re.search(r"^NSpid:.*\s(\d+)$", read("/proc/%d/status" % holder_pid), re.M).group(1))
    c.check("the role's sglang_memory.py, run as pct exec runs it, finds the unit's process by its "
            "cgroup, its pinned pool and private memory, and the container's usage (lxc/%d/ns memory.current)" % VMID,
            [p["pid"] for p in m["processes"]] == [holder_ns_pid] and m["unit_held_bytes"] >= SHM_BYTES + ANON_BYTES
            and m["processes"][0]["rss_shmem_bytes"] >= SHM_BYTES
            and min(before_ns, after_ns) - 16 * MIB <= m["cgroup_memory_usage_bytes"]
            <= max(before_ns, after_ns) + 16 * MIB,
            "processes %r, unit_held_bytes %r, usage %r; lxc/%d/ns memory.current %d..%d" % (
                [(p["pid"], p["rss_shmem_bytes"]) for p in m["processes"]], m["unit_held_bytes"],
                m["cgroup_memory_usage_bytes"], VMID, before_ns, after_ns))

    # ---- kill scope: a process group that straddles the container's cgroup (pct exec's caller on the host)
    leader = subprocess.Popen([sys.executable, GUEST, "sleep"], stdin=subprocess.DEVNULL,
                              preexec_fn=lambda: os.setpgid(0, 0))  # pct exec's caller on the host, a group leader
    box.procs.append(leader)
    pgid = leader.pid
    member, tok = box.run("", "group", "1", pgid=pgid)  # what it runs in the container: lxc-attach in its group
    ready_line(member)
    in_ct = [p for p in group_now(pgid) if read("/proc/%d/cgroup" % p).startswith("0::/lxc/%d/" % VMID)]
    on_host = [p for p in group_now(pgid) if p not in in_ct]
    c.check("a command lxc-attach runs without a terminal stays in the caller's process group: the group straddles "
            "the container's cgroup (process table, /proc/PID/cgroup)", len(in_ct) == 2
            and sorted(on_host) == sorted([pgid, member.pid]), "group %d: in the container %s, on the host %s" % (
                pgid, in_ct, on_host))
    scan = rp.scan_processes(VMID)
    group_in_ct = [p for p in scan["container"] if p["pgid"] == pgid]
    plan = rsig.pids_to_signal(group_in_ct, scan["all"], VMID, init)
    c.check("a process group with members on the host is not planned as a group, its container members are "
            "planned one by one (pids_to_signal)", not plan["groups"]
            and set(plan["pids"]) == {p["pid"] for p in group_in_ct} == set(in_ct),
            "group %d: plan %r" % (pgid, {k: plan[k] for k in ("groups", "pids")}))
    sent = rsig.send_signal(plan, signal.SIGKILL)
    gone = wait_for(lambda: not any(alive(p) for p in in_ct), 10)
    member.wait()
    c.check("SIGKILL ends the container's members; the host's members of the same group are not signalled: the "
            "caller lives, lxc-attach exits by itself", gone and alive(pgid) and pgid in procs_of(CG)
            and member.returncode != -signal.SIGKILL,
            "sent %r; caller %s, lxc-attach exit %s" % (sent, state_of(pgid), member.returncode))

    # ---- kill scope: a group wholly in the container, and one whose member root moves out before the signal
    launcher, tok = box.run("system.slice/sglang.service", "group", "2", own_group=True)
    ready_line(launcher)
    members = in_container_all(tok)  # the launcher (its group's leader) and its two workers
    lpgid = members[0]
    scan = rp.scan_processes(VMID)
    plan = rsig.pids_to_signal([p for p in scan["container"] if p["pid"] == members[1]], scan["all"], VMID, init)
    c.check("a process group wholly in the container is planned as the group", plan["groups"] == [lpgid]
            and set(plan["members"][lpgid]) == {p["pid"] for p in scan["all"] if p["pgid"] == lpgid} == set(members),
            repr({k: plan[k] for k in ("groups", "members", "pids")}))
    bystanders = [init, other_pid, tenant130_pid, tenant131_pid, holder_pid, attach_pid, host_sleeper.pid, monitor_pid]
    sent = rsig.send_signal(plan, signal.SIGKILL)
    ok = wait_for(lambda: not any(alive(p) for p in members), 10)
    c.check("SIGKILL to the group ends every member; the init, the other services, the tenant's nested cgroups, "
            "pct exec's command, the monitor and the host live", ok and sent["groups"] == [lpgid]
            and all(alive(p) for p in bystanders)
            and not procs_of(ct("ns", "system.slice", "sglang.service")) & set(members),
            "sent %r; bystanders %s" % (sent, [state_of(p) for p in bystanders]))
    launcher, tok = box.run("system.slice/sglang.service", "group", "2", own_group=True)
    ready_line(launcher)
    members = in_container_all(tok)
    lpgid = members[0]
    scan = rp.scan_processes(VMID)
    plan = rsig.pids_to_signal([p for p in scan["container"] if p["pid"] == members[2]], scan["all"], VMID, init)
    write(cg("lxc.monitor", str(VMID), "cgroup.procs"), str(members[1]))  # root moves one member out
    sent = rsig.send_signal(plan, signal.SIGKILL)
    wait_for(lambda: not any(alive(members[i]) for i in (0, 2)), 10)
    c.check("a member root moved out of the container after the plan is not signalled; the group is refused "
            "and its other planned members are killed one by one", plan["groups"] == [lpgid]
            and alive(members[1]) and members[1] in procs_of(cg("lxc.monitor", str(VMID)))
            and not any(alive(members[i]) for i in (0, 2)) and not sent["groups"]
            and any(r.get("pgid") == lpgid for r in sent["refused"]),
            "sent %r; moved member %s" % (sent, state_of(members[1])))
    if alive(members[1]):
        os.kill(members[1], signal.SIGKILL)

    # ---- a real OOM kill in the ns subtree, counted once
    os.kill(holder_pid, signal.SIGKILL)
    sglang.wait()
    listed = sorted(os.listdir("/proc/%d/root/dev/shm" % init))
    c.check("the pool the killed holder left in the container's /dev/shm is found from the node (through the "
            "init's root, tmpfs all the way)", rp.shm_leftovers(init) == listed
            == ["sgl_v2kernel_pinned", "sgl_v2kernel_pool"] and rp.shm_listing(init)[1] is None,
            "code %r, the directory %r" % (rp.shm_listing(init), listed))
    for name in ("sgl_v2kernel_pool", "sgl_v2kernel_pinned"):  # the container's /dev/shm, from the node
        os.unlink("/proc/%d/root/dev/shm/%s" % (init, name))
    cursor = rk.read_kmsg()["cursor"]
    before = keyed(read(ct("memory.events")))["oom_kill"]
    code_before = rpve.container_memory(VMID, init)["oom_kills"]
    hog, tok = box.run("system.slice/oomtest.service", "alloc", str(OOM_ALLOC_BYTES))
    ready_line(hog)
    hog_host_pid = in_container(tok)
    rest = hog.stdout.read()
    hog.wait()
    events = keyed(read(ct("memory.events")))
    local_leaf = keyed(read(ct("ns", "system.slice", "oomtest.service", "memory.events.local")))
    local_top = keyed(read(ct("memory.events.local")))
    c.check("the kernel OOM-killed the allocator in lxc/%d/ns/system.slice/oomtest.service (memory.events)" % VMID,
            "survived" not in rest and not alive(hog_host_pid) and events["oom_kill"] == before + 1
            and local_leaf["oom_kill"] == 1 and local_top["oom_kill"] == 0 and local_top["oom"] >= 1,
            "PID %d %s; lxc/%d memory.events oom_kill %d -> %d, .local %r; oomtest.service .local %r" % (
                hog_host_pid, state_of(hog_host_pid), VMID, before, events["oom_kill"], local_top, local_leaf))
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
        hog, tok = box.run("system.slice/oomtest2.service", "alloc", str(OOM_ALLOC_BYTES))
        ready_line(hog)
        hog_host_pid = in_container(tok)
        rest = hog.stdout.read()
        hog.wait()
        local_sum = sum(keyed(read(os.path.join(d, "memory.events.local")))["oom_kill"] for d, _x, _y in os.walk(ct())
                        if os.path.exists(os.path.join(d, "memory.events.local")))  # not where memory is not enabled
        code_after = rpve.container_memory(VMID, init)["oom_kills"]
        c.check("with memory_localevents, a kill in ns/system.slice/oomtest2.service leaves lxc/%d's memory.events "
                "as it was, and oom_kills still counts it once (memory.events.local of the container's cgroups)" % VMID,
                "survived" not in rest and not alive(hog_host_pid)
                and keyed(read(ct("memory.events")))["oom_kill"] == top_before
                and keyed(read(ct("ns", "system.slice", "oomtest2.service", "memory.events.local")))["oom_kill"] == 1
                and code_before is not None and code_after == code_before + 1 == local_sum,
                "PID %d %s; lxc/%d memory.events oom_kill %d -> %d; code %r -> %r; sum of .local %d" % (
                    hog_host_pid, state_of(hog_host_pid), VMID, top_before,
                    keyed(read(ct("memory.events")))["oom_kill"], code_before, code_after, local_sum))
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


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] in ROLES:
        ROLES[sys.argv[1]](*sys.argv[2:])
        sys.exit(0)
    ARGV = sys.argv[1:]
    sys.exit(main(ARGV[ARGV.index("--out") + 1], ARGV[ARGV.index("--deb") + 1]))
