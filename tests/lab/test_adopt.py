"""Taking over a running, hand-made GPU container (docs/deploy.md, "Taking over an existing container").

CT 160 is made the way a person makes it, through the lab's pct and by editing /etc/pve/lxc/160.conf: its own
hostname, 1 core, swap 512, a static address, GPUs 6 and 7 passed by raw lxc lines (lxc.cgroup2.devices.allow and
lxc.mount.entry, the community scripts' way, no devN), the node's NVIDIA userspace from its .run, SGLang (the lab's
stand-in) pip-installed in a venv, and the server started from a shell with nohup and an oversized --hicache-size
(2 GB on each of 2 ranks where the plan gives 1). Then deploy.yml with pve_gpu_container_adopt, every check read from the
world (pct config, the process table, the container's mounts, the unit's argv, /health, the node's baseline file,
recover's own report):
- before any server runs (GPUs idle), the read step alone (--tags adopt_report) records the baseline on the node,
  changing nothing else, and recover.yml then judges the container Clean with it;
- with the hand-run server serving and no baseline, --check changes nothing (config, the server's process), reports
  the oversized size, names the port as your server's (not "pick another port") and what recover lacks, records no
  baseline, and recover.yml --check says Not clean for want of one, never Clean;
- a run without pve_gpu_container_adopt_interrupt stops before any change: the config is the same and the hand-run
  server still answers;
- the run with it ends with the same hostname, cores, swap and network, no devN beside the raw lines and each GPU
  node mounted once in the container, the server under sglang.service with the planned --hicache-size, the
  hand-run processes gone; a re-run changes nothing, and recover.yml then ends Clean;
- the operator goes back (unit disabled, the server started by hand again) with ranks that outlive SIGKILL (lab fault
  stuck-on-stop: on SIGTERM they read a FUSE file that never answers): the consented run climbs the recovery ladder
  for CT 160 inside the window (the ranks seen in D state, then gone, the FUSE connection aborted) and takes over.
The interruption (the last /health answer of the hand-run server to the first of the unit) is measured and printed.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import threading
import time
import urllib.error
import urllib.request

import pytest

from gpu import testlib as t
from conftest import REPO, wait_running_systemd

pytestmark = [t.needs_root, pytest.mark.skipif(not t.container_available(),
                                               reason="the lab's pct and container template are not installed")]

VMID = 160
GPUS = (6, 7)
ADDRESS = "10.77.0.160"
NET0 = "name=eth0,bridge=vmbr0,ip=%s/24,gw=10.77.0.1" % ADDRESS
VERSION = "0.5.21"
PACKAGES = "/var/lib/inferops-lab/packages"
MODEL = "/opt/models/kimi-k2-tiny"
BASELINE = "/var/lib/inferops/baseline/%d.json" % VMID
HAND_SIZE_GB = 2
TP = 2
CONF = "/etc/pve/lxc/%d.conf" % VMID
INVENTORY = """all:
  children:
    proxmox_nodes:
      hosts:
        pve1:
          # CT 129 of the default scenario may exist beside this one: count other guests by what they use.
          pve_gpu_container_node_others_count: measured
    sglang_containers:
      hosts:
        ct160:
          ansible_connection: inferops.gpu_inference.pct_remote
          ansible_host: 127.0.0.1
          ansible_port: 2222
          ansible_user: root
          ansible_private_key_file: /var/lib/inferops-lab/ssh/id_ed25519
          ansible_python_interpreter: /usr/bin/python3
          proxmox_vmid: 160
          pve_gpu_container_adopt: true
          pve_gpu_container_gpus: [%d, %d]
          pve_gpu_container_memory_mib: 16384
          sglang_server_version: "%s"
          sglang_server_tp_size: %d
          sglang_server_model_preset: kimi-k2
          sglang_server_model_path: %s
          sglang_server_wheelhouse_src: %s
          sglang_server_model_src: %s/models/kimi-k2-tiny
          sglang_server_nvidia_installer_node_dir: /var/lib/inferops-lab/nvidia
          sglang_server_stop_timeout_s: 30
          sglang_server_health_timeout_s: 180
          # 1 GiB a rank and 1 GiB for the front end: the plan gives 1 GB a rank where SGLang itself takes 2.
          sglang_server_hicache_policy:
            rank_overhead_bytes: 1073741824
            frontend_overhead_bytes: 1073741824
""" % (GPUS[0], GPUS[1], VERSION, TP, MODEL, PACKAGES, PACKAGES)


def in_ct(*cmd: str, **kw) -> subprocess.CompletedProcess:
    return t.attach(VMID, list(cmd), **kw)


def pct_config() -> dict:
    r = t.run(["pct", "config", str(VMID)])
    assert r.returncode == 0, r.stdout + r.stderr
    out: dict = {"lxc": []}
    for line in r.stdout.splitlines():
        key, _sep, value = line.partition(": ")
        if key.startswith("lxc."):
            out["lxc"].append((key, value))
        elif key != "digest":
            out[key] = value
    return out


def host_proc(pid: int) -> dict | None:
    """The world's view of a host PID: its start time, argv and cgroup, or None when gone."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            argv = [a.decode() for a in f.read().split(b"\0") if a]
        with open("/proc/%d/cgroup" % pid) as f:
            cgroup = f.read()
    except OSError:
        return None
    if fields[0] in ("Z", "X"):
        return None
    return {"starttime": int(fields[19]), "argv": argv, "cgroup": cgroup}


def launchers() -> dict[int, dict]:
    """Host PIDs of the SGLang launchers in CT 160 (python -m sglang.launch_server, or the unit's sglang-launch that
    runs it in its own process), with their world view."""
    found = {}
    for pid in t.host_pids_in_ct(VMID):
        proc = host_proc(pid)
        if proc and ("sglang.launch_server" in proc["argv"] or any(a.endswith("/sglang-launch") for a in proc["argv"])):
            found[pid] = proc
    return found


def healthy() -> bool:
    try:
        with urllib.request.urlopen("http://%s:30000/health" % ADDRESS, timeout=1) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError):
        return False


def gpu_mounts() -> list[str]:
    """The mount points of /dev/nvidia* in the container's mount table, as its init sees them."""
    init = int(t.run(["lxc-info", "-n", str(VMID), "-p", "-H"]).stdout.strip())
    with open("/proc/%d/mountinfo" % init) as f:
        return sorted(line.split()[4] for line in f if line.split()[4].startswith("/dev/nvidia"))


def deploy(reports: str, inventory: str, *extra: str, log: str) -> tuple[int, str]:
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg"), ANSIBLE_NOCOLOR="1",
               ANSIBLE_FORCE_COLOR="0", ANSIBLE_VAULT_PASSWORD_FILE="/var/lib/inferops-lab/vault-pass",
               ANSIBLE_COLLECTIONS_PATH=os.path.join(REPO, ".collections"), INFEROPS_REPORT_DIR=reports,
               ANSIBLE_PIPELINING="true")
    began = time.monotonic()
    r = subprocess.run([os.path.join(REPO, ".venv", "bin", "ansible-playbook"),
                        "-i", os.path.join(REPO, "inventories", "lab", "hosts.yml"), "-i", inventory, *extra],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=REPO, timeout=900)
    with open(os.path.join(reports, log), "w") as f:
        f.write(r.stdout)
    print("\n%s: rc %d, %.1f s" % (log, r.returncode, time.monotonic() - began))
    return r.returncode, r.stdout


def flat(text: str) -> str:
    """The output with its line wrapping undone (the callback folds long lines)."""
    return " ".join(text.split())


def playbook(name: str) -> str:
    return os.path.join(REPO, "playbooks", name)


@pytest.fixture(scope="module")
def handmade():
    """CT 160 as a person makes it, serving with a hand-started, oversized SGLang."""
    t.lab_up()
    if os.path.exists(CONF):
        t.ct_destroy(VMID)
    drop_baseline()  # a container made by hand has none
    r = t.run(["pct", "create", str(VMID), t.TEMPLATE, "--hostname", "kimi-by-hand", "--cores", "1", "--memory", "16384",
               "--swap", "512", "--unprivileged", "1", "--net0", NET0], timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    uvm = os.major(os.stat("/dev/nvidia-uvm").st_rdev)
    with open(CONF, "a") as f:  # the community scripts' raw lines, appended by hand
        f.write("lxc.cgroup2.devices.allow: c 195:* rwm\nlxc.cgroup2.devices.allow: c %d:* rwm\n" % uvm)
        for node in ["nvidia%d" % g for g in GPUS] + ["nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"]:
            f.write("lxc.mount.entry: /dev/%s dev/%s none bind,optional,create=file\n" % (node, node))
    t.ct_start(VMID)
    wait_running_systemd(VMID)
    driver = t.driver({"op": "query"})["driver_version"]
    with open("/var/lib/inferops-lab/nvidia/NVIDIA-Linux-x86_64-%s.run" % driver, "rb") as f:
        assert in_ct("sh", "-c", "cat > /root/nv.run && chmod +x /root/nv.run", input=f.read(), text=False).returncode == 0
    assert in_ct("/root/nv.run", "--no-kernel-module", "--silent").returncode == 0
    tar = subprocess.run(["tar", "-C", PACKAGES, "-cf", "-", "."], stdout=subprocess.PIPE, check=True).stdout
    r = in_ct("sh", "-c", "mkdir -p /root/wheels %s && tar -C /root/wheels -xf - && cp -r /root/wheels/models/kimi-k2-tiny/. %s"
              % (MODEL, MODEL), input=tar, text=False)
    assert r.returncode == 0, r.stderr
    r = in_ct("sh", "-c", "python3 -m venv /root/sgl && /root/sgl/bin/pip install -q --no-index --find-links /root/wheels "
                          "sglang==%s" % VERSION, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    yield VMID
    t.ct_destroy(VMID)
    drop_baseline()


def ranks() -> list[int]:
    """Host PIDs of the SGLang ranks in CT 160 (their process title)."""
    out = []
    for pid in t.host_pids_in_ct(VMID):
        try:
            with open("/proc/%d/comm" % pid) as f:
                if f.read().startswith("sglang::schedul"):
                    out.append(pid)
        except OSError:
            pass
    return out


def drop_baseline() -> None:
    try:
        os.remove(BASELINE)
    except FileNotFoundError:
        pass


def start_hand_run_server() -> None:
    # Started from a shell, as the incident's operator did: nohup, in the background, no unit.
    # (lxc-attach's output goes nowhere: the server outlives the attach and nothing waits for its pipes.)
    r = in_ct("bash", "-c", "cd /root && setsid -f nohup /root/sgl/bin/python3 -m sglang.launch_server --model-path %s "
                            "--tp-size %d --enable-hierarchical-cache --hicache-size %d --host 0.0.0.0 --port 30000 "
                            "> /root/sglang.log 2>&1 < /dev/null" % (MODEL, TP, HAND_SIZE_GB),
              capture_output=False, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    assert r.returncode == 0
    assert t.wait_for(healthy, 120), in_ct("cat", "/root/sglang.log").stdout[-2000:]


def recover_report(reports: str, check: bool) -> dict:
    with open(os.path.join(reports, "pve1", "recover-%d%s.json" % (VMID, "-check" if check else ""))) as f:
        return json.load(f)


def test_a_hand_made_container_is_taken_over_only_with_consent_and_keeps_what_the_operator_chose(handmade, tmp_path):
    reports = str(tmp_path)
    inventory = os.path.join(reports, "ct160.yml")
    with open(inventory, "w") as f:
        f.write(INVENTORY)
    limit = ["-e", "deploy_containers=ct160"]
    before = pct_config()

    # 0. GPUs idle, no server yet: the read step alone records the baseline on the node and changes nothing else;
    # recover then judges the container with it, Clean, before any take-over.
    assert not os.path.exists(BASELINE)
    rc, out = deploy(reports, inventory, playbook("deploy.yml"), "--tags", "adopt_report", *limit, log="read-idle.log")
    assert rc == 0, out[-4000:]
    assert pct_config() == before
    with open(BASELINE) as f:
        baseline = json.load(f)
    assert baseline["vmid"] == VMID and sorted(g["index"] for g in baseline["gpus"]) == list(GPUS)
    rc, out = deploy(reports, inventory, playbook("recover.yml"), "--check", "-e", "recover_vmid=%d" % VMID,
                     log="recover-idle.log")
    assert rc == 0, out[-4000:]
    assert recover_report(reports, check=True)["verdict"] == "Clean"

    # The operator then starts serving by hand; a container first read while it serves has no baseline.
    drop_baseline()
    start_hand_run_server()
    hand = launchers()
    assert len(hand) == 1
    (hand_pid, hand_proc), = hand.items()
    assert "--hicache-size" in hand_proc["argv"] and "sglang.service" not in hand_proc["cgroup"]

    # 1. Check mode: nothing changes, the oversized running size is named, the port is your server's, and what
    # recover lacks is said; recover itself says Not clean for want of a baseline, never Clean.
    rc, out = deploy(reports, inventory, playbook("deploy.yml"), "--check", *limit, log="check.log")
    assert rc == 0, out[-4000:]
    assert "your running --hicache-size %d x %d ranks does not fit" % (HAND_SIZE_GB, TP) in flat(out)
    assert "port 30000 is held by your server (SGLang, pid %d, started by hand)" % hand_pid in flat(out)
    assert "free port" not in flat(out)
    assert "no baseline yet, and the GPUs are busy" in flat(out)
    assert pct_config() == before
    assert host_proc(hand_pid) == hand_proc and healthy()
    assert not os.path.exists(BASELINE)
    rc, out = deploy(reports, inventory, playbook("recover.yml"), "--check", "-e", "recover_vmid=%d" % VMID,
                     log="recover-busy.log")
    assert rc == 0, out[-4000:]
    judged = recover_report(reports, check=True)
    assert judged["verdict"] != "Clean" and "no baseline" in json.dumps(judged), json.dumps(judged)[:3000]
    assert host_proc(hand_pid) == hand_proc and healthy()

    # 2. Without consent: stops before the first change, the hand-run server still serves.
    rc, out = deploy(reports, inventory, playbook("deploy.yml"), *limit, log="no-consent.log")
    assert rc != 0 and "pve_gpu_container_adopt_interrupt=true" in out and "Nothing has been changed" in out
    assert pct_config() == before
    assert host_proc(hand_pid) == hand_proc and healthy()

    # 3. With consent: one window, measured from the hand-run server's last answer to the unit's first.
    seen: list[tuple[float, bool]] = []
    stop = threading.Event()

    def poll():
        while not stop.is_set():
            seen.append((time.monotonic(), healthy()))
            time.sleep(0.25)

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    try:
        rc, out = deploy(reports, inventory, playbook("deploy.yml"), *limit, "-e", "pve_gpu_container_adopt_interrupt=true",
                         log="consent.log")
    finally:
        stop.set()
        poller.join()
    assert rc == 0, out[-6000:]
    # The baseline was taken right after the stop (the unit's start records it again at idle): the task ran there,
    # and the node holds it now.
    assert re.search(r"Record the baseline right after the stop[^\n]*\*+\n(changed|ok): \[pve1", out), out[-6000:]
    assert os.path.exists(BASELINE)
    after = pct_config()
    for key in ("hostname", "cores", "swap", "net0", "rootfs", "features"):
        assert after.get(key) == before.get(key), key
    assert after["lxc"] == before["lxc"]  # the raw GPU lines stay the passthrough
    assert not [k for k in after if re.fullmatch(r"dev\d+", k)]  # no devN beside them
    assert "inferops-gpu" in after.get("tags", "")
    mounts = gpu_mounts()
    assert len(mounts) == len(set(mounts)) and {"/dev/nvidia%d" % g for g in GPUS} <= set(mounts)
    assert host_proc(hand_pid) is None  # the hand-run server is gone
    assert not [p for p in t.host_pids_in_ct(VMID) if p == hand_pid]
    now = launchers()
    assert len(now) == 1
    (unit_pid, unit_proc), = now.items()
    assert "sglang.service" in unit_proc["cgroup"]
    argv = unit_proc["argv"]
    size = int(argv[argv.index("--hicache-size") + 1])
    assert 0 < size < HAND_SIZE_GB
    assert healthy()
    down = [ts for ts, ok in seen if not ok]
    if down:
        last_up = max([ts for ts, ok in seen if ok and ts < down[0]] or [down[0]])
        first_up = min([ts for ts, ok in seen if ok and ts > down[-1]] or [down[-1]])
        print("\nadoption interruption (last /health of the hand-run server to the unit's first): %.1f s; "
              "whole deploy run: %.1f s" % (first_up - last_up, seen[-1][0] - seen[0][0]))

    # 4. A re-run changes nothing: the same unit process, no change in the recap.
    rc, out = deploy(reports, inventory, playbook("deploy.yml"), *limit, "-e", "pve_gpu_container_adopt_interrupt=true",
                     log="rerun.log")
    assert rc == 0, out[-4000:]
    assert re.search(r"pve1\s*:.*changed=0", out) and re.search(r"ct160\s*:.*changed=0", out), out[-3000:]
    assert launchers() == {unit_pid: unit_proc}
    assert pct_config() == after

    # 5. recover.yml on the adopted container ends Clean (its own verdict, against the baseline deploy took at idle).
    rc, out = deploy(reports, inventory, playbook("recover.yml"), "-e", "recover_vmid=%d" % VMID, log="recover.log")
    assert rc == 0, out[-4000:]
    with open(os.path.join(reports, "pve1", "recover-%d.json" % VMID)) as f:
        assert json.load(f)["verdict"] == "Clean"

    # 6. The operator goes back (docs/deploy.md) and serves by hand again, from a server whose ranks outlive SIGKILL:
    # on SIGTERM they read a file of a FUSE mount that never answers (lab fault stuck-on-stop). The consented window
    # climbs the recovery ladder for CT 160 and takes over only once it is Clean.
    assert in_ct("systemctl", "disable", "--now", "sglang.service").returncode == 0
    start_hand_run_server()
    hand = launchers()
    assert len(hand) == 1 and not [p for p in hand.values() if "sglang.service" in p["cgroup"]]
    (hand_pid, _proc), = hand.items()
    stuck = ranks()
    assert len(stuck) == TP
    r = t.fault("inject", "stuck-on-stop", "--vmid", str(VMID))
    assert r.returncode == 0, r.stdout + r.stderr
    in_d: set[int] = set()
    stop.clear()

    def watch():
        while not stop.is_set():
            in_d.update(p for p in stuck if t.proc_state(p) == "D")
            time.sleep(0.2)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    started = time.time()
    try:
        rc, out = deploy(reports, inventory, playbook("deploy.yml"), *limit, "-e", "pve_gpu_container_adopt_interrupt=true",
                         "-e", "pve_gpu_container_adopt_stop_timeout_s=5", log="consent-stuck.log")
    finally:
        stop.set()
        watcher.join()
        left = [p for p in stuck if host_proc(p)]
        t.fault("clear", "--vmid", str(VMID))
    assert rc == 0, out[-6000:]
    assert in_d == set(stuck), (in_d, stuck)  # they did outlive SIGKILL, stuck in the kernel
    assert not left, left  # and were gone before the fault was cleared: only aborting the FUSE connection frees them
    assert "Climb the recovery ladder for what outlived SIGKILL" in out
    assert host_proc(hand_pid) is None
    now = launchers()
    assert len(now) == 1
    (unit_pid, unit_proc), = now.items()
    assert "sglang.service" in unit_proc["cgroup"] and healthy()
    ladder = os.path.join(reports, "pve1", "recover-%d.json" % VMID)
    assert os.path.getmtime(ladder) > started and recover_report(reports, check=False)["verdict"] == "Clean"
