# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

from ansible_collections.inferops.gpu_inference.plugins.module_utils.recover import recover_smi as smi


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


# Device minor <-> nvidia-smi index <-> PCI bus id (nvidia-smi(1): -q prints "Minor Number" under "GPU <bus id>").
Q_TEXT = """
==============NVSMI LOG==============

Timestamp                                 : Fri Dec  4 22:00:00 2026
Driver Version                            : 580.95.05
Attached GPUs                             : 3
GPU 00000000:18:00.0
    Product Name                          : NVIDIA H100 80GB HBM3
    Minor Number                          : 2
    PCI
        Bus Id                            : 00000000:18:00.0

GPU 00000000:2A:00.0
    Minor Number                          : 0

GPU 00000000:3A:00.0
    Minor Number                          : N/A
"""


def test_parse_q_minors_reads_each_sections_minor_number():
    assert smi.parse_q_minors(Q_TEXT) == {"0000:18:00.0": 2, "0000:2a:00.0": 0, "0000:3a:00.0": None}
    assert smi.parse_q_minors("") == {}


def test_bus_ids_in_every_spelling_are_one():
    assert smi.norm_bus_id("00000000:2A:00.0") == smi.norm_bus_id("0000:2a:00.0") == "0000:2a:00.0"
    assert smi.norm_bus_id("[N/A]") is None


def test_numbering_maps_minors_to_indexes_through_the_bus_id_and_says_what_it_cannot():
    rows = [{"index": 0, "pci_bus_id": "00000000:18:00.0"}, {"index": 1, "pci_bus_id": "00000000:2A:00.0"},
            {"index": 2, "pci_bus_id": "00000000:3A:00.0"}]
    n = smi.gpu_numbering(rows, smi.parse_q_minors(Q_TEXT))
    assert n["index_of_minor"] == {2: 0, 0: 1} and n["minor_of_index"] == {0: 2, 1: 0}
    assert n["complete"] is False and n["problems"] == ["GPU 2 (0000:3a:00.0): nvidia-smi -q gives no Minor Number"]
    # /dev/nvidia2 is GPU 0, never GPU 2; /dev/nvidia1 is no GPU the driver numbers.
    assert smi.indexes_of_minors([2, 0, 1], n) == ([0, 1], [1])
    assert smi.indexes_of_minors([2], None) == ([], [2])


def test_a_minor_given_twice_maps_neither_gpu():
    rows = [{"index": 0, "pci_bus_id": "00000000:18:00.0"}, {"index": 1, "pci_bus_id": "00000000:2A:00.0"}]
    n = smi.gpu_numbering(rows, {"0000:18:00.0": 3, "0000:2a:00.0": 3})
    assert n["index_of_minor"] == {} and n["minor_of_index"] == {} and not n["complete"]
