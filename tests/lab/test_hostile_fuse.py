"""A hostile neighbour: a tenant's FUSE filesystem at /dev/nvidia-x that stops answering, with a process of the
tenant holding a file of it open. Reading the node must not wait on it.

CT 185 is the tenant (running), CT 186 another container of the node (created, stopped), both tagged as the
collection's (inferops-gpu) so that recovery reads them. tests/lab/gpu/stuckfs.py
--stall-after-open mounts a raw /dev/fuse filesystem at /dev/nvidia-x inside CT 185's mount namespace (the lab's way
of a tenant FUSE mount: a server of the node, mounted with setns, as fuse=1 would let the tenant do itself); a python3
of the CT opens /dev/nvidia-x/blob, and from that OPEN on the server answers nothing. A stat of that fd through
/proc/PID/fd/N then waits in request_wait_answer (shown by a probe here: that is what the holder scan used to do).

The real gpu_diagnose runs through ansible for CT 186 and for CT 185, and the event source gpu_watch polls both once
(the real ansible command). Each must finish (the bound is each call's own timeout: a hang fails the test, nothing
is timed), name the holder as unverified (its path and filesystem), judge it a holder of CT 185 only, and leave the
tenant's processes as they were: the holder alive with the same start time and still holding its fd, the server
alive and still stalled. The connection is aborted at the end, and the CTs destroyed.
"""
import asyncio
import json
import os
import runpy
import signal
import subprocess
import tempfile

import pytest
import yaml

from gpu import testlib as t

pytestmark = [t.needs_root, pytest.mark.skipif(not t.container_available(),
                                               reason="the lab's pct and container template are not installed")]

REPO = os.path.realpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
TENANT, OTHER = 185, 186
MOUNT = "/dev/nvidia-x"
STUCKFS = os.path.join(t.GPU_DIR, "stuckfs.py")
# Run from the collection as installed (the checkout linked under .collections, as `make setup` does).
SOURCE = os.path.join(REPO, ".collections", "ansible_collections", "inferops", "gpu_inference", "extensions", "eda",
                      "plugins", "event_source", "gpu_watch.py")
DECLARED = [{"host": "ct185", "vmid": TENANT, "node_host": "pve1"}, {"host": "ct186", "vmid": OTHER, "node_host": "pve1"}]
BOUND_S = 180  # each module run and the watcher's poll: a hang fails the test here


def ansible_env():
    env = dict(os.environ)
    env.update(ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg"),
               ANSIBLE_VAULT_PASSWORD_FILE="/var/lib/inferops-lab/vault-pass",
               PATH=os.path.join(REPO, ".venv", "bin") + ":" + env.get("PATH", ""))
    return env


def create(vmid, start):
    t.run(["pct", "stop", str(vmid)], timeout=120)
    t.run(["pct", "destroy", str(vmid)], timeout=120)
    r = t.run(["pct", "create", str(vmid), t.TEMPLATE, "--hostname", "hostile%d" % vmid, "--memory", "256",
               "--swap", "0", "--unprivileged", "1", "--tags", "inferops-gpu"], timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    if start:
        t.ct_start(vmid)


def init_pid(vmid):
    return int(t.run(["lxc-info", "-n", str(vmid), "-p", "-H"]).stdout.strip())


def nspid(pid):
    with open("/proc/%d/status" % pid) as f:
        return next([int(x) for x in line.split()[1:]] for line in f if line.startswith("NSpid:"))


def starttime(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])
    except OSError:
        return None


@pytest.fixture(scope="module")
def tenant():
    t.lab_up()
    create(OTHER, start=False)
    create(TENANT, start=True)
    subprocess.run(["mount", "-t", "fusectl", "fusectl", "/sys/fs/fuse/connections"], capture_output=True)
    status_path = tempfile.mktemp(prefix="hostile-fuse-", suffix=".json", dir="/run")
    server = subprocess.Popen([t.PY, STUCKFS, "--target-pid", str(init_pid(TENANT)), "--mountpoint", MOUNT,
                               "--status", status_path, "--stall-after-open"],
                              stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              start_new_session=True)
    holder = probe = None
    try:
        assert t.wait_for(lambda: os.path.exists(status_path) or server.poll() is not None, 10)
        assert os.path.exists(status_path), server.stderr.read().decode()
        status = json.load(open(status_path))
        # The tenant's process opens the file (os.open: no stat of its own), then the server stops answering.
        holder = subprocess.Popen(["lxc-attach", "-n", str(TENANT), "--clear-env", "--", "python3", "-c",
                                   "import os, sys, time\n"
                                   "fd = os.open('%s/blob', os.O_RDONLY)\n"
                                   "print(os.getpid(), fd, flush=True)\n"
                                   "time.sleep(3600)\n" % MOUNT],
                                  stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"})
        ct_pid, fd = (int(x) for x in holder.stdout.readline().split())
        assert t.wait_for(lambda: json.load(open(status_path)).get("stalled"), 10)
        host_pid = next(p for p in t.host_pids_in_ct(TENANT) if nspid(p)[-1:] == [ct_pid])
        fd_path = "/proc/%d/fd/%d" % (host_pid, fd)
        assert os.readlink(fd_path) == MOUNT + "/blob"
        # The hazard is real: a stat of that fd (what the holder scan used to do) does not return.
        probe = subprocess.Popen(["stat", "-L", fd_path], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL)
        assert not t.wait_for(lambda: probe.poll() is not None, 3), "stat of the FUSE fd returned: no hazard to test"
        with open("/proc/%d/wchan" % probe.pid) as f:
            assert f.read() == "request_wait_answer"
        yield {"host_pid": host_pid, "fd": fd, "fd_path": fd_path, "starttime": starttime(host_pid),
               "server": server, "server_start": starttime(server.pid), "status_path": status_path,
               "abort": status["abort"], "conn": status["conn"]}
    finally:
        try:
            with open(json.load(open(status_path))["abort"], "w") as f:
                f.write("1")
        except (OSError, ValueError, KeyError):
            pass
        for proc in (probe, holder):
            if proc is not None:
                if proc.poll() is None:
                    proc.kill()
                t.wait_for(lambda: proc.poll() is not None, 20)
        if server.poll() is None:
            server.send_signal(signal.SIGTERM)
        t.wait_for(lambda: server.poll() is not None, 20)
        for path in (status_path,):
            try:
                os.unlink(path)
            except OSError:
                pass
        t.ct_destroy(TENANT)
        t.ct_destroy(OTHER)


def diagnose(vmid):
    options = {"vmid": vmid, "node": "pve1", "declared": DECLARED, "samples": 1, "kernel_log": False,
               "command_timeout": 30}
    r = subprocess.run(["ansible", "pve1", "-i", os.path.join(REPO, "inventories", "lab"), "-m",
                        "inferops.gpu_inference.gpu_diagnose", "-a", json.dumps(options)],
                       capture_output=True, text=True, timeout=BOUND_S, cwd=REPO,
                       env=dict(ansible_env(), ANSIBLE_LOAD_CALLBACK_PLUGINS="1",
                                ANSIBLE_STDOUT_CALLBACK="ansible.posix.json"))
    res = json.loads(r.stdout)["plays"][0]["tasks"][0]["hosts"]["pve1"]
    assert not res.get("failed"), res.get("msg")
    return res


def untouched(tenant):
    assert starttime(tenant["host_pid"]) == tenant["starttime"]
    assert os.readlink(tenant["fd_path"]) == MOUNT + "/blob"
    assert tenant["server"].poll() is None and starttime(tenant["server"].pid) == tenant["server_start"]
    assert json.load(open(tenant["status_path"]))["stalled"] is True


def named(res, tenant):
    mine = [u for u in res["evidence"]["unverified_holders"] if u.startswith("%d/" % tenant["host_pid"])]
    assert mine == ["%d/python3 (CT %d): fd %d %s/blob on fuse.lab-stuckfs" % (tenant["host_pid"], TENANT,
                                                                               tenant["fd"], MOUNT)], res["evidence"]
    return mine[0]


def test_another_containers_diagnosis_finishes_and_names_the_holder_without_judging_by_it(tenant):
    res = diagnose(OTHER)
    line = named(res, tenant)
    assert "unverified holder outside CT %d, not judged for it: %s" % (OTHER, line) in res["notes"]
    assert not [r for r in res["reasons"] if "unverified" in r or str(tenant["host_pid"]) in r], res["reasons"]
    untouched(tenant)


def test_the_tenants_diagnosis_finishes_and_takes_the_holder_as_its_own(tenant):
    res = diagnose(TENANT)
    line = named(res, tenant)
    assert any(r.startswith("1 process(es) of CT %d have a /dev/nvidia* path open on a filesystem that is not "
                            "stat'ed" % TENANT) and line in r for r in res["reasons"]), res["reasons"]
    assert res["verdict"] == "Not clean" and res["findings"]["holders"] >= 1
    held = [h for h in res["evidence"]["ct_holders"] if h["pid"] == tenant["host_pid"]]
    assert held and held[0]["unverified_nvidia_fds"][0]["fstype"] == "fuse.lab-stuckfs"
    assert held[0]["unverified_nvidia_fds"][0]["mount_point"] == MOUNT
    untouched(tenant)


def test_the_event_source_poll_finishes(tenant, tmp_path, caplog):
    lab = yaml.safe_load(open(os.path.join(REPO, "inventories", "lab", "hosts.yml")))
    inventory = {"all": {"children": {
        "proxmox_nodes": lab["all"]["children"]["proxmox_nodes"],
        "sglang_containers": {"hosts": {"ct185": {"proxmox_vmid": TENANT}, "ct186": {"proxmox_vmid": OTHER}}}}}}
    inv = tmp_path / "hosts.yml"
    inv.write_text(yaml.safe_dump(inventory))
    events = []

    class Queue:
        async def put(self, item):
            events.append(item)

    env = ansible_env()
    old = dict(os.environ)
    os.environ.update(env)
    cwd = os.getcwd()
    os.chdir(REPO)
    caplog.set_level("INFO")
    try:
        mod = runpy.run_path(SOURCE)
        asyncio.run(asyncio.wait_for(mod["main"](Queue(), {
            "inventory": str(inv), "ansible": os.path.join(REPO, ".venv", "bin", "ansible"),
            "ansible_inventory": os.path.join(REPO, ".venv", "bin", "ansible-inventory"), "interval": 0, "debounce": 0,
            "once": 1, "samples": 1, "read_timeout": BOUND_S}), 2 * BOUND_S + 60))
    finally:
        os.chdir(cwd)
        os.environ.clear()
        os.environ.update(old)
    assert "not read" not in caplog.text, caplog.text
    assert "poll 1 of 2 container(s) took" in caplog.text
    assert not [e for e in events if e["vmid"] == OTHER], events
    untouched(tenant)
