"""awx/site-template: a site's own repository as the AWX project, with the collection installed by the project sync
and the inventory sourced from the site's files, never from a fork of this collection. Checked by AWX's rules
(runner/awx_job.py): the job templates of awx/config.yml name playbooks AWX lists in the site's project, each a
one-line import of a playbook the collection ships; the sync installs inferops.gpu_inference from the site's
collections/requirements.yml (Galaxy is not reachable here, so its entry is replaced by the tarball built from
this checkout, the one substitution); a plan job then runs from the site's project and inventory."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
import yaml

from conftest import ROOT, awx_config

import awx_job  # tests/awx/runner (pytest.ini)

SITE = os.path.join(ROOT, "awx", "site-template")
BIN = os.path.dirname(sys.executable)
COLLECTION = "inferops.gpu_inference"


def _yaml(path):
    with open(os.path.join(SITE, path), encoding="utf-8") as f:
        return yaml.safe_load(f)


def _template_playbooks():
    return [jt["playbook"] for jt in awx_config()["inferops_awx_job_templates"]]


def test_job_templates_name_playbooks_awx_lists_in_the_site_project():
    """Every job template's playbook is offered; AWX also offers inventory/hosts.yml (its indented hosts: lines
    match AWX's pattern), and nothing else."""
    listed = awx_job.project_playbooks(SITE)
    assert set(_template_playbooks()) <= set(listed), listed
    assert set(listed) - set(_template_playbooks()) == {"inventory/hosts.yml"}, listed


def test_the_listing_rule_refuses_what_awx_refuses(tmp_path):
    """The rule itself, on files AWX would not offer: a data file, a playbook under roles/, a .yaml.j2."""
    (tmp_path / "vars.yml").write_text("---\nhosts_count: 3\n")
    (tmp_path / "roles" / "r").mkdir(parents=True)
    (tmp_path / "roles" / "r" / "play.yml").write_text("- hosts: all\n")
    (tmp_path / "site.yml.j2").write_text("- hosts: all\n")
    (tmp_path / "short.yml").write_text("- import_playbook: a.b.c\n")
    (tmp_path / "fqcn.yml").write_text("- name: x\n  ansible.builtin.import_playbook: a.b.c\n")
    assert awx_job.project_playbooks(str(tmp_path)) == ["fqcn.yml", "short.yml"]


def test_each_playbook_imports_the_collections_own():
    for rel in _template_playbooks():
        plays = _yaml(rel)
        assert len(plays) == 1 and set(plays[0]) == {"name", "ansible.builtin.import_playbook"}, rel
        target = plays[0]["ansible.builtin.import_playbook"]
        namespace, name, playbook = target.split(".")
        assert "%s.%s" % (namespace, name) == COLLECTION, rel
        assert playbook == os.path.splitext(os.path.basename(rel))[0], rel
        assert os.path.isfile(os.path.join(ROOT, "playbooks", playbook + ".yml")), target


def test_requirements_pin_a_range_that_admits_this_release():
    from ansible.galaxy.dependency_resolution.versioning import meets_requirements
    with open(os.path.join(ROOT, "galaxy.yml"), encoding="utf-8") as f:
        version = yaml.safe_load(f)["version"]
    entries = _yaml("collections/requirements.yml")["collections"]
    assert [e["name"] for e in entries] == [COLLECTION]
    assert meets_requirements(version, entries[0]["version"]), (version, entries[0]["version"])
    assert not meets_requirements("9.0.0", entries[0]["version"]), "the pin must have an upper bound"


def test_no_secret_in_the_site_inventory():
    """AWX imports only committed files: the credentials carry the secrets, the inventory names none."""
    for dirpath, _, files in os.walk(os.path.join(SITE, "inventory")):
        for name in files:
            with open(os.path.join(dirpath, name), encoding="utf-8") as f:
                text = f.read()
            for secret in ("vault_", "api_token_secret", "api_password", "sglang_server_api_key"):
                assert secret not in text.replace("proxmox_api_token_* / proxmox_api_password", ""), (name, secret)


@pytest.fixture(scope="module")
def site_project(tmp_path_factory):
    """The site template as a site's repository, its requirement's source replaced by this checkout's tarball."""
    pytest.importorskip("ansible_runner")
    pytest.importorskip("distlib")
    work = tmp_path_factory.mktemp("site")
    src = work / "collection-src"
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, capture_output=True,
                           check=True).stdout.split(b"\0")
    for rel in filter(None, (f.decode() for f in files)):
        path = os.path.join(ROOT, rel)
        if os.path.isfile(path) and not os.path.islink(path):
            os.makedirs(os.path.dirname(os.path.join(src, rel)), exist_ok=True)
            shutil.copy2(path, os.path.join(src, rel))
    env = {"PATH": BIN + os.pathsep + "/usr/bin:/bin", "HOME": str(work), "LANG": "C.UTF-8"}
    subprocess.run([os.path.join(BIN, "ansible-galaxy"), "collection", "build", "--output-path", str(work), str(src)],
                   env=env, check=True, capture_output=True)
    tarball = [p for p in os.listdir(work) if p.endswith(".tar.gz")]
    assert len(tarball) == 1, tarball
    project = work / "site"
    shutil.copytree(SITE, project)
    req = project / "collections" / "requirements.yml"
    entries = yaml.safe_load(req.read_text())["collections"]
    entries[0] = {"name": str(work / tarball[0]), "type": "file"}
    req.write_text(yaml.safe_dump({"collections": entries}))
    return str(project)


def test_a_plan_job_runs_from_the_site_project(site_project, tmp_path):
    """The plan job template, launched as AWX launches it: the site's project synced (the collection from its
    requirements, nowhere else: the job's collection path is the sync's folder and the EE's defaults), the site's
    inventory imported from the project, the playbook the site's import."""
    cfg = awx_config()
    template = next(jt for jt in cfg["inferops_awx_job_templates"] if jt["name"] == "GPU host: plan")
    survey = awx_job.load_yaml(os.path.join("awx", template["survey"]))
    extra = awx_job.launch_extra_vars(survey, {"plan_host": "ct129"})
    job = awx_job.new_job(template, extra, 7, awx_job.git_revision(), "inventory/hosts.yml", project_dir=site_project)
    pdd = tmp_path / "job"
    result = awx_job.run(job, keep=str(pdd))
    out = awx_job.strip_color(result["stdout"])
    assert result["status"] == "successful", out[-3000:] + result["runner_output"]
    installed = pdd / "requirements_collections" / "ansible_collections" / "inferops" / "gpu_inference"
    assert (installed / "MANIFEST.json").is_file() and (installed / "playbooks" / "plan.yml").is_file()
    assert not (pdd / "project" / "playbooks" / "tasks").exists()  # the site holds imports, not the collection
    paths = result["safe_env"]["ANSIBLE_COLLECTIONS_PATHS"].split(os.pathsep)
    assert paths[0] == str(pdd / "requirements_collections") and not any(ROOT in p for p in paths), paths
    # Either callback format (the site has no ansible.cfg: ansible-core's default callback prints msg as JSON).
    assert "tp 8 x pp 1 over 1 node(s), 8 GPU(s)" in out and "--hicache-size 48" in out
    assert result["artifact_data"]["hicache_plan"]["per_rank_gb"] == 48


def test_a_playbook_the_site_does_not_hold_is_refused(site_project, tmp_path):
    template = {"name": "GPU host: plan", "playbook": "playbooks/plan_missing.yml"}
    job = awx_job.new_job(template, {"plan_host": "ct129"}, 8, awx_job.git_revision(), "inventory/hosts.yml",
                          project_dir=site_project)
    with pytest.raises(awx_job.LaunchRefused, match="playbooks/plan_missing.yml is not one of the project's playbooks"):
        awx_job.run(job, keep=str(tmp_path / "job"))


def test_apply_sources_the_inventory_from_the_site_repository():
    """awx/apply.yml's defaults: the project is the site's repository, the inventory source its inventory/hosts.yml."""
    play_vars = awx_job.load_yaml("awx/apply.yml")[0]["vars"]
    path = play_vars["inferops_awx_inventory_source_path"]
    assert os.path.isfile(os.path.join(SITE, path)), path
    assert play_vars["inferops_awx_scm_url"] == ""  # the one value a site must give: its repository
    assert play_vars["inferops_awx_inventory"] and play_vars["inferops_awx_project"] != COLLECTION


def test_apply_requirements_name_awx_awx():
    entries = awx_job.load_yaml("awx/requirements.yml")["collections"]
    assert [e["name"] for e in entries] == ["awx.awx"]


def _tasks(tasks):
    for task in tasks:
        yield task
        yield from _tasks(task.get("block") or [])


def test_apply_wires_project_inventory_and_templates_to_the_site_repository():
    """The project is the site's Git URL; the inventory source reads that project; every job template runs from it."""
    play = awx_job.load_yaml("awx/apply.yml")[0]
    by_module = {}
    for task in _tasks(play["tasks"]):
        for key, args in task.items():
            if key.startswith("awx.awx."):
                by_module[key[len("awx.awx."):]] = args
    assert by_module["project"]["scm_url"] == "{{ inferops_awx_scm_url }}"
    assert by_module["project"]["name"] == "{{ inferops_awx_project }}"
    source = by_module["inventory_source"]
    assert (source["source"], source["source_project"], source["source_path"]) == (
        "scm", "{{ inferops_awx_project }}", "{{ inferops_awx_inventory_source_path }}")
    assert by_module["job_template"]["project"] == "{{ inferops_awx_project }}"
    assert by_module["job_template"]["playbook"] == "{{ item.playbook }}"
