"""labctl: idempotent up, the bystander, the refusal on a real PVE node."""
from __future__ import annotations

import os
import subprocess
import time

from conftest import LABCTL, labctl


def bystander() -> tuple[int, str]:
    out = labctl("status").stdout
    line = [ln for ln in out.splitlines() if ln.startswith("bystander CT 130: ")][0]
    pid = int(line.split("host pid ")[1].split(",")[0])
    heartbeat = line.split("heartbeat ")[1].split(" (")[0]
    return pid, heartbeat


def test_second_up_is_a_noop_and_bystander_survives(lab):
    pid, beat = bystander()
    r = labctl("up")
    peers = ("labctl: labctl gpu up", "labctl: building the SGLang stand-in wheels")
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("labctl:") and not ln.startswith(peers)]
    assert lines[-1].startswith("labctl: lab is up"), r.stdout
    assert len(lines) == 1, f"second up changed something:\n{r.stdout}"
    time.sleep(2.5)
    pid2, beat2 = bystander()
    assert pid2 == pid and beat2 != beat


def test_bystander_is_an_unprivileged_ct_with_small_memory(lab):
    with open("/etc/pve/lxc/130.conf") as f:
        conf = f.read()
    assert "memory: 256\n" in conf and "unprivileged: 1\n" in conf
    # Its own GPU work: GPU 4 passed as dev0, a process holding 512 MiB on it (what recovery of CT 129 must not touch).
    assert "dev0: /dev/nvidia4\n" in conf
    out = labctl("status").stdout
    line = [ln for ln in out.splitlines() if ln.startswith("bystander CT 130 GPU:")][0]
    assert "GPU 4 512 MiB" in line and "NOT RUNNING" not in line, line


def test_refuses_a_real_pve_node(lab):
    # A private mount namespace where /etc/pve is a mount, as pmxcfs makes it on a real node.
    r = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c",
                        f"mount -t tmpfs pmxcfs /etc/pve && {LABCTL} up"], capture_output=True, text=True)
    assert r.returncode == 2 and "real Proxmox VE node" in r.stderr, r
    assert os.path.exists("/usr/sbin/pct")
