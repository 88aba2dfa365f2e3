"""Two recover runs on one container at once: one ladder acts, the other waits for the node's lock (docs/recover.md,
"One ladder at a time"); a run that cannot wait is refused, naming the holder, and changes nothing.

CT 176 (made here through the lab's pct, GPU 6 passed through, tagged inferops-gpu) runs a `sglang.service` that holds
GPU memory (the lab's worker). Everything is read from the world: the lock file and the kernel's flock on it, the
holder in the process table (pid and start time), the container's service (systemctl in the container) and its
GPU memory (the lab's nvidia-smi), each playbook's exit status and output.
"""
from __future__ import annotations

import fcntl
import json
import os
import re
import subprocess
import sys
import time

import pytest

from gpu import testlib as t
from conftest import REPO, wait_running_systemd

pytestmark = [t.needs_root, pytest.mark.skipif(not t.container_available(),
                                                reason="the lab's pct and container template are not installed")]

VMID = 176
GPU = 6
LOCK = "/run/inferops/locks/recover-ct-%d.lock" % VMID
BASELINE = "/var/lib/inferops/baseline/%d.json" % VMID
UNIT = """[Unit]
Description=stand-in server holding GPU memory (test_recover_lock)
[Service]
ExecStart=/usr/bin/python3 /run/nvidia-lab/lab-worker.py --gpus %d --mib 512
[Install]
WantedBy=multi-user.target
""" % GPU
INVENTORY = """all:
  children:
    sglang_containers:
      hosts:
        ct176:
          proxmox_vmid: 176
          ansible_connection: local
"""


def in_ct(*cmd: str) -> str:
    return t.attach(VMID, list(cmd)).stdout.strip()


def holders() -> list:
    """Host PIDs of the container's processes on a GPU, from the lab's nvidia-smi."""
    mine = set(t.host_pids_in_ct(VMID))
    return [int(p[0]) for p in t.compute_apps() if int(p[0]) in mine]


def start_service() -> None:
    r = t.attach(VMID, ["sh", "-c", "systemctl enable --now sglang.service"])
    assert r.returncode == 0, r.stdout + r.stderr
    assert t.wait_for(lambda: holders(), 30), "the service holds no GPU memory"


@pytest.fixture(scope="module")
def ct():
    t.lab_up()
    if os.path.exists("/etc/pve/lxc/%s.conf" % VMID):
        t.ct_destroy(VMID)
    devs = []
    for i, path in enumerate(["/dev/nvidia%d" % GPU, "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]):
        devs += ["--dev%d" % i, path]
    r = t.run(["pct", "create", str(VMID), t.TEMPLATE, "--hostname", "locktest", "--memory", "1024", "--swap", "0",
               "--unprivileged", "1", "--tags", "inferops-gpu"] + devs, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    t.ct_start(VMID)
    wait_running_systemd(VMID)
    r = t.attach(VMID, ["sh", "-c", "cat > /etc/systemd/system/sglang.service && systemctl daemon-reload"], input=UNIT)
    assert r.returncode == 0, r.stdout + r.stderr
    # The container's baseline at idle (as deploy records it), so that a recovered container is Clean.
    reports = "/tmp/inferops-test-recover-lock"
    os.makedirs(reports, exist_ok=True)
    inventory = os.path.join(reports, "ct176.yml")
    with open(inventory, "w") as f:
        f.write(INVENTORY)
    rc = recover(reports, inventory, "baseline", "-e", "recover_record_baseline=true").wait(timeout=300)
    assert rc == 0 and os.path.exists(BASELINE), output(reports, "baseline")[-3000:]
    yield VMID
    t.ct_destroy(VMID)
    for path in (BASELINE, LOCK):
        if os.path.exists(path):
            os.unlink(path)
    metrics = "/var/lib/prometheus/node-exporter/inferops_recover_%d.prom" % VMID
    if os.path.exists(metrics):
        os.unlink(metrics)


def recover(reports: str, inventory: str, name: str, *extra: str) -> subprocess.Popen:
    os.makedirs(reports, exist_ok=True)
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg"), ANSIBLE_NOCOLOR="1",
               ANSIBLE_FORCE_COLOR="0", ANSIBLE_VAULT_PASSWORD_FILE="/var/lib/inferops-lab/vault-pass",
               ANSIBLE_COLLECTIONS_PATH=os.path.join(REPO, ".collections"), INFEROPS_REPORT_DIR=reports)
    log = open(os.path.join(reports, "%s.log" % name), "w")
    return subprocess.Popen([os.path.join(REPO, ".venv", "bin", "ansible-playbook"),
                             "-i", os.path.join(REPO, "inventories", "lab", "hosts.yml"), "-i", inventory,
                             os.path.join(REPO, "playbooks", "recover.yml"), "-e", "recover_vmid=%d" % VMID, *extra],
                            stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO, start_new_session=True)


def output(reports: str, name: str) -> str:
    with open(os.path.join(reports, "%s.log" % name)) as f:
        return " ".join(f.read().split())


def lock_holder():
    """(pid, alive) of the lock's holder as the world shows it: the kernel refuses the flock to this process, and the
    pid the file names is a live process whose start time is the one recorded; None when the lock is free."""
    if not os.path.exists(LOCK):
        return None
    fd = os.open(LOCK, os.O_RDWR)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            fcntl.flock(fd, fcntl.LOCK_UN)
            return None
        except BlockingIOError:
            pass
        text = os.read(fd, 4096).decode()
    finally:
        os.close(fd)
    try:
        rec = json.loads(text)
    except ValueError:
        return (None, False)
    try:
        with open("/proc/%d/stat" % rec["pid"]) as f:
            ticks = int(f.read().rpartition(")")[2].split()[19])
    except OSError:
        return (rec["pid"], False)
    return (rec["pid"], ticks == rec.get("start_ticks"))


def test_two_runs_at_once_one_ladder_acts_the_other_waits_then_finds_it_clean(ct, tmp_path):
    inventory = str(tmp_path / "ct176.yml")
    with open(inventory, "w") as f:
        f.write(INVENTORY)
    start_service()
    before = holders()
    runs = {name: recover(str(tmp_path / name), inventory, name) for name in ("a", "b")}
    seen = set()
    while any(p.poll() is None for p in runs.values()):
        holder = lock_holder()
        if holder:
            seen.add(holder)
        time.sleep(0.1)
    rcs = {name: p.wait() for name, p in runs.items()}
    outs = {name: output(str(tmp_path / name), name) for name in runs}
    assert rcs == {"a": 0, "b": 0}, outs
    # The world while they ran: the lock was held, by one live holder process at a time, which is gone now.
    assert seen and all(alive for _pid, alive in seen), seen
    assert lock_holder() is None
    assert not [pid for pid, _ in seen if pid and os.path.exists("/proc/%d" % pid)]
    # One ladder acted: the service is stopped and disabled, the GPU memory released; the other waited for the lock,
    # diagnosed again and found nothing to do.
    assert (in_ct("systemctl", "is-enabled", "sglang.service"), in_ct("systemctl", "is-active", "sglang.service")) \
        == ("disabled", "inactive")
    assert before and holders() == []
    waited = [name for name, text in outs.items() if "for the node's lock" in text]
    assert len(waited) == 1, outs
    other = "a" if waited == ["b"] else "b"
    assert "diagnosing again" in outs[waited[0]] and "Already clean" in outs[waited[0]]
    assert re.search(r"pve1 : ok=\d+ changed=0 ", outs[waited[0]]) and re.search(r"pve1 : ok=\d+ changed=1 ", outs[other])
    assert "Clean after rung 1 (stop_service)" in outs[other]


def test_a_run_that_cannot_wait_is_refused_naming_the_holder_and_changes_nothing(ct, tmp_path):
    inventory = str(tmp_path / "ct176.yml")
    with open(inventory, "w") as f:
        f.write(INVENTORY)
    start_service()
    before = holders()
    # Another run's ladder, as the node shows it: a process holding the container's lock, its record naming it.
    holder = subprocess.Popen([sys.executable, "-c", (
        "import fcntl, json, os, sys, time\n"
        "os.makedirs(os.path.dirname(%r), mode=0o700, exist_ok=True)\n"
        "fd = os.open(%r, os.O_RDWR | os.O_CREAT, 0o600)\n"
        "fcntl.flock(fd, fcntl.LOCK_EX)\n"
        "ticks = int(open('/proc/self/stat').read().rpartition(')')[2].split()[19])\n"
        "os.ftruncate(fd, 0); os.write(fd, json.dumps({'pid': os.getpid(), 'start_ticks': ticks, 'what': 'recover "
        "ladder', 'vmid': %d, 'playbook': 'the operator run', 'since': time.time()}).encode())\n"
        "print('held', flush=True); time.sleep(120)\n") % (LOCK, LOCK, VMID)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        run = recover(str(tmp_path / "c"), inventory, "c", "-e", "gpu_recover_lock_wait_s=2")
        rc = run.wait(timeout=300)
        out = output(str(tmp_path / "c"), "c")
        assert rc != 0, out
        assert "holds the ladder of CT %d" % VMID in out and "held by pid %d" % holder.pid in out, out
        assert "playbook the operator run" in out
        # Nothing changed: the service runs, enabled, and holds its GPU memory; the holder still holds the lock.
        assert (in_ct("systemctl", "is-enabled", "sglang.service"), in_ct("systemctl", "is-active", "sglang.service")) \
            == ("enabled", "active")
        assert holders() == before and lock_holder() == (holder.pid, True)
        assert not os.path.exists(os.path.join(str(tmp_path / "c"), "pve1", "recover-%d.json" % VMID))
    finally:
        holder.kill()
        holder.wait()
    assert lock_holder() is None
