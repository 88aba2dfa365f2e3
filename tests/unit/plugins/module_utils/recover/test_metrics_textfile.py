# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""metrics_textfile: the node_exporter textfile files, parsed back with an independent reading of the text format,
and the Prometheus rules shipped beside them (structure, and every metric they read is one the files write)."""
from __future__ import annotations

import os
import re

import pytest
import yaml

from ansible_collections.inferops.gpu_inference.plugins.module_utils.recover import metrics_textfile as mt

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..", "..", ".."))
SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{((?:[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\]|\\.)*",?)+)\})? (\S+)$')


def parse(text):
    """name -> {frozenset(labels): value}; checks HELP/TYPE precede each family's samples."""
    assert text.endswith("\n")
    out, declared = {}, set()
    for line in text.splitlines():
        if line.startswith("# HELP ") or line.startswith("# TYPE "):
            declared.add((line[2:6], line.split()[2]))
            continue
        m = SAMPLE.match(line)
        assert m, line
        name = m.group(1)
        assert ("HELP", name) in declared and ("TYPE", name) in declared
        labels = frozenset(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"', m.group(2) or ""))
        out.setdefault(name, {})[labels] = float(m.group(3))
    return out


RECOVER = {"vmid": 129, "node": "pve1", "verdict": "Clean", "cleared_by_rung": 4, "reboot_needed": False, "seconds": 41.5}
DEPLOY = {"vmid": "132", "node": "pve1", "host": "ct132", "node_plan_fits": True,
          "plan": {"budget_bytes": 3197665280},
          "verify": {"ok": True, "planned_pinned_bytes": 2006056960, "ranks_held_bytes": 2020397056}}


def test_recover_metrics():
    m = parse(mt.recover_metrics(RECOVER, 1700000000.5))
    lab = frozenset({("vmid", "129"), ("node", "pve1")})
    assert m["inferops_recover_last_clean"][lab] == 1
    assert m["inferops_recover_last_rung"][lab] == 4
    assert m["inferops_recover_reboot_needed"][lab] == 0
    assert m["inferops_recover_duration_seconds"][lab] == 41.5
    assert m["inferops_recover_last_run_timestamp_seconds"][lab] == 1700000000.5


def test_recover_not_clean_and_already_clean():
    m = parse(mt.recover_metrics(dict(RECOVER, verdict="Not clean", cleared_by_rung=None, reboot_needed=True), 1.0))
    assert list(m["inferops_recover_last_rung"].values()) == [-1]
    assert list(m["inferops_recover_reboot_needed"].values()) == [1]
    m = parse(mt.recover_metrics(dict(RECOVER, cleared_by_rung=None, seconds=None), 1.0))
    assert list(m["inferops_recover_last_rung"].values()) == [0]
    assert "inferops_recover_duration_seconds" not in m


def test_deploy_metrics():
    m = parse(mt.deploy_metrics(DEPLOY, 5.0))
    lab = frozenset({("vmid", "132"), ("node", "pve1"), ("host", "ct132")})
    assert m["inferops_deploy_planned_pinned_bytes"][lab] == 2006056960
    assert m["inferops_deploy_measured_pinned_bytes"][lab] == 2020397056
    assert m["inferops_deploy_node_budget_bytes"][lab] == 3197665280
    assert m["inferops_deploy_verify_ok"][lab] == 1 and m["inferops_deploy_node_plan_fits"][lab] == 1


def test_missing_figures_are_absent_not_zero():
    m = parse(mt.deploy_metrics({"vmid": 129, "node": "pve1"}, 5.0))
    assert set(m) == {"inferops_deploy_timestamp_seconds"}


def test_label_values_escaped():
    text = mt.render([("inferops_recover_last_clean", {"node": 'a"b\\c\nd'}, True)])
    assert 'node="a\\"b\\\\c\\nd"' in text
    parse(text)


@pytest.mark.parametrize("bad", [("nope", {}, 1), ("inferops_recover_last_clean", {"__x": "1"}, 1),
                                 ("inferops_recover_last_clean", {}, "1")])
def test_bad_samples_refused(bad):
    with pytest.raises(mt.MetricsError):
        mt.render([bad])


def test_bad_report_refused():
    with pytest.raises(mt.MetricsError):
        mt.recover_metrics({"verdict": "Clean"}, 1.0)


def test_recover_in_progress_and_interrupted():
    lab = frozenset({("vmid", "129"), ("node", "pve1")})
    # Written before and after each rung: only that a run is on the ladder (no end, so no recovery counted).
    m = parse(mt.recover_metrics(dict(RECOVER, finished=False, verdict="Not clean", cleared_by_rung=None), 5.0))
    assert m == {"inferops_recover_in_progress": {lab: 1}}
    m = parse(mt.recover_metrics(dict(RECOVER, finished=True, verdict="Not clean", cleared_by_rung=None,
                                      interrupted={"rung": 2, "msg": "x"}), 5.0))
    assert m["inferops_recover_in_progress"][lab] == 0 and m["inferops_recover_interrupted"][lab] == 1
    assert m["inferops_recover_last_clean"][lab] == 0 and m["inferops_recover_last_run_timestamp_seconds"][lab] == 5.0
    m = parse(mt.recover_metrics(dict(RECOVER, finished=True, interrupted=None), 5.0))
    assert m["inferops_recover_in_progress"][lab] == 0 and m["inferops_recover_interrupted"][lab] == 0


def test_alert_rules_read_only_metrics_the_files_write():
    with open(os.path.join(ROOT, "extensions", "eda", "prometheus", "inferops-gpu-rules.yml")) as f:
        doc = yaml.safe_load(f)
    assert set(doc) == {"groups"}
    names = set()
    for group in doc["groups"]:
        assert set(group) <= {"name", "interval", "rules", "limit"} and group["name"]
        for rule in group["rules"]:
            assert set(rule) <= {"alert", "expr", "for", "labels", "annotations", "keep_firing_for"}, rule
            assert re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", rule["alert"]) and rule["alert"] not in names
            names.add(rule["alert"])
            used = set(re.findall(r"\binferops_[a-z_]+\b", rule["expr"]))
            assert used and used <= set(mt.FAMILIES), (rule["alert"], used - set(mt.FAMILIES))
            assert rule["expr"].count("(") == rule["expr"].count(")")
            assert "summary" in rule["annotations"]
    assert len(names) >= 4


def test_watch_metrics():
    text = mt.watch_metrics({"pve1": {"up": False, "failed_polls": 4, "last_read_at": 1700.5},
                             "pve2": {"up": True, "failed_polls": 0, "last_read_at": None}},
                            [{"vmid": 129, "node": "pve1", "exhausted": True}, {"vmid": "132", "node": "pve2"}], 1800.0)
    m = parse(text)
    assert "\ninferops_watch_last_poll_timestamp_seconds 1800.0\n" in text       # no labels: no braces
    assert m["inferops_watch_last_poll_timestamp_seconds"] == {frozenset(): 1800.0}
    assert m["inferops_watch_node_up"] == {frozenset({("node", "pve1")}): 0, frozenset({("node", "pve2")}): 1}
    assert m["inferops_watch_node_failed_polls"][frozenset({("node", "pve1")})] == 4
    assert m["inferops_watch_node_last_read_timestamp_seconds"] == {frozenset({("node", "pve1")}): 1700.5}
    assert m["inferops_watch_budget_exhausted"] == {frozenset({("vmid", "129"), ("node", "pve1")}): 1,
                                                    frozenset({("vmid", "132"), ("node", "pve2")}): 0}
