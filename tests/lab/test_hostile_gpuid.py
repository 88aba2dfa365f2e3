"""Hostile neighbours: a node whose GPU device minors are not the nvidia-smi indexes, and a declared VMID that
another tenant made again without the collection's tag.

Two throwaway CTs of the lab's own pct (VMIDs 189 and 190, override with LABGPU_GPUID_VMIDS=a,b): CT 189 is ours
(tag inferops-gpu) and passes /dev/nvidia5; CT 190 is another tenant's (no tag) and passes /dev/nvidia6 with a live
GPU worker on it. The lab's driver is told (fault.py minor-map 5=6,6=5) that GPU index 5 has minor 6 and index 6
minor 5, as nvidia-smi -q's "Minor Number" shows on some servers: CT 189's GPU is index 6, CT 190's index 5.

Everything is checked from the world: the driver's reset count and memory of each GPU, the tenant's processes
(host PIDs and start times), its container's status and config file.
"""
import hashlib
import json
import os
import re
import subprocess
import tempfile

import pytest

from gpu import testlib as t

pytestmark = [t.needs_root, pytest.mark.skipif(not t.container_available(),
                                               reason="the lab's pct and container template are not installed")]

REPO = os.path.realpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
OURS, THEIRS = os.environ.get("LABGPU_GPUID_VMIDS", "189,190").split(",")
# GPU index 5 has device minor 6 and index 6 minor 5 (fault.py minor-map).
OUR_MINOR, THEIR_MINOR = 5, 6
OUR_INDEX, THEIR_INDEX = 6, 5
LEAK_MIB, THEIR_MIB = 1200, 700
CONTROL = ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]


def env():
    e = dict(os.environ, ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg"),
             ANSIBLE_VAULT_PASSWORD_FILE="/var/lib/inferops-lab/vault-pass",
             INFEROPS_REPORT_DIR=tempfile.gettempdir() + "/inferops-gpuid-reports",
             PATH=os.path.join(REPO, ".venv", "bin") + ":" + os.environ.get("PATH", ""))
    return e


def make_ct(vmid, minor, *opts):
    t.ct_destroy(vmid)
    devs = []
    for i, path in enumerate(["/dev/nvidia%d" % minor] + CONTROL):
        devs += ["--dev%d" % i, path]
    r = t.run(["pct", "create", str(vmid), t.TEMPLATE, "--hostname", "gpuid%s" % vmid, "--memory", "512", "--swap",
               "0", "--unprivileged", "1"] + devs + list(opts), timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    t.ct_start(vmid)


def gpu(index):
    """What the driver says of GPU ``index``: minor, memory used, reset count."""
    return next(g for g in t.driver({"op": "query"})["gpus"] if g["index"] == index)


def processes(vmid):
    """The CT's processes as the host sees them: {host PID: start time}."""
    out = {}
    for pid in t.host_pids_in_ct(vmid):
        try:
            with open("/proc/%d/stat" % pid) as f:
                out[pid] = int(f.read().rsplit(")", 1)[1].split()[19])
        except OSError:
            pass
    return out


def tenant_world():
    with open("/etc/pve/lxc/%s.conf" % THEIRS, "rb") as f:
        conf = hashlib.sha256(f.read()).hexdigest()
    g = gpu(THEIR_INDEX)
    return {"status": t.run(["pct", "status", THEIRS]).stdout.strip(), "processes": processes(THEIRS),
            "memory_used_mib": g["memory_used_mib"], "resets": g["resets"], "conf_sha256": conf,
            "apps": sorted((a[0], a[2]) for a in t.compute_apps() if int(a[0]) in t.host_pids_in_ct(THEIRS))}


def module(name, args):
    """One module of the collection run on the lab's node (ansible ad hoc, the lab inventory, as recover.yml's
    tasks run it); returns (rc, result)."""
    e = dict(env(), ANSIBLE_LOAD_CALLBACK_PLUGINS="1", ANSIBLE_STDOUT_CALLBACK="json")
    r = subprocess.run([os.path.join(REPO, ".venv", "bin", "ansible"), "-i", "inventories/lab/hosts.yml", "pve1",
                        "-m", "inferops.gpu_inference." + name, "-a", json.dumps(args)],
                       cwd=REPO, env=e, capture_output=True, text=True, timeout=300)
    out = json.loads(r.stdout[r.stdout.index("{"):])
    return r.returncode, out["plays"][0]["tasks"][0]["hosts"]["pve1"]


@pytest.fixture(scope="module")
def node():
    t.lab_up()
    assert t.fault("minor-map", "%d=%d,%d=%d" % (THEIR_INDEX, THEIR_MINOR, OUR_INDEX, OUR_MINOR)).returncode == 0
    try:
        # The other tenant: no tag, GPU minor 6 (index 5), a worker with memory on it.
        make_ct(THEIRS, THEIR_MINOR)
        t.ct_worker(THEIRS, THEIR_MINOR, THEIR_MIB)
        # Ours: tagged, GPU minor 5 (index 6); its worker dies under driver-leak, its memory stays, CT stopped.
        make_ct(OURS, OUR_MINOR, "--tags", "inferops-gpu")
        before = gpu(OUR_INDEX)["memory_used_mib"]
        t.ct_worker(OURS, OUR_MINOR, LEAK_MIB)
        assert t.fault("inject", "driver-leak", "--vmid", OURS).returncode == 0
        t.attach(OURS, ["pkill", "-9", "-f", "lab-worker"])
        assert t.wait_for(lambda: not [a for a in t.compute_apps() if int(a[0]) in t.host_pids_in_ct(OURS)])
        assert t.run(["pct", "stop", OURS]).returncode == 0
        assert gpu(OUR_INDEX)["memory_used_mib"] == before + LEAK_MIB  # the wedged GPU: memory, no process
        yield
    finally:
        t.fault("minor-map", "none")
        for vmid in (OURS, THEIRS):
            t.fault("clear", "--vmid", vmid)
            t.ct_destroy(vmid)


def test_the_driver_reports_minor_and_index_apart(node):
    r = t.smi("-q")
    assert r.returncode == 0
    assert "GPU %s\n" % gpu(OUR_INDEX)["pci_bus_id"] in r.stdout
    sections = {s.split("\n", 1)[0]: s for s in r.stdout.split("\nGPU ")[1:]}
    assert "Minor Number                          : %d" % OUR_MINOR in sections[gpu(OUR_INDEX)["pci_bus_id"]]
    r = t.smi("--query-gpu=index,minor_number,pci.bus_id", "--format=csv,noheader", "-i", "%d,%d" % (THEIR_INDEX, OUR_INDEX))
    assert [ln.split(", ")[:2] for ln in r.stdout.splitlines()] == [[str(THEIR_INDEX), str(THEIR_MINOR)],
                                                                    [str(OUR_INDEX), str(OUR_MINOR)]]


def test_deploy_reads_which_gpu_each_device_node_is(node):
    # deploy.yml's node preflight (gpu_host_facts on the node) and its gate (sglang_deploy.check_gpus_exist): the
    # GPU a container asks for as /dev/nvidia5 is planned with GPU index 6's row, the one devN will pass.
    rc, facts = module("gpu_host_facts", {"gather_compute_apps": False})
    assert rc == 0 and facts["gpu_numbering_problems"] == [], facts
    minors = {g["index"]: g["minor_number"] for g in facts["gpus"]}
    assert (minors[OUR_INDEX], minors[THEIR_INDEX]) == (OUR_MINOR, THEIR_MINOR)
    from ansible_collections.inferops.gpu_inference.plugins.module_utils.deploy import sglang_deploy
    rows = sglang_deploy.check_gpus_exist(int(OURS), [OUR_MINOR], {
        "gpus": facts["gpus"], "device_paths": [d["path"] for d in facts["device_nodes"]]})
    assert rows[OUR_MINOR]["index"] == OUR_INDEX and rows[OUR_MINOR]["pci_bus_id"] == gpu(OUR_INDEX)["pci_bus_id"]


def test_the_reset_hits_the_wedged_gpu_not_the_tenant_whose_minor_is_its_index(node):
    tenant = tenant_world()
    assert tenant["memory_used_mib"] >= THEIR_MIB and tenant["apps"], tenant
    ours_before = gpu(OUR_INDEX)
    rc, diag = module("gpu_diagnose", {"vmid": int(OURS), "node": "pve1", "allow_undeclared": True, "samples": 1,
                                       "sample_interval": 0, "kernel_log": False,
                                       "baseline_dir": tempfile.mkdtemp(prefix="gpuid-baseline-")})
    assert rc == 0, diag
    c = diag["evidence"]["container"]
    assert (c["gpu_minors"], c["gpus"]) == ([OUR_MINOR], [OUR_INDEX]), c
    assert diag["verdict"] == "Not clean"
    with t.persistenced_stopped():
        rc, res = module("gpu_recover_action", {"vmid": int(OURS), "action": "reset_gpus", "gpus": c["gpus"]})
    assert rc == 0, res
    # The world: the wedged GPU (index 6, minor 5) was reset and its leaked memory is gone; the tenant's GPU
    # (index 5, the one /dev/nvidia5 would be if minors were indexes) was not reset, its memory and processes stay.
    assert gpu(OUR_INDEX)["resets"] == ours_before["resets"] + 1
    assert gpu(OUR_INDEX)["memory_used_mib"] == ours_before["memory_used_mib"] - LEAK_MIB
    assert tenant_world() == tenant


def test_a_declared_vmid_made_again_without_the_tag_is_refused_before_any_rung(node):
    tenant = tenant_world()
    assert tenant["status"] == "status: running" and tenant["processes"]
    with tempfile.NamedTemporaryFile("w", suffix=".yml", delete=False) as f:
        # The inventory declares CT 190 as one of its GPU containers (deploy.yml made it once); someone else has
        # destroyed it and made a container of their own under the same VMID, with the same GPU.
        f.write("all:\n  children:\n    sglang_containers:\n      hosts:\n        ct%s:\n          proxmox_vmid: %s\n"
                % (THEIRS, THEIRS))
    try:
        r = subprocess.run([os.path.join(REPO, ".venv", "bin", "ansible-playbook"), "-i", "inventories/lab/hosts.yml",
                            "-i", f.name, "playbooks/recover.yml", "-e", "recover_vmid=%s" % THEIRS],
                           cwd=REPO, env=env(), capture_output=True, text=True, timeout=600)
    finally:
        os.unlink(f.name)
    out = r.stdout + r.stderr
    assert r.returncode != 0, out
    assert "does not carry the PVE tag 'inferops-gpu'" in out and "Nothing has been changed" in out, out
    # Refused by the ladder's diagnosis, before any rung acted: the node's play changed nothing.
    assert "The ladder of CT %s" % THEIRS in out and re.search(r"pve1\s+: ok=\d+\s+changed=0\s", out), out
    assert tenant_world() == tenant
