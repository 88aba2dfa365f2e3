# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

from ansible_collections.inferops.gpu_inference.plugins.module_utils.recover import recover_pve as pve
from ansible_collections.inferops.gpu_inference.tests.unit.plugins.module_utils.fake_node import fake_proc, v2_container


def test_parse_pct_config_gpus():
    conf = """\
#recover dev CT
arch: amd64
dev0: /dev/nvidia6
dev1: path=/dev/nvidia7,mode=0666
dev2: /dev/nvidiactl
dev3: /dev/nvidia-uvm
lxc.mount.entry: /dev/nvidia3 dev/nvidia3 none bind,optional,create=file
memory: 4096

[snap1]
dev0: /dev/nvidia0
"""
    assert pve.parse_pct_config_gpus(conf) == [3, 6, 7]
    assert pve.parse_pct_config_gpus("") == []


def test_parse_pct_status():
    assert pve.parse_pct_status("status: running\npid: 17074\nname: x\n") == {"status": "running", "pid": 17074}
    assert pve.parse_pct_status("status: stopped\n") == {"status": "stopped", "pid": None}


def test_parse_systemctl_show():
    text = "ActiveState=active\nSubState=running\nMainPID=4242\nExecStart={ path=/x ; argv[]=/x --a=b }\n\n"
    assert pve.parse_systemctl_show(text) == {"ActiveState": "active", "SubState": "running", "MainPID": "4242",
                                              "ExecStart": "{ path=/x ; argv[]=/x --a=b }"}
    assert pve.parse_systemctl_show(None) == {}


# pct list as PVE 8 prints it (API2/LXC.pm vmlist through the CLI formatter).
PCT_LIST = """\
VMID       Status     Lock         Name
129        running                 sglang-129
130        running                 bystander
131        stopped    backup       other
"""


def test_parse_pct_list():
    assert pve.parse_pct_list(PCT_LIST) == {129: "running", 130: "running", 131: "stopped"}
    assert pve.parse_pct_list("") == {}


def v1_container(tmp_path, files):
    """CT 131 (init PID 17074) on a hybrid host, its memory hierarchy at /sys/fs/cgroup/memory/lxc/131."""
    fake_proc(tmp_path, 17074, {"cgroup": "4:memory:/lxc/131/ns/init.scope\n0::/lxc/131/ns/init.scope\n"})
    fake_proc(tmp_path, "self", {"mountinfo": "30 25 0:26 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"})
    mem = tmp_path / "sys/fs/cgroup/memory/lxc/131"
    mem.mkdir(parents=True)
    for name, text in files.items():
        (mem / name).write_text(text)


def test_container_memory_hybrid(tmp_path):
    root = str(tmp_path)
    # container memory on a hybrid host: the memory hierarchy, cut at lxc/131
    v1_container(tmp_path, {"memory.limit_in_bytes": "4294967296\n", "memory.usage_in_bytes": "80162816\n",
                            "memory.oom_control": "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n"})
    got = pve.container_memory(131, 17074, root)
    assert got == {"cgroup_version": 1, "path": "/lxc/131", "memory_limit_bytes": 4294967296,
                   "memory_usage_bytes": 80162816, "memory_held_bytes": None, "oom_kills": 3}
    assert pve.container_memory(131, None, root)["path"] is None


def test_container_memory_v1_counts_oom_kills_in_the_containers_child_cgroups(tmp_path):
    # cgroup v1's memory.oom_control counts only its own memcg's kills: a unit's (or a nested cgroup's) kill inside the
    # container shows below lxc/131, and counts for the container as v2's hierarchical memory.events counts it.
    v1_container(tmp_path, {"memory.limit_in_bytes": "4294967296\n", "memory.usage_in_bytes": "80162816\n",
                            "memory.oom_control": "oom_kill 1\n"})
    for sub, kills in (("ns", 0), ("ns/system.slice", 0), ("ns/system.slice/sglang.service", 2), ("ns/inferops-oom", 1)):
        d = tmp_path / "sys/fs/cgroup/memory/lxc/131" / sub
        d.mkdir(parents=True, exist_ok=True)
        (d / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill %d\n" % kills)
    assert pve.container_memory(131, 17074, str(tmp_path))["oom_kills"] == 4


def test_container_memory_v2(tmp_path):
    root = str(tmp_path)
    d = v2_container(tmp_path, 2001, 129, {"memory.max": "15032385536\n", "memory.current": "2147483648\n",
                                           "memory.events": "low 0\nhigh 0\nmax 12\noom 2\noom_kill 2\n"})
    expected = {"cgroup_version": 2, "path": "/lxc/129", "memory_limit_bytes": 15032385536,
                "memory_usage_bytes": 2147483648, "memory_held_bytes": None, "oom_kills": 2}
    assert pve.container_memory(129, 2001, root) == expected
    (d / "memory.max").write_text("max\n")
    assert pve.container_memory(129, 2001, root)["memory_limit_bytes"] is None


def test_container_memory_v2_with_memory_localevents_adds_up_the_containers_cgroups(tmp_path):
    # A node whose cgroup2 is mounted with memory_localevents: memory.events then counts only the cgroup's own
    # events (seen on a real kernel, tests/v2kernel: an OOM kill in ns/system.slice/<unit> left lxc/<vmid>'s counter
    # as it was), so memory.events.local of every cgroup of the container is added up; a cgroup without the memory
    # controller (a tenant's own ns/lxc) has none and counts nothing.
    root = str(tmp_path)
    v2_container(tmp_path, 2001, 129, {"memory.max": "15032385536\n", "memory.current": "2147483648\n",
                                       "memory.events": "low 0\nhigh 0\nmax 3\noom 3\noom_kill 1\noom_group_kill 0\n",
                                       "memory.events.local": "low 0\nhigh 0\nmax 3\noom 3\noom_kill 0\noom_group_kill 0\n"})
    for sub, kills in (("ns", 0), ("ns/system.slice", 0), ("ns/system.slice/sglang.service", 2),
                       ("ns/init.scope", 1), ("ns/lxc", None)):
        d = tmp_path / "sys/fs/cgroup/lxc/129" / sub
        d.mkdir(parents=True, exist_ok=True)
        if kills is not None:
            (d / "memory.events.local").write_text("low 0\nhigh 0\nmax 0\noom 0\noom_kill %d\noom_group_kill 0\n" % kills)
    fake_proc(tmp_path, "self", {"mountinfo": (
        "26 25 0:23 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate,memory_localevents,memory_recursiveprot\n")})
    assert pve.cgroup2_options(root) == {"rw", "nsdelegate", "memory_localevents", "memory_recursiveprot"}
    assert pve.container_memory(129, 2001, root)["oom_kills"] == 3
    # the default mount (systemd's on PVE 9): memory.events is hierarchical, the container's own counter is the count
    fake_proc(tmp_path, "self", {"mountinfo": (
        "26 25 0:23 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot\n")})
    assert pve.container_memory(129, 2001, root)["oom_kills"] == 1
    assert pve.oom_kills_under(str(tmp_path / "sys/fs/cgroup/lxc/129"), "memory.events", 2, local_events=True) == 3


def test_cgroup_mounts_hybrid(tmp_path):
    fake_proc(tmp_path, "self", {"mountinfo": (
        "26 25 0:23 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw,nsdelegate\n"
        "27 25 0:24 / /sys/fs/cgroup/systemd rw - cgroup cgroup rw,xattr,name=systemd\n"
        "30 25 0:26 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"
        "31 25 0:27 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct\n"
        "32 25 0:28 / /sys/fs/cgroup/memory2 rw - cgroup cgroup rw,memory\n"
        "43 27 0:41 / /var/lib/lxcfs rw - fuse.lxcfs lxcfs rw\n")})
    assert pve.cgroup_mounts(str(tmp_path)) == {
        "": "/sys/fs/cgroup/unified", "name=systemd": "/sys/fs/cgroup/systemd", "memory": "/sys/fs/cgroup/memory",
        "cpu": "/sys/fs/cgroup/cpu,cpuacct", "cpuacct": "/sys/fs/cgroup/cpu,cpuacct"}


def test_container_cgroup_dir_v2_and_payload():
    assert pve.container_cgroup_dir({"": "/lxc/129/ns/system.slice/x.service"}, 129, "") == "/lxc/129"
    assert pve.container_cgroup_dir({"": "/lxc.payload.140/init.scope"}, 140, "") == "/lxc.payload.140"
    assert pve.container_cgroup_dir({"": "/system.slice"}, 129, "") is None
    # a hybrid host: the hierarchy of the controller asked for
    hybrid = {"name=systemd": "/lxc/131/ns/init.scope", "memory": "/lxc/131/ns", "": "/lxc/131/ns/init.scope"}
    assert pve.container_cgroup_dir(hybrid, 131, "memory") == "/lxc/131"
    assert pve.container_cgroup_dir(hybrid, 131, "pids") is None


def test_container_memory_of_an_unreadable_usage_is_none(tmp_path):
    # v1's "unlimited" size is no limit; a usage that is not a number is unknown
    v2_container(tmp_path, 2001, 129, {"memory.max": "9223372036854771712\n", "memory.current": "lots\n"})
    got = pve.container_memory(129, 2001, str(tmp_path))
    assert got["memory_limit_bytes"] is None and got["memory_usage_bytes"] is None and got["oom_kills"] is None


def test_held_memory_keeps_shared_memory_and_leaves_out_the_file_lru_v2(tmp_path):
    # A container pinning 2 GiB of shared memory (SGLang's MAP_SHARED pools) beside 1 GiB of page cache: the file
    # LRU lists hold the page cache only; shmem is swap-backed (anon lists) and counts as held. ``file`` includes
    # shmem, which is why PVE's mem (current - file) misses the pools.
    gib = 1 << 30
    stat = ("anon 104857600\nfile %d\nshmem %d\nactive_anon %d\ninactive_anon 0\nactive_file %d\ninactive_file %d\n"
            % (3 * gib, 2 * gib, 2 * gib + 104857600, gib // 2, gib // 2))
    v2_container(tmp_path, 2001, 129, {"memory.max": "15032385536\n", "memory.current": "%d\n" % (3 * gib + 104857600),
                                       "memory.stat": stat})
    got = pve.container_memory(129, 2001, str(tmp_path))
    assert got["memory_held_bytes"] == 2 * gib + 104857600


def test_held_memory_v1_reads_the_hierarchical_totals(tmp_path):
    # the cgroup's own counters (0 here: everything is in the child ns/) and the hierarchical totals
    v1_container(tmp_path, {"memory.limit_in_bytes": "4294967296\n", "memory.usage_in_bytes": "3000\n",
                            "memory.oom_control": "oom_kill 0\n",
                            "memory.stat": "cache 0\nactive_file 0\ninactive_file 0\ntotal_cache 2500\ntotal_shmem 2000\n"
                                           "total_active_file 300\ntotal_inactive_file 200\n"})
    assert pve.container_memory(131, 17074, str(tmp_path))["memory_held_bytes"] == 2500


def test_held_memory_unknown_without_the_lru_counters():
    assert pve.held_bytes(1000, "anon 10\n", 2) is None
    assert pve.held_bytes(None, "active_file 1\ninactive_file 1\n", 2) is None
    assert pve.held_bytes(100, "active_file 80\ninactive_file 80\n", 2) == 0
