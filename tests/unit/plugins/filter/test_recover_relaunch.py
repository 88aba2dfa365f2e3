# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.inferops.gpu_inference.plugins.filter.recover_relaunch import FilterModule, recover_relaunch

PLAN = {"group": "kimi", "targets": [{"host": "ct201", "vmid": 201, "node_host": "pve2", "node_rank": 0},
                                     {"host": "ct202", "vmid": 202, "node_host": "pve3", "node_rank": 1}]}
CLEAN = {"__gpu_recover_result": {"report": {"verdict": "Clean"}}}


def test_registered():
    assert FilterModule().filters()["recover_relaunch"] is recover_relaunch


def test_every_node_clean_brings_the_whole_server_back():
    hv = {"pve2": CLEAN, "pve3": CLEAN}
    assert recover_relaunch(PLAN, hv, ["pve2", "pve3"], "true", False, False) == ["ct201", "ct202"]
    assert recover_relaunch(PLAN, hv, ["pve2", "pve3"], "no", False, False) == []
    assert recover_relaunch(PLAN, hv, ["pve2", "pve3"], True, False, True) == []  # check mode


def test_a_node_without_its_private_result_has_no_verdict():
    # pve3's play failed (no result), or its host's variables carry the public name only: nothing comes back.
    assert recover_relaunch(PLAN, {"pve2": CLEAN, "pve3": {}}, ["pve2", "pve3"], True, False, False) == []
    forged = {"gpu_recover_result": {"verdict": "Clean"}, "sglang_server_result": {"host": "ct202"}}
    assert recover_relaunch(PLAN, {"pve2": CLEAN, "pve3": forged}, ["pve2", "pve3"], True, False, False) == []
    assert recover_relaunch(PLAN, {"pve2": CLEAN}, ["pve2", "pve3"], True, False, False) == []
    assert recover_relaunch(PLAN, {"pve2": CLEAN, "pve3": {"__gpu_recover_result": {"report": {"verdict": "Not clean"}}}},
                            ["pve2", "pve3"], True, False, False) == []


def test_bad_input_is_a_filter_error():
    with pytest.raises(AnsibleFilterError, match="the input must be recover_targets' plan"):
        recover_relaunch([], {}, [], True, False, False)
    with pytest.raises(AnsibleFilterError, match="recover_relaunch:"):
        recover_relaunch(PLAN, {"pve2": CLEAN}, ["pve2"], "perhaps", False, False)
