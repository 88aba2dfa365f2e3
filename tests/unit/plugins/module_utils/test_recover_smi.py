# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

from ansible_collections.inferops.gpu_inference.plugins.module_utils import recover_smi as smi


def test_parse_topo_nvlink_and_closure():
    topo = """\
\tGPU0\tGPU1\tGPU2\tGPU3\tCPU Affinity
GPU0\t X \tNV18\tNV18\tSYS\t0-47
GPU1\tNV18\t X \tNV18\tSYS\t0-47
GPU2\tNV18\tNV18\t X \tSYS\t0-47
GPU3\tSYS\tSYS\tSYS\t X \t48-95
"""
    peers = smi.parse_topo_nvlink(topo)
    assert peers == {0: [1, 2], 1: [0, 2], 2: [0, 1]}
    assert smi.nvlink_closure([1], peers) == [0, 1, 2]
    assert smi.nvlink_closure([3], peers) == [3]
    assert smi.parse_topo_nvlink("") == {}


def test_parse_recovery_actions():
    got = smi.parse_recovery_actions(0, "0, None\n1, Reset\n2, [GPU is lost]\n3, Node Reboot\n")
    assert got == {"supported": True, "error": None, "actions": {0: "None", 1: "Reset", 2: None, 3: "Node Reboot"}}
    old = smi.parse_recovery_actions(2, 'Field "gpu_recovery_action" is not a valid field to query.\n\n')
    assert old["supported"] is False and old["actions"] == {}
    broken = smi.parse_recovery_actions(255, "", "Unable to determine the device handle for GPU0000:18:00.0: Unknown Error")
    assert broken["supported"] is True and "Unknown Error" in broken["error"]
