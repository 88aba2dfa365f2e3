# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""pve_gpu_devices: the device paths of gpu_passthrough, devN options and which devN keys hold them."""
from __future__ import annotations

import pytest

from ansible_collections.inferops.gpu_inference.plugins.module_utils.pve import pve_config
from ansible_collections.inferops.gpu_inference.plugins.module_utils.pve import pve_gpu_devices as gd
from ansible_collections.inferops.gpu_inference.plugins.module_utils.pve.pve_options import ConfigError
from ansible_collections.inferops.gpu_inference.tests.unit.plugins.module_utils.pve_current import CURRENT


# ---- devN ------------------------------------------------------------------------------------


def test_gpu_device_paths_count():
    assert gd.gpu_device_paths(2) == [
        "/dev/nvidia0",
        "/dev/nvidia1",
        "/dev/nvidiactl",
        "/dev/nvidia-uvm",
        "/dev/nvidia-uvm-tools",
    ]
    assert gd.gpu_device_paths(0) == []
    assert gd.gpu_device_paths([]) == []
    assert gd.gpu_device_paths("1") == ["/dev/nvidia0", "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]


def test_gpu_device_paths_list():
    paths = gd.gpu_device_paths(["/dev/nvidia3", 5, "/dev/nvidia-caps/nvidia-cap1", "/dev/nvidiactl"])
    assert paths == [
        "/dev/nvidia3",
        "/dev/nvidia5",
        "/dev/nvidia-caps/nvidia-cap1",
        "/dev/nvidiactl",
        "/dev/nvidia-uvm",
        "/dev/nvidia-uvm-tools",
    ]


@pytest.mark.parametrize(
    "spec,match",
    [
        (True, "not a boolean"),
        (-1, ">= 0"),
        ({"a": 1}, "GPU count"),
        (["nvidia0"], "must start with /dev/"),
        (["/dev/../etc/passwd"], "/../"),
        (["/dev/nvidia-caps"], "is a directory"),
        (300, "at most 256"),
    ],
)
def test_gpu_device_paths_errors(spec, match):
    with pytest.raises(ConfigError, match=match):
        gd.gpu_device_paths(spec)


def test_device_options():
    assert gd.device_options_suffix({"gid": 44, "mode": "0666", "uid": None}) == {"gid": "44", "mode": "0666"}
    assert gd.device_options_suffix({"deny_write": True}) == {"deny-write": "1"}
    with pytest.raises(ConfigError, match="quoted octal string"):
        gd.device_options_suffix({"mode": 438})
    with pytest.raises(ConfigError, match="0\\[0-7\\]"):
        gd.device_options_suffix({"mode": "666"})
    with pytest.raises(ConfigError, match="unknown key"):
        gd.device_options_suffix({"owner": 1})
    assert gd.device_entry("/dev/nvidia0", {"gid": "44"}) == "/dev/nvidia0,gid=44"


def test_plan_gpu_devices_idempotent_keeps_indices():
    desired, delete = gd.plan_gpu_devices(CURRENT, gd.gpu_device_paths(2), {})
    assert desired == {
        "dev0": "/dev/nvidia0",
        "dev1": "/dev/nvidia1",
        "dev2": "/dev/nvidiactl",
        "dev3": "/dev/nvidia-uvm",
        "dev4": "/dev/nvidia-uvm-tools",
    }
    assert delete == []
    assert not pve_config.plan_config(CURRENT, desired).changed


def test_plan_gpu_devices_reordered_is_not_a_change():
    current = {"dev0": "/dev/nvidia1", "dev1": "/dev/nvidia0", "dev2": "path=/dev/nvidiactl",
               "dev3": "/dev/nvidia-uvm", "dev4": "/dev/nvidia-uvm-tools"}
    desired, delete = gd.plan_gpu_devices(current, gd.gpu_device_paths(2), {})
    assert not pve_config.plan_config(current, desired, delete).changed


def test_plan_gpu_devices_grow_shrink_and_options():
    # Grow to 3 GPUs: the new one takes the lowest free index (dev6; dev5 is a non-NVIDIA device).
    desired, delete = gd.plan_gpu_devices(CURRENT, gd.gpu_device_paths(3), {})
    plan = pve_config.plan_config(CURRENT, desired, delete)
    assert plan.set == {"dev6": "/dev/nvidia2"} and plan.delete == []
    # Shrink to one GPU: dev1 goes, the render node is left alone.
    desired, delete = gd.plan_gpu_devices(CURRENT, gd.gpu_device_paths(1), {})
    plan = pve_config.plan_config(CURRENT, desired, delete)
    assert plan.set == {} and plan.delete == ["dev1"]
    assert plan.touches_devices()
    # No GPUs at all.
    desired, delete = gd.plan_gpu_devices(CURRENT, [], {})
    assert desired == {} and delete == ["dev0", "dev1", "dev2", "dev3", "dev4"]
    # New options change every entry in place.
    desired, _unused = gd.plan_gpu_devices(CURRENT, gd.gpu_device_paths(2), {"gid": "44"})
    plan = pve_config.plan_config(CURRENT, desired)
    assert plan.set["dev0"] == "/dev/nvidia0,gid=44" and len(plan.set) == 5


def test_plan_gpu_devices_reserved_and_replacement():
    current = {"dev0": "/dev/nvidia0", "dev1": "/dev/nvidiactl"}
    desired, delete = gd.plan_gpu_devices(current, gd.gpu_device_paths(["/dev/nvidia1"]), {}, reserved_keys={"dev2": "/dev/net/tun"})
    # nvidia0 is replaced: its index is reused; dev2 is reserved by extra_config.
    assert desired["dev1"] == "/dev/nvidiactl"
    assert "dev2" not in desired
    assert sorted(desired.values()) == sorted(["/dev/nvidia1", "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"])
    assert delete == []
    assert desired["dev0"] == "/dev/nvidia1"


def test_dev_index():
    assert gd.dev_index("dev7") == 7
    assert gd.dev_index("net0") is None and gd.dev_index("rootfs") is None
