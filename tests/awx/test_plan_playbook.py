"""playbooks/plan.yml as operators and AWX run it: an inventory host planned with deploy's variables, -e overrides
honoured, an unknown host refused, survey answers as AWX dumps them (!unsafe, blank, null, strings). Touches no
host: the example inventory's hosts do not resolve, so any connection would fail the run."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT

BIN = os.path.dirname(sys.executable)
INCIDENT = "@playbooks/vars/examples/kimi-k2-incident.yml"


def flat(text):
    """The output as one line of words: the checkout's ansible.cfg prints results as YAML, which folds a long line of
    the plan inside its quotes (and doubles a quote); an operator's default callback prints it whole."""
    return " ".join(text.split()).replace("''", "'")


def plan(*args, extra_file=None, tmp_path=None):
    cmd = [os.path.join(BIN, "ansible-playbook"), "playbooks/plan.yml"]
    if extra_file is not None:
        path = tmp_path / "extravars.yml"
        path.write_text(extra_file)
        cmd += ["-e", "@%s" % path]
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    env.pop("ANSIBLE_VAULT_PASSWORD_FILE", None)
    run = subprocess.run(cmd + list(args), cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)
    return run.returncode, flat(run.stdout + run.stderr)


def test_inventory_host_is_planned_with_its_deploy_variables():
    rc, out = plan("-i", "inventories/lab/hosts.yml", "-e", "plan_host=ct129")
    assert rc == 0, out
    assert "Planned offline for ct129 (CT 129, tp 2 x pp 1 over 1 node(s), 2 GPU(s): 0,1)" in out
    assert "declared memory limit 14.0 GiB" in out
    assert "msg: --hicache-size 1" in out  # docs/deploy.md: the lab's plan


def test_no_host_is_contacted():
    rc, out = plan("-i", "inventories/example/hosts.yml", "-e", "plan_host=ct129")
    assert rc == 0, out
    assert "unreachable=0" in out and "UNREACHABLE" not in out
    assert "tp 8 x pp 1 over 1 node(s), 8 GPU(s)" in out and "msg: --hicache-size 48" in out


def test_layout_override_is_honoured():
    rc, out = plan("-i", "inventories/lab/hosts.yml", "-e", "plan_host=ct129", "-e", "sglang_server_tp_size=4")
    assert rc != 0
    assert "tp 4 x pp 1 over 1 node(s) puts 4 scheduler rank(s) on this node (one per GPU), but 2 GPU(s)" in out
    rc, out = plan("-i", "inventories/lab/hosts.yml", "-e", "plan_host=ct129", "-e", "sglang_server_tp_size=4",
                   "-e", '{"pve_gpu_container_gpus": [0, 1, 2, 3], "pve_gpu_container_memory_mib": 20480}')
    assert rc == 0, out
    assert "tp 4 x pp 1 over 1 node(s), 4 GPU(s): 0,1,2,3" in out and "declared memory limit 20.0 GiB" in out
    assert "each of the 4 scheduler ranks" in out


def test_unknown_host_is_refused():
    rc, out = plan("-i", "inventories/lab/hosts.yml", "-e", "plan_host=ct999")
    assert rc != 0
    assert "plan_host=ct999 is not a host of the inventory" in out and "container hosts here: ct129" in out


def test_deploy_settings_without_plan_host_are_refused():
    rc, out = plan("-e", INCIDENT, "-e", "sglang_server_tp_size=4")
    assert rc != 0
    assert "sglang_server_tp_size is a deploy setting: the calculator reads these only for an inventory host" in out


def test_requested_size_override():
    rc, out = plan("-i", "inventories/lab/hosts.yml", "-e", "plan_host=ct129", "-e", "plan_requested_gb=2")
    assert rc != 0
    assert "plan_requested_gb=2 overrides ct129's sglang_server_hicache_requested_gb" in out
    assert "DOES NOT FIT" in out


@pytest.mark.parametrize("answer", ["!unsafe ''", "null", "!unsafe '0'", "0"])
def test_blank_requested_size_lets_the_plan_choose(answer, tmp_path):
    rc, out = plan("-e", INCIDENT, extra_file="!unsafe 'plan_requested_gb': %s\n" % answer, tmp_path=tmp_path)
    assert rc == 0, out
    assert "msg: --hicache-size 48" in out
    assert "requested_gb must be at least 1" not in out


def test_string_requested_size_is_a_number(tmp_path):
    rc, out = plan("-e", INCIDENT, extra_file="!unsafe 'plan_requested_gb': !unsafe '44'\n", tmp_path=tmp_path)
    assert rc == 0, out
    assert "msg: --hicache-size 44" in out


def test_unit_in_requested_size_is_explained(tmp_path):
    rc, out = plan("-e", INCIDENT, extra_file="!unsafe 'plan_requested_gb': !unsafe '300GB'\n", tmp_path=tmp_path)
    assert rc != 0
    assert "give a bare whole number of decimal GB per rank" in out


def test_blank_role_setting_is_said(tmp_path):
    rc, out = plan("-i", "inventories/lab/hosts.yml", "-e", "plan_host=ct129", tmp_path=tmp_path,
                   extra_file="!unsafe 'sglang_server_hicache_requested_gb': !unsafe ''\n!unsafe 'sglang_server_version': null\n")
    assert rc != 0
    assert "sglang_server_version must be set" in out
    assert "sglang_server_hicache_requested_gb, sglang_server_version are blank in the extra variables" in out
    assert "Traceback" not in out


def test_awx_style_run_through_ansible_runner(tmp_path):
    """tests/awx/runner/awx_run.py: the plan job template's way (private data dir, !unsafe extravars, runner)."""
    pytest.importorskip("ansible_runner")
    pytest.importorskip("distlib")
    pdd = tmp_path / "job"
    run = subprocess.run([sys.executable, "tests/awx/runner/awx_run.py", "--keep", str(pdd), "--playbook", "playbooks/plan.yml",
                          "--survey", "awx/surveys/plan.yml", "--inventory", "inventories/lab/hosts.yml",
                          "--answer", "plan_host=ct129", "--answer", "sglang_server_tp_size=2"],
                         cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)
    out = run.stdout + run.stderr
    assert run.returncode == 0, out
    assert "!unsafe 'plan_host': !unsafe 'ct129'" in (pdd / "env" / "extravars").read_text()
    assert '"hicache_plan": {"host": "ct129", "fits": true, "per_rank_gb": 1' in out


def test_a_refused_plan_fails_the_awx_job_with_its_arithmetic(tmp_path):
    """What AWX keeps of a refused plan job: status failed, the reason in the output, the plan in artifact_data."""
    out_json = tmp_path / "job.json"
    run = subprocess.run([sys.executable, "tests/awx/runner/awx_run.py", "--json-out", str(out_json),
                          "--playbook", "playbooks/plan.yml", "--survey", "awx/surveys/plan.yml",
                          "--inventory", "inventories/lab/hosts.yml", "--answer", "plan_host=ct129",
                          "--answer", "plan_requested_gb=300"],
                         cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)
    job = json.loads(out_json.read_text())
    assert run.returncode != 0 and job["status"] == "failed", run.stdout[-3000:]
    tail = flat(job["stdout_tail"])
    assert "2 ranks x 300.0 GB = 600.0 GB pinned" in tail and "DOES NOT FIT" in tail
    assert "Largest safe value: --hicache-size 1" in tail
    assert job["artifact_data"]["hicache_plan"]["fits"] is False
    assert job["artifact_data"]["hicache_plan"]["max_per_rank_gb"] == 1
