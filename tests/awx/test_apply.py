"""awx/apply.yml and awx/config.yml: every awx.awx option exists (snapshot of the modules' documentation,
awx_module_options.json), the objects reference each other consistently, and the playbook parses."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from conftest import ROOT, awx_config, load

BIN = os.path.dirname(sys.executable)
OPTIONS = json.load(open(os.path.join(os.path.dirname(__file__), "awx_module_options.json"), encoding="utf-8"))


def _names(options):
    out = set(options)
    for spec in options.values():
        out.update(spec["aliases"])
    return out


def _awx_tasks(tasks):
    for task in tasks:
        for key, args in task.items():
            if key.startswith("awx.awx."):
                yield key[len("awx.awx."):], args, task["name"]
        yield from _awx_tasks(task.get("block") or [])


def test_every_option_of_apply_exists_in_the_module():
    play = load("awx/apply.yml")[0]
    seen = set()
    for module, args, name in _awx_tasks(play["tasks"]):
        assert module in OPTIONS["modules"], "%s: awx.awx.%s is not in the snapshot; run tests/awx/snapshot_awx_options.py" % (name, module)
        known = _names(OPTIONS["modules"][module]) | _names(OPTIONS["auth_options"])
        assert set(args) <= known, "%s: awx.awx.%s has no option %s" % (name, module, sorted(set(args) - known))
        seen.add(module)
    assert seen == set(OPTIONS["modules"])


def test_workflow_nodes_use_the_modules_suboptions():
    node_opts = OPTIONS["modules"]["workflow_job_template"]["workflow_nodes"]["suboptions"]
    ujt = node_opts["unified_job_template"]["suboptions"]
    for wf in awx_config()["inferops_awx_workflows"]:
        for node in wf["workflow_nodes"]:
            # related is read by the module's code (success_nodes, failure_nodes, always_nodes), not documented.
            assert set(node) - {"related"} <= _names(node_opts), node
            assert set(node["unified_job_template"]) <= _names(ujt) | {"type"}, node
            assert set(node.get("related", {})) <= {"success_nodes", "failure_nodes", "always_nodes", "credentials"}


def test_config_is_consistent():
    cfg = awx_config()
    names = [jt["name"] for jt in cfg["inferops_awx_job_templates"]]
    assert names == ["GPU host: deploy", "GPU host: recover", "GPU host: plan"]
    for jt in cfg["inferops_awx_job_templates"]:
        assert os.path.isfile(os.path.join(ROOT, jt["playbook"])), jt["playbook"]
        assert os.path.isfile(os.path.join(ROOT, "awx", jt["survey"])), jt["survey"]
        assert set(jt["credential_types"]) <= {"machine", "proxmox_ve", "sglang_api_key"}
    wf = cfg["inferops_awx_workflows"]
    assert [w["name"] for w in wf] == ["GPU host: recover then deploy"]
    nodes = {n["identifier"]: n for n in wf[0]["workflow_nodes"]}
    assert nodes["recover"]["unified_job_template"]["name"] == "GPU host: recover"
    assert nodes["deploy"]["unified_job_template"]["name"] == "GPU host: deploy"
    assert nodes["recover"]["related"]["success_nodes"] == [{"identifier": "deploy"}]
    for node in nodes.values():
        assert node["unified_job_template"]["name"] in names
        for edge in node.get("related", {}).values():
            assert all(e["identifier"] in nodes for e in edge)


def test_awx_does_not_list_data_files_as_playbooks():
    """AWX offers any .yml with a line matching ^\\s*-?\\s*(hosts|include|import_playbook): as a playbook."""
    import re
    pattern = re.compile(r"^\s*-?\s*(hosts|include|import_playbook):")
    for dirpath, _, files in os.walk(os.path.join(ROOT, "awx")):
        for f in files:
            path = os.path.join(dirpath, f)
            # The site template is a project of its own (test_site_template.py lists its playbooks by AWX's rule).
            if f.endswith(".yml") and path != os.path.join(ROOT, "awx", "apply.yml") and \
                    not path.startswith(os.path.join(ROOT, "awx", "site-template") + os.sep):
                with open(path, encoding="utf-8") as fh:
                    assert not any(pattern.match(line) for line in fh), path


def test_apply_parses(tmp_path):
    """ansible-playbook --syntax-check with stand-ins for the awx.awx modules (no package carries the collection;
    set INFEROPS_AWX_COLLECTIONS to a path holding the real one to check against it instead)."""
    real = os.environ.get("INFEROPS_AWX_COLLECTIONS")
    path = real
    if not real:
        modules = tmp_path / "ansible_collections" / "awx" / "awx" / "plugins" / "modules"
        modules.mkdir(parents=True)
        (modules.parent.parent / "galaxy.yml").write_text("namespace: awx\nname: awx\nversion: 0.0.0\n")
        for m in OPTIONS["modules"]:
            (modules / (m + ".py")).write_text("# stand-in for the syntax check\n")
        path = str(tmp_path)
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"),
               ANSIBLE_COLLECTIONS_PATH=path + os.pathsep + os.path.join(ROOT, ".collections"))
    run = subprocess.run([os.path.join(BIN, "ansible-playbook"), "--syntax-check", "awx/apply.yml"], cwd=ROOT, env=env,
                         capture_output=True, text=True, check=False)
    assert run.returncode == 0, run.stdout + run.stderr
