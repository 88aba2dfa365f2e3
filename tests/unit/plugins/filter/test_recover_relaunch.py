# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.inferops.gpu_inference.plugins.filter.recover_relaunch import FilterModule, recover_relaunch

PLAN = {"group": "kimi", "targets": [{"host": "ct201", "vmid": 201, "node_host": "pve2", "node_rank": 0},
                                     {"host": "ct202", "vmid": 202, "node_host": "pve3", "node_rank": 1}]}


def test_registered():
    assert FilterModule().filters()["recover_relaunch"] is recover_relaunch


def test_every_node_clean_brings_the_whole_server_back():
    assert recover_relaunch(PLAN, {"pve2": "Clean", "pve3": "Clean"}, "true", False, False) == ["ct201", "ct202"]
    assert recover_relaunch(PLAN, {"pve2": "Clean", "pve3": None}, True, False, False) == []
    assert recover_relaunch(PLAN, {"pve2": "Clean", "pve3": "Clean"}, "no", False, False) == []


def test_bad_input_is_a_filter_error():
    with pytest.raises(AnsibleFilterError, match="the input must be recover_targets' plan"):
        recover_relaunch([], {}, True, False, False)
    with pytest.raises(AnsibleFilterError, match="recover_relaunch:"):
        recover_relaunch(PLAN, {"pve2": "Clean"}, "perhaps", False, False)
