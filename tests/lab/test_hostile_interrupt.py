"""A recover run stopped mid-ladder leaves a report, metrics and a stated state (docs/recover.md, "Interrupted runs").

CT 193 (made here through the lab's pct, GPU 5 passed through, tagged inferops-gpu) runs a `sglang.service` that holds
GPU memory (the lab's worker). recover.yml climbs rung 1 (stop_service: `systemctl disable --now`); as soon as the
unit's enablement link disappears from the container's root (the world, not the run's output), ansible-playbook is
killed with SIGKILL (its whole process group), as a lost controller or connection would stop it. Then:
- the report on the controller and the metrics on the node exist, say the run did not finish, name the rung that ran
  and what it does to the service, and how to restore it; the service is, in the container, what the report says;
- a second run to the end reads what it leaves from the world: its report says the service is disabled and inactive
  (systemctl in the container agrees), and the metrics say no run is in progress.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest

from gpu import testlib as t
from conftest import REPO, wait_running_systemd

pytestmark = [t.needs_root, pytest.mark.skipif(not t.container_available(),
                                               reason="the lab's pct and container template are not installed")]

VMID = 193
GPU = 5
METRICS = "/var/lib/prometheus/node-exporter/inferops_recover_%d.prom" % VMID
UNIT = """[Unit]
Description=stand-in server holding GPU memory (test_hostile_interrupt)
[Service]
ExecStart=/usr/bin/python3 /run/nvidia-lab/lab-worker.py --gpus %d --mib 512
[Install]
WantedBy=multi-user.target
""" % GPU
WANTS = "/etc/systemd/system/multi-user.target.wants/sglang.service"
# recover.yml finds CT 193 in the inventory: a second inventory source adds it to the lab's.
INVENTORY = """all:
  children:
    sglang_containers:
      hosts:
        ct193:
          proxmox_vmid: 193
          ansible_connection: local
"""


def init_pid() -> int:
    return int(t.run(["lxc-info", "-n", str(VMID), "-p", "-H"]).stdout.strip())


def in_ct(*cmd: str) -> str:
    return t.attach(VMID, list(cmd)).stdout.strip()


@pytest.fixture(scope="module")
def ct():
    t.lab_up()
    if os.path.exists("/etc/pve/lxc/%s.conf" % VMID):
        t.ct_destroy(VMID)
    devs = []
    for i, path in enumerate(["/dev/nvidia%d" % GPU, "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]):
        devs += ["--dev%d" % i, path]
    r = t.run(["pct", "create", str(VMID), t.TEMPLATE, "--hostname", "interrupt", "--memory", "1024", "--swap", "0",
               "--unprivileged", "1", "--tags", "inferops-gpu"] + devs, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    t.ct_start(VMID)
    wait_running_systemd(VMID)
    r = t.attach(VMID, ["sh", "-c", "cat > /etc/systemd/system/sglang.service && systemctl daemon-reload && "
                                    "systemctl enable --now sglang.service"], input=UNIT)
    assert r.returncode == 0, r.stdout + r.stderr
    # The service holds its GPU before recover starts.
    assert t.wait_for(lambda: [p for p in t.compute_apps() if int(p[0]) in t.host_pids_in_ct(VMID)], 30)
    yield VMID
    t.ct_destroy(VMID)
    if os.path.exists(METRICS):
        os.unlink(METRICS)


def recover(reports: str, inventory: str, *extra: str, kill_when=None) -> int:
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg"), ANSIBLE_NOCOLOR="1",
               ANSIBLE_FORCE_COLOR="0", ANSIBLE_VAULT_PASSWORD_FILE="/var/lib/inferops-lab/vault-pass",
               ANSIBLE_COLLECTIONS_PATH=os.path.join(REPO, ".collections"), INFEROPS_REPORT_DIR=reports)
    with open(os.path.join(reports, "recover-%s.log" % ("killed" if kill_when else "to-the-end")), "w") as log:
        proc = subprocess.Popen([os.path.join(REPO, ".venv", "bin", "ansible-playbook"),
                                 "-i", os.path.join(REPO, "inventories", "lab", "hosts.yml"), "-i", inventory,
                                 os.path.join(REPO, "playbooks", "recover.yml"), "-e", "recover_vmid=%d" % VMID,
                                 *extra], stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO,
                                start_new_session=True)
        if kill_when is not None:
            while proc.poll() is None and not kill_when():
                time.sleep(0.05)
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
        return proc.wait(timeout=600)


def metrics() -> dict:
    out = {}
    with open(METRICS) as f:
        for line in f:
            if line.startswith("inferops_"):
                name, value = line.split("{")[0], line.rsplit(" ", 1)[1]
                out[name] = float(value)
    return out


def test_a_recover_killed_mid_ladder_leaves_its_report_metrics_and_a_stated_state(ct, tmp_path):
    reports = str(tmp_path)
    inventory = os.path.join(reports, "ct193.yml")
    with open(inventory, "w") as f:
        f.write(INVENTORY)
    report_path = os.path.join(reports, "pve1", "recover-%d.json" % VMID)
    if os.path.exists(METRICS):
        os.unlink(METRICS)
    init = init_pid()
    wants = "/proc/%d/root%s" % (init, WANTS)
    assert os.path.lexists(wants)

    rc = recover(reports, inventory, kill_when=lambda: not os.path.lexists(wants))
    assert rc == -signal.SIGKILL, "recover.yml ended (rc %s) before the service was disabled: %s" % (
        rc, open(os.path.join(reports, "recover-killed.log")).read()[-3000:])

    # The world: rung 1 disabled the service (that is when the run was killed).
    assert in_ct("systemctl", "is-enabled", "sglang.service") == "disabled"
    with open(report_path) as f:
        report = json.load(f)
    assert report["finished"] is False and report["verdict"] == "Not clean" and report["cleared_by_rung"] is None
    assert report["interrupted"]["rung"] == 1 and report["interrupted"]["name"] == "stop_service"
    left = report["left"]
    assert left["read"] is False and left["changed_by_rungs"] == [1] and left["service"] == "sglang.service"
    assert "disables and stops sglang.service" in left["summary"]
    assert left["restore"][0].startswith("run recover.yml again for CT %d" % VMID)
    assert "systemctl enable --now sglang.service" in left["restore"][-1]
    # The metrics on the node say a run stopped without its verdict (and count no finished run).
    assert metrics() == {"inferops_recover_in_progress": 1.0}

    # A run to the end reads what it leaves from the world.
    rc = recover(reports, inventory, "-e", "recover_record_baseline=true")
    log = open(os.path.join(reports, "recover-to-the-end.log")).read()
    assert rc == 0, log[-3000:]
    with open(report_path) as f:
        report = json.load(f)
    enabled = in_ct("systemctl", "is-enabled", "sglang.service")
    active = in_ct("systemctl", "is-active", "sglang.service")
    assert (enabled, active) == ("disabled", "inactive")
    assert report["finished"] is True and report["interrupted"] is None and report["verdict"] == "Clean"
    assert {k: report["left"][k] for k in ("read", "container", "enabled", "active")} == {
        "read": True, "container": "running", "enabled": enabled, "active": active}
    assert report["left"]["restore"] and "deploy.yml" in report["left"]["restore"][-1]
    m = metrics()
    assert m["inferops_recover_in_progress"] == 0 and m["inferops_recover_interrupted"] == 0
    assert m["inferops_recover_last_clean"] == 1
