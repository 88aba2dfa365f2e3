# -*- coding: utf-8 -*-
"""The node is planned as a whole (issue 21), checked against the lab's world after converge: CT 129 and CT 132 deployed by
deploy.yml, the bystander (CT 130, not managed) holding GPU 4 as dev0.

Each case runs deploy.yml in check mode with one more declared container or one more guest on the node, and reads
the world before and after (pct list, every CT's config, the server's main PID): the run must fail before any
change and name what it refuses, and nothing may change on the node.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile

import yaml

ROOT = os.environ.get("MOLECULE_PROJECT_DIRECTORY", os.getcwd())
sys.path.insert(0, os.path.join(ROOT, "tests", "corpus"))
import labstate  # noqa: E402  (reads the world: CT configs, CT list, the server's PIDs and files)

PLAYBOOK = os.path.join(ROOT, "playbooks", "deploy.yml")
TEMPLATE = "local:vztmpl/debian-13-standard_13.1-1_amd64.tar.zst"  # tests/lab/labctl TEMPLATE_VOLID


def sh(*cmd: str, check: bool = True) -> str:
    return subprocess.run(list(cmd), check=check, capture_output=True, text=True, timeout=600).stdout


def world() -> dict:
    """What a change would show: labstate's CT list, configs, server PIDs and files, and every CT's pct config."""
    state = labstate.state()
    vmids = [line.split()[0] for line in sh("/usr/sbin/pct", "list").splitlines()[1:] if line.strip()]
    state["vmids"] = vmids
    state["configs"] = {v: sh("/usr/sbin/pct", "config", v) for v in vmids}
    return state


def deploy_check(extra_hosts: dict | None = None, *args: str) -> subprocess.CompletedProcess:
    cmd = [labstate.ansible_playbook(), "--check", "-i", labstate.INVENTORY]
    with tempfile.TemporaryDirectory() as tmp:
        if extra_hosts:
            path = os.path.join(tmp, "extra.yml")
            with open(path, "w") as f:
                yaml.safe_dump({"all": {"children": {"sglang_containers": {"hosts": extra_hosts}}}}, f)
            cmd += ["-i", path]
        return subprocess.run(cmd + [PLAYBOOK, *args], capture_output=True, text=True, timeout=900, cwd=ROOT,
                              env=labstate.playbook_env())


def declared(vmid: int, gpus: list, memory_mib: int = 14336, **settings) -> dict:
    """A container declared like CT 129 (its host_vars), with its own VMID, GPUs and address (and ``settings``)."""
    with open(os.path.join(ROOT, "inventories", "lab", "host_vars", "ct129.yml")) as f:
        host = yaml.safe_load(f)
    host.update({
        "ansible_connection": "inferops.gpu_inference.pct_remote", "ansible_host": "127.0.0.1", "ansible_port": 2222,
        "ansible_user": "root", "ansible_private_key_file": "/var/lib/inferops-lab/ssh/id_ed25519",
        "proxmox_vmid": vmid, "pve_gpu_container_gpus": gpus, "pve_gpu_container_memory_mib": memory_mib,
        "pve_gpu_container_net": {"net0": "name=eth0,bridge={{ proxmox_bridge }},ip=10.77.0.%d/24,gw={{ proxmox_bridge_gateway }}" % vmid},
    }, **settings)
    return {"ct%d" % vmid: host}


def refused(result: subprocess.CompletedProcess, *words: str) -> str:
    out = " ".join((result.stdout + result.stderr).replace("\\n", " ").split())
    assert result.returncode != 0, out[-3000:]
    assert "Traceback" not in out, out[-3000:]
    for word in words:
        assert word in out, "%r not in: %s" % (word, out[-3000:])
    return out


def gpu_apps() -> dict:
    """GPU index -> the VMIDs whose processes hold memory on it, from the node's nvidia-smi and each PID's cgroup."""
    index = dict(line.split(", ") for line in sh("nvidia-smi", "--query-gpu=uuid,index", "--format=csv,noheader").splitlines())
    held: dict = {}
    for line in sh("nvidia-smi", "--query-compute-apps=pid,gpu_uuid,used_memory", "--format=csv,noheader,nounits").splitlines():
        pid, uuid, _mib = [f.strip() for f in line.split(",")]
        try:
            with open("/proc/%s/cgroup" % pid) as f:
                cgroup = f.read()
        except OSError:
            continue
        vmid = next((part.split("/")[0] for part in cgroup.split("/lxc/")[1:]), "host")
        held.setdefault(int(index[uuid]), set()).add(vmid)
    return held


def test_both_tenants_run_their_own_server_on_their_own_gpus():
    # One deploy.yml run placed CT 129 (GPUs 0-1) and CT 132 (GPUs 2-3) on the node, each with its own server.
    apps = gpu_apps()
    for vmid, gpus in (("129", [0, 1]), ("132", [2, 3])):
        config = sh("/usr/sbin/pct", "config", vmid)
        passed = sorted(int(m) for m in re.findall(r"^dev\d+: /dev/nvidia(\d+)\b", config, re.M))
        assert passed == gpus, config
        assert sh("/usr/sbin/pct", "exec", vmid, "--", "systemctl", "is-active", "sglang.service").strip() == "active"
        argv = sh("/usr/sbin/pct", "exec", vmid, "--", "sh", "-c", "cat /proc/$(systemctl show -p MainPID --value sglang.service)/cmdline")
        assert "--hicache-size\x001\x00" in argv and "--tp-size\x002\x00" in argv, argv
        for gpu in gpus:
            assert apps.get(gpu) == {vmid}, apps


def test_a_gpu_another_inventory_container_asks_for_is_refused_naming_ct_129():
    before = world()
    out = refused(deploy_check(declared(133, [0, 5])), "CT 129 (ct129) and CT 133 (ct133) both ask for GPU 0")
    assert "refused before any change" in out
    assert world() == before


def test_a_gpu_the_unmanaged_bystander_holds_is_refused_naming_it():
    before = world()
    refused(deploy_check(declared(133, [4, 5])), "CT 133 (ct133) asks for GPU 4, which CT 130 bystander",
            "already has as a devN passthrough")
    assert world() == before
    assert "133" not in before["vmids"]


def test_an_unmanaged_guest_counted_by_its_limit_overflows_the_node_and_is_refused_with_its_figures():
    # A stopped container the collection does not manage, whose memory limit leaves the node less than CT 129's plan,
    # the bystander and the node's 4 GiB reserve need: refused with the table; counted by its use (stopped: 0) it fits.
    mem_total_mib = int(sh("awk", "/^MemTotal:/ {print int($2/1024)}", "/proc/meminfo").strip())
    limit_mib = mem_total_mib - 6 * 1024
    sh("/usr/sbin/pct", "destroy", "140", check=False)  # a leftover of an interrupted run
    sh("/usr/sbin/pct", "create", "140", TEMPLATE, "--hostname", "other", "--memory", str(limit_mib), "--swap", "0",
       "--unprivileged", "1")
    try:
        before = world()
        out = refused(deploy_check(), "overflow node pve1", "CT 140 other (stopped)", "not managed, its limit", "OVER by")
        assert "CT 129 ct129" in out
        assert world() == before
        measured = deploy_check(None, "-e", "pve_gpu_container_node_others_count=measured")
        assert measured.returncode == 0, (measured.stdout + measured.stderr)[-3000:]
        assert world() == before
    finally:
        sh("/usr/sbin/pct", "destroy", "140", check=False)


def meminfo_bytes(key: str) -> int:
    with open("/proc/meminfo") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(key + ":"))


def test_two_more_containers_each_fitting_alone_are_refused_together_naming_the_nodes_figures():
    # The case on this node: beside CT 129 and CT 132 (running), two more containers (CT 133, CT 134, one GPU
    # each of the free 5-7) whose pools each fit what the node has available (MemAvailable less SGLang's 10 GiB
    # reserve), but not both. Sized from the world now, so the case holds on any lab machine: each pins about 0.65 of
    # that room with its rank (256 MiB) and front end (512 MiB, the lab's policy). Each alone: check mode passes.
    gib = 1 << 30
    room = meminfo_bytes("MemAvailable") - 10 * gib
    gb = int((0.65 * room - 768 * 2 ** 20) // 10 ** 9)
    assert gb >= 1, "the lab node has %d bytes of MemAvailable beyond SGLang's 10 GiB reserve: too little for this case" % room
    limit_mib = (meminfo_bytes("MemTotal") - 5 * gib) // 2 ** 20
    hosts = {**declared(133, [5], limit_mib, sglang_server_tp_size=1, sglang_server_hicache_requested_gb=gb),
             **declared(134, [6], limit_mib, sglang_server_tp_size=1, sglang_server_hicache_requested_gb=gb)}
    before = world()
    for alone in ("ct133", "ct134"):
        ok = deploy_check(hosts, "-e", "deploy_containers=%s" % alone)
        assert ok.returncode == 0, (ok.stdout + ok.stderr)[-3000:]
        assert world() == before
    out = refused(deploy_check(hosts), "CT 134: refused before any change, the HiCache plan does not fit",
                  "It is planned against the node's MemAvailable", "that the containers planned before it on this node "
                  "will still pin and hold")
    assert "CT 133: refused" not in out
    assert world() == before
    assert "133" not in before["vmids"] and "134" not in before["vmids"]


def test_a_refusal_on_one_node_changes_nothing_on_another_node_of_the_run():
    # A run over two nodes (a server spread over both): pve1 would create CT 133 (it fits), while the other node's
    # container asks for a GPU that node lacks. The gate is all or nothing: no node changes. Not check mode, so a
    # gate that let pve1 go on would really create CT 133. The second node is pve1 again under another inventory
    # name (the roles only see an inventory host, its API and its SSH endpoint).
    with open(os.path.join(ROOT, "inventories", "lab", "hosts.yml")) as f:
        node = dict(yaml.safe_load(f)["all"]["children"]["proxmox_nodes"]["hosts"]["pve1"])
    hosts = {**declared(133, [5], sglang_server_tp_size=1),
             **declared(134, [9], sglang_server_tp_size=1, pve_gpu_container_node_host="pve1b")}
    before = world()
    assert "133" not in before["vmids"]
    cmd = [labstate.ansible_playbook(), "-i", labstate.INVENTORY]
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "nodes.yml")
        with open(path, "w") as f:
            yaml.safe_dump({"all": {"children": {"proxmox_nodes": {"hosts": {"pve1b": node}},
                                                 "sglang_containers": {"hosts": hosts}}}}, f)
        try:
            result = subprocess.run(cmd + ["-i", path, PLAYBOOK, "-e", "deploy_containers=ct133,ct134"], capture_output=True,
                                    text=True, timeout=900, cwd=ROOT, env=labstate.playbook_env())
            out = refused(result, "CT 134 asks for GPUs 9 but the node has 8 GPU",
                          "refused before any change on any node: node(s) pve1b failed the checks above")
            assert "node(s) pve1 " not in out and "node(s) pve1," not in out
            assert world() == before
        finally:
            if "133" in sh("/usr/sbin/pct", "list"):
                sh("/usr/sbin/pct", "stop", "133", check=False)
                sh("/usr/sbin/pct", "destroy", "133", check=False)


def cgroup_memory(vmid: str) -> dict:
    """The container's memory cgroup counters on the node (v2 /sys/fs/cgroup/lxc/<vmid>, else v1's memory hierarchy)."""
    for base, usage in (("/sys/fs/cgroup/lxc/%s", "memory.current"), ("/sys/fs/cgroup/memory/lxc/%s", "memory.usage_in_bytes")):
        path = base % vmid
        if os.path.exists(os.path.join(path, usage)):
            with open(os.path.join(path, usage)) as f:
                got = {"usage": int(f.read())}
            with open(os.path.join(path, "memory.stat")) as f:
                got.update({k: int(v) for k, v in (line.split() for line in f)})
            return got
    raise AssertionError("no memory cgroup for CT %s" % vmid)


def test_the_node_read_live_counts_what_each_running_tenant_holds_pools_included():
    # The node's plan read from the live node without changing anything (docs/deploy.md: deploy.yml with the node
    # role's preflight tag only, not in check mode). Both tenants run: the table counts what each holds now. Read
    # from the world: the container's cgroup holds its two 1 GB pools as shared memory, and the figure the plan counts
    # is at least that (the PVE API's mem, usage less page cache, would leave the pools out).
    before = world()
    result = subprocess.run([labstate.ansible_playbook(), "-i", labstate.INVENTORY, PLAYBOOK, "--tags", "pve_gpu_container_preflight"],
                            capture_output=True, text=True, timeout=900, cwd=ROOT, env=labstate.playbook_env())
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    assert world() == before
    out = " ".join(result.stdout.split())
    assert re.findall(r"changed=(\d+)", out) and set(re.findall(r"changed=(\d+)", out)) == {"0"}, out[-3000:]
    rows = dict(re.findall(r"CT (\d+) ct\d+ +[\d.]+ GiB +\d+ ranks x \d+ GB -> [\d.]+ GB = [\d.]+ GiB +[\d.]+ GiB +([\d.]+) GiB "
                           r"running: what it holds now", out))
    assert set(rows) == {"129", "132"}, out[-3000:]
    for vmid, commits_gib in rows.items():
        cg = cgroup_memory(vmid)
        shmem = cg.get("total_shmem", cg.get("shmem", 0))
        assert shmem >= 2 * 10 ** 9, (vmid, cg)
        counted = float(commits_gib) * 2 ** 30
        assert counted >= shmem - 0.01 * 2 ** 30, (vmid, commits_gib, shmem)
        held = cg["usage"] - cg.get("total_active_file", cg.get("active_file", 0)) - cg.get("total_inactive_file", cg.get("inactive_file", 0))
        assert abs(counted - held) <= 0.1 * 2 ** 30, (vmid, commits_gib, held)
