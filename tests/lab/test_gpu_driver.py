"""The lab's simulated NVIDIA driver on the node: nvidia-smi formats, allocation lifetime, reset, -pm.

Runs as root; brings the GPU simulator up with tests/lab/labctl gpu up (idempotent).
"""
import os
import re
import signal

import pytest

from gpu import testlib as t

pytestmark = t.needs_root
GPU = 5  # a GPU the lab's SGLang CT is least likely to be using while these run


@pytest.fixture(scope="module", autouse=True)
def gpu_lab():
    t.lab_up()
    yield


@pytest.fixture
def persistenced_stopped():
    with t.persistenced_stopped():
        yield


@pytest.fixture
def pm_restore():
    before = t.driver({"op": "query"})["gpus"]
    yield
    for g in before:
        t.smi("-pm", "1" if g["persistence_mode"] == "Enabled" else "0", "-i", str(g["index"]))


def test_device_nodes_have_nvidia_numbers():
    import stat
    for path, major, minor in [("/dev/nvidia0", 195, 0), ("/dev/nvidia7", 195, 7), ("/dev/nvidiactl", 195, 255),
                               ("/dev/nvidia-uvm", 510, 0), ("/dev/nvidia-uvm-tools", 510, 1)]:
        st = os.stat(path)
        assert stat.S_ISCHR(st.st_mode)
        assert (os.major(st.st_rdev), os.minor(st.st_rdev)) == (major, minor)
    assert "510 nvidia-uvm" in open("/run/inferops-lab/gpu/devices").read()


def test_labgpu_up_is_idempotent_and_status():
    r = t.run(t.LABGPU + ["up"])
    assert r.returncode == 0 and "already running" in r.stdout
    r = t.run(t.LABGPU + ["status"])
    assert r.returncode == 0, r.stdout
    for v in ("580.95.05", "580.82.07"):
        assert os.access("/var/lib/inferops-lab/nvidia/NVIDIA-Linux-x86_64-%s.run" % v, os.X_OK)


def test_query_gpu_csv_formats():
    q = "index,name,uuid,memory.total,memory.used,memory.free,driver_version,persistence_mode,pci.bus_id"
    r = t.smi("--query-gpu=" + q, "--format=csv")
    assert r.returncode == 0
    lines = r.stdout.splitlines()
    assert lines[0] == ("index, name, uuid, memory.total [MiB], memory.used [MiB], memory.free [MiB], "
                        "driver_version, persistence_mode, pci.bus_id")
    assert len(lines) == 9
    f = lines[1].split(", ")
    assert f[0] == "0" and f[1] == "NVIDIA RTX PRO 6000 Blackwell Server Edition"
    assert re.fullmatch(r"GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", f[2])
    assert f[3] == "97887 MiB" and re.fullmatch(r"\d+ MiB", f[4]) and f[6] == "580.95.05"
    assert f[7] in ("Enabled", "Disabled") and re.fullmatch(r"00000000:[0-9A-F]{2}:00\.0", f[8])
    r = t.smi("--query-gpu=index,memory.total,memory.used", "--format=csv,noheader,nounits", "-i", "3")
    assert r.stdout == "3, 97887, %d\n" % t.gpu_used(3)
    r = t.smi("--query-gpu=index,memory.total", "--format=csv,noheader")
    assert r.stdout.splitlines()[0] == "0, 97887 MiB"
    r = t.smi("--query-gpu=index,memory.total", "--format=csv,nounits")
    assert r.stdout.splitlines()[0] == "index, memory.total"


def test_query_compute_apps_header_and_list():
    r = t.smi("--query-compute-apps=pid,process_name,used_memory,gpu_uuid,gpu_bus_id", "--format=csv")
    assert r.returncode == 0
    assert r.stdout.splitlines()[0] == "pid, process_name, used_gpu_memory [MiB], gpu_uuid, gpu_bus_id"


def test_list_and_selection_and_errors():
    r = t.smi("-L")
    assert r.returncode == 0
    assert re.fullmatch(r"GPU 0: NVIDIA RTX PRO 6000 Blackwell Server Edition \(UUID: GPU-[0-9a-f-]+\)",
                        r.stdout.splitlines()[0])
    uuid = r.stdout.splitlines()[2].split("UUID: ")[1].rstrip(")")
    assert t.smi("--query-gpu=index", "--format=csv,noheader", "-i", uuid).stdout == "2\n"
    bus = t.smi("--query-gpu=pci.bus_id", "--format=csv,noheader", "-i", "4").stdout.strip()
    assert t.smi("--query-gpu=index", "--format=csv,noheader", "-i", bus).stdout == "4\n"
    r = t.smi("-i", "99")
    assert r.returncode == 6 and "No devices were found" in r.stdout
    r = t.smi("--query-gpu=bogus", "--format=csv")
    assert r.returncode == 2 and 'Field "bogus" is not a valid field to query.' in r.stdout
    r = t.smi("--bogus")
    assert r.returncode == 2


def test_plain_table():
    r = t.smi()
    assert r.returncode == 0
    out = r.stdout
    assert "| NVIDIA-SMI 580.95.05" in out and "Driver Version: 580.95.05" in out and "CUDA Version: 13.0" in out
    body = [line for line in out.splitlines()[1:] if line]
    assert all(len(line) == 91 for line in body), [line for line in body if len(line) != 91]
    assert "97887MiB" in out and "Processes:" in out


def test_alloc_shows_and_is_freed_when_process_gone():
    base = t.gpu_used(GPU)
    h = t.Holder(GPU, 2048)
    try:
        assert h.reply["ok"] and h.reply["handle"].startswith("h-")
        assert t.gpu_used(GPU) == base + 2048
        apps = [a for a in t.compute_apps() if a[0] == str(h.pid)]
        assert len(apps) == 1
        pid, name, used, uuid, bus = apps[0]
        assert used == "2048" and name.endswith("python3")
        g = t.driver({"op": "query"})["gpus"][GPU]
        assert uuid == g["uuid"] and bus == g["pci_bus_id"]
        table = t.smi("-i", str(GPU)).stdout
        assert re.search(r"\|\s+%d\s+N/A\s+N/A\s+%d\s+C\s+\S+python3\s+2048MiB \|" % (GPU, h.pid), table), table
    finally:
        h.stop()
    assert t.gpu_used(GPU) == base
    assert not [a for a in t.compute_apps() if a[0] == str(h.pid)]


def test_zombie_holds_nothing_but_zombie_leader_with_live_thread_does():
    base = t.gpu_used(GPU)
    h = t.Holder(GPU, 1024)
    os.kill(h.pid, signal.SIGKILL)
    assert t.wait_for(lambda: t.proc_state(h.pid) == "Z")  # not reaped yet: a zombie
    assert t.gpu_used(GPU) == base
    h.p.wait()
    z = t.Holder(GPU, 1024, mode="zombie-leader")
    try:
        assert t.wait_for(lambda: t.proc_state(z.pid) == "Z")  # defunct leader, one thread alive
        assert t.gpu_used(GPU) == base + 1024
    finally:
        z.stop()
    assert t.gpu_used(GPU) == base


def test_alloc_requires_open_node_and_respects_free_memory():
    rep = t.driver({"op": "alloc", "gpu": GPU, "bytes": 1 << 20})  # this process holds no /dev/nvidiaN
    assert not rep["ok"] and "cudaErrorNoDevice" in rep["error"]
    h = t.Holder(GPU, 200000)  # more than 97887 MiB
    try:
        assert not h.reply["ok"] and "out of memory" in h.reply["error"]
    finally:
        h.stop()


def test_free_releases_allocation():
    base = t.gpu_used(GPU)
    h = t.Holder(GPU, 512)
    try:
        assert t.driver({"op": "free", "handle": h.reply["handle"]})["ok"]  # root on the host may free
        assert t.gpu_used(GPU) == base
    finally:
        h.stop()


def test_persistenced_holds_every_gpu_and_blocks_a_reset():
    pid = t.persistenced_pid()
    assert pid is not None, "labgpu up starts the node's nvidia-persistenced"
    held = sorted(os.readlink("/proc/%d/fd/%s" % (pid, fd)) for fd in os.listdir("/proc/%d/fd" % pid))
    assert ["/dev/nvidia%d" % i for i in range(8)] == [h for h in held if h[11:].isdigit()]
    bus = t.driver({"op": "query"})["gpus"][GPU]["pci_bus_id"]
    r = t.smi("-r", "-i", str(GPU))
    assert r.returncode == 255 and "GPU %s: In use by another client" % bus in r.stdout
    assert t.run([t.PERSISTENCED]).returncode == 1  # a second instance refuses to start


def test_reset_refused_with_client_or_persistence_then_works(pm_restore, persistenced_stopped):
    bus = t.driver({"op": "query"})["gpus"][GPU]["pci_bus_id"]
    assert t.smi("-pm", "1", "-i", str(GPU)).returncode == 0
    r = t.smi("-r", "-i", str(GPU))
    assert r.returncode == 255
    assert "The following GPUs could not be reset:\n  GPU %s: In use by another client" % bus in r.stdout
    r = t.smi("-pm", "0", "-i", str(GPU))
    assert r.returncode == 0 and r.stdout == "Disabled persistence mode for GPU %s.\nAll done.\n" % bus
    h = t.Holder(GPU, 256)
    try:
        r = t.smi("--gpu-reset", "-i", str(GPU))
        assert r.returncode == 255 and "In use by another client" in r.stdout
        assert "Please first kill all processes using this device" in r.stdout
    finally:
        h.stop()
    r = t.smi("-r", "-i", str(GPU))
    assert r.returncode == 0, r.stdout
    assert r.stdout == "GPU %s was successfully reset.\nAll done.\n" % bus


def test_pm_and_reset_need_root(pm_restore):
    nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    r = t.run(nobody + [t.SMI, "-pm", "1", "-i", "0"])
    assert r.returncode == 4
    assert "Insufficient Permissions" in r.stdout and "Terminating early due to previous errors." in r.stdout
    r = t.run(nobody + [t.SMI, "-r", "-i", "0"])
    assert r.returncode == 4 and "Insufficient Permissions" in r.stdout
    r = t.run(nobody + [t.SMI, "--query-gpu=index", "--format=csv,noheader", "-i", "0"])
    assert r.returncode == 0 and r.stdout == "0\n"  # queries need no privilege


def test_no_driver_exit_9():
    r = t.run([t.SMI], env=dict(os.environ, NVIDIA_LAB_SOCKET="/nonexistent/driver.sock"))
    assert r.returncode == 9
    assert r.stdout.startswith("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.")


def test_state_survives_daemon_restart():
    base = t.gpu_used(GPU)
    h = t.Holder(GPU, 768)
    try:
        pid = int(open("/run/inferops-lab/gpu-driverd.pid").read())
        os.kill(pid, signal.SIGTERM)
        assert t.wait_for(lambda: t.proc_state(pid) in (None, "Z"))
        t.lab_up()
        assert t.gpu_used(GPU) == base + 768
        assert [a for a in t.compute_apps() if a[0] == str(h.pid)]
    finally:
        h.stop()
    assert t.gpu_used(GPU) == base


def _restart_driver(env_topology=None):
    """labgpu up restarts the daemon when its settings change (LABGPU_TOPOLOGY); the driver state survives."""
    env = dict(os.environ)
    env.pop("LABGPU_TOPOLOGY", None)
    if env_topology:
        env["LABGPU_TOPOLOGY"] = env_topology
    r = t.run(t.LABGPU + ["up"], env=env)
    assert r.returncode == 0, r.stdout + r.stderr


def test_topo_matrix_pcie_node_and_nvswitch_node():
    # The lab's node is a PCIe server: two sockets of four GPUs, no NVLink (what recover then resets GPU by GPU).
    r = t.smi("topo", "-m")
    assert r.returncode == 0, r.stdout
    lines = r.stdout.splitlines()
    assert lines[0] == "\t" + "\t".join("GPU%d" % i for i in range(8)) + "\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID"
    assert lines[1].split("\t")[:9] == ["GPU0", " X ", "NODE", "NODE", "NODE", "SYS", "SYS", "SYS", "SYS"]
    assert "NV" not in "".join(lines[1:9]) and "  NV#  = Connection traversing a bonded set of # NVLinks" in lines
    assert t.smi("topo").returncode == 2
    # An HGX board (LABGPU_TOPOLOGY=nvswitch): every pair joined by 18 NVLinks, so a reset takes all eight.
    try:
        _restart_driver("nvswitch")
        row = t.smi("topo", "-m").stdout.splitlines()[1].split("\t")
        assert row[:9] == ["GPU0", " X "] + ["NV18"] * 7
    finally:
        _restart_driver()
    assert t.smi("topo", "-m").stdout.splitlines()[1].split("\t")[2] == "NODE"


def kmsg_lines_after(seq):
    """Kernel log records after sequence number ``seq``, read here from /dev/kmsg (not with the collection's reader)."""
    fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
    out, last = [], seq
    try:
        while True:
            try:
                rec = os.read(fd, 16384).decode("utf-8", "replace")
            except BlockingIOError:
                break
            except BrokenPipeError:
                continue
            head, _, msg = rec.partition(";")
            n = int(head.split(",")[1])
            last = max(last, n)
            if n > seq:
                out.append(msg.split("\n", 1)[0])
    finally:
        os.close(fd)
    return out, last


@pytest.fixture
def gpu_fault_clear():
    yield
    t.driver({"op": "fault_clear", "gpus": [GPU]})


def test_gpu_lost_fails_nvidia_smi_with_rc_15_and_logs_xid_79(gpu_fault_clear):
    _, seq = kmsg_lines_after(0)
    bus = t.driver({"op": "query"})["gpus"][GPU]["pci_bus_id"]
    assert t.driver({"op": "fault_set", "fault": "gpu_lost", "gpu": GPU})["ok"]
    r = t.smi("--query-gpu=index,memory.used", "--format=csv,noheader,nounits")
    assert r.returncode == 15 and r.stdout == (
        "Unable to determine the device handle for GPU %s: GPU is lost.  Reboot the system to recover this GPU\n"
        % bus[4:])
    assert t.smi("--query-gpu=index", "--format=csv,noheader", "-i", str((GPU + 1) % 8)).returncode == 0
    assert t.smi("-r", "-i", str(GPU)).returncode == 15  # nor can it be reset
    lines, _ = kmsg_lines_after(seq)
    assert "NVRM: Xid (PCI:%s:%s): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus." % (
        bus[4:8], bus[9:14]) in lines
    h = t.Holder(GPU, 256)
    try:
        assert not h.reply["ok"] and "fallen off the bus" in h.reply["error"]
    finally:
        h.stop()


def test_memory_na_prints_na_for_memory_figures(gpu_fault_clear):
    h = t.Holder(GPU, 512)
    try:
        assert t.driver({"op": "fault_set", "fault": "memory_na", "gpu": GPU})["ok"]
        r = t.smi("--query-gpu=index,memory.used,memory.free", "--format=csv,noheader,nounits", "-i", str(GPU))
        assert r.returncode == 0 and r.stdout == "%d, [N/A], [N/A]\n" % GPU
        assert [a[2] for a in t.compute_apps() if a[0] == str(h.pid)] == ["[N/A]"]
    finally:
        h.stop()


def test_util_latch_busy_with_no_process_until_a_clean_client_or_a_reset(gpu_fault_clear, pm_restore,
                                                                         persistenced_stopped):
    """Fault util-latch (Datura-ai/lium-io PR #1142, #1140): 100 % utilisation with no process and no memory of its
    own; a reset is refused while persistence mode holds the GPU; a client that opens and closes cleanly clears it,
    a killed one does not; a reset with persistence mode off clears it too."""
    def util():
        r = t.smi("--query-gpu=index,utilization.gpu", "--format=csv,noheader,nounits", "-i", str(GPU))
        assert r.returncode == 0, r.stdout
        return r.stdout

    assert util() == "%d, 0\n" % GPU
    assert t.smi("-pm", "1", "-i", str(GPU)).returncode == 0
    assert t.driver({"op": "fault_set", "fault": "util_latch", "gpu": GPU})["ok"]
    assert util() == "%d, 100\n" % GPU
    bus = t.driver({"op": "query"})["gpus"][GPU]["pci_bus_id"]
    assert not [a for a in t.compute_apps() if a[3] == t.driver({"op": "query"})["gpus"][GPU]["uuid"]]
    r = t.smi("-r", "-i", str(GPU))
    assert r.returncode == 255 and "GPU %s: In use by another client" % bus in r.stdout
    killed = t.Holder(GPU, 64)
    killed.stop()  # a client that dies does not clear it
    t.gpu_used(GPU)
    assert util() == "%d, 100\n" % GPU
    h = t.Holder(GPU, 64)
    try:
        assert t.driver({"op": "free", "handle": h.reply["handle"]})["ok"]  # a clean close after the latch
        assert util() == "%d, 0\n" % GPU
    finally:
        h.stop()
    assert t.driver({"op": "fault_set", "fault": "util_latch", "gpu": GPU})["ok"]
    assert t.smi("-pm", "0", "-i", str(GPU)).returncode == 0
    r = t.smi("-r", "-i", str(GPU))
    assert r.returncode == 0, r.stdout
    assert util() == "%d, 0\n" % GPU


def test_xid_on_exit_is_logged_when_the_client_goes_away(gpu_fault_clear):
    bus = t.driver({"op": "query"})["gpus"][GPU]["pci_bus_id"]
    assert t.driver({"op": "fault_set", "fault": "xid_on_exit", "gpu": GPU, "xid": 45})["ok"]
    h = t.Holder(GPU, 256)
    _, seq = kmsg_lines_after(0)
    h.stop()
    t.gpu_used(GPU)  # the driver notices the exit on the next request
    lines, _ = kmsg_lines_after(seq)
    assert [ln for ln in lines if ln.startswith("NVRM: Xid (PCI:%s:%s): 45, pid=%d," % (bus[4:8], bus[9:14], h.pid))]


def test_persistenced_runs_under_its_root_owned_unit_and_comes_back_through_it():
    """What rung 5 does: systemctl stop, then systemctl start of the unit; the new main process is in the unit's
    cgroup and holds every GPU again."""
    pid = t.persistenced_pid()
    unit = t.unit_show()
    assert (unit["LoadState"], unit["ActiveState"], unit["MainPID"]) == ("loaded", "active", str(pid))
    st = os.stat(unit["FragmentPath"])
    assert unit["FragmentPath"] == "/lib/systemd/system/nvidia-persistenced.service"
    assert (st.st_uid, st.st_mode & 0o777) == (0, 0o644)
    assert "path=/usr/bin/nvidia-persistenced ;" in unit["ExecStart"]
    assert "name=systemd:/system.slice/nvidia-persistenced.service" in open("/proc/%d/cgroup" % pid).read()
    assert t.run([t.SYSTEMCTL, "stop", t.PERSISTENCED_UNIT], timeout=150).returncode == 0
    assert t.persistenced_pid() is None and t.unit_show()["ActiveState"] == "inactive"
    assert t.run([t.SYSTEMCTL, "start", t.PERSISTENCED_UNIT], timeout=150).returncode == 0
    new = t.persistenced_pid()
    assert new is not None and new != pid and t.unit_show()["MainPID"] == str(new)
    assert "name=systemd:/system.slice/nvidia-persistenced.service" in open("/proc/%d/cgroup" % new).read()
    assert open("/proc/%d/comm" % new).read().strip() == "nvidia-persiste"
    held = [os.readlink("/proc/%d/fd/%s" % (new, fd)) for fd in os.listdir("/proc/%d/fd" % new)]
    assert sorted(h for h in held if h[11:].isdigit()) == ["/dev/nvidia%d" % i for i in range(8)]
