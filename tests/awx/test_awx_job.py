"""tests/awx/runner/: the harness against AWX's rules (ansible/awx e21dd0a, cited in awx_job.py): the launch rules of
the four surveys, the private data dir as RunJob lays it out (read back from disk), credentials through their types'
injectors, and the workflow's DAG as WorkflowJobNode.get_job_kwargs passes variables between nodes."""

from __future__ import annotations

import json
import os
import shlex
import stat
import subprocess

import pytest
import yaml

from conftest import ROOT, load

import awx_job  # tests/awx/runner (pytest.ini)
import awx_workflow

RECOVER = load("awx/surveys/recover.yml")
DEPLOY = load("awx/surveys/deploy.yml")
PLAN = load("awx/surveys/plan.yml")
WORKFLOW = load("awx/surveys/recover_then_deploy.yml")


# --- Launch rules (SurveyJobTemplateMixin._accept_or_ignore_variables) -----------------------------------------

def test_required_question_with_a_default_must_still_be_answered():
    with pytest.raises(awx_job.LaunchRefused) as exc:
        awx_job.launch_extra_vars(RECOVER, {"recover_vmid": 129})
    assert "'recover_relaunch' value missing" in str(exc.value)
    assert "'recover_allow_reboot' value missing" in str(exc.value)


def test_blank_integer_and_multiple_choice_answers_are_refused():
    with pytest.raises(awx_job.LaunchRefused) as exc:
        awx_job.launch_extra_vars(DEPLOY, {"deploy_containers": "ct129", "sglang_server_tp_size": "",
                                           "sglang_server_model_preset": ""})
    assert "Value  for 'sglang_server_tp_size' expected to be an integer." in str(exc.value)
    assert "Value  for 'sglang_server_model_preset' expected to be one of" in str(exc.value)


@pytest.mark.parametrize("name", ["sglang_server_version", "sglang_server_tp_size", "sglang_server_enable_dp_attention"])
def test_null_is_refused_for_every_type(name):
    with pytest.raises(awx_job.LaunchRefused):
        awx_job.launch_extra_vars(DEPLOY, {"deploy_containers": "ct129", name: None})


def test_a_variable_the_survey_does_not_ask_is_refused():
    with pytest.raises(awx_job.LaunchRefused) as exc:
        awx_job.launch_extra_vars(PLAN, {"plan_host": "ct129", "plan_node": "pve1"})
    assert "Variables plan_node are not allowed on launch" in str(exc.value)


def test_blank_text_is_accepted_and_defaults_go_under_the_answers():
    extra = awx_job.launch_extra_vars(DEPLOY, {"sglang_server_version": "", "deploy_containers": "ct129"})
    assert extra == {"deploy_containers": "ct129", "sglang_server_version": ""}
    extra = awx_job.launch_extra_vars(RECOVER, {"recover_vmid": 129, "recover_relaunch": "true", "recover_allow_reboot": "false"})
    assert extra == {"recover_vmid": 129, "recover_relaunch": "true", "recover_allow_reboot": "false"}


def test_the_docs_launch_examples_are_accepted():
    """docs/awx.md: every `awx ... launch --extra_vars` example passes AWX's launch validation."""
    text = open(os.path.join(ROOT, "docs", "awx.md"), encoding="utf-8").read()
    surveys = {"GPU host: plan": PLAN, "GPU host: deploy": DEPLOY, "GPU host: recover": RECOVER,
               "GPU host: recover then deploy": WORKFLOW}
    found = 0
    for line in text.splitlines():
        for name, survey in surveys.items():
            if ('launch "%s"' % name) in line and "--extra_vars" in line:
                argv = shlex.split(line)
                answers = json.loads(argv[argv.index("--extra_vars") + 1])
                awx_job.launch_extra_vars(survey, answers)
                found += 1
    assert found == 4, "docs/awx.md should show one awx CLI launch per template and the workflow"


# --- The private data dir (RunJob), read back from disk --------------------------------------------------------

PVE = {"api_user": "root@pam", "api_token_id": "ansible", "api_token_secret": "s3cret-token", "api_password": "",
       "ca_bundle": "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"}


@pytest.fixture(scope="module")
def layout(tmp_path_factory):
    pytest.importorskip("distlib")
    pdd = str(tmp_path_factory.mktemp("job"))
    os.environ["INFEROPS_TEST_CALLER_ONLY"] = "1"  # must not reach the job
    job = awx_job.new_job({"name": "GPU host: plan", "playbook": "playbooks/plan.yml", "id": 3},
                          awx_job.launch_extra_vars(PLAN, {"plan_host": "ct129"}), 7, awx_job.git_revision(),
                          "inventories/lab/hosts.yml",
                          [(load("awx/credential_types/proxmox_ve.yml"), PVE)], job_type="check")
    built = awx_job.build_private_data_dir(pdd, job)
    return pdd, built, job


def test_project_is_the_committed_revision(layout):
    pdd, _built, job = layout
    tracked = subprocess.run(["git", "ls-tree", "-r", "--name-only", job["revision"]], cwd=ROOT, capture_output=True,
                             text=True, check=True).stdout.split()
    # git tracks a symbolic link as one entry, and os.walk lists a link to a directory among the directories
    found = sorted(os.path.relpath(os.path.join(d, f), os.path.join(pdd, "project"))
                   for d, dirs, files in os.walk(os.path.join(pdd, "project"))
                   for f in files + [x for x in dirs if os.path.islink(os.path.join(d, x))])
    assert found == sorted(tracked)
    assert not os.path.exists(os.path.join(pdd, "project", "inventories", "lab", "group_vars", "all", "vault.yml"))
    assert os.path.isdir(os.path.join(pdd, "requirements_collections", "ansible_collections", "inferops", "gpu_inference"))


def test_inventory_is_a_json_script_of_the_committed_inventory(layout):
    pdd, _built, _job = layout
    script = os.path.join(pdd, "inventory", "hosts")
    assert stat.S_IMODE(os.stat(script).st_mode) == 0o700
    data = json.loads(subprocess.run([script], capture_output=True, text=True, check=True).stdout)
    assert data["all"]["children"] and "sglang_containers" in data["all"]["children"]
    assert data["sglang_containers"]["hosts"] == ["ct129", "ct132"]
    assert data["_meta"]["hostvars"]["ct129"]["proxmox_vmid"] == 129
    assert data["_meta"]["hostvars"]["ct129"]["remote_tower_enabled"] == "true"
    assert data["all"]["vars"]["proxmox_api_token_id"] == "lab"
    assert "vault" not in json.dumps(data)  # the lab's secrets are not in the tracked inventory


def test_env_is_awx_own_not_the_callers(layout):
    pdd, _built, job = layout
    env = yaml.safe_load(open(os.path.join(pdd, "env", "envvars"), encoding="utf-8"))
    assert "INFEROPS_TEST_CALLER_ONLY" not in env and "ANSIBLE_CONFIG" not in env and "ANSIBLE_VAULT_PASSWORD_FILE" not in env
    assert env["ANSIBLE_HOST_KEY_CHECKING"] == "False" and env["JOB_ID"] == "7" and env["INVENTORY_ID"] == "1"
    assert env["PROJECT_REVISION"] == job["revision"] and env["AWX_PRIVATE_DATA_DIR"] == pdd
    assert env["ANSIBLE_COLLECTIONS_PATH"].startswith(os.path.join(pdd, "requirements_collections") + ":")
    assert "INFEROPS_TEST_CALLER_ONLY" not in awx_job.ee_environment(pdd)
    assert json.load(open(os.path.join(pdd, "env", "settings"), encoding="utf-8"))["suppress_output_file"] is True
    assert open(os.path.join(pdd, "env", "cmdline"), encoding="utf-8").read() == "--check -u root"


def test_credential_injectors_render_as_awx_does(layout):
    pdd, built, _job = layout
    env = yaml.safe_load(open(os.path.join(pdd, "env", "envvars"), encoding="utf-8"))
    assert env["INFEROPS_PVE_API_TOKEN_SECRET"] == "s3cret-token"
    assert env["INFEROPS_PVE_API_PASSWORD"] == ""  # an empty input renders as ''
    ca = env["INFEROPS_PVE_API_CA_PATH"]
    assert os.path.dirname(ca) == os.path.join(pdd, "env") and open(ca, encoding="utf-8").read() == PVE["ca_bundle"]
    assert stat.S_IMODE(os.stat(ca).st_mode) == 0o600
    assert built["safe_env"]["INFEROPS_PVE_API_TOKEN_SECRET"] == "**********"


def test_extravars_are_unsafe_with_awx_meta_vars(layout):
    pdd, built, _job = layout
    text = open(os.path.join(pdd, "env", "extravars"), encoding="utf-8").read()
    assert "!unsafe 'plan_host': !unsafe 'ct129'" in text
    meta = [k for k in built["extra_vars"] if k.startswith(("awx_", "tower_"))]
    assert len(meta) >= 28 and "awx_job_template_name" in meta and "tower_project_revision" in meta


# --- The workflow (WorkflowJobNode.get_job_kwargs, dag_workflow) ------------------------------------------------

def _fake_run(results):
    seen = []

    def run(job, keep=None):
        seen.append(job)
        status, artifacts = results[job["template_name"]]
        return {"id": job["id"], "name": job["template_name"], "status": status, "rc": 0 if status == "successful" else 2,
                "artifact_data": artifacts, "stdout": "", "extra_vars": job["extra_vars"]}
    return run, seen


def test_workflow_passes_answers_to_every_node_and_artifacts_to_the_next(monkeypatch):
    run, seen = _fake_run({"GPU host: recover": ("successful", {"gpu_recover": {"verdict": "Clean", "vmid": 129}}),
                           "GPU host: deploy": ("successful", {"sglang_deploy": {}})})
    monkeypatch.setattr(awx_job, "run", run)
    result = awx_workflow.run_workflow("GPU host: recover then deploy",
                                       {"recover_vmid": 129, "deploy_containers": "ct129", "recover_allow_reboot": "false"},
                                       "inventories/lab/hosts.yml", [], "HEAD")
    assert result["status"] == "successful"
    recover, deploy = seen
    assert recover["extra_vars"] == {"recover_vmid": 129, "deploy_containers": "ct129", "recover_allow_reboot": "false",
                                     "recover_relaunch": "false"}  # the job template's survey default under them
    assert deploy["extra_vars"]["gpu_recover"] == {"verdict": "Clean", "vmid": 129}
    assert deploy["extra_vars"]["deploy_containers"] == "ct129" and deploy["launch_type"] == "workflow"


def test_a_failed_recover_does_not_run_deploy_and_fails_the_workflow(monkeypatch):
    run, seen = _fake_run({"GPU host: recover": ("failed", {})})
    monkeypatch.setattr(awx_job, "run", run)
    result = awx_workflow.run_workflow("GPU host: recover then deploy",
                                       {"recover_vmid": 129, "deploy_containers": "ct129", "recover_allow_reboot": "false"},
                                       "inventories/lab/hosts.yml", [], "HEAD")
    assert [j["template_name"] for j in seen] == ["GPU host: recover"]
    assert result["status"] == "failed" and result["do_not_run"] == ["deploy"]


def test_workflow_launch_is_validated_against_its_survey():
    with pytest.raises(awx_job.LaunchRefused) as exc:
        awx_workflow.run_workflow("GPU host: recover then deploy", {"recover_vmid": 129}, "inventories/lab/hosts.yml", [], "HEAD")
    assert "'deploy_containers' value missing" in str(exc.value)


def _set_stats_keys(folder):
    keys = set()
    for dirpath, _dirs, files in os.walk(os.path.join(ROOT, folder)):
        for name in files:
            if name.endswith(".yml"):
                for task in yaml.safe_load(open(os.path.join(dirpath, name), encoding="utf-8")) or []:
                    if isinstance(task, dict) and "ansible.builtin.set_stats" in task:
                        keys.update(task["ansible.builtin.set_stats"]["data"])
    return keys


def test_each_workflow_node_accepts_what_awx_passes_it():
    """A node's job gets the workflow's answers, its template's survey defaults and its parent's artifacts as extra
    vars; the playbook's allow-list (extra_vars_check) must accept every one of them, or the node fails at once."""
    from ansible_collections.inferops.gpu_inference.plugins.module_utils.deploy import playbook_inputs as pi
    loader = lambda path: yaml.safe_load(open(path, encoding="utf-8"))  # noqa: E731
    config = load("awx/config.yml")
    wf = config["inferops_awx_workflows"][0]
    templates = {jt["name"]: jt for jt in config["inferops_awx_job_templates"]}
    artifacts = {"recover": _set_stats_keys("roles/gpu_recover")}
    assert artifacts["recover"] == {"gpu_recover"}
    for node in wf["workflow_nodes"]:
        jt = templates[node["unified_job_template"]["name"]]
        names = {q["variable"] for q in WORKFLOW["spec"]}
        names |= {q["variable"] for q in load(os.path.join("awx", jt["survey"]))["spec"] if "default" in q}
        parents = [n["identifier"] for n in wf["workflow_nodes"]
                   if any(c["identifier"] == node["identifier"] for c in (n.get("related") or {}).get("success_nodes", []))]
        for parent in parents:
            names |= artifacts.get(parent, set())
        playbook = os.path.basename(jt["playbook"])
        assert pi.undocumented(sorted(names), pi.allowed(playbook, loader)) == [], (node["identifier"], playbook)
