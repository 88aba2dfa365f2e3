"""pve2's own GPUs (docs/lab.md, "GPUs of pve2"): what pve2's SSH, pve2's `pct` and a container of pve2 see, and
that pve1 sees none of it.

Reaches pve2 as a client would (root@127.0.0.2:2222, the lab's key); makes a throwaway unprivileged CT 196 on pve2
with pve2's GPU 0 as dev0 and destroys it at the end.
"""
from __future__ import annotations

import json
import os
import shlex
import signal

import pytest

from conftest import LABCTL, NODE2, TEMPLATE, destroy, labctl, node_ssh

from gpu import testlib as t

VMID = 196
PVE1_GPUS = 8
PVE2_GPUS = 4  # the lab's default pve2_gpu_count
MIB = 700
PERSISTENCED_PVE2 = "/run/inferops-lab/pve2/nvidia-persistenced/nvidia-persistenced.pid"


def ssh(node: str, *args: str, timeout: int = 120):
    """One command over the node's SSH, its arguments quoted for the remote shell."""
    return node_ssh(node, " ".join(shlex.quote(a) for a in args), timeout=timeout)


def smi_csv(node: str | None, *args: str) -> list[list[str]]:
    """nvidia-smi's csv rows (header first) on a node: over its SSH, or on this machine's shell (pve1) for None."""
    cmd = ["nvidia-smi", *args]
    r = ssh(node, *cmd) if node else t.run(cmd)
    assert r.returncode == 0, (node, r.stdout, r.stderr)
    return [[c.strip() for c in line.split(",")] for line in r.stdout.splitlines() if line.strip()]


def used(node: str | None, gpu: int) -> int:
    return int(smi_csv(node, "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", str(gpu))[0][0])


def apps(node: str | None) -> list[list[str]]:
    return smi_csv(node, "--query-compute-apps=pid,process_name,used_memory,gpu_bus_id", "--format=csv,noheader,nounits")


def test_each_node_shows_its_own_gpus(lab):
    rows = smi_csv(NODE2, "--query-gpu=index,pci.bus_id,memory.used", "--format=csv")
    assert rows[0] == ["index", "pci.bus_id", "memory.used [MiB]"]
    assert [r[0] for r in rows[1:]] == [str(i) for i in range(PVE2_GPUS)]  # numbered from 0, as on any node
    for ssh_node in ("pve1", None):
        rows1 = smi_csv(ssh_node, "--query-gpu=index,pci.bus_id,memory.used", "--format=csv")
        assert [r[0] for r in rows1[1:]] == [str(i) for i in range(PVE1_GPUS)]
    uuids2 = {r[0] for r in smi_csv(NODE2, "--query-gpu=uuid", "--format=csv,noheader")}
    uuids1 = {r[0] for r in smi_csv(None, "--query-gpu=uuid", "--format=csv,noheader")}
    assert len(uuids2) == PVE2_GPUS and not uuids1 & uuids2  # other boards
    # pve2's /dev has its own GPU nodes only, with NVIDIA's numbers (195:N)
    r = node_ssh(NODE2, "stat -c '%n %t:%T' /dev/nvidia*")
    assert r.returncode == 0, r.stderr
    nodes = dict(line.split() for line in r.stdout.splitlines())
    assert {n: v for n, v in nodes.items() if n[11:].isdigit()} == {f"/dev/nvidia{i}": f"c3:{i:x}" for i in range(PVE2_GPUS)}
    assert {"/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"} <= set(nodes)


@pytest.fixture(scope="module")
def ct2(lab):
    destroy(VMID)
    r = ssh(NODE2, "pct", "create", str(VMID), TEMPLATE, "--hostname", "gpu-pve2", "--memory", "512",
            "--swap", "0", "--unprivileged", "1", "--dev0", "/dev/nvidia0", "--dev1", "/dev/nvidiactl",
            "--dev2", "/dev/nvidia-uvm", timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert os.path.exists(f"/etc/pve/nodes/pve2/lxc/{VMID}.conf")
    r = ssh(NODE2, "pct", "start", str(VMID))
    assert r.returncode == 0, r.stdout + r.stderr
    assert t.wait_for(lambda: ssh(NODE2, "pct", "exec", str(VMID), "--", "true").returncode == 0, 30)
    yield VMID
    labctl("fault", "clear", "--vmid", str(VMID), check=False)
    destroy(VMID)


def test_pve2_refuses_pve1_only_gpu(ct2):
    r = ssh(NODE2, "pct", "set", str(ct2), "--dev3", f"/dev/nvidia{PVE2_GPUS}")
    assert r.returncode != 0 and f"Device /dev/nvidia{PVE2_GPUS} does not exist" in r.stderr, r.stderr


def test_pve2_container_holds_pve2_gpu0(ct2):
    pve1_apps = apps(None)
    r = ssh(NODE2, "pct", "exec", str(ct2), "--", "python3", "/run/nvidia-lab/lab-worker.py", "--daemonize",
            "--gpus", "0", "--mib", str(MIB), "--name", "pve2-worker")
    assert r.returncode == 0, r.stdout + r.stderr
    ct_pid = json.loads(r.stdout.strip().splitlines()[-1])["pid"]
    try:
        assert t.wait_for(lambda: used(NODE2, 0) == MIB), smi_csv(NODE2, "--query-gpu=index,memory.used", "--format=csv")
        mine = [a for a in apps(NODE2) if a[1] == "pve2-worker"]
        assert len(mine) == 1 and mine[0][2] == str(MIB) and mine[0][3] == "00000000:18:00.0", apps(NODE2)
        host_pid = int(mine[0][0])
        assert host_pid in t.host_pids_in_ct(ct2)
        # pve1 sees none of it: not the process, not its memory on its own GPU 0
        assert all(a[1] != "pve2-worker" and int(a[0]) != host_pid for a in apps(None))
        assert all(a[1] != "pve2-worker" for a in apps("pve1"))
        assert [a for a in apps(None) if a[3] == "00000000:18:00.0"] == [a for a in pve1_apps if a[3] == "00000000:18:00.0"]
        # the CT's own view: one GPU, index 0, the memory (no processes: the driver has no PID namespaces)
        q = ssh(NODE2, "pct", "exec", str(ct2), "--", "python3", "-c",
                "import socket; s = socket.socket(socket.AF_UNIX); s.connect('/run/nvidia-lab/driver.sock'); "
                "s.sendall(b'{\"op\": \"query\"}\\n'); print(s.makefile().readline())")
        assert q.returncode == 0, q.stderr
        gpus = json.loads(q.stdout)["gpus"]
        assert len(gpus) == PVE2_GPUS and gpus[0]["memory_used_mib"] == MIB and gpus[0]["processes"] == []
        # a reset over pve2 is refused while the CT's process holds the GPU
        r = ssh(NODE2, "nvidia-smi", "-r", "-i", "0")
        assert r.returncode == 255 and "GPU 00000000:18:00.0: In use by another client" in r.stdout, r.stdout
    finally:
        ssh(NODE2, "pct", "exec", str(ct2), "--", "kill", "-9", str(ct_pid))
    assert t.wait_for(lambda: used(NODE2, 0) == 0), "pve2's GPU 0 was not freed when its process died"
    assert not [a for a in apps(NODE2) if a[1] == "pve2-worker"]


def test_fault_targets_pve2_gpu(ct2):
    r = t.run([LABCTL, "fault", "inject", "recovery-action", "--vmid", str(ct2)])
    assert r.returncode == 0, r.stdout + r.stderr
    try:
        assert smi_csv(NODE2, "--query-gpu=gpu_recovery_action", "--format=csv,noheader", "-i", "0") == [["Reset"]]
        assert smi_csv(None, "--query-gpu=gpu_recovery_action", "--format=csv,noheader", "-i", "0") == [["None"]]
    finally:
        r = t.run([LABCTL, "fault", "clear", "--vmid", str(ct2)])
        assert r.returncode == 0, r.stdout + r.stderr
    assert smi_csv(NODE2, "--query-gpu=gpu_recovery_action", "--format=csv,noheader", "-i", "0") == [["None"]]


def test_pve2_reset_is_pve2s_only(lab):
    """pve2's GPU 3 resets once pve2's nvidia-persistenced is stopped and its persistence mode off, while pve1's
    GPU 3 (the same device numbers, 195:3) stays held by pve1's nvidia-persistenced and is not reset."""
    gpu = PVE2_GPUS - 1
    # pve2 runs without nvidia-persistenced unless asked (labgpu, LABGPU_PVE2_PERSISTENCED): start it for this test.
    assert t.run(t.LABGPU + ["up"], env=dict(os.environ, LABGPU_PVE2_PERSISTENCED="1")).returncode == 0
    assert t.wait_for(lambda: os.path.exists(PERSISTENCED_PVE2))
    with open(PERSISTENCED_PVE2) as f:
        pid = int(f.read())
    os.kill(pid, signal.SIGTERM)
    assert t.wait_for(lambda: not os.path.exists(f"/proc/{pid}"))
    try:
        r = ssh(NODE2, "nvidia-smi", "-r", "-i", str(gpu))  # persistence mode still Enabled
        assert r.returncode == 255 and "In use by another client" in r.stdout, r.stdout
        assert ssh(NODE2, "nvidia-smi", "-pm", "0", "-i", str(gpu)).returncode == 0
        assert t.persistenced_pid() is not None  # pve1's holds pve1's /dev/nvidia3
        r = ssh(NODE2, "nvidia-smi", "-r", "-i", str(gpu))
        assert r.returncode == 0 and r.stdout == "GPU 00000000:5D:00.0 was successfully reset.\nAll done.\n", r.stdout
        assert smi_csv(None, "--query-gpu=persistence_mode", "--format=csv,noheader", "-i", str(gpu)) == [["Enabled"]]
        r = t.smi("-r", "-i", str(gpu))  # pve1's: refused (its persistence mode, its persistenced)
        assert r.returncode == 255, r.stdout
    finally:
        ssh(NODE2, "nvidia-smi", "-pm", "1", "-i", str(gpu))
        assert t.run(t.LABGPU + ["up"]).returncode == 0  # the lab's default again: pve2 without nvidia-persistenced
    try:
        with open(PERSISTENCED_PVE2) as f:
            left = int(f.read())
    except (OSError, ValueError):
        left = None
    assert left is None or not os.path.exists(f"/proc/{left}")
