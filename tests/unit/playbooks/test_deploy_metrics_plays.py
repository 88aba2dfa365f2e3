# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""deploy.yml's last two plays, read from the playbook and run offline: the node play writes each container's
inferops_deploy_<vmid>.prom from what the container play left (the container role's private
__sglang_server_node_metrics) of the containers the node served in the run, then the verdict play fails a container
whose server does not match its plan. A run whose every container mismatches still writes their metrics first
(ansible-playbook runs no further play once every host of a play failed, so the verdict cannot come before the node
play). The node and container plays are stood in for by plays that set the private results the node role
(__pve_gpu_container_states) and verify.yml set; the files are read from the disk, the failures from the run's recap.
managed_files sets the files' owner root, so the test runs as root (as CI and the lab do)."""
from __future__ import annotations

import os
import re
import stat
import subprocess
import sys

import pytest
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
DEPLOY = os.path.join(ROOT, "playbooks", "deploy.yml")
PLAYS = ("Proxmox VE node - the deploy's metrics of its containers", "SGLang in the container - the verdict")

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="managed_files makes the metrics files owned by root")


def collections_path() -> str:
    if os.path.basename(os.path.dirname(os.path.dirname(ROOT))) == "ansible_collections":  # under ansible-test
        return os.path.dirname(os.path.dirname(os.path.dirname(ROOT)))
    return os.path.join(ROOT, ".collections")


def _last_plays():
    with open(DEPLOY) as f:
        plays = yaml.safe_load(f)
    names = [p.get("name") for p in plays]
    assert tuple(names[-2:]) == PLAYS, names
    return plays[-2:]


def _metrics(host, ok, directory):
    return {"directory": str(directory), "file": {"dest": "%s/inferops_deploy_%s.prom" % (directory, host[2:]),
                                                  "content": "inferops_deploy_verify_ok{vmid=\"%s\"} %d\n" % (host[2:], ok)}}


def _run(tmp_path, containers, check=False, outside=None):
    """containers: host -> (ok, metrics dir or None), the node's containers of the run; outside: a container host of
    the group left out of the run, whose inventory sets __sglang_server_node_metrics (metrics dir).
    Returns (rc, output, recap {host: (changed, failed)})."""
    hosts = {h: None for h in containers}
    if outside:
        hosts["ct109"] = {"__sglang_server_node_metrics": _metrics("ct109", True, outside)}
    inventory = {"all": {"vars": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable},
                         "children": {"proxmox_nodes": {"hosts": {"node1": None}},
                                      "sglang_containers": {"hosts": hosts}}}}
    facts = {h: {"__sglang_server_verify": {"verify": {"ok": ok, "mismatches": [] if ok else ["tp_size: running 1, planned 2"]}},
                 "__sglang_server_node_metrics": _metrics(h, ok, directory) if directory else None}
             for h, (ok, directory) in containers.items()}
    node = {"name": "The node play (stand-in): the containers it served", "hosts": "proxmox_nodes", "gather_facts": False,
            "tasks": [{"name": "Set what configure_container.yml sets", "ansible.builtin.set_fact": {
                "__pve_gpu_container_states": {h: {"vmid": int(h[2:])} for h in containers}}}]}
    stand_in = {"name": "The container play (stand-in): verify's private results", "hosts": ",".join(containers),
                "gather_facts": False,
                "tasks": [
                    {"name": "Set what verify.yml sets", "ansible.builtin.set_fact": {
                        "__sglang_server_verify": "{{ __facts[inventory_hostname].__sglang_server_verify }}"}},
                    {"name": "Set the metrics verify.yml keeps", "ansible.builtin.set_fact": {
                        "__sglang_server_node_metrics": "{{ __facts[inventory_hostname].__sglang_server_node_metrics }}"},
                     "when": "__facts[inventory_hostname].__sglang_server_node_metrics is not none"}],
                "vars": {"__facts": facts}}
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump(inventory))
    (tmp_path / "play.yml").write_text(yaml.safe_dump([node, stand_in] + _last_plays(), sort_keys=False))
    if not (tmp_path / "tasks").exists():
        os.symlink(os.path.join(ROOT, "playbooks", "tasks"), tmp_path / "tasks")
    (tmp_path / "empty.cfg").write_text("")
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    env.update(ANSIBLE_CONFIG=str(tmp_path / "empty.cfg"), ANSIBLE_COLLECTIONS_PATH=collections_path(),
               ANSIBLE_LOCAL_TEMP=str(tmp_path / "tmp"), ANSIBLE_REMOTE_TEMP=str(tmp_path / "tmp"), ANSIBLE_NOCOLOR="1",
               HOME=str(tmp_path))
    cmd = [os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i", str(tmp_path / "hosts.yml"),
           str(tmp_path / "play.yml")] + (["--check"] if check else []) + (["--limit", "!ct109"] if outside else [])
    r = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False)
    out = r.stdout + r.stderr
    recap = {m.group(1): (int(m.group(2)), int(m.group(3)))
             for m in re.finditer(r"^(\S+)\s+: ok=\d+\s+changed=(\d+)\s+unreachable=\d+\s+failed=(\d+)", out, re.M)}
    return r.returncode, out, recap


def _mode(path) -> str:
    return oct(stat.S_IMODE(os.stat(path).st_mode))


def test_a_mismatch_is_in_the_metrics_before_the_run_fails(tmp_path):
    prom = tmp_path / "prom"
    rc, out, recap = _run(tmp_path, {"ct101": (False, prom)})
    assert rc != 0, out
    assert "The running server does not match the plan: tp_size: running 1, planned 2" in out, out
    assert recap["ct101"][1] == 1 and recap["node1"][1] == 0, recap   # the container fails, not its node
    assert (prom / "inferops_deploy_101.prom").read_text() == 'inferops_deploy_verify_ok{vmid="101"} 0\n'
    assert _mode(prom / "inferops_deploy_101.prom") == "0o644" and _mode(prom) == "0o755"
    assert os.stat(prom / "inferops_deploy_101.prom").st_uid == 0


def test_each_container_of_the_node_gets_its_file_and_a_rerun_changes_nothing(tmp_path):
    prom, other = tmp_path / "prom", tmp_path / "other"
    containers = {"ct101": (True, prom), "ct102": (True, other), "ct103": (True, None)}
    for run in ("first", "again"):
        rc, out, recap = _run(tmp_path, containers)
        assert rc == 0, out
        assert recap["node1"] == (0, 0), (run, recap)   # metrics of the run, not managed state
    assert (prom / "inferops_deploy_101.prom").read_text() == 'inferops_deploy_verify_ok{vmid="101"} 1\n'
    assert (other / "inferops_deploy_102.prom").read_text() == 'inferops_deploy_verify_ok{vmid="102"} 1\n'
    assert sorted(os.listdir(prom)) == ["inferops_deploy_101.prom"] and sorted(os.listdir(other)) == ["inferops_deploy_102.prom"]


def test_a_container_the_node_did_not_serve_gets_nothing_whatever_its_inventory_says(tmp_path):
    prom, planted = tmp_path / "prom", tmp_path / "planted"
    rc, out, recap = _run(tmp_path, {"ct101": (True, prom)}, outside=planted)
    assert rc == 0 and "ct109" not in recap, out
    assert (prom / "inferops_deploy_101.prom").exists()
    assert not planted.exists()


def test_check_mode_writes_nothing_and_judges_nothing(tmp_path):
    prom = tmp_path / "prom"
    rc, out, recap = _run(tmp_path, {"ct101": (False, prom)}, check=True)
    assert rc == 0 and recap["ct101"] == (0, 0), out
    assert not prom.exists()
