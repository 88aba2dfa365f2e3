"""The simulated NVIDIA driver seen from a real (unprivileged) LXC container, the fake .run installer,
and the GPU faults of tests/lab/gpu/fault.py.

Uses a throwaway CT (VMID 197, override with LABGPU_TEST_VMID) made with the lab's own `pct` from the
lab's template, with GPUs 6 and 7 passed through as devN entries; it is destroyed at the end.
"""
import json
import os
import re
import signal
import subprocess
import time

import pytest

from gpu import testlib as t

pytestmark = [t.needs_root, pytest.mark.skipif(not t.container_available(),
                                               reason="the lab's pct and container template are not installed")]
CT = t.CT
G0, G1 = t.CT_GPUS
DRIVER = "580.95.05"
OTHER = "580.82.07"


@pytest.fixture(scope="module")
def ct():
    t.lab_up()
    t.ct_create(CT)
    yield CT
    t.fault("clear", "--vmid", CT)
    t.ct_destroy(CT)


@pytest.fixture
def clean(ct):
    yield ct
    t.fault("clear", "--vmid", ct)
    t.attach(ct, ["pkill", "-9", "-f", "lab-worker"])
    t.wait_for(lambda: not [p for p in t.compute_apps() if int(p[0]) in t.host_pids_in_ct(ct)])


def install(ct, version, *opts):
    path = "/var/lib/inferops-lab/nvidia/NVIDIA-Linux-x86_64-%s.run" % version
    with open(path) as f:
        r = t.attach(ct, ["sh", "-c", "cat > /root/inst.run && chmod +x /root/inst.run"], input=f.read())
    assert r.returncode == 0, r.stderr
    return t.attach(ct, ["/root/inst.run"] + list(opts))


def ct_smi(ct, *args):
    return t.attach(ct, ["nvidia-smi"] + list(args))


def test_installer(ct):
    r = install(ct, DRIVER, "--silent")  # no --no-kernel-module: cannot build/load a module in a CT
    assert r.returncode == 1 and "ERROR:" in r.stderr and "Installation has failed" in r.stderr
    r = install(ct, OTHER, "--no-kernel-module", "--silent")
    assert r.returncode == 0, r.stderr
    r = ct_smi(ct)
    assert r.returncode == 18
    assert r.stdout == "Failed to initialize NVML: Driver/library version mismatch\nNVML library version: 580.82\n"
    r = install(ct, DRIVER, "-s", "--no-kernel-module", "--ui=none", "--no-questions", "--accept-license")
    assert r.returncode == 0, r.stderr
    assert t.attach(ct, ["ls", "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.%s" % DRIVER,
                         "/usr/lib/x86_64-linux-gnu/libcuda.so.%s" % DRIVER]).returncode == 0
    assert t.attach(ct, ["ls", "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.%s" % OTHER]).returncode != 0
    r = ct_smi(ct, "--query-gpu=driver_version", "--format=csv,noheader")
    assert r.returncode == 0 and r.stdout == "%s\n%s\n" % (DRIVER, DRIVER)
    assert install(ct, DRIVER, "--version").stdout.strip().startswith("nvidia-installer:  version %s" % DRIVER)


@pytest.fixture
def smi_in_ct(ct):
    if ct_smi(ct, "-L").returncode != 0:
        assert install(ct, DRIVER, "--no-kernel-module", "--silent").returncode == 0
    return ct


def test_ct_sees_only_its_gpus_memory_but_no_processes(smi_in_ct, clean):
    ct = smi_in_ct
    base = t.gpu_used(G0)
    w = t.ct_worker(ct, G0, 2048)
    r = ct_smi(ct, "--query-gpu=index,memory.used", "--format=csv,noheader,nounits")
    assert r.returncode == 0
    seen = dict(line.split(", ") for line in r.stdout.splitlines())
    assert sorted(seen) == [str(G0), str(G1)] and int(seen[str(G0)]) == base + 2048
    r = ct_smi(ct, "--query-compute-apps=pid,process_name,used_memory", "--format=csv,noheader")
    assert r.returncode == 0 and r.stdout == ""
    assert "No running processes found" in ct_smi(ct).stdout
    host = [a for a in t.compute_apps() if int(a[0]) in t.host_pids_in_ct(ct)]
    assert len(host) == 1 and host[0][2] == "2048" and int(host[0][0]) != w["pid"]  # host PID, not the CT's
    assert t.attach(ct, ["kill", "-9", str(w["pid"])]).returncode == 0
    assert t.wait_for(lambda: t.gpu_used(G0) == base)


def test_reset_and_pm_refused_inside_ct(smi_in_ct):
    r = ct_smi(smi_in_ct, "-r", "-i", str(G0))
    assert r.returncode == 4 and "Insufficient Permissions" in r.stdout
    r = ct_smi(smi_in_ct, "-pm", "0", "-i", str(G0))
    assert r.returncode == 4 and "Insufficient Permissions" in r.stdout


def test_fault_sigterm_ignored(ct, clean):
    r = t.fault("inject", "sigterm-ignored", "--vmid", ct)
    assert r.returncode == 0, r.stderr
    r = t.attach(ct, ["cat", "/run/sglang-standin/faults.json"])
    assert json.loads(r.stdout) == {"ignore_sigterm": True}
    assert t.fault("clear", "--vmid", ct).returncode == 0
    assert t.attach(ct, ["test", "-e", "/run/sglang-standin/faults.json"]).returncode != 0


def test_fault_escaped_workers(ct, clean):
    base = (t.gpu_used(G0), t.gpu_used(G1))
    r = t.fault("inject", "escaped-workers", "--vmid", ct, "--mib", "1500")
    assert r.returncode == 0, r.stderr
    procs = json.loads(r.stdout)["processes"]
    assert sorted(p["gpu"] for p in procs) == [G0, G1]
    init = int(t.run(["lxc-info", "-n", ct, "-p", "-H"]).stdout)
    init_cg = open("/proc/%d/cgroup" % init).read()
    for p in procs:
        st = open("/proc/%d/stat" % p["pid"]).read().rsplit(")", 1)[1].split()
        assert int(st[1]) == init  # reparented to the CT's PID 1
        assert open("/proc/%d/comm" % p["pid"]).read().strip() in ("pt_main_thread", "python3")
        assert open("/proc/%d/cgroup" % p["pid"]).read() == init_cg  # in the CT's init cgroup
    # the usual in-CT clean-up does not match them; memory stays, visible from the node
    t.attach(ct, ["pkill", "-9", "-f", "sglang"])
    assert (t.gpu_used(G0), t.gpu_used(G1)) == (base[0] + 1500, base[1] + 1500)
    names = {a[1] for a in t.compute_apps() if int(a[0]) in [p["pid"] for p in procs]}
    assert names == {"pt_main_thread", "python3"}
    assert t.fault("clear", "--vmid", ct).returncode == 0
    assert t.wait_for(lambda: (t.gpu_used(G0), t.gpu_used(G1)) == base)


def kill_worker_under_fault(ct, fault, mib, *args):
    """A worker in the CT holds mib on G1; with the fault injected it is SIGKILLed; no process is left."""
    t.ct_worker(ct, G1, mib)
    assert t.fault("inject", fault, "--vmid", ct, *args).returncode == 0
    t.attach(ct, ["pkill", "-9", "-f", "lab-worker"])
    assert t.wait_for(lambda: not [a for a in t.compute_apps() if int(a[0]) in t.host_pids_in_ct(ct)])


def test_fault_driver_held_until_ct_stopped(ct, clean):
    base = t.gpu_used(G1)
    kill_worker_under_fault(ct, "driver-held", 3000)
    assert t.gpu_used(G1) == base + 3000  # no process, memory still used
    r = t.run(["pct", "stop", ct])
    assert r.returncode == 0, r.stdout + r.stderr
    assert t.wait_for(lambda: t.gpu_used(G1) == base)
    t.ct_start(ct)


def test_fault_slow_teardown_frees_the_memory_after_its_delay(ct, clean):
    base = t.gpu_used(G1)
    kill_worker_under_fault(ct, "slow-teardown", 1100, "--seconds", "6")
    gone = time.time()
    assert t.gpu_used(G1) == base + 1100  # no process listed, memory still used: it looks like a leak
    assert not [a for a in t.compute_apps() if int(a[0]) in t.host_pids_in_ct(ct)]
    assert t.wait_for(lambda: t.gpu_used(G1) == base, timeout=20)
    assert time.time() - gone >= 4  # not before the teardown's time (less the time to see the worker gone)
    r = t.run(["lxc-info", "-n", ct, "-s", "-H"])
    assert r.stdout.strip() == "RUNNING"  # freed without stopping the container


def reset_from_node(gpu):
    """nvidia-persistenced stopped, persistence mode off, `nvidia-smi -r -i gpu` on the node, both restored."""
    pm = t.driver({"op": "query"})["gpus"][gpu]["persistence_mode"]
    with t.persistenced_stopped():
        try:
            assert t.smi("-pm", "0", "-i", str(gpu)).returncode == 0
            r = t.smi("-r", "-i", str(gpu))
            assert r.returncode == 0, r.stdout
        finally:
            t.smi("-pm", "1" if pm == "Enabled" else "0", "-i", str(gpu))


def test_fault_driver_held_released_by_host_reset(ct, clean):
    base = t.gpu_used(G1)
    kill_worker_under_fault(ct, "driver-held", 1000)
    assert t.gpu_used(G1) == base + 1000
    reset_from_node(G1)
    assert t.gpu_used(G1) == 0


def test_fault_driver_leak_outlives_ct_until_host_reset(ct, clean):
    base = t.gpu_used(G1)
    kill_worker_under_fault(ct, "driver-leak", 1200)
    r = t.run(["pct", "stop", ct])
    assert r.returncode == 0, r.stdout + r.stderr
    try:
        # the CT and every process of it are gone; the memory is not
        assert t.gpu_used(G1) == base + 1200
        assert t.driver({"op": "query"})["gpus"][G1]["driver_retained_mib"] == 1200
        reset_from_node(G1)
        assert t.gpu_used(G1) == 0
    finally:
        t.ct_start(ct)


def test_fault_stuck_resists_sigkill_until_fuse_abort(ct, clean):
    base = t.gpu_used(G0)
    r = t.fault("inject", "stuck", "--vmid", ct, "--gpu", str(G0), "--mib", "2500")
    assert r.returncode == 0, r.stderr
    rec = json.loads(r.stdout)
    pid = rec["processes"][0]["pid"]
    assert t.proc_state(pid) == "D"
    assert open("/proc/%d/wchan" % pid).read() == "request_wait_answer"
    assert "fuse" in open("/proc/%d/stack" % pid).read()
    t.attach(ct, ["pkill", "-9", "python3"])
    os.kill(pid, signal.SIGKILL)  # even from the host
    assert not t.wait_for(lambda: t.proc_state(pid) is None, timeout=2)
    assert t.proc_state(pid) == "D" and t.gpu_used(G0) == base + 2500
    assert [a for a in t.compute_apps() if a[0] == str(pid)]
    r = t.smi("-r", "-i", str(G0))
    assert r.returncode == 255  # a client still has the device open
    assert re.fullmatch(r"/sys/fs/fuse/connections/\d+/abort", rec["abort"])
    with open(rec["abort"], "w") as f:  # Rung 3
        f.write("1")
    assert t.wait_for(lambda: t.proc_state(pid) is None)
    assert t.wait_for(lambda: t.gpu_used(G0) == base)


def test_stop_that_cannot_stop_fails(ct, clean):
    """A task in D state keeps the CT's PID namespace alive: `pct stop` must fail (exit 255, `container did
    not stop`, as PVE::LXC::vm_stop) instead of reporting OK."""
    r = t.fault("inject", "stuck", "--vmid", ct, "--gpu", str(G0), "--mib", "512")
    assert r.returncode == 0, r.stderr
    rec = json.loads(r.stdout)
    pid = rec["processes"][0]["pid"]
    try:
        # PVE's vm_stop waits for the container's monitor to close its socket, without a limit of its own, so a
        # stop of a CT that cannot stop may block as long as the D-state task lasts; what it must never do is
        # report OK while the CT still runs. Either it is still waiting after 40 s, or it failed.
        try:
            r = t.run(["pct", "stop", ct], timeout=40)
        except subprocess.TimeoutExpired:
            r = None
        assert r is None or (r.returncode == 255 and "container did not stop" in r.stderr), r.stdout + r.stderr
        assert "RUNNING" in t.run(["lxc-info", "-n", ct, "-s"]).stdout or "STOPPING" in t.run(["lxc-info", "-n", ct, "-s"]).stdout
    finally:
        with open(rec["abort"], "w") as f:
            f.write("1")
        assert t.wait_for(lambda: t.proc_state(pid) is None, timeout=30)
        t.wait_for(lambda: "State:" in t.run(["lxc-info", "-n", ct, "-s"]).stdout
                   and "STOPPED" in t.run(["lxc-info", "-n", ct, "-s"]).stdout, timeout=60)
        if t.run(["pct", "status", ct]).stdout == "status: stopped\n":
            t.ct_start(ct)
