# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

import os

import pytest

from ansible_collections.inferops.gpu_inference.plugins.module_utils.host import gpu_facts as gf

# nvidia-smi --query-gpu=index,name,memory.total,memory.used,uuid,pci.bus_id,driver_version,persistence_mode,utilization.gpu
#            --format=csv,noheader,nounits  (H100 HGX node, real format)
H100_CSV = """\
0, NVIDIA H100 80GB HBM3, 81559, 0, GPU-5a1b6c7d-0e1f-2a3b-4c5d-6e7f8a9b0c1d, 00000000:18:00.0, 550.54.15, Enabled, 0
1, NVIDIA H100 80GB HBM3, 81559, 70312, GPU-6b2c7d8e-1f20-3b4c-5d6e-7f8091a2b3c4, 00000000:2A:00.0, 550.54.15, Enabled, 0
"""

COMPUTE_APPS_CSV = """\
4242, sglang::scheduler_TP0, 70144, GPU-6b2c7d8e-1f20-3b4c-5d6e-7f8091a2b3c4
4243, /opt/venv/bin/python3, 512, GPU-5a1b6c7d-0e1f-2a3b-4c5d-6e7f8a9b0c1d
"""

MEMINFO = """\
MemTotal:       2113466624 kB
MemFree:        1900000000 kB
MemAvailable:   2000000000 kB
Buffers:          123456 kB
Cached:          5000000 kB
SwapCached:            0 kB
Unevictable:       12108 kB
Mlocked:           10404 kB
SwapTotal:       8388604 kB
SwapFree:        8388604 kB
Shmem:           1048576 kB
HugePages_Total:       0
HugePages_Free:        0
Hugepagesize:       2048 kB
"""


def test_parse_gpu_csv_real_format():
    gpus = gf.parse_gpu_csv(H100_CSV)
    assert len(gpus) == 2
    assert gpus[0] == {
        "index": 0,
        "name": "NVIDIA H100 80GB HBM3",
        "memory_total_mib": 81559,
        "memory_used_mib": 0,
        "uuid": "GPU-5a1b6c7d-0e1f-2a3b-4c5d-6e7f8a9b0c1d",
        "pci_bus_id": "00000000:18:00.0",
        "driver_version": "550.54.15",
        "persistence_mode": "Enabled",
        "utilization_gpu_pct": 0,
    }
    assert gpus[1]["memory_used_mib"] == 70312
    summary = gf.summarize_gpus(gpus)
    assert summary["gpu_count"] == 2
    assert summary["gpu_memory_total_mib"] == 2 * 81559
    assert summary["driver_version"] == "550.54.15"


def test_parse_gpu_csv_na_values_become_none():
    line = "0, NVIDIA A10G, [N/A], [Not Supported], GPU-1, 00000000:00:1E.0, 535.104.05, [N/A], [Not Supported]\n"
    gpu = gf.parse_gpu_csv(line)[0]
    assert gpu["memory_total_mib"] is None
    assert gpu["memory_used_mib"] is None
    assert gpu["persistence_mode"] is None and gpu["utilization_gpu_pct"] is None
    assert gf.summarize_gpus([gpu])["gpu_memory_total_mib"] == 0


def test_parse_gpu_csv_name_with_comma_and_units():
    line = "3, NVIDIA Foo, Rev 2, 1024 MiB, 5 MiB, GPU-x, 00000000:01:00.0, 1.2.3, Disabled, 3"
    gpu = gf.parse_gpu_csv(line)[0]
    assert gpu["name"] == "NVIDIA Foo, Rev 2"
    assert gpu["memory_total_mib"] == 1024
    assert gpu["memory_used_mib"] == 5 and gpu["utilization_gpu_pct"] == 3


def test_parse_gpu_csv_errors():
    with pytest.raises(gf.ParseError, match="expected 9 comma-separated columns"):
        gf.parse_gpu_csv("0, only, three")
    with pytest.raises(gf.ParseError, match="integer for memory_total_mib"):
        gf.parse_gpu_csv("0, X, lots, 0, GPU-1, 0000:00:00.0, 1, Enabled, 0")
    assert gf.parse_gpu_csv("") == []
    assert gf.parse_gpu_csv("No devices were found\n") == []


def test_parse_compute_apps():
    apps = gf.parse_compute_apps_csv(COMPUTE_APPS_CSV)
    assert apps[0] == {
        "pid": 4242,
        "process_name": "sglang::scheduler_TP0",
        "used_memory_mib": 70144,
        "gpu_uuid": "GPU-6b2c7d8e-1f20-3b4c-5d6e-7f8091a2b3c4",
    }
    assert apps[1]["process_name"] == "/opt/venv/bin/python3"
    assert gf.parse_compute_apps_csv("") == []
    assert gf.parse_compute_apps_csv("No running processes found\n") == []
    # Inside a container the driver may not know the memory per process.
    assert gf.parse_compute_apps_csv("17, python, [N/A], GPU-1")[0]["used_memory_mib"] is None


def test_query_args():
    args = gf.gpu_query_args("/usr/bin/nvidia-smi")
    assert args[1] == "--query-gpu=index,name,memory.total,memory.used,uuid,pci.bus_id,driver_version,persistence_mode,utilization.gpu"
    assert args[2] == "--format=csv,noheader,nounits"
    assert gf.compute_apps_query_args("nvidia-smi")[1] == "--query-compute-apps=pid,process_name,used_memory,gpu_uuid"


def test_parse_meminfo_bytes():
    mem = gf.parse_meminfo(MEMINFO)
    assert mem["mem_total_bytes"] == 2113466624 * 1024
    assert mem["mem_available_bytes"] == 2000000000 * 1024
    assert mem["shmem_bytes"] == 1048576 * 1024
    assert mem["mlocked_bytes"] == 10404 * 1024
    assert mem["swap_total_bytes"] == 8388604 * 1024
    assert mem["hugepage_size_bytes"] == 2048 * 1024
    assert mem["hugepages_total"] == 0


def test_parse_meminfo_missing_fields_and_garbage():
    # lxcfs inside a container prints fewer fields.
    mem = gf.parse_meminfo("MemTotal: 1024 kB\nMemFree: 512 kB\n")
    assert mem["mem_total_bytes"] == 1024 * 1024
    assert mem["mem_available_bytes"] is None
    with pytest.raises(gf.ParseError, match="MemTotal"):
        gf.parse_meminfo("hello\n")


@pytest.mark.parametrize(
    "text,expected",
    [
        ("max\n", None),
        ("9223372036854771712\n", None),  # cgroup v1 "unlimited"
        ("34359738368\n", 32 * 1024**3),
        ("", None),
        (None, None),
    ],
)
def test_parse_cgroup_memory_value(text, expected):
    assert gf.parse_cgroup_memory_value(text) == expected


def test_parse_cgroup_memory_value_error():
    with pytest.raises(gf.ParseError, match="byte count or 'max'"):
        gf.parse_cgroup_memory_value("lots")


def _write(root, path, text):
    full = os.path.join(str(root), path.lstrip("/"))
    os.makedirs(os.path.dirname(full), exist_ok=True)
    with open(full, "w") as handle:
        handle.write(text)


def test_collect_cgroup_v2_in_container(tmp_path):
    # Inside an LXC: cgroup namespace root "/", the service in a child cgroup.
    _write(tmp_path, "/proc/self/cgroup", "0::/system.slice/sglang.service\n")
    _write(tmp_path, "/sys/fs/cgroup/cgroup.controllers", "cpu memory pids\n")
    _write(tmp_path, "/sys/fs/cgroup/memory.max", "549755813888\n")
    _write(tmp_path, "/sys/fs/cgroup/memory.current", "1234567168\n")
    _write(tmp_path, "/sys/fs/cgroup/system.slice/memory.max", "max\n")
    _write(tmp_path, "/sys/fs/cgroup/system.slice/memory.current", "1000\n")
    _write(tmp_path, "/sys/fs/cgroup/system.slice/sglang.service/memory.max", "max\n")
    _write(tmp_path, "/sys/fs/cgroup/system.slice/sglang.service/memory.current", "900\n")
    cg = gf.collect_cgroup_memory(str(tmp_path))
    assert cg["version"] == 2
    assert cg["memory_limit_bytes"] == 549755813888
    assert cg["memory_usage_bytes"] == 1234567168
    assert cg["limit_cgroup"] == "/"


def test_collect_cgroup_v2_no_limit_reports_top_usage(tmp_path):
    _write(tmp_path, "/proc/self/cgroup", "0::/user.slice\n")
    _write(tmp_path, "/sys/fs/cgroup/cgroup.controllers", "memory\n")
    _write(tmp_path, "/sys/fs/cgroup/user.slice/memory.max", "max\n")
    _write(tmp_path, "/sys/fs/cgroup/user.slice/memory.current", "4096\n")
    cg = gf.collect_cgroup_memory(str(tmp_path))
    assert cg["memory_limit_bytes"] is None
    assert cg["memory_usage_bytes"] == 4096


def test_collect_cgroup_v1(tmp_path):
    _write(tmp_path, "/proc/self/cgroup", "12:pids:/lxc/129\n4:memory:/lxc/129\n1:name=systemd:/\n")
    _write(tmp_path, "/sys/fs/cgroup/memory/lxc/129/memory.limit_in_bytes", "17179869184\n")
    _write(tmp_path, "/sys/fs/cgroup/memory/lxc/129/memory.usage_in_bytes", "2048\n")
    _write(tmp_path, "/sys/fs/cgroup/memory/memory.limit_in_bytes", "9223372036854771712\n")
    cg = gf.collect_cgroup_memory(str(tmp_path))
    assert cg["version"] == 1
    assert cg["memory_limit_bytes"] == 16 * 1024**3
    assert cg["memory_usage_bytes"] == 2048


def test_collect_cgroup_nothing(tmp_path):
    assert gf.collect_cgroup_memory(str(tmp_path))["version"] is None


def test_detect_container(tmp_path):
    assert gf.detect_container(str(tmp_path), "lxc\n") == {
        "in_container": True,
        "type": "lxc",
        "source": "systemd-detect-virt",
    }
    assert gf.detect_container(str(tmp_path), "none\n")["in_container"] is False
    with open(os.path.join(str(tmp_path), "environ"), "wb"):
        pass
    os.makedirs(os.path.join(str(tmp_path), "proc/1"))
    with open(os.path.join(str(tmp_path), "proc/1/environ"), "wb") as handle:
        handle.write(b"PATH=/usr/bin\0container=lxc\0TERM=linux\0")
    found = gf.detect_container(str(tmp_path), None)
    assert found == {"in_container": True, "type": "lxc", "source": "/proc/1/environ"}


def test_detect_container_host(tmp_path):
    assert gf.detect_container(str(tmp_path), None)["in_container"] is False


def test_describe_device_and_list(tmp_path):
    st = os.stat("/dev/null")
    desc = gf.describe_device("/dev/null", st.st_mode, st.st_rdev)
    assert desc["type"] == "char" and desc["major"] == 1 and desc["minor"] == 3

    os.makedirs(os.path.join(str(tmp_path), "dev/nvidia-caps"))
    for name in ("nvidia0", "nvidiactl", "nvidia-uvm", "sda", "nvidia-caps/nvidia-cap1"):
        open(os.path.join(str(tmp_path), "dev", name), "w").close()

    rdevs = {"nvidia0": os.makedev(195, 0), "nvidiactl": os.makedev(195, 255), "nvidia-uvm": os.makedev(511, 0)}

    class FakeStat:
        def __init__(self, mode, rdev):
            self.st_mode = mode
            self.st_rdev = rdev

    import stat as stat_mod

    def fake_stat(path):
        name = os.path.basename(path)
        if name == "nvidia-caps":
            return FakeStat(stat_mod.S_IFDIR | 0o755, 0)
        return FakeStat(stat_mod.S_IFCHR | 0o666, rdevs.get(name, os.makedev(240, 1)))

    nodes = gf.list_nvidia_devices(str(tmp_path), stat_fn=fake_stat)
    paths = [n["path"] for n in nodes]
    assert paths == [
        "/dev/nvidia-caps",
        "/dev/nvidia-caps/nvidia-cap1",
        "/dev/nvidia-uvm",
        "/dev/nvidia0",
        "/dev/nvidiactl",
    ]
    by_path = {n["path"]: n for n in nodes}
    assert by_path["/dev/nvidiactl"] == {
        "path": "/dev/nvidiactl",
        "type": "char",
        "major": 195,
        "minor": 255,
        "mode": "0666",
    }
    assert by_path["/dev/nvidia-caps"]["major"] is None


def test_list_nvidia_devices_no_dev(tmp_path):
    assert gf.list_nvidia_devices(str(tmp_path / "nothing")) == []


def test_driver_version_file():
    text = (
        "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:23:56 UTC 2024\n"
        "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n"
    )
    assert gf.parse_driver_version_file(text) == "550.54.15"
    open_kernel = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  570.148.08  Release Build\n"
    assert gf.parse_driver_version_file(open_kernel) == "570.148.08"
    assert gf.parse_driver_version_file(None) is None


def test_read_host_memory(tmp_path):
    _write(tmp_path, "/proc/meminfo", MEMINFO)
    assert gf.read_host_memory(str(tmp_path))["mem_total_bytes"] == 2113466624 * 1024
    with pytest.raises(gf.ParseError, match="cannot read"):
        gf.read_host_memory(str(tmp_path / "none"))


@pytest.mark.parametrize("driver,kernel,bad", [
    ("550.163.01", "6.17.13-2-pve", "open-gpu-kernel-modules#1143"),   # PVE 9.1's default kernel
    ("555.58.02", "6.17.2-1-pve", "open-gpu-kernel-modules#1143"),
    ("550.163.01", "6.14.11-4-pve", None),                              # PVE 9.0's kernel: no report
    ("580.95.05", "6.17.13-2-pve", None),
    ("580.142", "7.1.0_1", "void-packages#61087"),
    ("580.159.04", "7.1.0", None),                                      # the fix
    ("580.142", "7.0.12-1-pve", None),
    ("595.71.05", "7.1.0", None),
    (None, "6.17.13-2-pve", None),
    ("580.95.05", "not-a-release", None),
])
def test_driver_kernel_problem(driver, kernel, bad):
    problem = gf.driver_kernel_problem(driver, kernel)
    if bad is None:
        assert problem is None
    else:
        assert bad in problem and problem.startswith("NVIDIA driver %s with kernel %s: " % (driver, kernel))


def test_node_kernels(tmp_path):
    (tmp_path / "lib" / "modules" / "6.17.13-2-pve").mkdir(parents=True)
    (tmp_path / "lib" / "modules" / "6.14.11-4-pve").mkdir()
    (tmp_path / "lib" / "modules" / "extra").mkdir()
    assert gf.node_kernels(str(tmp_path)) == ["6.14.11-4-pve", "6.17.13-2-pve"]
    assert gf.node_kernels(str(tmp_path / "none")) == []
