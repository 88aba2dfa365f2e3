# -*- coding: utf-8 -*-
"""Verify the main job on the lab from the node (this machine): CT 129, SGLang, the plan, the bystander.

Every check reads the world itself (the CT config, the process table, the server's own /server_info with the
key the lab generated, the scheduler processes' memory), not the report the role wrote.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import urllib.request

import testinfra

NODE = testinfra.get_host("local://")
VMID = 129
ROOT = os.environ.get("MOLECULE_PROJECT_DIRECTORY", os.getcwd())
LAB = "/var/lib/inferops-lab"
ADDR = "10.77.0.129"
GB = 10**9


def pct(*cmd: str) -> str:
    return subprocess.run(["/usr/sbin/pct", "exec", str(VMID), "--", *cmd], check=True, capture_output=True, text=True).stdout


def api_key() -> str:
    with open(f"{LAB}/secrets/sglang-api-key") as f:
        return f.read().strip()


def server_info() -> dict:
    req = urllib.request.Request(f"http://{ADDR}:30000/server_info", headers={"Authorization": "Bearer " + api_key()})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.load(r)


def main_pid() -> int:
    return int(pct("systemctl", "show", "-p", "MainPID", "--value", "sglang.service").strip())


def unit_processes() -> list:
    """(pid, user, RssShmem+RssAnon bytes, cmdline) of every process of the unit, read in the container's /proc."""
    script = (
        "import json,os\n"
        "paths=['/sys/fs/cgroup/system.slice/sglang.service/cgroup.procs',\n"
        "       '/sys/fs/cgroup/systemd/system.slice/sglang.service/cgroup.procs']\n"
        "pids=[int(p) for p in open([x for x in paths if os.path.exists(x)][0]).read().split()]\n"
        "out=[]\n"
        "for p in pids:\n"
        "  st=dict(l.split(':',1) for l in open(f'/proc/{p}/status'))\n"
        "  kb=lambda k: int(st.get(k,'0 kB').split()[0])*1024\n"
        "  out.append([p, int(st['Uid'].split()[0]), kb('RssShmem')+kb('RssAnon'), open(f'/proc/{p}/cmdline').read()])\n"
        "print(json.dumps(out))\n"
    )
    return json.loads(pct("python3", "-c", script))


def test_ct_running_with_passthrough_and_limit():
    conf = NODE.file(f"/etc/pve/lxc/{VMID}.conf").content_string
    assert "memory: 14336" in conf
    for dev in ("/dev/nvidia0", "/dev/nvidia1", "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"):
        assert any(line.startswith("dev") and line.split(": ", 1)[1].split(",")[0] == dev for line in conf.splitlines()), dev
    assert "/dev/nvidia2" not in conf
    assert "status: running" in NODE.check_output(f"pct status {VMID}")


def test_nothing_left_half_done_by_the_cut_deploys():
    conf = NODE.file(f"/etc/pve/lxc/{VMID}.conf").content_string
    assert "\nlock:" not in conf and not conf.startswith("lock:")
    assert "tags: inferops-gpu" in conf
    listed = [line.split()[0] for line in NODE.check_output("pct list").splitlines()[1:]]
    assert listed.count(str(VMID)) == 1 and listed.count("130") == 1
    assert pct("/opt/sglang/venv/bin/python3", "-c", "import sglang, sys; print(sglang.__version__)").strip() == "0.5.21"


def test_unit_active_and_health_on_the_containers_address_only():
    assert pct("systemctl", "is-active", "sglang.service").strip() == "active"
    unit = pct("cat", "/etc/systemd/system/sglang.service")
    assert "KillMode=control-group" in unit and "User=sglang" in unit
    assert NODE.check_output(f"curl -s -o /dev/null -w '%{{http_code}}' http://{ADDR}:30000/health") == "200"
    listening = pct("ss", "-Hltn", "sport", "= :30000")
    assert f"{ADDR}:30000" in listening and "0.0.0.0:30000" not in listening and "*:30000" not in listening


def test_api_needs_the_key():
    code = NODE.check_output(f"curl -s -o /dev/null -w '%{{http_code}}' http://{ADDR}:30000/v1/models")
    assert code == "401"
    assert server_info()["tp_size"] == 2


def test_running_hicache_size_is_the_plans_and_in_the_argv_once():
    info = server_info()
    launch = json.loads(pct("cat", "/etc/sglang/launch.json"))
    cmdline = pct("cat", f"/proc/{main_pid()}/cmdline").split("\0")
    assert info["hicache_size"] == launch["hicache_size"] == launch["plan"]["per_rank_gb"] == 1
    assert cmdline.count("--hicache-size") == 1 and cmdline[cmdline.index("--hicache-size") + 1] == "1"
    assert info["enable_hierarchical_cache"] is True and info["host"] == ADDR


def test_server_runs_as_its_own_user_and_the_key_is_in_no_command_line_unit_or_plan():
    key = api_key()
    uid = int(pct("id", "-u", "sglang").strip())
    procs = unit_processes()
    assert len(procs) >= 3 and all(p[1] == uid != 0 for p in procs)
    # Every process in the container, as any user sees it: /proc/PID/cmdline is world-readable.
    everything = pct("sh", "-c", "cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' '; cat /etc/systemd/system/sglang.service "
                                 "/etc/sglang/launch.json /etc/sglang/sglang.env")
    assert key not in everything
    stat = pct("stat", "-c", "%a %U %G", "/etc/sglang/api-key").split()
    assert stat == ["640", "root", "sglang"]
    assert "Permission denied" in subprocess.run(
        ["/usr/sbin/pct", "exec", str(VMID), "--", "setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups",
         "cat", "/etc/sglang/api-key"], capture_output=True, text=True).stderr


def test_pinned_memory_is_the_plans():
    launch = json.loads(pct("cat", "/etc/sglang/launch.json"))
    planned = launch["plan"]["pinned_per_rank_bytes"]
    ranks = [p for p in unit_processes() if p[3].startswith("sglang::scheduler")]
    assert len(ranks) == 2
    for _pid, _uid, held, _cmd in ranks:
        assert 0.9 * planned <= held <= planned + 0.5 * GB


def _textfile(path: str) -> dict:
    """A node_exporter textfile read independently of the collection's writer: name{labels} value, comments skipped."""
    out = {}
    for line in NODE.file(path).content_string.splitlines():
        if line and not line.startswith("#"):
            m = re.fullmatch(r'(\w+)\{([^}]*)\} (\S+)', line)
            assert m, line
            labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2)))
            out[m.group(1)] = (labels, float(m.group(3)))
    return out


def test_deploy_metrics_written_on_the_node():
    """deploy.yml's node play writes inferops_deploy_129.prom after the container play: root's, 0644, labelled with
    the container and its node, the planned bytes those of the unit's launch record, the measured ones what the ranks
    hold, written after the container's configuration and after the figures were taken."""
    path = f"/var/lib/prometheus/node-exporter/inferops_deploy_{VMID}.prom"
    f = NODE.file(path)
    assert f.is_file and f.user == "root" and f.mode == 0o644
    metrics = _textfile(path)
    assert all(labels == {"vmid": str(VMID), "node": "pve1", "host": "ct129"} for labels, _ in metrics.values()), metrics
    assert metrics["inferops_deploy_verify_ok"][1] == 1 and metrics["inferops_deploy_node_plan_fits"][1] == 1
    launch = json.loads(pct("cat", "/etc/sglang/launch.json"))
    planned = launch["plan"]["total_pinned_bytes"]
    assert metrics["inferops_deploy_planned_pinned_bytes"][1] == planned
    held = sum(p[2] for p in unit_processes() if p[3].startswith("sglang::scheduler"))
    assert 0.9 * planned <= metrics["inferops_deploy_measured_pinned_bytes"][1] <= planned + GB
    assert abs(metrics["inferops_deploy_measured_pinned_bytes"][1] - held) <= 0.5 * GB, (metrics, held)
    written = f.mtime.timestamp()
    assert 0 <= written - metrics["inferops_deploy_timestamp_seconds"][1] < 600
    assert written >= float(pct("stat", "-c", "%Y", "/etc/sglang/launch.json").strip())


def test_baseline_recorded():
    base = json.loads(NODE.file(f"/var/lib/inferops/baseline/{VMID}.json").content_string)
    assert base["vmid"] == VMID and base["service"] == "sglang.service"
    assert [g["index"] for g in base["gpus"]] == [0, 1]
    assert base["container_memory_mib"] == 14336
    # Recorded at idle (gpu_baseline refuses leftovers): each GPU's idle figure, at most 16 MiB.
    assert all(0 <= g["memory_used_mib"] <= 16 for g in base["gpus"]), base["gpus"]


def test_bystander_untouched():
    pid_file = os.path.join(os.environ.get("MOLECULE_EPHEMERAL_DIRECTORY", "/nonexistent"), "bystander.pid")
    status = NODE.check_output(f"{ROOT}/tests/lab/labctl status")
    assert re.search(r"^\s*130\s+pve1\s+running\b", status, re.M), status
    if os.path.exists(pid_file):
        with open(pid_file) as f:
            assert f"bystanderd host pid {f.read().strip()}" in status
