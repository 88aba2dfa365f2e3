# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

import os

import pytest

from ansible_collections.inferops.gpu_inference.plugins.module_utils.host import procfs
from ansible_collections.inferops.gpu_inference.plugins.module_utils.recover import recover_procs as procs
from ansible_collections.inferops.gpu_inference.tests.unit.plugins.module_utils.fake_node import fake_proc

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
     ("", None), (None, None), ("0::/lxc/1290/ns\n", 1290), ("0::/mylxc/129\n", None),
     # a host user's delegated subtree, a tenant's nested cgroups: only root makes /lxc/<vmid> at the top
     ("0::/user.slice/user-1000.slice/user@1000.service/app.slice/lxc/129/x\n", None),
     ("0::/user.slice/user-1000.slice/user@1000.service/lxc.payload.129\n", None),
     ("0::/lxc/130/ns/lxc/129\n", 130)],
)
def test_container_of_cgroup(text, vmid):
    assert procs.container_of_cgroup(text) == vmid


def test_container_of_cgroup_conflicting_lines_is_none():
    assert procs.container_of_cgroup("4:memory:/lxc/129/ns\n0::/lxc/130/ns\n") is None


def test_parse_stat_with_spaces_and_parens_in_comm():
    text = "4242 (sglang::sch (x) y) D 1 4200 4200 0 -1 4194304 1 0 0 0 9 0 0 0 20 0 1 0 136055 2409 4256"
    st = procs.parse_stat(text)
    assert st == {"pid": 4242, "comm": "sglang::sch (x) y", "state": "D", "ppid": 1, "pgid": 4200, "sid": 4200,
                  "starttime": 136055}
    assert procs.parse_stat("garbage") is None


def test_parse_nspid():
    assert procs.parse_nspid("Name:\tx\nNSpid:\t17502\t139\n") == [17502, 139]
    assert procs.parse_nspid("Name:\tx\n") == []


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
    assert procs.classify_process(state, tasks, wchan, stack) == expected


def test_parse_mountinfo_and_fdinfo():
    mi = ("135 130 0:82 / /run/lab-stuckfs rw,nosuid - fuse.lab-stuckfs lab-stuckfs rw,user_id=0\n"
          "43 27 0:41 / /var/lib/lxcfs rw - fuse.lxcfs lxcfs rw\n")
    mounts = procs.parse_mountinfo(mi)
    assert mounts[0] == {"mount_id": 135, "major": 0, "minor": 82, "mount_point": "/run/lab-stuckfs",
                         "fstype": "fuse.lab-stuckfs", "source": "lab-stuckfs", "super_options": "rw,user_id=0"}
    assert procs.parse_fdinfo_mnt_id("pos:\t0\nflags:\t0100000\nmnt_id:\t135\nino:\t2\n") == 135
    assert procs.parse_fdinfo_mnt_id("pos: 0\n") is None


def real_mount_line(path, **change):
    """The line of /proc/self/mountinfo for the mount ``path`` is on, as the kernel gives it (the mount id of an
    O_PATH fd of it, from /proc/self/fdinfo), with fields replaced for a fake node: fstype, dev ("major:minor")."""
    fd = os.open(path, os.O_PATH)
    try:
        mnt_id = procs.parse_fdinfo_mnt_id(open("/proc/self/fdinfo/%d" % fd).read())
    finally:
        os.close(fd)
    line = next(ln for ln in open("/proc/self/mountinfo").read().splitlines() if ln.split()[0] == str(mnt_id))
    left, _sep, right = line.partition(" - ")
    lf, rf = left.split(), right.split()
    if "dev" in change:
        lf[2] = change["dev"]
    if "fstype" in change:
        rf[0] = change["fstype"]
    return " ".join(lf) + " - " + " ".join(rf) + "\n", mnt_id


def test_fuse_connection_number_is_the_kernel_dev_t():
    # fs/fuse/control.c: the directory is fc->dev (sb->s_dev), MKDEV(major, minor) = major << 20 | minor.
    assert procs.fuse_connection_number(0, 82) == 82
    assert procs.fuse_connection_number(8, 1) == 8388609
    assert procs.fuse_connection_number(259, 3) == (259 << 20) + 3


def test_fuse_connections_of_uses_the_mount_of_each_held_fd(tmp_path):
    """Real files held through the fd links; the mount table names their mounts FUSE (a plain FUSE mount 0:82, a
    fuseblk one on 8:1): the connection numbers are the kernel's dev_t, not the minor."""
    (tmp_path / "a").write_text("")
    blk = tmp_path / "sub"
    blk.mkdir()
    (blk / "b").write_text("")
    line_a, id_a = real_mount_line(str(tmp_path / "a"), fstype="fuse.lab-stuckfs", dev="0:82")
    fake_proc(tmp_path, 77, {"mountinfo": line_a})
    (tmp_path / "proc/77/fd").mkdir()
    os.symlink(str(tmp_path / "a"), tmp_path / "proc/77/fd/3")
    os.symlink("pipe:[1234]", tmp_path / "proc/77/fd/4")
    conns = procs.fuse_connections_of(77, str(tmp_path))
    assert [(c["conn"], c["device"], c["fstype"]) for c in conns] == [(82, "0:82", "fuse.lab-stuckfs")]
    (tmp_path / "proc/77/mountinfo").write_text(line_a.replace(" fuse.lab-stuckfs ", " fuseblk ").replace(" 0:82 ", " 8:1 "))
    assert [(c["conn"], c["device"]) for c in procs.fuse_connections_of(77, str(tmp_path))] == [(8388609, "8:1")]
    # A mount the process's table does not show is no connection of it.
    (tmp_path / "proc/77/mountinfo").write_text("%d 1 0:99 / / rw - ext4 /dev/x rw\n" % (id_a + 100000))
    assert procs.fuse_connections_of(77, str(tmp_path)) == []
    fake_proc(tmp_path, 1, {"mountinfo": "43 27 0:41 / /var/lib/lxcfs rw - fuse.lxcfs lxcfs rw\n"})
    assert procs.host_fuse_devices(str(tmp_path)) == {"0:41"}


def test_parse_proc_devices():
    text = "Character devices:\n  1 mem\n195 nvidia-frontend\n510 nvidia-uvm\n511 nvidia-caps\nBlock devices:\n  8 sd\n"
    assert procs.parse_proc_devices(text) == [510, 511]
    assert procs.nvidia_device_kind(195, 6, [510]) == "gpu"
    assert procs.nvidia_device_kind(195, 255, [510]) == "ctl"
    assert procs.nvidia_device_kind(510, 0, [510]) == "uvm"
    assert procs.nvidia_device_kind(1, 3, [510]) is None


def test_read_process(tmp_path):
    """The fds are real files held through the fake node's fd links: /dev/null (a character device on the devtmpfs
    or tmpfs /dev, 1:3, which major 1 makes an NVIDIA "uvm" node here) is stat'ed and judged by its device number;
    a file whose mount is not on the process's mount table, and a link to nothing, are not."""
    root = str(tmp_path)
    fake_proc(tmp_path, 4242, {
        "stat": "4242 (sglang::schedul) D 1 4200 4200 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 99 1 1",
        "cgroup": CG_HYBRID, "status": "NSpid:\t4242\t139\n", "wchan": "request_wait_answer",
        "stack": FUSE_STACK,
    })
    null_line, _unused = real_mount_line("/dev/null")
    assert null_line.split(" - ")[1].split()[0] in procs.STAT_SAFE_FSTYPES
    (tmp_path / "proc/4242/mountinfo").write_text(null_line)
    (tmp_path / "proc/4242/fd").mkdir()
    os.symlink("/dev/null", tmp_path / "proc/4242/fd/7")
    os.symlink("/run/lab-stuckfs/blob", tmp_path / "proc/4242/fd/8")
    proc = procs.read_process(4242, root, [1])
    assert proc["vmid"] == 131 and proc["class"] == "stuck_fuse"
    assert proc["nvidia_fd_kinds"] == ["uvm"] and proc["holds_nvidia"] and proc["gpu_fds"] == []
    assert proc["unverified_nvidia_fds"] == [] and not proc["holds_unverified"]
    # Without major 1 among the NVIDIA majors, /dev/null is what it is.
    assert not procs.read_process(4242, root, [510])["holds_nvidia"]
    # Its mount missing from the table: not stat'ed, and /dev/null claims no NVIDIA path.
    (tmp_path / "proc/4242/mountinfo").write_text("")
    proc = procs.read_process(4242, root, [1])
    assert not proc["holds_nvidia"] and not proc["holds_unverified"]
    assert procs.read_process(999, root) is None


def test_a_claimed_path_on_a_filesystem_not_stated_is_an_unverified_holder():
    """This process's own fds, read as any holder's: a pty's /dev/pts/N (devpts, not a filesystem the scan stats)
    claims a device path when the claim is /dev/pts/ (the scan's claim is /dev/nvidia); a file on /dev/shm (tmpfs)
    is stat'ed and, being no character device, held as nothing."""
    master, slave = os.openpty()
    shm = None
    try:
        shm = os.open("/dev/shm/inferops-unit-%d" % os.getpid(), os.O_CREAT | os.O_RDWR, 0o600)
        pts = os.readlink("/proc/self/fd/%d" % slave)
        found = procs.nvidia_fds(os.getpid(), "/", [1], claim_prefix="/dev/pts/")
        mine = [u for u in found["unverified"] if u["fd"] == slave]
        assert mine and mine[0]["path"] == pts and mine[0]["fstype"] == "devpts"
        assert mine[0]["mount_point"] == "/dev/pts"
        assert all(u["fd"] != shm for u in found["unverified"])
        assert procs.nvidia_fds(os.getpid(), "/", [510]) == {"gpus": [], "kinds": [], "unverified": []}
    finally:
        os.close(master)
        os.close(slave)
        if shm is not None:
            os.close(shm)
            os.unlink("/dev/shm/inferops-unit-%d" % os.getpid())


def test_describe_unverified():
    proc = {"pid": 5, "comm": "cat", "vmid": 186, "unverified_nvidia_fds": [
        {"fd": 3, "path": "/dev/nvidia-x/blob", "fstype": "fuse.x", "mount_point": "/dev/nvidia-x", "mount_id": 9},
        {"fd": 4, "path": "/dev/nvidia0", "fstype": None, "mount_point": None, "mount_id": None}]}
    assert procs.describe_unverified(proc) == ("5/cat (CT 186): fd 3 /dev/nvidia-x/blob on fuse.x, "
                                               "fd 4 /dev/nvidia0 on a mount outside its mount table")


def test_shm_leftovers(tmp_path):
    """The walk /proc/<init>/root -> dev -> shm on real directories; the fake init's mount table names the mount
    they are on (the real one of tmp_path) as each filesystem in turn."""
    shm = tmp_path / "ctroot/dev/shm"
    shm.mkdir(parents=True)
    for n in ("nccl-abc", "psm_1", "keep.me", "sgl_x"):
        (shm / n).write_text("")
    (tmp_path / "proc/17074").mkdir(parents=True)
    os.symlink(str(tmp_path / "ctroot"), tmp_path / "proc/17074/root")
    for fstype in sorted(procs.WALK_SAFE_FSTYPES):
        line, _unused = real_mount_line(str(tmp_path), fstype=fstype)
        (tmp_path / "proc/17074/mountinfo").write_text(line)
        assert procs.shm_leftovers(17074, str(tmp_path)) == ["nccl-abc", "psm_1", "sgl_x"]
        assert procs.shm_listing(17074, str(tmp_path)) == (["keep.me", "nccl-abc", "psm_1", "sgl_x"], None)
    for fstype in ("fuse.lab-stuckfs", "fuse", "overlay", "nfs4"):
        line, _unused = real_mount_line(str(tmp_path), fstype=fstype)
        (tmp_path / "proc/17074/mountinfo").write_text(line)
        names, why = procs.shm_listing(17074, str(tmp_path))
        assert names == [] and why == ("/dev/shm of the container not listed: / is on %s, which is not walked (its "
                                       "server could make the walk wait forever)" % fstype)
    (tmp_path / "proc/17074/mountinfo").write_text("")
    assert "/ is on a mount outside its mount table" in procs.shm_listing(17074, str(tmp_path))[1]
    # A symlink is never followed.
    line, _unused = real_mount_line(str(tmp_path), fstype="tmpfs")
    (tmp_path / "proc/17074/mountinfo").write_text(line)
    os.rename(shm, tmp_path / "ctroot/elsewhere")
    os.symlink("../elsewhere", shm)
    names, why = procs.shm_listing(17074, str(tmp_path))
    assert names == [] and why.startswith("/dev/shm of the container not listed: /dev/shm cannot be opened as a directory")
    assert procs.shm_leftovers(None, str(tmp_path)) == []


# --------------------------------------------------------------------------- one /proc/PID/cgroup parser

def test_parse_proc_cgroup_and_the_hierarchy_of_a_controller():
    cg = procfs.parse_proc_cgroup(CG_HYBRID)
    assert cg == {"name=systemd": "/lxc/131/ns/system.slice/sglang.service",
                  "memory": "/lxc/131/ns/system.slice/sglang.service", "cpu": "/lxc/131/ns",
                  "": "/lxc/131/ns/system.slice/sglang.service"}
    assert procfs.cgroup_path_of(cg, "") == "/lxc/131/ns/system.slice/sglang.service"
    assert procfs.cgroup_path_of(procfs.parse_proc_cgroup("3:cpu,cpuacct:/a\n"), "cpuacct") == "/a"
    assert procfs.cgroup_path_of(cg, "pids") is None
    assert procfs.parse_proc_cgroup(None) == {} and procfs.parse_proc_cgroup("garbage\n") == {}


def test_container_of_pid(tmp_path):
    fake_proc(tmp_path, 10, {"cgroup": CG_V2})
    fake_proc(tmp_path, 11, {"cgroup": CG_HOST})
    root = str(tmp_path)
    assert procs.container_of_pid(10, root) == 129
    assert procs.container_of_pid(11, root) == "host"
    assert procs.container_of_pid(12, root) == "gone"


def test_read_stat_and_is_alive(tmp_path):
    fake_proc(tmp_path, 20, {"stat": "20 (python3) S 1 20 20 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 777 1 1"})
    fake_proc(tmp_path, 21, {"stat": "21 (python3) Z 1 21 21 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 778 1 1"})
    root = str(tmp_path)
    assert procs.read_stat(20, root)["starttime"] == 777
    assert procs.is_alive(20, 777, root)["comm"] == "python3"
    assert procs.is_alive(20, None, root) is not None
    assert procs.is_alive(20, 778, root) is None  # the PID was reused
    assert procs.is_alive(21, 778, root) is None  # a zombie
    assert procs.read_stat(22, root) is None and procs.is_alive(22, None, root) is None


def test_in_unit_reads_the_v2_line_and_v1_name_systemd():
    assert procs.in_unit("0::/lxc/129/ns/system.slice/sglang.service\n", "sglang.service")
    assert procs.in_unit("1:name=systemd:/lxc/129/ns/system.slice/sglang.service/x\n0::/\n", "sglang.service")
    assert not procs.in_unit("0::/lxc/129/ns/init.scope\n", "sglang.service")
    assert not procs.in_unit("0::/lxc/129/ns/system.slice/sglang.service-old\n", "sglang.service")
    assert not procs.in_unit(None, "sglang.service") and not procs.in_unit("0::/a/sglang.service", "")
