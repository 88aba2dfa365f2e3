"""A host user posing as nvidia-persistenced cannot turn rung 5 (reset_gpus) against the node.

The impostor is an unprivileged process (uid nobody) that names itself nvidia-persistenced (prctl PR_SET_NAME),
holds the GPU device node a reset is planned for (mode 0666), exits on SIGTERM, and whose command line would write a
marker file if root ran it. The real gpu_recover_action module runs rung 5 for CT 180, which passes that GPU, on the
lab node over SSH (as the role runs it). What the world must show: the reset refused naming the impostor, the
impostor untouched (same PID and start time), the node's real nvidia-persistenced untouched, the GPU not reset, no
marker. Then, with the impostor gone, the real daemon, which its root-owned unit vouches for, is stopped and started
again through that unit (a new main process in the unit's cgroup, holding every GPU) and the GPU is reset.

VMIDs 180-181 (this file's own); the CT is created stopped and destroyed at the end.
"""
import json
import os
import shutil
import signal
import subprocess
import tempfile
import textwrap

import pytest

from gpu import testlib as t

pytestmark = [t.needs_root, pytest.mark.skipif(not t.container_available(),
                                               reason="the lab's pct and container template are not installed")]
REPO = os.path.realpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
CT = 180
NOBODY = 65534
UNIT_CG = "/system.slice/nvidia-persistenced.service"

IMPOSTOR = textwrap.dedent("""\
    import ctypes, json, os, signal, sys, time
    marker, gpu = sys.argv[1], sys.argv[2]
    if os.getuid() == 0:                      # what it would do if root ran its command line again
        open(marker, "w").write("root ran the impostor's command line\\n")
    ctypes.CDLL(None).prctl(15, ctypes.c_char_p(b"nvidia-persistenced"), 0, 0, 0)   # PR_SET_NAME
    fd = os.open("/dev/nvidia" + gpu, os.O_PATH)   # as the lab's clients hold it (no kernel driver to open)
    tried = {}
    for name, path in (("cgroup", "/sys/fs/cgroup/systemd%s/cgroup.procs" % sys.argv[3]),
                       ("pidfile", "/var/run/nvidia-persistenced/nvidia-persistenced.pid")):
        try:
            with open(path, "w") as f:
                f.write(str(os.getpid()))
            tried[name] = "written"
        except OSError as exc:
            tried[name] = exc.strerror
    signal.signal(signal.SIGTERM, lambda *a: os._exit(0))
    print(json.dumps(tried), flush=True)
    while True:
        time.sleep(3600)
""")


def free_gpu():
    """A GPU of 5-7 that no running container has as devN (the module refuses those for another reason)."""
    taken = set()
    for line in t.run(["pct", "list"]).stdout.splitlines()[1:]:
        vmid, status = line.split()[:2]
        if status == "running":
            for cl in t.run(["pct", "config", vmid]).stdout.splitlines():
                if cl.startswith("dev") and "/dev/nvidia" in cl:
                    tail = cl.split("/dev/nvidia", 1)[1].split(",")[0]
                    if tail.isdigit():
                        taken.add(int(tail))
    free = [g for g in (5, 6, 7) if g not in taken]
    assert free, "GPUs 5-7 are all passed to running containers: %s" % sorted(taken)
    return free[0]


def recover_action(gpu):
    """gpu_recover_action's reset rung for CT 180 on the lab node, through Ansible's SSH connection."""
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg"), ANSIBLE_LOAD_CALLBACK_PLUGINS="1",
               ANSIBLE_STDOUT_CALLBACK="json", ANSIBLE_VAULT_PASSWORD_FILE="/var/lib/inferops-lab/vault-pass")
    args = json.dumps({"vmid": CT, "action": "reset_gpus", "gpus": [gpu], "term_grace": 1, "wait": 5,
                       "command_timeout": 20})
    r = subprocess.run([os.path.join(REPO, ".venv", "bin", "ansible"), "-i", "inventories/lab/hosts.yml", "pve1",
                        "-m", "inferops.gpu_inference.gpu_recover_action", "-a", args],
                       capture_output=True, text=True, cwd=REPO, env=env, timeout=300)
    out = json.loads(r.stdout)
    return out["plays"][0]["tasks"][0]["hosts"]["pve1"]


def proc_id(pid):
    """(start time, real uid, systemd cgroup) of a live PID, from the kernel."""
    stat = open("/proc/%d/stat" % pid).read()
    uid = int([ln for ln in open("/proc/%d/status" % pid) if ln.startswith("Uid:")][0].split()[1])
    cg = [ln.split(":", 2)[2].strip() for ln in open("/proc/%d/cgroup" % pid) if ":name=systemd:" in ln][0]
    return int(stat.rsplit(")", 1)[1].split()[19]), uid, cg


def holds(pid, gpu):
    return "/dev/nvidia%d" % gpu in [os.readlink("/proc/%d/fd/%s" % (pid, fd)) for fd in os.listdir("/proc/%d/fd" % pid)]


def recovery_action(gpu):
    r = t.smi("--query-gpu=gpu_recovery_action", "--format=csv,noheader", "-i", str(gpu))
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout.strip()


@pytest.fixture(scope="module")
def ct_gpu():
    t.lab_up()
    gpu = free_gpu()
    if os.path.exists("/etc/pve/lxc/%d.conf" % CT):
        t.ct_destroy(CT)
    r = t.run(["pct", "create", str(CT), t.TEMPLATE, "--hostname", "hostile-daemons", "--memory", "256", "--swap",
               "0", "--unprivileged", "1", "--dev0", "/dev/nvidia%d" % gpu, "--dev1", "/dev/nvidiactl"], timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    yield gpu
    t.driver({"op": "fault_clear", "gpus": [gpu]})
    t.ct_destroy(CT)


@pytest.fixture
def impostor(ct_gpu):
    work = tempfile.mkdtemp(prefix="hostile-daemons-")
    os.chmod(work, 0o755)
    script = os.path.join(work, "impostor.py")
    with open(script, "w") as f:
        f.write(IMPOSTOR)
    os.chmod(script, 0o644)
    marker = os.path.join(work, "marker")

    def drop():
        os.setgid(NOBODY)
        os.setgroups([])
        os.setuid(NOBODY)
    p = subprocess.Popen(["/usr/bin/python3", script, marker, str(ct_gpu), UNIT_CG], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, preexec_fn=drop, cwd="/")
    line = p.stdout.readline()
    assert line, "the impostor did not start: %s" % p.stderr.read()
    tried = json.loads(line)
    yield {"proc": p, "marker": marker, "script": script, "tried": tried, "gpu": ct_gpu}
    if p.poll() is None:
        p.send_signal(signal.SIGKILL)
    p.wait(timeout=30)
    shutil.rmtree(work, ignore_errors=True)


def test_a_host_user_posing_as_persistenced_is_a_client_and_the_reset_refused(impostor):
    p, gpu = impostor["proc"], impostor["gpu"]
    assert p.poll() is None, p.stderr.read()
    # What the impostor could not do: enter the unit's cgroup, or name itself in the daemon's PID file.
    assert impostor["tried"] == {"cgroup": "Permission denied", "pidfile": "Permission denied"}
    assert open("/proc/%d/comm" % p.pid).read().strip() == "nvidia-persiste" and holds(p.pid, gpu)
    before = proc_id(p.pid)
    assert before[1:] == (NOBODY, "/")
    daemon = t.persistenced_pid()
    unit = t.unit_show()
    assert unit["MainPID"] == str(daemon) and unit["ActiveState"] == "active"
    daemon_id = proc_id(daemon)
    assert t.driver({"op": "fault_set", "fault": "recovery_action", "gpu": gpu, "action": "Reset"})["ok"]

    res = recover_action(gpu)

    # The world: the impostor runs on as it was, the node's daemon was not stopped, the GPU was not reset, root ran
    # nothing of the impostor's, and the unit is as it was.
    assert p.poll() is None and proc_id(p.pid) == before
    assert t.persistenced_pid() == daemon and proc_id(daemon) == daemon_id
    assert t.unit_show()["MainPID"] == str(daemon)
    assert recovery_action(gpu) == "Reset"
    assert not os.path.exists(impostor["marker"])
    ran = [pid for pid in map(int, filter(str.isdigit, os.listdir("/proc"))) if pid != p.pid
           and impostor["script"].encode() in open("/proc/%d/cmdline" % pid, "rb").read()]
    assert ran == []
    st = os.stat(unit["FragmentPath"])
    assert (st.st_uid, st.st_mode & 0o777) == (0, 0o644)
    # And the refusal names the impostor, with why it is not the daemon.
    why = "; ".join(r.get("why", "") for r in res["refused"])
    assert "%d/nvidia-persiste (host: not the main process of a host daemon's unit" % p.pid in why, res
    assert res.get("daemons") is None and res["reset"] == [], res


def test_the_daemon_its_unit_vouches_for_is_stopped_and_started_again_through_the_unit(ct_gpu):
    gpu = ct_gpu
    daemon = t.persistenced_pid()
    assert daemon is not None and t.unit_show()["MainPID"] == str(daemon)
    assert t.driver({"op": "fault_set", "fault": "recovery_action", "gpu": gpu, "action": "Reset"})["ok"]

    res = recover_action(gpu)

    assert res["refused"] == [], res
    new = t.persistenced_pid()
    assert new is not None and new != daemon
    assert not os.path.exists("/proc/%d" % daemon) or proc_id(daemon)[0] != proc_id(new)[0]
    # Started through the unit: the service manager's main process, in the unit's cgroup, root, holding every GPU.
    assert t.unit_show()["MainPID"] == str(new)
    assert proc_id(new)[1:] == (0, UNIT_CG)
    assert all(holds(new, g) for g in range(8))
    assert recovery_action(gpu) == "None"   # the driver's flag is cleared only by a reset
