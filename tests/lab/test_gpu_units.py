"""In-process tests of the simulated driver's per-node rules (docs/lab.md, "GPUs of pve2"): no root, no lab."""
from __future__ import annotations

import os
import stat

from gpu import driverd
from pve import nodens


def test_node_paths_and_config():
    assert driverd.node_paths("pve1") == {"sock_dir": "/run/nvidia-lab", "state": driverd.STATE_PATH, "dev_dir": "/dev"}
    p2 = driverd.node_paths("pve2")
    # what pve2's namespace shows at /run/nvidia-lab and /dev/nvidia* (nodens binds exactly these)
    assert p2["sock_dir"] == nodens.binds("pve2")[0][0] and nodens.binds("pve2")[0][1] == "/run/nvidia-lab"
    assert p2["dev_dir"] == nodens.dev_dir("pve2")
    assert p2["state"] != driverd.STATE_PATH
    cfg = dict(driverd.DEFAULTS)
    assert driverd.node_config(cfg, "pve1")["gpu_count"] == 8
    assert driverd.node_config(cfg, "pve2")["gpu_count"] == 4 and driverd.node_config(cfg, "pve2")["node"] == "pve2"
    assert driverd.node_config(dict(cfg, pve2_gpu_count=2), "pve2")["gpu_count"] == 2


def test_each_node_numbers_from_zero_with_its_own_uuids():
    cfg = dict(driverd.DEFAULTS)
    pve1 = [driverd.gpu_static(driverd.node_config(cfg, "pve1"), i) for i in range(8)]
    pve2 = [driverd.gpu_static(driverd.node_config(cfg, "pve2"), i) for i in range(4)]
    assert [g["index"] for g in pve2] == [0, 1, 2, 3]
    assert [g["pci_bus_id"] for g in pve2] == [g["pci_bus_id"] for g in pve1[:4]]  # the same server model
    assert not {g["uuid"] for g in pve1} & {g["uuid"] for g in pve2}
    assert not {g["serial"] for g in pve1} & {g["serial"] for g in pve2}
    # pve1's identities are those of the one-node lab (nothing changes for pve1)
    assert pve1[0]["uuid"] == driverd.gpu_static(dict(cfg), 0)["uuid"]


def test_node_id_is_the_file_not_the_device_number():
    a = os.stat_result((stat.S_IFCHR | 0o666, 11, 5, 1, 0, 0, 0, 0, 0, 0))
    b = os.stat_result((stat.S_IFCHR | 0o666, 12, 6, 1, 0, 0, 0, 0, 0, 0))
    assert driverd.node_id(a) == (5, 11) and driverd.node_id(a) != driverd.node_id(b)


def test_dev_plan_leaves_out_every_nvidia_entry():
    entries = [("null", stat.S_IFCHR | 0o666), ("sda", stat.S_IFBLK | 0o660), ("pts", stat.S_IFDIR | 0o755),
               ("fd", stat.S_IFLNK | 0o777), ("log", stat.S_IFSOCK | 0o666), ("nvidia0", stat.S_IFCHR | 0o666),
               ("nvidia7", stat.S_IFCHR | 0o666), ("nvidiactl", stat.S_IFCHR | 0o666),
               ("nvidia-uvm", stat.S_IFCHR | 0o666), ("nvidia-caps", stat.S_IFDIR | 0o755)]
    assert nodens.dev_plan(entries) == [("null", "node"), ("sda", "node"), ("pts", "dir"), ("fd", "symlink"),
                                        ("log", "file")]
