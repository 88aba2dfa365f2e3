"""Hostile neighbours against unattended recovery's readings, on the lab with real containers and the real kernel.

1. A tenant (CT 188) names a process after another container's cgroup (``lxc.payload.187``, the name LXC gives a
   container's cgroup) and has the kernel OOM-kill it in a memory cgroup of its own. The kill is real (the kernel's
   own record, read here from dmesg with a regex of the test's, shows ``task=lxc.payload.187`` and the tenant's
   task_memcg); the real gpu_diagnose (ad-hoc ansible on the lab node, as the event source runs it) then counts no
   new OOM kill for CT 187, and eda_watch's policy makes no event for it, while the kill IS the tenant's: CT 188's
   own reading has a newer kill record and its policy a cgroup OOM kill fault.
2. The real event source gpu_watch runs a few polls over an inventory with one node that accepts TCP and never says
   a word (an sshd that hangs: a wedged node looks the same from here) beside the real lab node: each read of the
   silent node is killed at the source's bound with the processes it started (ssh's own timeout is set far above
   it), the lab node is read meanwhile, the silent node is one node_unreachable event, the metrics file says so,
   and the source ends its polls.

CT 187 (the victim, created, never started) and CT 188 (the tenant, running, no GPU) are made here from the lab's
template and destroyed at the end; no GPU is used.
"""
from __future__ import annotations

import asyncio
import json
import os
import re
import runpy
import socket
import subprocess
import threading
import time

import pytest

from conftest import REPO, pct

VICTIM, TENANT = 187, 188
TEMPLATE = "local:vztmpl/debian-13-standard_13.1-1_amd64.tar.zst"
SOURCE = os.path.join(REPO, "extensions", "eda", "plugins", "event_source", "gpu_watch.py")
BIN = os.path.join(REPO, ".venv", "bin")
LAB = "/var/lib/inferops-lab"

from ansible_collections.inferops.gpu_inference.plugins.module_utils.recover import eda_watch  # noqa: E402

# The lab node as inventories/lab/hosts.yml reaches it (root over SSH, the host key checked).
PVE1 = {"ansible_connection": "ssh", "ansible_host": "127.0.0.1", "ansible_port": 2222, "ansible_user": "root",
        "ansible_ssh_private_key_file": f"{LAB}/ssh/id_ed25519",
        "ansible_ssh_common_args": f"-o UserKnownHostsFile={LAB}/ssh/known_hosts -o StrictHostKeyChecking=yes "
                                   "-o IdentitiesOnly=yes",
        "ansible_python_interpreter": "/usr/bin/python3"}

# In the tenant: a memory cgroup of its own below the container's (delegated to it), 64 MiB, and in it a copy of tail
# named lxc.payload.187 (the comm is the executable's name: 15 characters, all of it kept) reading 512 MiB with no
# newline, which it must hold whole: the kernel OOM-kills it.
ATTACK = """\
if [ -d /sys/fs/cgroup/memory ]; then d=/sys/fs/cgroup/memory/hostile-oom; f=memory.limit_in_bytes
else d=/sys/fs/cgroup/hostile-oom; f=memory.max; fi
mkdir -p "$d" && echo 67108864 > "$d/$f" || exit 3
cp /usr/bin/tail /tmp/lxc.payload.%d
sh -c 'echo $$ > "$1/cgroup.procs" && head -c 536870912 /dev/zero | /tmp/lxc.payload.%d' attack "$d"
echo "rc=$?"
rmdir "$d"
""" % (VICTIM, VICTIM)


def env():
    return dict(os.environ, ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg"), PATH=BIN + ":" + os.environ["PATH"])


def write_inventory(path, nodes, containers):
    doc = {"all": {"children": {
        "proxmox_nodes": {"hosts": nodes},
        "sglang_containers": {"hosts": containers}}}}
    with open(path, "w") as f:
        json.dump(doc, f)       # JSON is YAML
    return str(path)


def destroy(vmid):
    if os.path.exists("/etc/pve/lxc/%d.conf" % vmid):
        pct("stop", str(vmid))
        r = pct("destroy", str(vmid))
        assert r.returncode == 0, r.stdout + r.stderr


@pytest.fixture(scope="module")
def cts(lab):
    for vmid, name in ((VICTIM, "hostile-victim"), (TENANT, "hostile-tenant")):
        destroy(vmid)
        r = pct("create", str(vmid), TEMPLATE, "--hostname", name, "--memory", "512", "--swap", "0",
                "--unprivileged", "1", "--tags", "inferops-gpu", timeout=600)
        assert r.returncode == 0, r.stdout + r.stderr
    r = pct("start", str(TENANT))
    assert r.returncode == 0, r.stdout + r.stderr
    for _ in range(100):
        if pct("exec", str(TENANT), "--", "true").returncode == 0:
            break
        time.sleep(0.3)
    yield
    destroy(TENANT)
    destroy(VICTIM)


def diagnose(inventory, vmid, since=None):
    """The real gpu_diagnose on the lab node, run as the event source runs it (ad-hoc ansible, json callback)."""
    options = {"vmid": vmid, "node": "pve1", "samples": 1, "sample_interval": 0,
               "declared": [{"host": "ct%d" % v, "vmid": v, "node_host": "pve1"} for v in (VICTIM, TENANT)]}
    if since is not None:
        options["kernel_since_seq"] = since
    r = subprocess.run([os.path.join(BIN, "ansible"), "pve1", "-i", inventory, "-m", "inferops.gpu_inference.gpu_diagnose",
                        "-a", json.dumps(options)], capture_output=True, text=True, timeout=300,
                       env=dict(env(), ANSIBLE_LOAD_CALLBACK_PLUGINS="1", ANSIBLE_STDOUT_CALLBACK="ansible.posix.json"))
    result = json.loads(r.stdout)["plays"][0]["tasks"][0]["hosts"]["pve1"]
    assert not result.get("failed") and not result.get("unreachable"), result.get("msg")
    assert result["evidence"]["kernel_log"]["source"] == "/dev/kmsg", result["evidence"]["kernel_log"]
    return result


def kernel_records_after(mark):
    """The kernel's oom-kill records after the test's mark, from dmesg, with the test's own reading of the fields."""
    log = subprocess.run(["dmesg"], capture_output=True, text=True, check=True).stdout
    assert mark in log, "the test's mark is not in the kernel log"
    return re.findall(r"oom-kill:constraint=\w+,.*?,task_memcg=(\S+?),task=(.+?),pid=(\d+),uid=\d+$",
                      log.rsplit(mark, 1)[1], re.M)


def test_a_tenants_oom_kill_named_after_another_container_is_not_that_containers(cts, tmp_path):
    inventory = write_inventory(tmp_path / "inv.yml", {"pve1": PVE1},
                                {"ct%d" % v: {"proxmox_vmid": v} for v in (VICTIM, TENANT)})
    victim_before = diagnose(inventory, VICTIM)
    tenant_before = diagnose(inventory, TENANT)
    mark = "inferops tests/lab/test_hostile_oom.py: CT %d's OOM kill named lxc.payload.%d follows (%d)" % (
        TENANT, VICTIM, os.getpid())
    with open("/dev/kmsg", "w") as f:
        f.write(mark + "\n")
    r = subprocess.run(["/usr/sbin/pct", "exec", str(TENANT), "--", "sh", "-s"], input=ATTACK, capture_output=True,
                       text=True, timeout=120)
    assert "rc=137" in r.stdout, (r.stdout, r.stderr)          # the pipeline's reader died of SIGKILL
    # The world: the kernel killed the tenant's process that bore the victim's name, in the tenant's cgroup.
    kills = kernel_records_after(mark)
    assert [(memcg.split("/")[:3], task) for memcg, task, _pid in kills] == [(["", "lxc", str(TENANT)],
                                                                              "lxc.payload.%d" % VICTIM)], kills

    # Without kernel_since_seq (it bounds the Xids judged, not the OOM kills read), so that its kernel_cursor is where
    # the ring buffer stood when this reading began: past the kill's record.
    victim_after = diagnose(inventory, VICTIM)
    tenant_after = diagnose(inventory, TENANT, since=tenant_before["kernel_cursor"])
    vlog, tlog = victim_after["evidence"]["kernel_log"], tenant_after["evidence"]["kernel_log"]
    # The victim: no new kill record, the same count, no fault, no event from the watch's policy.
    assert vlog["oom_kill_last_seq"] == victim_before["evidence"]["kernel_log"]["oom_kill_last_seq"], vlog
    assert vlog["oom_kills_in_container"] == victim_before["evidence"]["kernel_log"]["oom_kills_in_container"]
    # ... from a reading of the ring buffer past the kill's record (the record the tenant's reading gives it)
    assert victim_after["kernel_cursor"] >= tlog["oom_kill_last_seq"], (victim_after["kernel_cursor"], tlog)
    assert eda_watch.faults(victim_after, eda_watch.oom_mark(victim_before)) == []
    policy = eda_watch.Policy(eda_watch.PolicySettings(debounce_s=0))
    victim = eda_watch.Watched("ct%d" % VICTIM, VICTIM, "pve1")
    assert policy.observe(victim, victim_before, 0) is None and policy.observe(victim, victim_after, 1) is None
    # The tenant: the kill is its own.
    assert (tenant_before["evidence"]["kernel_log"]["oom_kill_last_seq"] or -1) < tlog["oom_kill_last_seq"], tlog
    kinds = [k for k, _why in eda_watch.faults(tenant_after, eda_watch.oom_mark(tenant_before))]
    assert eda_watch.KIND_OOM_KILL in kinds


class SilentNode(threading.Thread):
    """A TCP port that accepts every connection and never sends a byte (an sshd that hangs)."""

    def __init__(self):
        super().__init__(daemon=True)
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.accepted = []
        self.done = False

    def run(self):
        while not self.done:
            try:
                conn, _addr = self.sock.accept()
            except OSError:
                return
            self.accepted.append(conn)

    def close(self):
        self.done = True
        self.sock.close()
        for c in self.accepted:
            c.close()


def test_the_event_source_bounds_its_polls_and_makes_a_silent_node_an_event(cts, tmp_path):
    silent = SilentNode()
    silent.start()
    # ssh's own timeout far above the source's bound: what ends each read of the silent node is the source.
    gone = dict(PVE1, ansible_port=silent.port, ansible_ssh_timeout=600)
    inventory = write_inventory(tmp_path / "inv.yml", {"pve1": PVE1, "pve-silent": gone},
                                {"ct%d" % TENANT: {"proxmox_vmid": TENANT},
                                 "ct%d" % VICTIM: {"proxmox_vmid": VICTIM, "pve_gpu_container_node_host": "pve-silent"}})
    metrics = tmp_path / "watch.prom"
    events = []

    class Queue:
        async def put(self, item):
            events.append(item)

    started = time.time()
    saved = dict(os.environ)
    os.environ.update(env())
    try:
        mod = runpy.run_path(SOURCE)
        asyncio.run(mod["main"](Queue(), {"inventory": inventory, "interval": 0, "debounce": 0, "read_timeout": 20,
                                          "unreachable_polls": 2, "once": 2, "metrics_file": str(metrics),
                                          "ansible": os.path.join(BIN, "ansible"),
                                          "ansible_inventory": os.path.join(BIN, "ansible-inventory")}))
    finally:
        os.environ.clear()
        os.environ.update(saved)
        silent.close()
    took = time.time() - started
    print("gpu_watch: 2 polls with a silent node in %.1f s; events %s" % (took, [(e["action"], e["node"]) for e in events]))
    # The silent node was really asked (ssh connected to it) and is one event, after its second poll.
    assert silent.accepted
    assert [(e["action"], e["node"]) for e in events] == [("node_unreachable", "pve-silent")], events
    assert events[0]["failed_polls"] == 2 and events[0]["vmids"] == [VICTIM]
    assert events[0]["reasons"] == ["CT %d: timed_out: no answer within read_timeout (20 s): killed" % VICTIM], events[0]
    # The lab node was read in every poll meanwhile; the metrics file the site's Prometheus reads says both.
    text = metrics.read_text()
    assert 'inferops_watch_node_up{node="pve-silent"} 0\n' in text, text
    assert 'inferops_watch_node_up{node="pve1"} 1\n' in text and 'inferops_watch_node_failed_polls{node="pve1"} 0\n' in text
    # No read of the silent node outlives the source: no ssh to its port is left.
    ps = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
    assert not [line for line in ps.splitlines() if "Port=%d" % silent.port in line], ps
