"""Hostile neighbours and kills: signals reach only what was judged.

A throwaway unprivileged CT (VMID 191, override with HOSTILE_SIGNALS_VMID) with one lab GPU (5) passed through runs a
process group of GPU workers. Root on the node moves one member of that group out of the container's cgroup, as an
escaped worker would be, and a PID of the container is reused by another process between the rung's SIGTERM and its
SIGKILL. The real kill rung runs through the real module (``ansible localhost -m
inferops.gpu_inference.gpu_recover_action``), and recover_signals' send path is run on a plan made before a member
was moved out. Everything is judged from the world: the process table (PID and start time), /proc/PID/cgroup and the
simulated driver's compute apps, never the module's report.

A host process cannot join a container's process group across PID namespaces on its own (setpgid(2) needs the same
session); what can straddle the container's cgroup is a member that root moved to another cgroup, or a process started
by a non-interactive ``pct exec`` (it keeps the host caller's process group), which tests/unit covers.
"""
from __future__ import annotations

import ctypes
import importlib
import json
import os
import signal
import struct
import subprocess
import sys
import time

import pytest

from gpu import testlib as t

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.realpath(os.path.join(HERE, "..", ".."))
COLLECTIONS = os.path.join(REPO, ".collections")
LINK = os.path.join(COLLECTIONS, "ansible_collections", "inferops", "gpu_inference")
if not os.path.exists(LINK):
    os.makedirs(os.path.dirname(LINK), exist_ok=True)
    os.symlink("../../..", LINK)
importlib.invalidate_caches()  # the link made just now, on sys.path since the start (pytest.ini)
from ansible_collections.inferops.gpu_inference.plugins.module_utils.recover import recover_procs as procs  # noqa: E402
from ansible_collections.inferops.gpu_inference.plugins.module_utils.recover import recover_signals as rsig  # noqa: E402

pytestmark = [t.needs_root, pytest.mark.skipif(not t.container_available(),
                                               reason="the lab's pct and container template are not installed")]

VMID = int(os.environ.get("HOSTILE_SIGNALS_VMID", "191"))
GPU = 5
CGROUP_ROOT = "/sys/fs/cgroup"

# Run inside the CT by lxc-attach: leaves the attach (so the command returns), starts a session and process group of
# its own, starts one lab worker per tag in it (each opens /dev/nvidia<GPU> and registers an allocation), and waits.
GROUP = r"""
import json, os, subprocess, sys, time
if os.fork():
    os._exit(0)
os.setsid()
null = os.open("/dev/null", os.O_RDWR)
for fd in (0, 1, 2):
    os.dup2(null, fd)
for tag, stay in json.loads(sys.argv[3]):
    subprocess.Popen([sys.executable, "/run/nvidia-lab/lab-worker.py", "--gpus", sys.argv[2], "--mib", "64",
                      "--tag", tag] + (["--ignore-term"] if stay else []))
while True:
    time.sleep(60)
"""

# --------------------------------------------------------------------------- the world


def stat(pid):
    return procs.read_stat(pid)


def same_process_alive(pid, starttime):
    """The process table has ``pid`` with that start time, not a zombie."""
    return procs.is_alive(pid, starttime) is not None


def cgroup(pid):
    return procs.parse_proc_cgroup(procs.read_text("/proc/%d/cgroup" % pid))


def hierarchy_dir(controllers):
    """The mount of a hierarchy named as /proc/PID/cgroup names it ("" is cgroup v2)."""
    if os.path.exists(os.path.join(CGROUP_ROOT, "cgroup.controllers")):
        return CGROUP_ROOT if controllers == "" else None
    if controllers == "":
        return os.path.join(CGROUP_ROOT, "unified")
    name = controllers[len("name="):] if controllers.startswith("name=") else controllers
    for candidate in (name, controllers):
        path = os.path.join(CGROUP_ROOT, candidate)
        if os.path.isdir(path):
            return path
    for entry in os.listdir(CGROUP_ROOT):  # cpu,cpuacct mounted under one of its names
        if set(entry.split(",")) == set(controllers.split(",")):
            return os.path.join(CGROUP_ROOT, entry)
    return None


def move(pid, paths):
    """Root moves ``pid`` to ``paths`` ({hierarchy: cgroup path}) in every hierarchy of the node."""
    for controllers, path in paths.items():
        base = hierarchy_dir(controllers)
        assert base, "no mount for cgroup hierarchy %r" % controllers
        with open(os.path.join(base, path.lstrip("/"), "cgroup.procs"), "w") as f:
            f.write(str(pid))


def to_host_root(pid):
    move(pid, {k: "/" for k in cgroup(pid)})


def kill_if_same(pid, starttime):
    """Clean-up: SIGKILL through a pidfd, only if the PID is still the process that started at ``starttime``."""
    try:
        fd = os.pidfd_open(pid)
    except OSError:
        return
    try:
        if same_process_alive(pid, starttime):
            signal.pidfd_send_signal(fd, signal.SIGKILL)
    finally:
        os.close(fd)


def lab_apps():
    return {int(a[0]) for a in t.compute_apps()}


def pids_tagged(marker):
    """Host PIDs whose command line holds ``marker`` as one argument."""
    found = []
    for pid in procs.list_pids("/"):
        try:
            with open("/proc/%d/cmdline" % pid, "rb") as f:
                if marker.encode() in f.read().split(b"\0"):
                    found.append(pid)
        except OSError:
            pass
    return found


_libc = ctypes.CDLL(None, use_errno=True)
SYS_CLONE3 = 435


def spawn_with_pid(pid, argv):
    """Start ``argv`` as a process whose host PID is exactly ``pid`` (clone3 with set_tid: root): a PID reused."""
    tid = (ctypes.c_int32 * 1)(pid)
    args = struct.pack("=11Q", 0, 0, 0, 0, signal.SIGCHLD, 0, 0, 0, ctypes.addressof(tid), 1, 0)
    buf = ctypes.create_string_buffer(args, len(args))
    r = _libc.syscall(SYS_CLONE3, buf, ctypes.c_size_t(len(args)))
    if r == 0:
        try:
            fd = os.open("/dev/null", os.O_RDWR)
            for n in (0, 1, 2):
                os.dup2(fd, n)
            os.execv(argv[0], argv)
        finally:
            os._exit(127)
    if r < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return r


# --------------------------------------------------------------------------- the container

def ct_create(vmid):
    if os.path.exists("/etc/pve/lxc/%d.conf" % vmid):
        t.ct_destroy(vmid)
    devs = []
    for i, path in enumerate(["/dev/nvidia%d" % GPU, "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]):
        devs += ["--dev%d" % i, path]
    r = t.run(["pct", "create", str(vmid), t.TEMPLATE, "--hostname", "hostile-signals", "--memory", "512", "--swap",
               "0", "--unprivileged", "1"] + devs, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    t.ct_start(vmid)


@pytest.fixture(scope="module")
def ct():
    t.lab_up()
    ct_create(VMID)
    yield VMID
    t.ct_destroy(VMID)


@pytest.fixture
def group(ct):
    """Start a process group in the CT: {tag: host PID} of its lab workers and "leader"; the test names the tags
    (``tag:stay`` ignores SIGTERM). Whatever is left is killed afterwards, wherever root moved it."""
    started = []

    def make(*specs):
        label = "hostile-signals-%d" % len(started)
        tags = [s.partition(":")[0] for s in specs]
        workers = json.dumps([[label + "-" + tag, s.endswith(":stay")] for tag, s in zip(tags, specs)])
        r = t.attach(ct, [t.PY, "-c", GROUP, label + "-leader", str(GPU), workers])
        assert r.returncode == 0, r.stdout + r.stderr
        assert t.wait_for(lambda: all(len(pids_tagged(label + "-" + tag)) == 1 for tag in tags + ["leader"])
                          and len(lab_apps() & {p for tag in tags for p in pids_tagged(label + "-" + tag)}) == len(tags),
                          timeout=30), "the workers did not register their allocations"
        found = {tag: pids_tagged(label + "-" + tag)[0] for tag in tags + ["leader"]}
        assert all(stat(pid)["pgid"] == found["leader"] for pid in found.values())
        started.append((found, {tag: stat(pid)["starttime"] for tag, pid in found.items()}))
        return found
    yield make
    for found, starts in started:
        for tag, pid in found.items():
            kill_if_same(pid, starts[tag])


def run_module(**args):
    argv = [os.path.join(os.path.dirname(sys.executable), "ansible"), "localhost", "-m",
            "inferops.gpu_inference.gpu_recover_action", "-a", " ".join("%s=%s" % kv for kv in args.items())]
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    return subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


# --------------------------------------------------------------------------- the attacks

def test_kill_rung_spares_a_moved_member_and_a_reused_pid(group):
    """Rung 2 through the real module on a process group of the CT that holds its GPU. The group is whole when the
    rung plans: SIGTERM goes to the group (the leader, which holds nothing, ends by it). Then, before the SIGKILL,
    root moves member "escaped" to the node's root cgroup, and the PID of member "a" (ended by SIGTERM) is reused by
    a new process that root puts in a's cgroup and that opens the GPU. The SIGKILL must reach "b" alone."""
    g = group("a", "b:stay", "escaped:stay")
    starts = {tag: stat(pid)["starttime"] for tag, pid in g.items()}
    a_cgroup = cgroup(g["a"])
    assert all(procs.container_of_cgroup(procs.read_text("/proc/%d/cgroup" % pid)) == VMID for pid in g.values())
    # The grace is the window the test has to move a member and reuse a PID (under 1 s here): wide for a loaded CI.
    proc = run_module(vmid=VMID, action="kill_holders", term_grace=15, wait=3, command_timeout=30)
    reused = None
    try:
        # The rung's SIGTERM ends "a" (and the leader); until then nothing is touched.
        assert t.wait_for(lambda: not same_process_alive(g["a"], starts["a"]), timeout=60, step=0.05), \
            "the rung sent no SIGTERM to a"
        to_host_root(g["escaped"])
        assert procs.container_of_cgroup(procs.read_text("/proc/%d/cgroup" % g["escaped"])) is None
        end = time.time() + 5
        while reused is None:
            try:
                reused = spawn_with_pid(g["a"], [t.PY, "/run/nvidia-lab/lab-worker.py", "--gpus", str(GPU), "--mib",
                                                 "64", "--tag", "hostile-signals-reused"])
            except OSError:  # a's PID not reaped yet (EEXIST)
                if time.time() > end:
                    proc.kill()
                    raise AssertionError("a's PID was not freed: %s\n%s" % (
                        {k: stat(p) for k, p in g.items()}, proc.communicate()[0]))
                time.sleep(0.02)
        move(reused, a_cgroup)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out
    try:
        assert reused == g["a"] and stat(reused)["starttime"] != starts["a"]
        assert same_process_alive(reused, stat(reused)["starttime"]), "the process that reused a's PID was killed"
        assert procs.container_of_cgroup(procs.read_text("/proc/%d/cgroup" % reused)) == VMID
        assert same_process_alive(g["escaped"], starts["escaped"]), "the member moved out of the CT was killed:\n" + out
        assert not same_process_alive(g["b"], starts["b"]), "b still runs:\n" + out
        assert not same_process_alive(g["leader"], starts["leader"]), "the group was not signalled while whole"
        apps = lab_apps()
        assert g["escaped"] in apps and g["b"] not in apps
    finally:
        os.kill(reused, signal.SIGKILL)
        os.waitpid(reused, 0)


def test_a_member_moved_out_after_the_plan_splits_the_group(ct, group):
    """The send path itself, with the cgroup part real: a plan made while the group was whole, then root moves one
    member to the node's root cgroup; at the moment of sending the group is judged again: no kill(-pgid), the planned
    members still in the CT are killed one by one, the moved one lives on with its GPU memory."""
    g = group("a", "b", "moved")
    starts = {tag: stat(pid)["starttime"] for tag, pid in g.items()}
    scan = procs.scan_processes(VMID, "/", procs.uvm_majors())
    init = int(t.run(["lxc-info", "-n", str(VMID), "-p", "-H"]).stdout)
    targets = [p for p in scan["container"] if p["pid"] in (g["a"], g["b"])]
    plan = rsig.pids_to_signal(targets, scan["all"], VMID, init)
    assert plan["groups"] == [g["leader"]] and sorted(plan["members"][g["leader"]]) == sorted(g.values())
    to_host_root(g["moved"])
    out = rsig.send_signal(plan, signal.SIGKILL)
    assert t.wait_for(lambda: not any(same_process_alive(g[k], starts[k]) for k in ("leader", "a", "b")), timeout=30)
    assert same_process_alive(g["moved"], starts["moved"])
    assert g["moved"] in lab_apps()
    assert out["groups"] == [] and sorted(out["pids"]) == sorted([g["leader"], g["a"], g["b"]]), json.dumps(out)
    assert [(r.get("pgid"), r.get("pid")) for r in out["refused"]] == [(g["leader"], None), (None, g["moved"])]
