# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

import json

import pytest

from ansible.errors import AnsibleFilterError

from ansible_collections.inferops.gpu_inference.plugins.filter.report_artifact import report_artifact
from ansible_collections.inferops.gpu_inference.plugins.module_utils.common.report_artifact import ReportArtifactError, bounded


def size(value):
    return len(json.dumps(value, sort_keys=True).encode("utf-8"))


def test_a_small_report_is_kept_whole():
    rep = {"vmid": 129, "verdict": "Clean", "rungs": [{"rung": 1, "action": {"rc": 0}}]}
    assert bounded(rep) == {"report": rep, "report_bytes": size(rep), "report_complete": True, "report_dropped": []}


def test_a_large_report_loses_its_bulkiest_parts_first_and_fits():
    rep = {"vmid": 129, "verdict": "Not clean", "before": {"evidence": {"smi": "x" * 40000}, "reasons": ["holders"]},
           "rungs": [{"rung": 2, "action": {"signalled": list(range(3000))}, "seconds": 3.5}]}
    out = bounded(rep, 1024)
    assert size(out["report"]) <= 1024 and out["report_bytes"] == size(rep) and not out["report_complete"]
    assert out["report_dropped"] == ["evidence", "action"]
    assert out["report"] == {"vmid": 129, "verdict": "Not clean", "before": {"reasons": ["holders"]},
                             "rungs": [{"rung": 2, "seconds": 3.5}]}


def test_when_nothing_bulky_is_left_only_top_level_scalars_stay():
    rep = {"vmid": 129, "verdict": "Clean", "notes": ["n" * 900] * 10, "big": "y" * 5000}
    out = bounded(rep, 300)
    assert size(out["report"]) <= 300 and out["report"] == {"vmid": 129, "verdict": "Clean"}
    assert out["report_dropped"][-1] == "every nested value"


@pytest.mark.parametrize("rep, max_bytes, msg", [
    ([1], 1000, "must be a mapping"), ({"a": 1}, 100, ">= 256"), ({"a": 1}, True, ">= 256"),
    ({"a": object()}, 1000, "not JSON")])
def test_bad_input_is_named(rep, max_bytes, msg):
    with pytest.raises(ReportArtifactError, match=msg):
        bounded(rep, max_bytes)
    with pytest.raises(AnsibleFilterError, match="report_artifact: .*" + msg):
        report_artifact(rep, max_bytes)
