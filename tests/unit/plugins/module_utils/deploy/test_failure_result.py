# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A refusal of several lines (the arithmetic, a table) as a failed task's result: a one-line msg and the lines as a
list, which ansible-core's default callback prints one per line (a string's line breaks it prints as \\n)."""
from __future__ import annotations

import pytest

from ansible_collections.inferops.gpu_inference.plugins.module_utils.sizing import hicache
from ansible_collections.inferops.gpu_inference.plugins.module_utils.common import safe_text
from ansible_collections.inferops.gpu_inference.plugins.module_utils.deploy import sglang_deploy
from ansible_collections.inferops.gpu_inference.plugins.module_utils.deploy.sglang_request import DeployError


def test_one_line_stays_msg_alone():
    assert safe_text.failure_result("plan_input must be a dict") == {"msg": "plan_input must be a dict"}
    assert safe_text.failure_result("one line\n\n") == {"msg": "one line"}


def test_several_lines_split_first_line_and_list():
    got = safe_text.failure_result("Refused: does not fit.\n  - OS reserve: 48.2 GB\n\n # OS reserve  48.2 GB\n")
    assert "\n" not in got["msg"]
    assert got["msg"].startswith("Refused: does not fit.") and "msg_lines" in got["msg"]
    # Every line kept, in order, leading spaces (the picture's columns) and the blank separator included.
    assert got["msg_lines"] == ["  - OS reserve: 48.2 GB", "", " # OS reserve  48.2 GB"]


def test_a_real_refusal_keeps_its_arithmetic_once():
    plan = hicache.plan({
        "mem_total_bytes": 482110078976, "mem_available_bytes": 477815111680, "gpu_count": 8, "gpu_memory_mib": 97887,
        "sglang_version": "0.5.9", "tp_size": 8, "model_preset": "kimi-k2", "device_pool_tokens_per_rank": 116000,
        "requested_gb": 300})
    assert not plan["fits"]
    with pytest.raises(DeployError) as raised:
        sglang_deploy._refuse_plan("Refused: the HiCache plan does not fit this container; nothing was changed.", plan)
    got = safe_text.failure_result(str(raised.value))
    assert got["msg"].startswith("Refused: the HiCache plan does not fit this container")
    assert got["msg_lines"] == list(plan["explain"]) + [""] + list(plan["picture"])
    shown = [got["msg"]] + got["msg_lines"]
    assert sum("DOES NOT FIT" in line for line in shown) == 1
    assert not any("\n" in line for line in shown)
