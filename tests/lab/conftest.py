"""Fixtures for the lab tests: the lab is brought up (labctl up, idempotent) before any test runs.

Nothing is skipped silently: without root the tests fail with the reason.
"""
from __future__ import annotations

import os
import subprocess
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.realpath(os.path.join(HERE, "..", ".."))
LABCTL = os.path.join(HERE, "labctl")
LAB = "/var/lib/inferops-lab"
CA = f"{LAB}/pki/ca.pem"
NODE = "pve1"
NODE2 = "pve2"        # the cluster's second node (docs/lab.md, "Two nodes")
NODE_ADDRESSES = {"pve1": "127.0.0.1", "pve2": "127.0.0.2"}
TEMPLATE = "local:vztmpl/debian-13-standard_13.1-1_amd64.tar.zst"
TEST_VMID = 199       # shared by the tests of one module; never 129 or 130
LIFECYCLE_VMID = 198  # created and destroyed by the lifecycle test


def labctl(*args: str, check: bool = True, timeout: int = 900) -> subprocess.CompletedProcess:
    r = subprocess.run([LABCTL, *args], capture_output=True, text=True, timeout=timeout)
    if check and r.returncode != 0:
        raise AssertionError(f"labctl {' '.join(args)} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}")
    return r


def pct(*args: str, timeout: int = 120) -> subprocess.CompletedProcess:
    return subprocess.run(["/usr/sbin/pct", *args], capture_output=True, text=True, timeout=timeout)


def node_ssh(node: str, *cmd: str, timeout: int = 120) -> subprocess.CompletedProcess:
    """A command on a node as its SSH endpoint runs it (root, the lab's key, the host key checked)."""
    return subprocess.run(["ssh", "-p", "2222", "-i", f"{LAB}/ssh/id_ed25519", "-o", "IdentitiesOnly=yes",
                           "-o", f"UserKnownHostsFile={LAB}/ssh/known_hosts", "-o", "StrictHostKeyChecking=yes",
                           "-o", "BatchMode=yes", f"root@{NODE_ADDRESSES[node]}", *cmd],
                          capture_output=True, text=True, timeout=timeout)


def secret(name: str) -> str:
    with open(f"{LAB}/secrets/{name}") as f:
        return f.read().strip()


@pytest.fixture(scope="session")
def lab():
    if os.geteuid() != 0:
        pytest.fail("the lab tests need root (they run real LXC containers)", pytrace=False)
    labctl("up")
    return LAB


@pytest.fixture(scope="session")
def api_root(lab):
    from proxmoxer import ProxmoxAPI
    return ProxmoxAPI("127.0.0.1", user="root@pam", password=secret("root-password"), verify_ssl=CA)


@pytest.fixture(scope="session")
def api_token(lab):
    from proxmoxer import ProxmoxAPI
    return ProxmoxAPI("127.0.0.1", user="root@pam", token_name="lab", token_value=secret("token-secret"),
                      verify_ssl=CA)


@pytest.fixture(scope="session")
def api_token_pve2(lab):
    """The token's client of pve2's own API address."""
    from proxmoxer import ProxmoxAPI
    return ProxmoxAPI(NODE_ADDRESSES[NODE2], user="root@pam", token_name="lab", token_value=secret("token-secret"),
                      verify_ssl=CA)


def wait_task(api, upid: str, timeout: int = 120) -> dict:
    from proxmoxer.tools import Tasks
    st = Tasks.blocking_status(api, upid, timeout=timeout, polling_interval=0.5)
    assert st is not None, f"task {upid} did not finish in {timeout}s"
    return st


def destroy(vmid: int) -> None:
    labctl("-q", "ct-destroy", str(vmid))


def create_ct(api, vmid: int, memory: int = 512, swap: int = 0, **extra) -> None:
    destroy(vmid)
    upid = api.nodes(NODE).lxc.post(
        vmid=vmid, ostemplate=TEMPLATE, hostname=f"labtest{vmid}", memory=memory, swap=swap, cores=1,
        unprivileged=1, net0=f"name=eth0,bridge=vmbr0,ip=10.77.0.{vmid}/24,gw=10.77.0.1", **extra)
    st = wait_task(api, upid)
    assert st["exitstatus"] == "OK", st


def wait_running_systemd(vmid: int, timeout: float = 60) -> None:
    """Waits until the CT's systemd has finished booting (or degraded)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        r = pct("exec", str(vmid), "--", "systemctl", "is-system-running")
        if r.stdout.strip() in ("running", "degraded"):
            return
        time.sleep(0.5)
    raise AssertionError(f"CT {vmid}: systemd did not finish booting in {timeout}s")


def running_ct(api_root, vmid: int):
    """A running unprivileged test CT (512 MiB, no swap) for a module fixture: ``yield from running_ct(api, vmid)``;
    destroyed afterwards."""
    create_ct(api_root, vmid)
    st = wait_task(api_root, api_root.nodes(NODE).lxc(vmid).status.start.post())
    assert st["exitstatus"] == "OK", st
    wait_running_systemd(vmid)
    yield vmid
    destroy(vmid)


@pytest.fixture(scope="module")
def ct(lab, api_root):
    """A running unprivileged test CT (VMID 199), destroyed afterwards."""
    yield from running_ct(api_root, TEST_VMID)
