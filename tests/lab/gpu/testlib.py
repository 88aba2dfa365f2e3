"""Helpers shared by tests/lab/test_gpu_*.py (the lab's simulated NVIDIA driver)."""
import contextlib
import json
import os
import shutil
import socket
import subprocess
import textwrap
import time

import pytest

GPU_DIR = os.path.dirname(os.path.abspath(__file__))
PY = "/usr/bin/python3"
LABCTL = os.path.join(os.path.dirname(GPU_DIR), "labctl")
LABGPU = [PY, LABCTL, "gpu"]  # labgpu (gpu/labgpu.py): `LABGPU + ["up"]`
SMI = "/usr/bin/nvidia-smi"
SOCK = "/run/nvidia-lab/driver.sock"

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="the lab tests run as root")


def run(cmd, **kw):
    kw.setdefault("capture_output", True)
    kw.setdefault("text", True)
    kw.setdefault("timeout", 120)
    return subprocess.run(cmd, **kw)


def smi(*args):
    return run([SMI] + list(args))


def gpu_used(index):
    r = smi("--query-gpu=index,memory.used", "--format=csv,noheader,nounits", "-i", str(index))
    assert r.returncode == 0, r.stdout + r.stderr
    return int(r.stdout.split(",")[1])


def compute_apps():
    r = smi("--query-compute-apps=pid,process_name,used_memory,gpu_uuid,gpu_bus_id", "--format=csv,noheader,nounits")
    assert r.returncode == 0, r.stdout + r.stderr
    return [[c.strip() for c in line.split(",")] for line in r.stdout.splitlines() if line.strip()]


def driver(req):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(10)
    s.connect(SOCK)
    s.sendall(json.dumps(req).encode() + b"\n")
    buf = b""
    while not buf.endswith(b"\n"):
        buf += s.recv(65536)
    s.close()
    return json.loads(buf)


HOLDER = textwrap.dedent("""
    import json, os, socket, sys, threading, time, ctypes
    gpu, mib, mode = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    fd = os.open("/dev/nvidia%d" % gpu, os.O_PATH)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect("/run/nvidia-lab/driver.sock")
    s.sendall(json.dumps({"op": "alloc", "gpu": gpu, "bytes": mib << 20, "tag": "test"}).encode() + b"\\n")
    rep = json.loads(s.makefile().readline())
    print(json.dumps(rep), flush=True)
    if mode == "zombie-leader":
        threading.Thread(target=lambda: time.sleep(3600)).start()
        ctypes.CDLL(None).pthread_exit(None)
    sys.stdin.read()
""")


class Holder:
    """A host process that opens /dev/nvidiaN with O_PATH and registers an allocation (the contract)."""

    def __init__(self, gpu, mib, mode="plain"):
        self.p = subprocess.Popen([PY, "-c", HOLDER, str(gpu), str(mib), mode], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True)
        self.reply = json.loads(self.p.stdout.readline())
        self.pid = self.p.pid

    def stop(self):
        if self.p.poll() is None:
            self.p.kill()
        self.p.wait()


def wait_for(pred, timeout=10.0, step=0.1):
    end = time.time() + timeout
    while time.time() < end:
        v = pred()
        if v:
            return v
        time.sleep(step)
    return pred()


def lab_up():
    r = run(LABGPU + ["up"])
    assert r.returncode == 0, r.stdout + r.stderr


# ----------------------------------------------------------------------------- containers

CT = os.environ.get("LABGPU_TEST_VMID", "197")
CT_GPUS = (6, 7)
TEMPLATE = "local:vztmpl/debian-13-standard_13.1-1_amd64.tar.zst"
TEMPLATE_FILE = "/var/lib/vz/template/cache/debian-13-standard_13.1-1_amd64.tar.zst"


def container_available():
    return (shutil.which("pct") and shutil.which("lxc-attach") and os.path.exists(TEMPLATE_FILE))


def ct_destroy(vmid):
    run(["pct", "stop", str(vmid)], timeout=120)
    run(["pct", "destroy", str(vmid)], timeout=120)


def ct_create(vmid):
    """A throwaway unprivileged CT made through the lab's own pct, with two GPUs passed through (devN)."""
    if os.path.exists("/etc/pve/lxc/%s.conf" % vmid):
        ct_destroy(vmid)
    devs = []
    for i, path in enumerate(["/dev/nvidia%d" % CT_GPUS[0], "/dev/nvidia%d" % CT_GPUS[1], "/dev/nvidiactl",
                              "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]):
        devs += ["--dev%d" % i, path]
    r = run(["pct", "create", str(vmid), TEMPLATE, "--hostname", "gputest", "--memory", "1024", "--swap", "0",
             "--unprivileged", "1"] + devs, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    ct_start(vmid)


def ct_start(vmid):
    r = run(["pct", "start", str(vmid)], timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert wait_for(lambda: attach(vmid, ["true"]).returncode == 0, 30)


def attach(vmid, cmd, **kw):
    return run(["lxc-attach", "-n", str(vmid), "--clear-env", "--"] + cmd,
               env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}, **kw)


def ct_worker(vmid, gpu, mib, *extra):
    r = attach(vmid, [PY, "/run/nvidia-lab/lab-worker.py", "--daemonize", "--gpus", str(gpu), "--mib", str(mib)]
               + list(extra))
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def fault(*args):
    return run([PY, LABCTL, "fault"] + list(args), timeout=120)


def host_pids_in_ct(vmid):
    """Host PIDs of the CT's processes (by PID namespace of its init)."""
    init = int(run(["lxc-info", "-n", str(vmid), "-p", "-H"]).stdout.strip())
    ns = os.stat("/proc/%d/ns/pid" % init).st_ino
    out = []
    for n in os.listdir("/proc"):
        if n.isdigit():
            try:
                if os.stat("/proc/%s/ns/pid" % n).st_ino == ns:
                    out.append(int(n))
            except OSError:
                pass
    return out


def proc_state(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


PERSISTENCED = "/usr/bin/nvidia-persistenced"
PERSISTENCED_PIDFILE = "/var/run/nvidia-persistenced/nvidia-persistenced.pid"


def persistenced_pid():
    try:
        pid = int(open(PERSISTENCED_PIDFILE).read().strip())
        return pid if open("/proc/%d/comm" % pid).read().strip() == "nvidia-persiste" else None
    except (OSError, ValueError):
        return None


# The node runs it under its systemd unit, through the lab's service manager (docs/lab.md, "Service manager").
SYSTEMCTL = "/usr/local/sbin/systemctl"
PERSISTENCED_UNIT = "nvidia-persistenced.service"


def unit_show(unit=PERSISTENCED_UNIT):
    """``systemctl show UNIT`` as a dict (the lab's service manager)."""
    r = run([SYSTEMCTL, "show", unit], timeout=150)
    assert r.returncode == 0, r.stderr
    return dict(line.split("=", 1) for line in r.stdout.splitlines() if "=" in line)


@contextlib.contextmanager
def persistenced_stopped():
    """The node's nvidia-persistenced stopped for the block through its unit (as an operator would before
    nvidia-smi -r), then started again through it."""
    if persistenced_pid() is not None:
        assert run([SYSTEMCTL, "stop", PERSISTENCED_UNIT], timeout=150).returncode == 0
        assert wait_for(lambda: persistenced_pid() is None)
    try:
        yield
    finally:
        if persistenced_pid() is None:
            run([SYSTEMCTL, "start", PERSISTENCED_UNIT], check=True, timeout=150)
