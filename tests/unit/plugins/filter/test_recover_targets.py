# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.inferops.gpu_inference.plugins.filter.recover_targets import FilterModule, recover_targets

GROUP = ["ct201", "ct202"]
CTS = [
    {"host": "ct201", "vmid": 201, "node_host": "pve2", "cluster_group": "kimi_tp16", "cluster": GROUP},
    {"host": "ct202", "vmid": 202, "node_host": "pve3", "cluster_group": "kimi_tp16", "cluster": GROUP},
]


def test_registered():
    assert FilterModule().filters()["recover_targets"] is recover_targets


def test_the_whole_server():
    out = recover_targets(CTS, "202")
    assert out["group"] == "kimi_tp16"
    assert [(t["host"], t["node_host"], t["node_rank"]) for t in out["targets"]] == [("ct201", "pve2", 0), ("ct202", "pve3", 1)]


def test_not_a_list():
    with pytest.raises(AnsibleFilterError, match="must be the list of containers, got str"):
        recover_targets("ct201", 201)


def test_an_inventory_error_is_a_filter_error_with_its_cause():
    with pytest.raises(AnsibleFilterError, match="recover.yml: the server kimi_tp16 has two containers on node pve2") as exc:
        recover_targets([CTS[0], dict(CTS[1], node_host="pve2")], 201)
    assert exc.value.orig_exc is not None
