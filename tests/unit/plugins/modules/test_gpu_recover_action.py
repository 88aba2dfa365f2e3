# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Rung 2 (kill_holders) judges process groups by every process on the host, not by the container's alone, and sends
real signals to real processes (the scan reads the real /proc); rungs 1, 4 and 5 on canned command output."""
from __future__ import annotations

import os
import stat

import pytest

import yaml

from ansible_collections.inferops.gpu_inference.plugins.module_utils.host import bounded_command
from ansible_collections.inferops.gpu_inference.plugins.module_utils.recover import recover_daemons as rd
from ansible_collections.inferops.gpu_inference.plugins.module_utils.recover import recover_gate as gate
from ansible_collections.inferops.gpu_inference.plugins.module_utils.recover import recover_procs as procs
from ansible_collections.inferops.gpu_inference.plugins.module_utils.recover import recover_signals as rsig
from ansible_collections.inferops.gpu_inference.plugins.modules import gpu_recover_action as action
from ansible_collections.inferops.gpu_inference.tests.unit.plugins.module_utils.real_procs import children  # noqa: F401  # pylint: disable=unused-import

VMID = 129


class FakeModule:
    params = {"term_grace": 0, "wait": 0, "command_timeout": 5}
    check_mode = False


# The kill tests' container: a VMID no node has (PVE's highest), so that no real container's process on the machine
# running the tests (a lab CT) is ever attributed to it, planned or signalled.
KILL_VMID = 999999999


def real_scan(monkeypatch, mine, changes=()):
    """The module's scan reads the real /proc; the test only says which of its processes stand for the container's
    (it cannot put them in a container's cgroup: tests/lab/test_hostile_signals.py does). Every other process keeps
    what its cgroup says, except that none is KILL_VMID's. ``changes``: per scan, in order, {pid: {field: value}}
    laid over what was read (the last one stays)."""
    real, changes, calls = procs.scan_processes, list(changes), []

    def scan(vmid, root, majors):
        assert vmid == KILL_VMID
        got = real(vmid, root, majors)
        over = changes[min(len(calls), len(changes) - 1)] if changes else {}
        calls.append(1)
        for p in got["all"]:
            p["vmid"] = KILL_VMID if p["pid"] in mine else (None if p["vmid"] == KILL_VMID else p["vmid"])
            p.update(over.get(p["pid"], {}))
        got["container"] = [p for p in got["all"] if p["vmid"] == KILL_VMID]
        got["nvidia_holders"] = [p for p in got["all"] if p["holds_nvidia"]]
        return got
    monkeypatch.setattr(procs, "scan_processes", scan)
    return calls


def kill_holders(monkeypatch, holders, term_grace=0, service=None, timed_out=False, wait=10):
    """Run the real kill_holders (real scan, real signals); ``holders`` are what nvidia-smi lists as compute apps."""
    monkeypatch.setattr(action, "compute_app_pids", lambda module, smi, timeout: [h.pid for h in holders])
    monkeypatch.setattr(action, "ct_init_pid", lambda module, vmid: None)

    class Module(FakeModule):
        params = dict(FakeModule.params, wait=10, service=service)
    result = {"refused": [], "signalled": [], "changed": False}
    action.kill_holders(Module(), KILL_VMID, "/usr/bin/nvidia-smi", result, term_grace, wait, timed_out)
    return result


def test_a_group_shared_with_the_host_is_never_signalled(monkeypatch, children):
    # `pct exec 129 -- worker` run from a host shell: the worker keeps the shell's process group, which also holds
    # the shell itself and a host `sleep`.
    shell = children(process_group=0)
    worker, sleep = children(process_group=shell.pid), children(process_group=shell.pid)
    real_scan(monkeypatch, {worker.pid})
    result = kill_holders(monkeypatch, [worker])
    assert result["planned"]["process_groups"] == [] and result["planned"]["pids"] == [worker.pid], result
    assert result["signalled"] == [{"signal": "SIGKILL", "groups": [], "pids": [worker.pid]}], result
    assert worker.gone() and shell.alive() and sleep.alive()


def test_a_group_all_in_the_container_is_signalled_whole(monkeypatch, children):
    main = children(process_group=0)
    rank0 = children(process_group=main.pid)
    real_scan(monkeypatch, {main.pid, rank0.pid})
    result = kill_holders(monkeypatch, [rank0])
    assert result["signalled"] == [{"signal": "SIGKILL", "groups": [main.pid], "pids": []}]
    assert main.gone() and rank0.gone() and not result["remaining"]


def test_a_reused_pid_is_never_signalled(monkeypatch, children):
    """The scan saw another process under the holder's PID (another start time) than the one there when the signal
    is sent: SIGTERM is refused, and nothing is planned again for SIGKILL."""
    rank0 = children(process_group=0)
    start = procs.read_stat(rank0.pid)["starttime"]
    real_scan(monkeypatch, {rank0.pid}, [{rank0.pid: {"starttime": start - 1}}])
    result = kill_holders(monkeypatch, [rank0], term_grace=1)
    assert result["signalled"] == [{"signal": "SIGTERM", "groups": [], "pids": []}], (
        result, rank0.pid, start, procs.read_stat(rank0.pid))
    assert result["planned"]["process_groups"] == [rank0.pid]  # alone in its group, the leader
    assert [r["pgid"] for r in result["refused"]] == [rank0.pid] and "no planned member" in result["refused"][0]["why"]
    assert rank0.alive() and not rank0.got_term()


def test_a_reused_pid_outside_any_planned_group_is_never_signalled(monkeypatch, children):
    shell = children(process_group=0)
    worker = children(process_group=shell.pid)  # its group is shared with the host: planned by PID
    start = procs.read_stat(worker.pid)["starttime"]
    real_scan(monkeypatch, {worker.pid}, [{worker.pid: {"starttime": start + 1}}])
    result = kill_holders(monkeypatch, [worker], term_grace=1)
    assert result["planned"]["pids"] == [worker.pid]
    assert {"pid": worker.pid, "why": rsig.REFUSALS["reused"]} in result["refused"]
    assert worker.alive() and not worker.got_term() and shell.alive()


def test_sigkill_is_planned_again_from_a_fresh_table(monkeypatch, children):
    """Between SIGTERM and SIGKILL a member of the planned group leaves the container (the second scan says so; the
    lab moves one for real): the group is judged again, only the holder gets SIGKILL."""
    main = children(process_group=0, on_term="stay")
    rank0 = children(process_group=main.pid, on_term="stay")
    real_scan(monkeypatch, {main.pid, rank0.pid}, [{}, {main.pid: {"vmid": None}}])
    result = kill_holders(monkeypatch, [rank0], term_grace=1, wait=1)  # main stays: the wait runs out
    assert result["signalled"] == [{"signal": "SIGTERM", "groups": [main.pid], "pids": []},
                                   {"signal": "SIGKILL", "groups": [], "pids": [rank0.pid]}]
    assert main.got_term() and rank0.got_term() and rank0.gone() and main.alive()
    assert [r["pid"] for r in result["remaining"]] == [main.pid]


# Rung 5 on an NVSwitch node: every GPU is every other's NVLink peer, so GPU 0's reset group is all eight.
GPU_ROWS = "".join("%d, NVIDIA H100, 81559, 0, GPU-%d, 00000000:%02X:00.0, 580.95.05, Disabled, 0\n" % (i, i, i)
                   for i in range(8))
TOPO_NVSWITCH = "\tGPU0\tGPU1\tGPU2\tGPU3\tGPU4\tGPU5\tGPU6\tGPU7\n" + "".join(
    "GPU%d\t%s\n" % (i, "\t".join("X" if j == i else "NV18" for j in range(8))) for i in range(8))
PCT_LIST = "VMID       Status     Lock         Name\n129        stopped                 a\n130        running                 b\n"


TOPO_PCIE = "\tGPU0\tGPU1\tGPU2\tGPU3\tGPU4\tGPU5\tGPU6\tGPU7\n" + "".join(
    "GPU%d\t%s\n" % (i, "\t".join("X" if j == i else ("NODE" if i // 4 == j // 4 else "SYS") for j in range(8)))
    for i in range(8))


def smi_q(minor_of_index):
    """nvidia-smi -q as NVIDIA's prints it: one "GPU <bus id>" section per GPU with its Minor Number."""
    return "\n==============NVSMI LOG==============\n\nAttached GPUs : 8\n" + "".join(
        "GPU 00000000:%02X:00.0\n    Product Name                          : NVIDIA H100\n"
        "    Minor Number                          : %s\n\n" % (i, minor_of_index.get(i, "N/A")) for i in range(8))


CURRENT = {}


class ResetModule(FakeModule):
    systemctl_present = True

    def __init__(self, other_config, own_config="dev0: /dev/nvidia0\ndev1: /dev/nvidia1\n", minors=None,
                 topo=TOPO_NVSWITCH, q_rc=0):
        self.calls = []
        self.systemctl = []
        self.other_config = other_config
        self.own_config = own_config
        self.minors = {i: i for i in range(8)} if minors is None else minors
        self.topo = topo
        self.q_rc = q_rc
        CURRENT["module"] = self

    def get_bin_path(self, name, required=False, opt_dirs=None):
        return {"pct": "/usr/sbin/pct", "systemctl": "/usr/bin/systemctl" if self.systemctl_present else None}.get(name)

    def show(self):
        """systemd's view of nvidia-persistenced.service: MainPID 4321 until stopped, 5555 once started again."""
        main = 5555 if getattr(self, "daemon_started", False) else 0 if getattr(self, "daemon_stopped", False) else 4321
        return SHOW.replace("MainPID=4321", "MainPID=%d" % main).replace(
            "ActiveState=active", "ActiveState=%s" % ("active" if main else "inactive"))

    def run_command(self, args, **kwargs):
        cmd = list(args)
        self.calls.append(cmd)
        if cmd[-1] == "list":
            return 0, PCT_LIST, ""
        if cmd[-2:] == ["config", "130"]:
            return 0, self.other_config, ""
        if cmd[-2:] == ["config", str(VMID)]:
            return 0, self.own_config, ""
        if cmd[-1] == "-q":
            return (self.q_rc, "", "Failed to initialize NVML: Unknown Error\n") if self.q_rc else (0, smi_q(self.minors), "")
        if any(a.startswith("--query-gpu") for a in cmd):
            return 0, GPU_ROWS, ""
        if cmd[-2:] == ["topo", "-m"]:
            return 0, self.topo, ""
        if any(a.startswith("--query-compute-apps") for a in cmd):
            return 0, "", ""
        if "-r" in cmd:
            return 0, "GPU reset", ""
        if "/usr/bin/systemctl" in cmd:
            verb = cmd[cmd.index("/usr/bin/systemctl") + 1]
            self.systemctl.append(cmd[cmd.index("/usr/bin/systemctl") + 1:])
            if verb == "show":
                return 0, self.show(), ""
            if verb == "stop":
                self.daemon_stopped = True
            if verb == "start":
                self.daemon_started = True
            return 0, "", ""
        return 1, "", "unexpected %s" % cmd

    def fail_json(self, **kw):
        raise AssertionError(kw)


def reset(monkeypatch, other_config, holders=(), stop_host_daemons=True, after_start=(), gpus=(0, 1), unverified=(),
          **kw):
    module = ResetModule(other_config, **kw)
    monkeypatch.setattr(procs, "scan_processes", lambda vmid, root, majors: {
        "nvidia_holders": list(after_start if getattr(module, "daemon_started", False) else holders),
        "unverified_holders": list(unverified)})
    monkeypatch.setattr(procs, "uvm_majors", lambda: [])
    module.params = dict(FakeModule.params, gpus=list(gpus), stop_host_daemons=stop_host_daemons)
    result = {"refused": [], "reset": [], "changed": False}
    action.reset_gpus(module, VMID, "/usr/bin/nvidia-smi", result)
    return result, module


def test_a_reset_group_holding_another_running_containers_gpu_is_refused(monkeypatch):
    result, module = reset(monkeypatch, "dev0: /dev/nvidia2\nmemory: 256\n")
    assert not any("-r" in c for c in module.calls), "no GPU may be reset"
    assert result["reset"] == [] and result["changed"] is False
    assert result["refused"] == [{"gpus": list(range(8)),
                                  "why": "GPU(s) [0, 1, 2, 3, 4, 5, 6, 7] are passed to running CT 130 (GPU 2): "
                                         "a reset would take them from under it"}]


def test_a_reset_group_free_of_other_containers_runs(monkeypatch):
    result, module = reset(monkeypatch, "memory: 256\n")
    assert result["refused"] == []
    assert [c[c.index("-r"):] for c in module.calls if "-r" in c] == [["-r", "-i", "0,1,2,3,4,5,6,7"]]


def unverified(pid, vmid):
    return {"pid": pid, "comm": "cat", "vmid": vmid, "holds_unverified": True, "unverified_nvidia_fds": [
        {"fd": 3, "path": "/dev/nvidia-x/blob", "fstype": "fuse.x", "mount_point": "/dev/nvidia-x", "mount_id": 900}]}


def test_an_unverified_holder_on_the_host_or_in_the_container_refuses_every_reset(monkeypatch):
    for who in (None, VMID):
        result, module = reset(monkeypatch, "memory: 256\n", unverified=[unverified(777, who)])
        assert not any("-r" in c for c in module.calls), "no GPU may be reset"
        owner = "host" if who is None else "CT %d" % VMID
        assert result["refused"] == [{"gpus": list(range(8)), "why": (
            "unverified holder(s) on the host or in CT 129, which may be clients of any GPU: 777/cat (%s): "
            "fd 3 /dev/nvidia-x/blob on fuse.x" % owner)}]
        assert result["unverified_holders"] == ["777/cat (%s): fd 3 /dev/nvidia-x/blob on fuse.x" % owner]


def test_an_unverified_holder_in_another_container_is_named_not_obeyed(monkeypatch):
    result, module = reset(monkeypatch, "memory: 256\n", unverified=[unverified(778, 186)])
    assert result["refused"] == []
    assert [c[c.index("-r"):] for c in module.calls if "-r" in c] == [["-r", "-i", "0,1,2,3,4,5,6,7"]]
    assert result["unverified_holders"] == ["778/cat (CT 186): fd 3 /dev/nvidia-x/blob on fuse.x"]


def test_kill_holders_targets_the_containers_unverified_holders(monkeypatch, children):
    # A process of the container with a /dev/nvidia* path on a filesystem the scan never stats (a FUSE mount at
    # /dev/nvidia-x): the scan's reading says so (a unit test cannot mount FUSE; tests/lab/test_hostile_fuse.py does).
    fuse_holder = children(process_group=0)
    real_scan(monkeypatch, {fuse_holder.pid}, [{fuse_holder.pid: {"holds_unverified": True}}])
    result = kill_holders(monkeypatch, [])
    assert result["planned"]["targets"] == ["%d/%s" % (fuse_holder.pid, procs.read_stat(fuse_holder.pid)["comm"])]
    assert result["signalled"] == [{"signal": "SIGKILL", "groups": [fuse_holder.pid], "pids": []}]
    assert fuse_holder.gone()


CG = "/system.slice/nvidia-persistenced.service"
PERSISTENCED = {"pid": 4321, "comm": "nvidia-persiste", "starttime": 99, "vmid": None, "gpu_fds": list(range(8)),
                "cgroup": {"name=systemd": CG, "": CG}}
SHOW = ("Id=nvidia-persistenced.service\nLoadState=loaded\nActiveState=active\nMainPID=4321\nControlGroup=%s\n"
        "FragmentPath=/lib/systemd/system/nvidia-persistenced.service\nDropInPaths=\n"
        "ExecStart={ path=/usr/bin/nvidia-persistenced ; argv[]=/usr/bin/nvidia-persistenced --verbose ; "
        "ignore_errors=no ; start_time=[n/a] ; stop_time=[n/a] ; pid=0 ; code=(null) ; status=0/0 }\nUser=\n" % CG)


@pytest.fixture
def root_owned_unit(monkeypatch):
    """The unit's files, as lstat sees them: root's (the module reads them through recover_daemons.unit_facts)."""
    real = rd.unit_facts
    monkeypatch.setattr(rd, "unit_facts", lambda unit, text: real(
        unit, text, stat_fn=lambda path: os.stat_result((stat.S_IFDIR | 0o755, 0, 0, 1, 0, 0, 0, 0, 0, 0)),
        resolve=lambda path: path))
    monkeypatch.setattr(rd, "read_real_uid", {4321: 0, 4242: 65534}.get)
    monkeypatch.setattr(rsig, "wait_until", lambda pred, timeout, **kw: pred())
    # The scanned daemon (PID and start time) lives until systemctl stop.
    monkeypatch.setattr(action, "_same_process", lambda pid, st: not getattr(CURRENT["module"], "daemon_stopped", False))


def test_persistenced_is_stopped_and_started_again_only_through_its_unit(monkeypatch, root_owned_unit):
    monkeypatch.setattr(procs, "read_process", lambda pid, root, majors, deep=True: {"gpu_fds": list(range(8))}
                        if pid == 5555 else None)
    result, module = reset(monkeypatch, "memory: 256\n", holders=[PERSISTENCED])
    verbs = [c[0] if c[0] != "show" else "show" for c in module.systemctl]
    assert verbs == ["show", "show", "stop", "start", "show"]
    assert [c[-1] for c in module.systemctl] == ["nvidia-persistenced.service"] * 5
    assert not any("nvidia-persistenced" in c[0] for c in module.calls), "nothing but systemctl starts it"
    assert [c[c.index("-r"):] for c in module.calls if "-r" in c] == [["-r", "-i", "0,1,2,3,4,5,6,7"]]
    daemon = result["daemons"][0]
    assert daemon["unit"] == "nvidia-persistenced.service" and daemon["stopped"] is True
    assert daemon["restarted"] is True and daemon["pid_after"] == 5555 and daemon["error"] is None
    assert result["planned"]["stop_host_daemons"] == [
        "nvidia-persistenced (pid 4321), the main process of nvidia-persistenced.service: stopped and started again "
        "through that unit"]


def test_an_impostor_holding_the_gpu_refuses_the_reset_and_nothing_is_stopped(monkeypatch, root_owned_unit):
    impostor = dict(PERSISTENCED, pid=4242, starttime=500, gpu_fds=[0], cgroup={"name=systemd": "/", "": "/"})
    result, module = reset(monkeypatch, "memory: 256\n", holders=[PERSISTENCED, impostor])
    assert not any("-r" in c for c in module.calls)
    assert [c[0] for c in module.systemctl] == ["show"], "only asked about, never stopped or started"
    assert result["refused"][0]["why"] == (
        "clients on GPU 0: 4242/nvidia-persiste (host: not the main process of a host daemon's unit "
        "(nvidia-persistenced.service's is 4321))")
    assert result.get("daemons") is None


def test_without_systemd_persistenced_is_a_client(monkeypatch, root_owned_unit):
    monkeypatch.setattr(ResetModule, "systemctl_present", False)
    result, module = reset(monkeypatch, "memory: 256\n", holders=[PERSISTENCED])
    assert not any("-r" in c for c in module.calls)
    assert "4321/nvidia-persiste (host: not the main process" in result["refused"][0]["why"]


def test_without_stop_host_daemons_persistenced_blocks_the_reset(monkeypatch):
    result, module = reset(monkeypatch, "memory: 256\n", holders=[PERSISTENCED], stop_host_daemons=False)
    assert not any("-r" in c for c in module.calls) and module.systemctl == []
    assert result["refused"][0]["why"].startswith("clients on GPU 0: 4321/nvidia-persiste (host: host daemons are not")


def test_a_daemon_that_does_not_come_back_is_reported(monkeypatch, root_owned_unit):
    monkeypatch.setattr(procs, "read_process", lambda pid, root, majors, deep=True: {"gpu_fds": []})
    result, module = reset(monkeypatch, "memory: 256\n", holders=[PERSISTENCED])
    daemon = result["daemons"][0]
    assert daemon["stopped"] is True and daemon["restarted"] is False
    assert daemon["error"] == ("started, but after 30 s: nvidia-persistenced.service's main process 5555 does not "
                               "hold /dev/nvidia0,1,2,3,4,5,6,7")


# Rungs 1 and 4 run pct on the node: what is run, in what order, and what is reported.
class PctModule:
    def __init__(self, replies, check_mode=False, service="sglang.service"):
        self.params = {"service": service, "service_stop_timeout": 90, "container_shutdown_timeout": 60,
                       "container_stop_timeout": 90, "term_grace": 0, "wait": 0, "command_timeout": 5}
        self.check_mode = check_mode
        self.replies = list(replies)
        self.calls = []

    def get_bin_path(self, name, opt_dirs=None):
        return {"pct": "/usr/sbin/pct", "timeout": "/usr/bin/timeout"}.get(name)

    def run_command(self, argv, environ_update=None):
        self.calls.append(argv[argv.index("/usr/sbin/pct") + 1:])
        return self.replies.pop(0) if self.replies else (0, "", "")

    def fail_json(self, **kw):
        raise AssertionError(kw["msg"])


def new_result():
    return {"changed": False, "planned": {}, "commands": [], "refused": [], "signalled": [], "remaining": []}


def test_stop_service_disables_and_stops_the_unit_inside_the_container():
    module, result = PctModule([(0, "", "Removed /etc/systemd/system/multi-user.target.wants/sglang.service.\n")]), new_result()
    action.stop_service(module, VMID, result)
    assert module.calls == [["exec", "129", "--", "systemctl", "disable", "--now", "--", "sglang.service"]]
    assert result["changed"] and result["commands"][0]["rc"] == 0 and not result["commands"][0]["timed_out"]


def test_stop_service_that_times_out_is_reported_not_hidden():
    module, result = PctModule([(124, "", "")]), new_result()
    action.stop_service(module, VMID, result)
    assert result["commands"][0]["timed_out"]


def test_stop_container_shuts_down_then_stops_hard_when_it_still_runs():
    running, stopped = (0, "status: running\n", ""), (0, "status: stopped\n", "")
    module = PctModule([running, (0, "", "Removed x\n"), (255, "", "shutdown timed out"), running, (0, "", ""), stopped])
    result = new_result()
    action.stop_container(module, VMID, result)
    assert module.calls == [["status", "129"], ["exec", "129", "--", "systemctl", "disable", "--", "sglang.service"],
                            ["shutdown", "129", "--timeout", "60", "--forceStop", "1"], ["status", "129"], ["stop", "129"]]
    assert result["container_was_running"] and result["changed"]


def test_stop_container_leaves_a_stopped_container_alone():
    module, result = PctModule([(0, "status: stopped\n", "")]), new_result()
    action.stop_container(module, VMID, result)
    assert module.calls == [["status", "129"]]
    assert result["container_was_running"] is False and not result["changed"]


def test_stop_container_in_check_mode_only_reads():
    module, result = PctModule([(0, "status: running\n", "")], check_mode=True), new_result()
    action.stop_container(module, VMID, result)
    assert module.calls == [["status", "129"]]
    assert result["planned"]["running"] and result["planned"]["commands"][0].startswith("pct shutdown 129")


def test_the_actions_are_the_acting_rungs_of_the_gate():
    """One table: the option's choices (documented and accepted) and the dispatch are recover_gate's acting rungs."""
    doc = yaml.safe_load(action.DOCUMENTATION)
    assert doc["options"]["action"]["choices"] == list(gate.ACTION_NAMES)
    assert sorted(action.RUNG_ACTIONS) == sorted(gate.ACTING_RUNGS)
    assert [gate.RUNG_OF_ACTION[name] for name in gate.ACTION_NAMES] == list(gate.ACTING_RUNGS)


def abort_fuse(monkeypatch):
    monkeypatch.setattr(action, "ct_init_pid", lambda module, vmid: None)

    class Module(FakeModule):
        params = dict(FakeModule.params, stuck_timeout=10)
    result = {"refused": [], "signalled": [], "aborted": [], "changed": False}
    action.abort_fuse(Module(), KILL_VMID, result)
    return result


def test_rung_3_kills_the_stuck_pids_alone_and_never_a_reused_pid(monkeypatch, children):
    """Rung 3's SIGKILL after the abort: the stuck PIDs only (not their group), each with its planned start time;
    it used to be planned without start times, and a PID reused since the scan got a bare kill(2). (The scan says
    which are stuck on FUSE: a unit test cannot put a task in D state; tests/lab/test_gpu_container.py does.)"""
    main = children(process_group=0)
    stuck, reused = children(process_group=main.pid), children(process_group=main.pid)
    stuck_fuse = {"class": "stuck_fuse", "state": "D", "wchan": "request_wait_answer"}
    real_scan(monkeypatch, {main.pid, stuck.pid, reused.pid}, [{
        stuck.pid: stuck_fuse, reused.pid: dict(stuck_fuse, starttime=procs.read_stat(reused.pid)["starttime"] - 1)}])
    result = abort_fuse(monkeypatch)
    assert result["planned"]["then_sigkill"] == sorted([stuck.pid, reused.pid])
    assert result["signalled"] == [{"signal": "SIGKILL", "groups": [], "pids": [stuck.pid]}]
    assert {"pid": reused.pid, "why": rsig.REFUSALS["reused"]} in result["refused"]
    assert stuck.gone() and reused.alive() and main.alive()


def _kill_after_stop(monkeypatch, children, cgroups, timed_out=True):
    """kill_holders with term_grace 1 after rung 1's stop (timed out or not); cgroups: {0: main's, 1: rank0's}
    /proc/PID/cgroup as the unit check reads it (the processes themselves cannot be put in the container's unit)."""
    main = children(process_group=0, on_term="stay")
    rank0 = children(process_group=main.pid, on_term="stay")
    texts = {main.pid: cgroups[0], rank0.pid: cgroups[1]}
    real_scan(monkeypatch, {main.pid, rank0.pid})
    monkeypatch.setattr(action, "read_text", lambda path: texts.get(int(path.split("/")[2])))
    result = kill_holders(monkeypatch, [rank0], term_grace=1, service="sglang.service", timed_out=timed_out)
    assert main.gone() and rank0.gone()
    return result, [x["signal"] for x in result["signalled"]], main.got_term() or rank0.got_term()


UNIT_CG = "0::/lxc/%d/ns/system.slice/sglang.service\n" % KILL_VMID
ESCAPED_CG = "0::/lxc/%d/ns/init.scope\n" % KILL_VMID


def test_after_a_stop_that_timed_out_the_units_processes_get_sigkill_only(monkeypatch, children):
    # systemd sent them SIGTERM when the stop began (systemd.kill(5)): no second SIGTERM, no second grace.
    result, sent, termed = _kill_after_stop(monkeypatch, children, [UNIT_CG, UNIT_CG])
    assert sent == ["SIGKILL"] and not termed, result
    assert result["planned"]["signals"] == ["SIGKILL"] and "systemd.kill" in result["sigkill_only"]


def test_a_process_outside_the_unit_still_gets_sigterm_and_the_grace(monkeypatch, children):
    result, sent, termed = _kill_after_stop(monkeypatch, children, [UNIT_CG, ESCAPED_CG])
    assert sent == ["SIGTERM", "SIGKILL"] and termed and "sigkill_only" not in result


def test_without_a_timed_out_stop_sigterm_comes_first(monkeypatch, children):
    result, sent, termed = _kill_after_stop(monkeypatch, children, [UNIT_CG, UNIT_CG], timed_out=False)
    assert sent == ["SIGTERM", "SIGKILL"] and termed


# The device minor is not the nvidia-smi index: on this node /dev/nvidia5 is GPU 6 and /dev/nvidia6 is GPU 5.
SWAPPED = {**{i: i for i in range(8)}, 5: 6, 6: 5}  # {index: minor}


def resets(module):
    return [c[c.index("-r"):] for c in module.calls if "-r" in c]


def test_the_reset_takes_the_index_the_driver_gives_the_containers_minor(monkeypatch):
    # CT 129 passes /dev/nvidia5 (GPU index 6); running CT 130 passes /dev/nvidia6 (GPU index 5) and holds it open.
    tenant = {"pid": 7001, "comm": "python3", "starttime": 5, "vmid": 130, "gpu_fds": [6], "cgroup": {"": "/lxc/130"}}
    result, module = reset(monkeypatch, "dev0: /dev/nvidia6\n", holders=[tenant], gpus=[6],
                           own_config="dev0: /dev/nvidia5\n", minors=SWAPPED, topo=TOPO_PCIE)
    assert result["refused"] == []
    assert resets(module) == [["-r", "-i", "6"]]
    assert result["gpu_numbering"]["6"] == {"minor": 5, "pci_bus_id": "0000:06:00.0"}


def test_the_other_tenants_gpu_is_never_taken_for_the_containers(monkeypatch):
    # Read as index = minor, CT 129's /dev/nvidia5 would be GPU 5: CT 130's. Asked for GPU 5, the reset is refused.
    result, module = reset(monkeypatch, "dev0: /dev/nvidia6\n", gpus=[5], own_config="dev0: /dev/nvidia5\n",
                           minors=SWAPPED, topo=TOPO_PCIE)
    assert resets(module) == []
    assert "numbers as GPU(s) [6], not the GPU(s) [5] asked for" in result["refused"][0]["why"]


def test_a_holder_of_the_other_minor_blocks_the_right_gpu(monkeypatch):
    # A host process holding /dev/nvidia5 holds GPU index 6: the reset of GPU 6 is refused, naming it.
    user = {"pid": 7002, "comm": "hog", "starttime": 5, "vmid": None, "gpu_fds": [5], "cgroup": {"": "/user.slice"}}
    result, module = reset(monkeypatch, "memory: 256\n", holders=[user], gpus=[6],
                           own_config="dev0: /dev/nvidia5\n", minors=SWAPPED, topo=TOPO_PCIE)
    assert resets(module) == []
    assert result["refused"][0]["why"].startswith("clients on GPU 6: 7002/hog (host: not the main process")


@pytest.mark.parametrize("kw, why", [
    ({"q_rc": 255}, "nvidia-smi -q failed (rc 255)"),
    ({"minors": {**{i: i for i in range(8)}, 3: "N/A"}}, "GPU 3 (0000:03:00.0): nvidia-smi -q gives no Minor Number"),
    ({"minors": {**{i: i for i in range(8)}, 3: 4}}, "GPUs 3 and 4: the same Minor Number 4"),
])
def test_without_the_drivers_numbering_nothing_is_reset(monkeypatch, kw, why):
    result, module = reset(monkeypatch, "memory: 256\n", **kw)
    assert resets(module) == [] and result["changed"] is False
    assert result["refused"][0]["why"].startswith("GPU numbering unknown, no GPU reset: " + why), result["refused"]


# Rung 5's task timeout (the role's) covers every step the module takes, each bounded by the module itself.
class BoundedModule(ResetModule):
    """Records the bound of every command (the bounded supervisor's timeout plus the slack the budget allows each
    command, recover_gate.COMMAND_SLACK_S) and fails on a command run without one."""

    def __init__(self, other_config, params):
        super().__init__(other_config)
        self.params = params
        self.bounds = []

    def get_bin_path(self, name, required=False, opt_dirs=None):
        return {"pct": "/usr/sbin/pct", "systemctl": "/usr/bin/systemctl", "timeout": "/usr/bin/timeout"}.get(name)

    def run_command(self, args, **kwargs):
        args = list(args)
        assert args[1:3] == ["-c", bounded_command.SUPERVISOR], "a step of rung 5 without a bound: %s" % args
        inner = args[args.index("--") + 1:]
        self.bounds.append((" ".join(inner[:3]), float(args[3]) + gate.COMMAND_SLACK_S))
        if inner[:2] == ["/usr/sbin/pct", "status"]:
            return 0, "status: running\npid: 777\n", ""
        if inner[:2] == ["/usr/sbin/pct", "exec"]:
            return 0, "", ""
        if inner[-2:] == ["topo", "-m"]:
            return 0, "\tGPU0\tGPU1\nGPU0\tX\tSYS\nGPU1\tSYS\tX\n", ""   # no NVLink: each GPU its own reset group
        return super().run_command(inner, **kwargs)


def role_defaults():
    path = os.path.join(os.path.dirname(action.__file__), "..", "..", "roles", "gpu_recover", "defaults", "main.yml")
    with open(path) as f:
        return yaml.safe_load(f)


def test_the_reset_rungs_task_timeout_covers_every_step_it_takes(monkeypatch, root_owned_unit, tmp_path):
    from ansible_collections.inferops.gpu_inference.plugins.module_utils.recover import recover_ladder as ladder
    defaults = role_defaults()
    settings = {k: defaults.get("gpu_recover_%s_s" % k, defaults.get("gpu_recover_" + k)) for k in ladder.SETTING_KEYS}
    state = ladder.start(VMID, "pve1", "2026-12-04T00:00:00Z", 0, "status: running\n", settings)
    gpus = [0, 1]
    state = ladder.step(state, "diagnosed", {"clean": False, "recommended_rung": gate.RUNG_RESET_GPUS,
                                             "evidence": {"container": {"gpus": gpus}}}, 0, 1)
    assert state["next"] == gate.RUNG_RESET_GPUS
    budget = state["action_timeout_s"]
    # The module, with the options the role passes (action.yml: action_args), through every step: the container
    # runs, its service and a GPU process are ended, the host's nvidia-persistenced is stopped and started again
    # through its unit, and each GPU is reset on its own.
    params = dict(state["action_args"], gpus=gpus, service="sglang.service", stop_host_daemons=True,
                  unit_stop_timed_out=False, lock_dir=str(tmp_path))
    module = BoundedModule("memory: 256\n", params)
    waits = []
    monkeypatch.setattr(rsig, "wait_until", lambda pred, timeout, **kw: waits.append(timeout) or pred())
    # The budget is judged here, not the kill (the kill tests above send real signals): nothing is signalled.
    monkeypatch.setattr(rsig, "send_signal", lambda plan, sig: {"groups": plan["groups"], "pids": plan["pids"],
                                                                "refused": [], "errors": []})
    worker = {"pid": 5301, "pgid": 5301, "vmid": VMID, "nspid": [5301, 301], "starttime": 1, "holds_nvidia": True,
              "comm": "python3", "class": "running", "gpu_fds": [0], "cgroup": {"": "/lxc/129"}}
    monkeypatch.setattr(procs, "scan_processes", lambda vmid, root, majors: {
        "container": [worker], "nvidia_holders": [PERSISTENCED] if not getattr(module, "daemon_stopped", False)
        else [], "all": [worker, dict(PERSISTENCED, pgid=4321)]})
    monkeypatch.setattr(action, "alive", lambda refs: [{"pid": 5301}])   # it outlives every wait
    monkeypatch.setattr(procs, "read_process", lambda pid, root, majors, deep=True: {"gpu_fds": list(range(8))})
    result = {"changed": False, "planned": {}, "signalled": [], "aborted": [], "refused": [], "remaining": [],
              "reset": [], "commands": []}
    action.rung_reset_gpus(module, VMID, "/usr/bin/nvidia-smi", result)
    assert [r["gpus"] for r in result["reset"]] == [[0], [1]] and result["daemons"][0]["restarted"] is True
    assert list(waits) == [params["term_grace"], params["wait"], rd.STOP_WAIT_S, rd.START_WAIT_S]
    steps = sum(bound for _cmd, bound in module.bounds) + sum(waits)
    assert steps <= budget, "rung 5 may take %d s, its task timeout is %d s: %s" % (steps, budget, module.bounds)
    # The same sum, step by step, is what the budget is made of; the budget grows with the GPUs.
    assert sum(gate.reset_step_bounds_s(state["settings"], len(gpus)).values()) >= steps
    assert gate.action_budget_s(gate.RUNG_RESET_GPUS, state["settings"], 8) > budget > 965
