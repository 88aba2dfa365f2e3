# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The rulebooks of extensions/eda/ against what they name: the event source's file and its arguments, the vars
file that sets them, recover.yml's allow-list (run_playbook), and the AWX job template and its survey
(run_job_template: AWX refuses extra vars a survey does not ask). The rulebook test on the lab
(tests/eda/run_unattended.py) runs gpu_recover.yml for real; the AWX one cannot run here (no AWX)."""
from __future__ import annotations

import os
import re

import pytest
import yaml

from ansible_collections.inferops.gpu_inference.plugins.module_utils.deploy import playbook_inputs as pi

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
EDA = os.path.join(ROOT, "extensions", "eda")


def load(path):
    with open(path) as f:
        return yaml.safe_load(f)


def rules(book):
    return [r for rs in load(os.path.join(EDA, "rulebooks", book)) for r in rs["rules"]]


@pytest.mark.parametrize("book", ["gpu_recover.yml", "gpu_recover_awx.yml"])
def test_rulebook_source_vars_and_strategy(book):
    rulesets = load(os.path.join(EDA, "rulebooks", book))
    watch_vars = load(os.path.join(EDA, "rulebooks", "gpu_watch_vars.yml"))
    source_doc = open(os.path.join(EDA, "plugins", "event_source", "gpu_watch.py")).read()
    for rs in rulesets:
        # One recovery at a time: the next event's action waits for the running one.
        assert rs["execution_strategy"] == "sequential"
        for src in rs["sources"]:
            args = src["inferops.gpu_inference.gpu_watch"]
            for key, value in args.items():
                assert re.search(r"^  %s: " % key, source_doc, re.M), "gpu_watch does not document %s" % key
                used = re.findall(r"\{\{\s*(\w+)\s*\}\}", str(value))
                assert used and all(u in watch_vars for u in used), (key, value)
        used = set(re.findall(r"\{\{\s*(gpu_watch_\w+)", open(os.path.join(EDA, "rulebooks", book)).read()))
        assert used <= set(watch_vars)
    conds = [r["condition"] for r in rules(book)]
    assert any('event.action == "recover"' in c for c in conds)
    assert any('event.action == "alert_budget_exhausted"' in c for c in conds)


def test_local_rulebook_runs_recover_with_accepted_names():
    accepted = pi.allowed("recover.yml", load)
    runs = [a["run_playbook"] for r in rules("gpu_recover.yml") for a in r["actions"] if "run_playbook" in a]
    assert len(runs) == 1
    assert runs[0]["name"] == "inferops.gpu_inference.recover"
    assert os.path.isfile(os.path.join(ROOT, "playbooks", "recover.yml"))
    # ansible-rulebook adds ansible_eda to every playbook it runs.
    assert set(runs[0]["extra_vars"]) | {"ansible_eda"} <= set(accepted)


def test_awx_rulebook_launches_the_template_with_its_survey_names():
    config = load(os.path.join(ROOT, "awx", "config.yml"))
    runs = [a["run_job_template"] for r in rules("gpu_recover_awx.yml") for a in r["actions"] if "run_job_template" in a]
    assert len(runs) == 1
    jt = [t for t in config["inferops_awx_job_templates"] if t["name"] == runs[0]["name"]]
    assert jt and jt[0]["playbook"] == "playbooks/recover.yml"
    survey = {q["variable"]: q for q in load(os.path.join(ROOT, "awx", jt[0]["survey"]))["spec"]}
    assert runs[0]["include_events"] is False  # ansible_eda is in no survey: AWX would refuse the launch
    extra = runs[0]["job_args"]["extra_vars"]
    assert set(extra) <= set(survey)
    for name, value in extra.items():
        if survey[name]["type"] == "multiplechoice" and "{{" not in str(value):
            assert value in survey[name]["choices"], (name, value)
    assert "| string | lower" in extra["recover_relaunch"]  # the survey's choices are the strings "true"/"false"
