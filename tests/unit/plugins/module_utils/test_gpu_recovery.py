# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

import os
import signal

import pytest

from ansible_collections.inferops.gpu_inference.plugins.module_utils import gpu_recovery as gr
from ansible_collections.inferops.gpu_inference.plugins.module_utils import recover_gate as gate
from ansible_collections.inferops.gpu_inference.plugins.module_utils import recover_signals as rsig
from ansible_collections.inferops.gpu_inference.plugins.module_utils import gpu_facts as gf

# /proc/PID/cgroup of a scheduler rank in CT 129 on a PVE 8 host (pure cgroup v2).
CG_V2 = "0::/lxc/129/ns/system.slice/sglang.service\n"
# The same on the lab's cgroup v1 hybrid host.
CG_HYBRID = """\
9:name=systemd:/lxc/131/ns/system.slice/sglang.service
4:memory:/lxc/131/ns/system.slice/sglang.service
1:cpu:/lxc/131/ns
0::/lxc/131/ns/system.slice/sglang.service
"""
CG_PAYLOAD = "0::/lxc.payload.140/system.slice/x.service\n"
CG_HOST = "0::/system.slice/nvidia-persistenced.service\n"
CG_MONITOR = "0::/lxc.monitor/129\n"
CG_V1_ONLY = "4:memory:/lxc/133/ns\n3:pids:/lxc/133/ns/init.scope\n"

FUSE_STACK = """\
[<0>] request_wait_answer+0x12e/0x240 [fuse]
[<0>] fuse_simple_request+0x19c/0x2e0 [fuse]
[<0>] fuse_do_readpage+0x11e/0x1a0 [fuse]
"""
NVIDIA_STACK = """\
[<0>] uvm_spin_loop+0x4e/0x80 [nvidia_uvm]
[<0>] uvm_gpu_release+0x22/0x50 [nvidia_uvm]
"""


@pytest.mark.parametrize(
    "text,vmid",
    [(CG_V2, 129), (CG_HYBRID, 131), (CG_PAYLOAD, 140), (CG_HOST, None), (CG_MONITOR, None), (CG_V1_ONLY, 133),
     ("", None), (None, None), ("0::/lxc/1290/ns\n", 1290), ("0::/mylxc/129\n", None)],
)
def test_container_of_cgroup(text, vmid):
    assert gr.container_of_cgroup(text) == vmid


def test_container_of_cgroup_conflicting_lines_is_none():
    assert gr.container_of_cgroup("4:memory:/lxc/129/ns\n0::/lxc/130/ns\n") is None


def test_parse_stat_with_spaces_and_parens_in_comm():
    text = "4242 (sglang::sch (x) y) D 1 4200 4200 0 -1 4194304 1 0 0 0 9 0 0 0 20 0 1 0 136055 2409 4256"
    st = gr.parse_stat(text)
    assert st == {"pid": 4242, "comm": "sglang::sch (x) y", "state": "D", "ppid": 1, "pgid": 4200, "sid": 4200,
                  "starttime": 136055}
    assert gr.parse_stat("garbage") is None


def test_parse_nspid():
    assert gr.parse_nspid("Name:\tx\nNSpid:\t17502\t139\n") == [17502, 139]
    assert gr.parse_nspid("Name:\tx\n") == []


@pytest.mark.parametrize(
    "state,tasks,wchan,stack,expected",
    [
        ("S", [], None, None, "running"),
        ("Z", [], None, None, "zombie"),
        ("Z", ["S", "D"], "request_wait_answer", FUSE_STACK, "stuck_fuse"),
        ("Z", ["S"], None, None, "zombie_with_threads"),
        ("D", [], "request_wait_answer", None, "stuck_fuse"),
        ("D", [], "0", FUSE_STACK, "stuck_fuse"),
        ("D", [], "uvm_spin_loop", NVIDIA_STACK, "stuck_nvidia"),
        ("D", [], "os_acquire_mutex", "[<0>] os_acquire_mutex+0x1/0x2 [nvidia]", "stuck_nvidia"),
        ("D", [], "rpc_wait_bit_killable", "[<0>] nfs_wait_on_request+0x1", "stuck_nfs"),
        ("D", [], "io_schedule", "[<0>] io_schedule+0x12/0x40", "stuck_unknown"),
        ("S", ["D"], "request_wait_answer", None, "stuck_fuse"),
    ],
)
def test_classify_process(state, tasks, wchan, stack, expected):
    assert gr.classify_process(state, tasks, wchan, stack) == expected


def test_parse_mountinfo_and_fdinfo():
    mi = ("135 130 0:82 / /run/lab-stuckfs rw,nosuid - fuse.lab-stuckfs lab-stuckfs rw,user_id=0\n"
          "43 27 0:41 / /var/lib/lxcfs rw - fuse.lxcfs lxcfs rw\n")
    mounts = gr.parse_mountinfo(mi)
    assert mounts[0] == {"mount_id": 135, "major": 0, "minor": 82, "mount_point": "/run/lab-stuckfs",
                         "fstype": "fuse.lab-stuckfs", "source": "lab-stuckfs", "super_options": "rw,user_id=0"}
    assert gr.parse_fdinfo_mnt_id("pos:\t0\nflags:\t0100000\nmnt_id:\t135\nino:\t2\n") == 135
    assert gr.parse_fdinfo_mnt_id("pos: 0\n") is None


def _fake_proc(tmp_path, pid, files):
    base = tmp_path / "proc" / str(pid)
    for rel, content in files.items():
        p = base / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(content)
    return base


def test_fuse_connections_of_uses_fdinfo_mount_ids(tmp_path):
    _fake_proc(tmp_path, 77, {
        "mountinfo": "135 130 0:82 / /run/lab-stuckfs rw - fuse.lab-stuckfs lab-stuckfs rw\n"
                     "43 27 0:41 / /proc/meminfo rw - fuse.lxcfs lxcfs rw\n30 1 8:1 / / rw - ext4 /dev/sda1 rw\n",
        "fdinfo/3": "pos:\t0\nmnt_id:\t135\n",
        "fdinfo/4": "pos:\t0\nmnt_id:\t30\n",
    })
    conns = gr.fuse_connections_of(77, str(tmp_path))
    assert [c["conn"] for c in conns] == [82]
    assert conns[0]["fstype"] == "fuse.lab-stuckfs"
    _fake_proc(tmp_path, 1, {"mountinfo": "43 27 0:41 / /var/lib/lxcfs rw - fuse.lxcfs lxcfs rw\n"})
    assert gr.host_fuse_devices(str(tmp_path)) == {"0:41"}


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
    assert gr.parse_pct_config_gpus(conf) == [3, 6, 7]
    assert gr.parse_pct_config_gpus("") == []


def test_parse_pct_status():
    assert gr.parse_pct_status("status: running\npid: 17074\nname: x\n") == {"status": "running", "pid": 17074}
    assert gr.parse_pct_status("status: stopped\n") == {"status": "stopped", "pid": None}


def test_parse_topo_nvlink_and_closure():
    topo = """\
\tGPU0\tGPU1\tGPU2\tGPU3\tCPU Affinity
GPU0\t X \tNV18\tNV18\tSYS\t0-47
GPU1\tNV18\t X \tNV18\tSYS\t0-47
GPU2\tNV18\tNV18\t X \tSYS\t0-47
GPU3\tSYS\tSYS\tSYS\t X \t48-95
"""
    peers = gr.parse_topo_nvlink(topo)
    assert peers == {0: [1, 2], 1: [0, 2], 2: [0, 1]}
    assert gr.nvlink_closure([1], peers) == [0, 1, 2]
    assert gr.nvlink_closure([3], peers) == [3]
    assert gr.parse_topo_nvlink("") == {}


def test_parse_kernel_log():
    text = """\
[Sun Nov 29 17:08:50 2026] python3 invoked oom-killer: gfp_mask=0xcc0(GFP_KERNEL), order=0
[Sun Nov 29 17:08:50 2026] oom-kill:constraint=CONSTRAINT_MEMCG,oom_memcg=/lxc/129,task_memcg=/lxc/129/ns/system.slice/sglang.service,task=sglang::schedul
[Sun Nov 29 17:09:00 2026] NVRM: Xid (PCI:0000:18:00): 79, pid=123, GPU has fallen off the bus.
[Sun Nov 29 17:10:00 2026] eth0: link up
"""
    k = gr.parse_kernel_log(text, 129)
    assert k["oom_kills_in_container"] == 1
    assert len(k["lines"]) == 3
    assert gr.parse_kernel_log(text, 130)["oom_kills_in_container"] == 0


def test_parse_proc_devices():
    text = "Character devices:\n  1 mem\n195 nvidia-frontend\n510 nvidia-uvm\n511 nvidia-caps\nBlock devices:\n  8 sd\n"
    assert gr.parse_proc_devices(text) == [510, 511]
    assert gr.nvidia_device_kind(195, 6, [510]) == "gpu"
    assert gr.nvidia_device_kind(195, 255, [510]) == "ctl"
    assert gr.nvidia_device_kind(510, 0, [510]) == "uvm"
    assert gr.nvidia_device_kind(1, 3, [510]) is None


BASE = {"gpus": [{"index": 6, "uuid": "GPU-6", "memory_used_mib": 0}, {"index": 7, "uuid": "GPU-7", "memory_used_mib": 4}],
        "host": {"mem_total_bytes": 100 * gr.GIB, "mem_available_bytes": 90 * gr.GIB, "shmem_bytes": gr.GIB,
                 "mlocked_bytes": 0}}
TOL = {"gpu_memory_mib": 16, "mem_available_bytes": None, "shmem_bytes": 2 * gr.GIB, "mlocked_bytes": gr.GIB,
       "min_available_pct": 10}


def sample(**kw):
    s = {"vmid": 131, "container_gpus": [6, 7],
         "gpus": [{"index": 6, "uuid": "GPU-6", "memory_used_mib": 0, "apps": []},
                  {"index": 7, "uuid": "GPU-7", "memory_used_mib": 10, "apps": []}],
         "ct_holders": [], "ct_stuck": [], "nvidia_smi_error": None, "nvidia_smi_hung": False,
         "host_memory": {"mem_total_bytes": 100 * gr.GIB, "mem_available_bytes": 89 * gr.GIB, "shmem_bytes": gr.GIB,
                         "mlocked_bytes": 0}}
    s.update(kw)
    return s


def test_evaluate_clean_with_baseline():
    e = gate.evaluate_sample(sample(), BASE, TOL)
    assert e["clean"], e["reasons"]
    assert e["host"]["judged_against"] == "baseline"


def test_evaluate_driver_held_memory():
    s = sample(gpus=[{"index": 6, "uuid": "GPU-6", "memory_used_mib": 86140, "apps": []},
                     {"index": 7, "uuid": "GPU-7", "memory_used_mib": 4, "apps": []}])
    e = gate.evaluate_sample(s, BASE, TOL)
    assert not e["clean"]
    assert any("held by the driver" in r for r in e["reasons"])


@pytest.mark.parametrize("text", ["[N/A]", "[Unknown Error]", "[GPU is lost]"])
def test_evaluate_unknown_memory_is_not_clean(text):
    """A GPU whose memory.used nvidia-smi cannot tell is not clean (it used to count as 0 MiB)."""
    row = gf.parse_gpu_csv("7, NVIDIA RTX PRO 6000, 97887, %s, GPU-7, 00000000:BA:00.0, 580.95.05, Enabled\n" % text)[0]
    assert row["memory_used_mib"] is None
    s = sample(gpus=[{"index": 6, "uuid": "GPU-6", "memory_used_mib": 0, "apps": []}, dict(row, apps=[])])
    e = gate.evaluate_sample(s, BASE, TOL)
    assert not e["clean"]
    assert [r for r in e["reasons"] if r.startswith("GPU 7")] == [
        "GPU 7: nvidia-smi reports no memory.used figure ([N/A], [Unknown Error] or [GPU is lost]): it cannot be judged clean"]


def test_evaluate_own_and_foreign_apps():
    apps = [{"pid": 1, "process_name": "sglang::scheduler_TP0", "used_memory_mib": 500, "owner": 131},
            {"pid": 2, "process_name": "other", "used_memory_mib": 1000, "owner": 130}]
    s = sample(gpus=[{"index": 6, "uuid": "GPU-6", "memory_used_mib": 1500, "apps": apps},
                     {"index": 7, "uuid": "GPU-7", "memory_used_mib": 1004,
                      "apps": [{"pid": 3, "process_name": "x", "used_memory_mib": 1000, "owner": 130}]}])
    e = gate.evaluate_sample(s, BASE, TOL)
    assert not e["clean"]
    assert any("compute app(s) of CT 131" in r for r in e["reasons"])
    assert not any(r.startswith("GPU 7") for r in e["reasons"])  # only CT 130 uses GPU 7: not ours
    assert any("CT 130" in n for n in e["notes"])


def test_evaluate_host_memory_with_and_without_baseline():
    s = sample(host_memory={"mem_total_bytes": 100 * gr.GIB, "mem_available_bytes": 70 * gr.GIB,
                            "shmem_bytes": 5 * gr.GIB, "mlocked_bytes": 0}, ct_memory_usage_bytes=20 * gr.GIB)
    e = gate.evaluate_sample(s, BASE, TOL)
    assert any("MemAvailable" in r for r in e["reasons"])
    assert any("Shmem" in r for r in e["reasons"])
    e2 = gate.evaluate_sample(s, None, TOL)
    assert e2["clean"]
    assert "no baseline" in e2["notes"][0]
    s3 = sample(host_memory={"mem_total_bytes": 100 * gr.GIB, "mem_available_bytes": 5 * gr.GIB},
                ct_memory_usage_bytes=50 * gr.GIB)
    assert not gate.evaluate_sample(s3, None, TOL)["clean"]


def test_host_memory_used_by_another_tenant_is_only_a_note():
    # The node is shared: CT 129 grew by 11 GiB while CT 131 (80 MB, or stopped) is being recovered.
    for usage in (80 * gr.MIB, None):
        s = sample(host_memory={"mem_total_bytes": 100 * gr.GIB, "mem_available_bytes": 70 * gr.GIB,
                                "shmem_bytes": gr.GIB, "mlocked_bytes": 0}, ct_memory_usage_bytes=usage)
        e = gate.evaluate_sample(s, BASE, TOL)
        assert e["clean"], e["reasons"]
        assert any("not attributable to CT 131" in n for n in e["notes"])


def test_evaluate_hung_nvidia_smi():
    e = gate.evaluate_sample(sample(gpus=[], nvidia_smi_hung=True), BASE, TOL)
    assert not e["clean"]
    assert "nvidia-smi hung (timed out)" in e["reasons"]


def test_default_available_tolerance():
    assert gate.default_available_tolerance(449 * gr.GIB) == int(449 * gr.GIB * 0.02)
    assert gate.default_available_tolerance(24 * gr.GIB) == 8 * gr.GIB


def D(**kw):
    d = {"clean": False, "container_status": "running", "service_active": False, "ct_holders": [], "ct_stuck": [],
         "gpu_excess_without_process": False, "host_memory_only": False, "reboot_signals": []}
    d.update(kw)
    return d


@pytest.mark.parametrize(
    "diag,after,rung",
    [
        (D(clean=True), 0, 0),
        (D(service_active=True, ct_holders=[{"pid": 1}]), 0, 1),
        (D(ct_holders=[{"pid": 1}]), 0, 2),  # no service but escaped holders: straight to the scoped kill
        (D(service_active=True, ct_stuck=[{"pid": 1, "class": "stuck_fuse"}]), 0, 3),  # D on FUSE: abort it
        (D(ct_stuck=[{"pid": 1, "class": "stuck_nvidia"}]), 0, 6),  # D in nvidia: reboot report
        (D(gpu_excess_without_process=True), 0, 4),  # driver-held, no process: stop the container
        (D(gpu_excess_without_process=True, container_status="stopped"), 0, 5),
        (D(reboot_signals=["nvidia-smi hung"]), 0, 6),
        (D(ct_stuck=[{"pid": 1, "class": "stuck_unknown"}]), 0, 4),
        (D(host_memory_only=True), 0, 4),
        (D(host_memory_only=True, container_status="stopped"), 0, 6),
        # escalation: never at or below the rung already tried
        (D(service_active=True, ct_holders=[{"pid": 1}]), 1, 2),
        (D(ct_holders=[{"pid": 1}]), 2, 4),
        (D(ct_stuck=[{"pid": 1, "class": "stuck_fuse"}]), 3, 4),
        (D(gpu_excess_without_process=True), 4, 5),
        (D(gpu_excess_without_process=True, container_status="stopped"), 5, 6),
        (D(ct_stuck=[{"pid": 1, "class": "stuck_unknown"}], container_status="running"), 4, 6),
    ],
)
def test_choose_rung(diag, after, rung):
    got, why = gate.choose_rung(diag, after)
    assert got == rung, why
    assert got == 0 or got > after


def P(pid, pgid, vmid=131, nspid=None, starttime=1):
    return {"pid": pid, "pgid": pgid, "vmid": vmid, "nspid": nspid or [pid, pid - 1000], "starttime": starttime}


def test_pids_to_signal_scoped_to_the_container():
    init = P(5000, 5000, nspid=[5000, 1])
    rank0, rank1, main = P(5101, 5100), P(5102, 5100), P(5100, 5100)
    escaped = P(5200, 5200)
    mixed_member_host = P(5301, 5300, vmid=None)
    mixed = P(5300, 5300)
    outside = P(6000, 6000, vmid=130)
    procs = [init, rank0, rank1, main, escaped, mixed_member_host, mixed, outside]
    plan = rsig.pids_to_signal([rank0, rank1, escaped, mixed, outside, init], procs, 131, 5000)
    assert plan["groups"] == [5100, 5200]  # whole process groups, all members in CT 131
    assert plan["pids"] == [5300]  # its group has a host member: only the PID itself
    assert {s["pid"] for s in plan["skipped"]} == {6000, 5000}


def test_pids_to_signal_never_the_init_group():
    init = P(5000, 5000, nspid=[5000, 1])
    child = P(5001, 5000)  # in the init's process group
    plan = rsig.pids_to_signal([child], [init, child], 131, 5000)
    assert plan == {"groups": [], "pids": [5001], "starttimes": {5001: 1}, "skipped": []}


def test_send_signal_uses_negative_pgid_and_ignores_esrch():
    calls = []

    def fake_kill(pid, sig):
        calls.append((pid, sig))
        if pid == 7:
            raise ProcessLookupError()
        if pid == 8:
            raise PermissionError("nope")

    errors = rsig.send_signal({"groups": [100], "pids": [7, 8]}, signal.SIGKILL, fake_kill)
    assert calls == [(-100, signal.SIGKILL), (7, signal.SIGKILL), (8, signal.SIGKILL)]
    assert len(errors) == 1 and "nope" in errors[0]


def test_read_process_and_container_memory(tmp_path):
    root = str(tmp_path)
    _fake_proc(tmp_path, 4242, {
        "stat": "4242 (sglang::schedul) D 1 4200 4200 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 99 1 1",
        "cgroup": CG_HYBRID, "status": "NSpid:\t4242\t139\n", "wchan": "request_wait_answer",
        "stack": FUSE_STACK,
    })
    (tmp_path / "proc/4242/fd").mkdir()
    os.symlink("/dev/nvidia6", tmp_path / "proc/4242/fd/7")
    os.symlink("/run/lab-stuckfs/blob", tmp_path / "proc/4242/fd/8")
    seen = []

    class St:
        st_rdev = os.makedev(195, 6)

    def fake_stat(path):
        seen.append(path)
        return St()

    proc = gr.read_process(4242, root, [510], stat_fn=fake_stat)
    assert proc["vmid"] == 131 and proc["class"] == "stuck_fuse" and proc["gpu_fds"] == [6]
    assert seen == [os.path.join(root, "proc/4242/fd/7")]  # the FUSE file is never stat'ed
    assert gr.read_process(999, root) is None
    # container memory on a hybrid host: the memory hierarchy, cut at lxc/131
    _fake_proc(tmp_path, 17074, {"cgroup": "4:memory:/lxc/131/ns/init.scope\n0::/lxc/131/ns/init.scope\n"})
    _fake_proc(tmp_path, "self", {"mountinfo": "30 25 0:26 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"})
    mem = tmp_path / "sys/fs/cgroup/memory/lxc/131"
    mem.mkdir(parents=True)
    (mem / "memory.limit_in_bytes").write_text("4294967296\n")
    (mem / "memory.usage_in_bytes").write_text("80162816\n")
    (mem / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 3\n")
    got = gr.container_memory(131, 17074, root)
    assert got == {"cgroup_version": 1, "path": "/lxc/131", "memory_limit_bytes": 4294967296,
                   "memory_usage_bytes": 80162816, "oom_kills": 3}
    assert gr.container_memory(131, None, root)["path"] is None


def test_container_memory_v2(tmp_path):
    root = str(tmp_path)
    _fake_proc(tmp_path, 2001, {"cgroup": "0::/lxc/129/ns/init.scope\n"})
    _fake_proc(tmp_path, "self", {"mountinfo": "26 25 0:23 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw,nsdelegate\n"})
    d = tmp_path / "sys/fs/cgroup/lxc/129"
    d.mkdir(parents=True)
    (d / "memory.max").write_text("15032385536\n")
    (d / "memory.current").write_text("2147483648\n")
    (d / "memory.events").write_text("low 0\nhigh 0\nmax 12\noom 2\noom_kill 2\n")
    expected = {"cgroup_version": 2, "path": "/lxc/129", "memory_limit_bytes": 15032385536,
                "memory_usage_bytes": 2147483648, "oom_kills": 2}
    assert gr.container_memory(129, 2001, root) == expected
    (d / "memory.max").write_text("max\n")
    assert gr.container_memory(129, 2001, root)["memory_limit_bytes"] is None


def test_cgroup_mounts_hybrid(tmp_path):
    _fake_proc(tmp_path, "self", {"mountinfo": (
        "26 25 0:23 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw,nsdelegate\n"
        "27 25 0:24 / /sys/fs/cgroup/systemd rw - cgroup cgroup rw,xattr,name=systemd\n"
        "30 25 0:26 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"
        "31 25 0:27 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct\n"
        "32 25 0:28 / /sys/fs/cgroup/memory2 rw - cgroup cgroup rw,memory\n"
        "43 27 0:41 / /var/lib/lxcfs rw - fuse.lxcfs lxcfs rw\n")})
    assert gr._cgroup_mounts(str(tmp_path)) == {
        "": "/sys/fs/cgroup/unified", "name=systemd": "/sys/fs/cgroup/systemd", "memory": "/sys/fs/cgroup/memory",
        "cpu": "/sys/fs/cgroup/cpu,cpuacct", "cpuacct": "/sys/fs/cgroup/cpu,cpuacct"}


def test_container_cgroup_dir_v2_and_payload():
    assert gr.container_cgroup_dir({"": "/lxc/129/ns/system.slice/x.service"}, 129, "") == "/lxc/129"
    assert gr.container_cgroup_dir({"": "/lxc.payload.140/init.scope"}, 140, "") == "/lxc.payload.140"
    assert gr.container_cgroup_dir({"": "/system.slice"}, 129, "") is None


def test_shm_leftovers(tmp_path):
    shm = tmp_path / "proc/17074/root/dev/shm"
    shm.mkdir(parents=True)
    for n in ("nccl-abc", "psm_1", "keep.me", "sgl_x"):
        (shm / n).write_text("")
    assert gr.shm_leftovers(17074, str(tmp_path)) == ["nccl-abc", "psm_1", "sgl_x"]
    assert gr.shm_leftovers(None, str(tmp_path)) == []


def test_wait_until():
    ticks = iter(range(100))
    values = iter([False, False, True])
    assert rsig.wait_until(lambda: next(values), 10, 1, sleep=lambda s: None, clock=lambda: next(ticks))
    assert not rsig.wait_until(lambda: False, 2, 1, sleep=lambda s: None, clock=lambda: next(ticks))


# --------------------------------------------------------------------------- the driver's recovery action

def test_parse_recovery_actions():
    got = gr.parse_recovery_actions(0, "0, None\n1, Reset\n2, [GPU is lost]\n3, Node Reboot\n")
    assert got == {"supported": True, "error": None, "actions": {0: "None", 1: "Reset", 2: None, 3: "Node Reboot"}}
    old = gr.parse_recovery_actions(2, 'Field "gpu_recovery_action" is not a valid field to query.\n\n')
    assert old["supported"] is False and old["actions"] == {}
    broken = gr.parse_recovery_actions(255, "", "Unable to determine the device handle for GPU0000:18:00.0: Unknown Error")
    assert broken["supported"] is True and "Unknown Error" in broken["error"]


@pytest.mark.parametrize("value,kind", [("None", "ok"), ("Reset", "reset"), ("Drain P2P", "reset"),
                                        ("Drain and Reset", "reset"), ("Node Reboot", "reboot"),
                                        ("System Reboot", "reboot"), (None, "unknown"), ("Recover IMEX Domain", "unknown")])
def test_recovery_action_class(value, kind):
    assert gate.recovery_action_class(value) == kind


def test_a_gpu_reset_asked_by_the_driver_stops_the_container_first_then_resets():
    diag = {"clean": False, "container_status": "running", "service_active": True, "recovery_reset": True}
    assert gate.choose_rung(diag)[0] == gate.RUNG_STOP_CONTAINER
    stopped = dict(diag, container_status="stopped", service_active=False)
    assert gate.choose_rung(stopped, after_rung=gate.RUNG_STOP_CONTAINER)[0] == gate.RUNG_RESET_GPUS
    assert gate.choose_rung(stopped, after_rung=gate.RUNG_RESET_GPUS)[0] == gate.RUNG_REBOOT


# --------------------------------------------------------------------------- signalling a planned PID (real processes)

def _child():
    import subprocess
    proc = subprocess.Popen(["sleep", "60"])
    st = gr.parse_stat(gr._read("/proc/%d/stat" % proc.pid))
    return proc, st["starttime"]


def test_signal_pid_hits_the_planned_process():
    proc, start = _child()
    try:
        assert rsig.signal_pid(proc.pid, start, signal.SIGKILL) == "sent"
        assert proc.wait(timeout=5) == -signal.SIGKILL
    finally:
        proc.kill()


def test_signal_pid_never_hits_a_reused_pid():
    proc, start = _child()
    try:
        # The plan saw another process (another start time) under this PID: the one there now is not signalled.
        assert rsig.signal_pid(proc.pid, start + 1, signal.SIGKILL) == "reused"
        assert proc.poll() is None
        errors = rsig.send_signal({"groups": [], "pids": [proc.pid], "starttimes": {proc.pid: start + 1}}, signal.SIGKILL)
        assert errors and "reused" in errors[0] and proc.poll() is None
        assert rsig.send_signal({"groups": [], "pids": [proc.pid], "starttimes": {proc.pid: start}}, signal.SIGKILL) == []
        assert proc.wait(timeout=5) == -signal.SIGKILL
    finally:
        proc.kill()
    proc.wait()
    assert rsig.signal_pid(proc.pid, start, signal.SIGKILL) == "gone"


def test_pids_to_signal_carries_the_start_times():
    procs = [{"pid": 10, "pgid": 1, "vmid": 129, "nspid": [10, 5], "starttime": 777}]
    plan = rsig.pids_to_signal(procs, procs, 129, None)
    assert plan["pids"] == [10] and plan["starttimes"] == {10: 777}


# --------------------------------------------------------------------------- the gate cannot be loosened

_SUPPORTED = {"supported": True, "error": None, "actions": {6: "None", 7: "None"}}


def _stub(kind):
    """One reading of an otherwise clean sample made unknown or bad; each alone must make it Not clean."""
    gpu6 = {"index": 6, "uuid": "GPU-6", "memory_used_mib": 0, "apps": []}
    gpu7 = {"index": 7, "uuid": "GPU-7", "memory_used_mib": 10, "apps": []}
    return {
        "memory.used [N/A]": sample(gpus=[gpu6, dict(gpu7, memory_used_mib=None)]),
        "GPU row missing": sample(gpus=[gpu6]),
        "nvidia-smi failed": sample(gpus=[], nvidia_smi_error="nvidia-smi exited 9: no driver"),
        "nvidia-smi hung": sample(gpus=[], nvidia_smi_hung=True),
        "recovery action unreadable": sample(recovery_actions=dict(_SUPPORTED, actions={6: "None", 7: None})),
        "recovery action query failed": sample(recovery_actions=dict(_SUPPORTED, actions={}, error="Unknown Error")),
        "recovery action Reset": sample(recovery_actions=dict(_SUPPORTED, actions={6: "Reset", 7: "None"})),
        "compute app listed but gone": sample(gpus=[gpu6, dict(gpu7, apps=[
            {"pid": 9, "owner": "gone", "used_memory_mib": 0}])]),
        "17 MiB above baseline": sample(gpus=[gpu6, dict(gpu7, memory_used_mib=10 + 17)]),
        "a holder in the container": sample(ct_holders=[{"pid": 5, "comm": "python3"}]),
        "a stuck process": sample(ct_stuck=[{"pid": 5, "comm": "python3", "class": "stuck_fuse"}]),
    }[kind]


def test_the_clean_sample_the_stubs_start_from_is_clean():
    assert gate.evaluate_sample(sample(recovery_actions=_SUPPORTED), BASE, TOL)["clean"]


@pytest.mark.parametrize("kind", ["memory.used [N/A]", "GPU row missing", "nvidia-smi failed", "nvidia-smi hung",
                                  "recovery action unreadable", "recovery action query failed",
                                  "recovery action Reset", "compute app listed but gone", "17 MiB above baseline",
                                  "a holder in the container", "a stuck process"])
def test_any_unknown_or_bad_reading_alone_is_not_clean(kind):
    e = gate.evaluate_sample(_stub(kind), BASE, TOL)
    assert not e["clean"] and e["reasons"], kind


# --------------------------------------------------------------------------- when a verification may stop polling

@pytest.mark.parametrize("rung,findings,elapsed,after,expect", [
    (0, {"holders": 3}, 0, 1, True),                                            # the gate passes
    (6, {"reboot_signals": ["kernel Xid 79"]}, 0, 1, True),                     # a reboot signal
    (4, {"recovery_reset": True, "container_status": "running"}, 0, 1, True),   # the driver asks for a reset
    (5, {"recovery_reset": True, "container_status": "stopped"}, 0, 5, False),  # ... the reset itself may clear it
    (3, {"stuck": 1, "container_status": "running"}, 29, 2, False),             # stuck, within the grace
    (3, {"stuck": 1, "container_status": "running"}, 30, 2, True),              # stuck past the grace
    (2, {"holders": 2, "container_status": "running"}, 14, 1, False),           # teardown may still be going on
    (2, {"holders": 2, "container_status": "running"}, 15, 1, True),            # not released past the grace
    (4, {"gpu_excess_without_process": True, "container_status": "running"}, 15, 2, True),
    (5, {"container_status": "stopped"}, 15, 4, True),
    (4, {"container_status": "running"}, 100, 2, False),                        # nothing the graces cover: budget
])
def test_settled(rung, findings, elapsed, after, expect):
    done, why = gate.settled(rung, findings, elapsed, after, 30, 15)
    assert done is expect, why
