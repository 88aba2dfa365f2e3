"""The AWX surveys (awx/surveys/*.yml) against AWX's rules and against what the playbooks and roles read."""

from __future__ import annotations

import glob
import os
import re

import pytest

from conftest import ROOT, awx_config, load
import awx_rules

from ansible_collections.inferops.gpu_inference.plugins.module_utils.sizing import hicache_geometry
from ansible_collections.inferops.gpu_inference.plugins.module_utils.deploy import sglang_extra_vars

SURVEYS = sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "awx", "surveys", "*.yml")))
ROLES = ("pve_gpu_container", "sglang_server", "gpu_recover")
# The roles each playbook runs (directly, through include_role, or deploy.yml through recover.yml's import).
PLAYBOOK_ROLES = {
    "playbooks/deploy.yml": ("pve_gpu_container", "sglang_server"),
    "playbooks/plan.yml": ("pve_gpu_container", "sglang_server"),
    "playbooks/recover.yml": ("gpu_recover", "pve_gpu_container", "sglang_server"),
}
PLAYBOOK_IMPORTS = {"playbooks/recover.yml": ("playbooks/deploy.yml",)}
SPEC_TYPE_TO_SURVEY = {"int": {"integer"}, "float": {"float", "integer"}, "bool": {"multiplechoice"},
                       "str": {"text", "textarea", "password", "multiplechoice"}, "raw": set(awx_rules.SURVEY_TYPE_MAPPING)}


def _role_options(role):
    """{name: argument spec} over every entry point of the role."""
    spec = load("roles/%s/meta/argument_specs.yml" % role)["argument_specs"]
    out = {}
    for entry in spec.values():
        out.update(entry.get("options") or {})
    return out


def _code(path):
    """The playbook's text without comments (a variable must be read by its YAML, not mentioned in a comment)."""
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        return "\n".join(re.sub(r"(^|\s)#.*$", "", line) for line in f)


def _survey_playbooks():
    """Each survey file with the playbooks whose extra vars its answers become."""
    cfg = awx_config()
    out = {}
    for jt in cfg["inferops_awx_job_templates"]:
        out.setdefault(jt["survey"], set()).add(jt["playbook"])
    by_name = {jt["name"]: jt["playbook"] for jt in cfg["inferops_awx_job_templates"]}
    for wf in cfg["inferops_awx_workflows"]:
        out.setdefault(wf["survey"], set()).update(by_name[n["unified_job_template"]["name"]] for n in wf["workflow_nodes"])
    return out


def _reads(playbook, variable):
    """Whether running ``playbook`` reads ``variable``: its own YAML uses it, or a role it runs declares it."""
    books = (playbook,) + PLAYBOOK_IMPORTS.get(playbook, ())
    if any(re.search(r"(?<![\w.])%s(?!\w)" % re.escape(variable), _code(b)) for b in books):
        return True
    return any(variable in _role_options(r) for r in PLAYBOOK_ROLES[playbook])


def test_every_survey_file_is_used():
    assert sorted("awx/" + s for s in _survey_playbooks()) == SURVEYS


@pytest.mark.parametrize("path", SURVEYS)
def test_survey_follows_awx_rules(path):
    assert awx_rules.survey_errors(load(path)) == []


@pytest.mark.parametrize("path", SURVEYS)
def test_survey_variables_are_read_by_the_playbooks(path):
    playbooks = _survey_playbooks()[os.path.relpath(path, "awx")]
    for item in load(path)["spec"]:
        unread = [p for p in sorted(playbooks) if not _reads(p, item["variable"])]
        # A workflow's answers reach every node; each must be read by at least one of them.
        assert len(unread) < len(playbooks), "%s: %s is read by none of %s" % (path, item["variable"], sorted(playbooks))


@pytest.mark.parametrize("path", SURVEYS)
def test_survey_variables_are_not_computed_or_private(path):
    for item in load(path)["spec"]:
        var = item["variable"]
        assert not var.startswith(sglang_extra_vars.PRIVATE_PREFIXES) and not var.startswith("_"), var
        assert sglang_extra_vars.injected_names([var]) == []


@pytest.mark.parametrize("path", SURVEYS)
def test_role_settings_have_no_default_and_are_optional(path):
    """AWX applies every survey default at every launch, and an extra var hides the inventory's value for every host:
    a question on a per-host role setting must have no default, and must be optional (unanswered = not sent)."""
    for item in load(path)["spec"]:
        if item["variable"].startswith(sglang_extra_vars.ROLE_PREFIXES):
            assert "default" not in item or item["default"] is None, item["variable"]
            assert item["required"] is False, item["variable"]


@pytest.mark.parametrize("path", SURVEYS)
def test_survey_types_match_the_argument_specs(path):
    options = {}
    for role in ROLES:
        options.update(_role_options(role))
    for item in load(path)["spec"]:
        spec = options.get(item["variable"])
        if spec is None:
            continue  # a playbook variable
        assert item["type"] in SPEC_TYPE_TO_SURVEY[spec.get("type", "str")], (item["variable"], spec.get("type"))
        if spec.get("type") == "bool":
            assert sorted(item["choices"]) == ["false", "true"], item["variable"]
        if item["variable"] == "sglang_server_model_preset":
            assert set(item["choices"]) <= set(hicache_geometry.MODEL_PRESETS), sorted(set(item["choices"]) - set(hicache_geometry.MODEL_PRESETS))


def test_answers_ranges_match_what_the_plan_accepts():
    """Integer bounds of the layout questions are those the request stage enforces (sglang_request.request)."""
    for path in SURVEYS:
        for item in load(path)["spec"]:
            if item["variable"] in ("sglang_server_tp_size", "sglang_server_pp_size", "sglang_server_dp_size"):
                assert (item["min"], item["max"]) == (1, 1024), (path, item["variable"])
            if item["variable"] == "recover_vmid":
                assert item["min"] == 100, path


# The validator itself: each rule is exercised by a spec AWX refuses.
GOOD = {"question_name": "Q", "variable": "v", "type": "text", "required": False}


@pytest.mark.parametrize("item, expected", [
    ({"question_name": "Q", "variable": "v", "type": "text"}, "'required' missing"),
    (dict(GOOD, type="string"), "not one of the allowed question types"),
    (dict(GOOD, required="no"), "'required' in survey question 0 expected to be boolean"),
    (dict(GOOD, variable="not-a-name"), "not a valid Ansible variable name"),
    (dict(GOOD, type="integer", default="4"), "expected to be integer"),
    (dict(GOOD, type="integer", min=1, max=8, default=9), "too large"),
    (dict(GOOD, min=3, default="ab"), "too small"),
    (dict(GOOD, min="1"), "The min limit"),
    (dict(GOOD, type="multiplechoice"), "must specify choices"),
    (dict(GOOD, type="multiplechoice", choices=["a", "b"], default="c"), "Default choice must be answered"),
    (dict(GOOD, type="multiplechoice", choices=["a", "b"], default="a\nb"), "only have one default"),
    (dict(GOOD, type="multiselect", choices=["a", "b"], default="a\nc"), "Default choice must be answered"),
    (dict(GOOD, type="password", default="hunter2"), "password default must be empty"),
    (dict(GOOD, default="$encrypted$"), "reserved keyword"),
])
def test_validator_refuses_what_awx_refuses(item, expected):
    errors = awx_rules.survey_errors({"name": "n", "description": "d", "spec": [item]})
    assert any(expected in e for e in errors), errors


def test_validator_refuses_bad_tops_and_duplicates():
    assert awx_rules.survey_errors({"name": "n", "spec": [GOOD]}) == ["Field 'description' is missing from survey spec."]
    assert awx_rules.survey_errors({"name": "n", "description": "d", "spec": []}) == ["'spec' doesn't contain any items."]
    assert any("duplicated" in e for e in awx_rules.survey_errors({"name": "n", "description": "d", "spec": [GOOD, GOOD]}))
    assert awx_rules.survey_errors({"name": "n", "description": "d", "spec": [GOOD]}) == []


def test_required_answer_missing_is_refused_at_launch():
    item = {"question_name": "Q", "variable": "recover_vmid", "type": "integer", "required": True, "min": 100}
    assert awx_rules.element_errors(item, {}) == ["'recover_vmid' value missing"]
    assert awx_rules.element_errors(item, {"recover_vmid": "129"}) == ["Value 129 for 'recover_vmid' expected to be an integer."]
    assert awx_rules.element_errors(item, {"recover_vmid": 129}) == []


def test_reads_is_not_vacuous():
    assert _reads("playbooks/plan.yml", "plan_host")
    assert not _reads("playbooks/plan.yml", "plan_hosts")
    assert not _reads("playbooks/deploy.yml", "recover_vmid")
    assert _reads("playbooks/recover.yml", "deploy_containers")  # recover.yml imports deploy.yml


@pytest.mark.parametrize("path", SURVEYS)
def test_no_question_for_what_the_playbook_finds_itself(path):
    """recover.yml finds the node from the VMID only while recover_node is undefined; any survey question would define
    it (its default at every launch, or blank when unanswered, which matches no host)."""
    assert "recover_node" not in [item["variable"] for item in load(path)["spec"]]
