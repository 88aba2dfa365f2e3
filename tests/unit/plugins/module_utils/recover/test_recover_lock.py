# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The node's recover locks (module_utils/recover/recover_lock.py and module gpu_recover_lock), with real flocks and real
processes: who holds a lock is read from the kernel (flock, the process table), never from the code under test."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from ansible_collections.inferops.gpu_inference.plugins.module_utils.recover import recover_ladder as ladder
from ansible_collections.inferops.gpu_inference.plugins.module_utils.recover import recover_lock as rl
from ansible_collections.inferops.gpu_inference.plugins.modules import gpu_recover_lock as lock_module

COLLECTIONS = os.path.abspath(os.path.join(os.path.dirname(rl.__file__), "..", "..", "..", "..", "..", ".."))
MODULE = lock_module.__file__


def held_by_someone(path):
    """The kernel's answer: a non-blocking flock from this process fails while another holds the file."""
    fd = os.open(path, os.O_RDWR)
    try:
        free = rl.try_flock(fd)
        return not free
    finally:
        os.close(fd)


def test_decide_waits_within_the_budget_then_refuses():
    assert rl.decide(True, 500, 0) == "acquired"
    assert rl.decide(False, 0, 10) == "wait"
    assert rl.decide(False, 9.6, 10) == "wait"
    assert rl.decide(False, 10, 10) == "refuse"
    assert rl.decide(False, 0, 0) == "refuse"
    with pytest.raises(rl.LockError, match="0 or more seconds"):
        rl.decide(False, 0, -1)


def test_start_ticks_counts_fields_after_the_last_parenthesis(tmp_path):
    # A comm a tenant chose, with spaces and ") " in it, does not shift the fields.
    (tmp_path / "42").mkdir()
    fields = ["S", "1", "42", "42", "0", "-1", "4194560"] + ["0"] * 12 + ["123456"]
    (tmp_path / "42" / "stat").write_text("42 (evil) 1 2 3 (x) %s 0 0\n" % " ".join(fields))
    assert rl.start_ticks(42, str(tmp_path)) == 123456
    assert rl.parent_pid(42, str(tmp_path)) == 1
    assert rl.start_ticks(43, str(tmp_path)) is None
    assert rl.same_process(os.getpid(), rl.start_ticks(os.getpid()))
    assert not rl.same_process(os.getpid(), (rl.start_ticks(os.getpid()) or 0) + 1)


def test_describe_names_the_holder_and_says_when_the_record_is_stale():
    rec = rl.holder_record(77, 5, "recover ladder", 129, "Recover", "root@ctl", lease_until=1100.0, now=1000.0)
    alive = rl.describe(rec, True, "/run/x.lock", 1030.0)
    assert "held by pid 77 (recover ladder of CT 129, playbook Recover, controller root@ctl) for 30 s" in alive
    assert "until 70 s from now" in alive
    assert "recorded holder pid 77" in rl.describe(rec, False, "/run/x.lock", 1030.0)
    assert "wrote no record" in rl.describe(None, False, "/run/x.lock", 1030.0)
    assert rl.parse("not json") is None and rl.parse('{"pid": "x"}') is None
    assert rl.parse(rl.render(rec))["vmid"] == 129


def test_a_lock_held_by_another_process_refuses_naming_it_and_is_free_once_it_ends(tmp_path):
    path = str(tmp_path / "locks" / "recover-ct-129.lock")
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""
        import os, sys, time
        sys.path.insert(0, %r)
        from ansible_collections.inferops.gpu_inference.plugins.module_utils.recover import recover_lock as rl
        fd, info = rl.acquire(%r, 0)
        rl.write_record(fd, rl.holder_record(os.getpid(), rl.start_ticks(os.getpid()), "recover ladder", 129, "A"))
        print("held", flush=True)
        time.sleep(60)
        """ % (COLLECTIONS, path))], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert held_by_someone(path)
        t0 = time.monotonic()
        fd, info = rl.acquire(path, 1)
        assert fd is None and time.monotonic() - t0 >= 0.9
        assert "held by pid %d (recover ladder of CT 129, playbook A)" % holder.pid in info["msg"]
    finally:
        holder.kill()
        holder.wait()
    fd, info = rl.acquire(path, 0)
    assert fd is not None and info["waited_s"] == 0
    os.close(fd)


def run_module(args, wrapper_sleep=0):
    """The module as Ansible runs it on a node: its own session, under a parent that stands for the connection
    (sshd's process of the connection). Returns (wrapper process, module result)."""
    argsfile = os.path.join(args.pop("_dir"), "args.json")
    with open(argsfile, "w") as handle:
        json.dump({"ANSIBLE_MODULE_ARGS": args}, handle)
    code = textwrap.dedent("""
        import subprocess, sys, time
        p = subprocess.run([sys.executable, %r, %r], start_new_session=True, capture_output=True, text=True,
                           env={"PYTHONPATH": %r, "PATH": "/usr/bin:/bin"})
        print(p.stdout.strip().splitlines()[-1] if p.stdout.strip() else p.stderr, flush=True)
        time.sleep(%d)
        """ % (MODULE, argsfile, COLLECTIONS, wrapper_sleep))
    wrapper = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    line = wrapper.stdout.readline()
    return wrapper, json.loads(line)


def test_the_module_leaves_a_holder_that_keeps_the_lock_until_released(tmp_path):
    lock_dir = str(tmp_path / "locks")
    metrics = str(tmp_path / "prom" / "inferops_recover_129.prom")
    wrapper, res = run_module({"_dir": str(tmp_path), "vmid": 129, "state": "acquired", "lease_s": 120,
                               "playbook": "Recover", "lock_dir": lock_dir, "metrics_path": metrics,
                               "metrics_text": "inferops_recover_in_progress 1\n"})
    try:
        path = os.path.join(lock_dir, "recover-ct-129.lock")
        assert res["path"] == path and not res.get("failed")
        pid, ticks = res["holder_pid"], res["holder_start_ticks"]
        # The world: the holder is a live process of its own, the kernel refuses the lock to others.
        assert rl.same_process(pid, ticks) and pid != wrapper.pid and held_by_someone(path)
        assert open(metrics).read() == "inferops_recover_in_progress 1\n"
        # A second run with no wait is refused, naming the holder.
        second, res2 = run_module({"_dir": str(tmp_path), "vmid": 129, "state": "acquired", "lock_dir": lock_dir})
        second.wait()
        assert res2["failed"] is True and res2["refused"] is True and "held by pid %d" % pid in res2["msg"]
        # Released with the token the acquisition gave: the holder ends, the lock is free, the metrics written.
        third, res3 = run_module({"_dir": str(tmp_path), "vmid": 129, "state": "released", "lock_dir": lock_dir,
                                  "holder_pid": pid, "holder_start_ticks": ticks, "metrics_path": metrics,
                                  "metrics_text": "inferops_recover_in_progress 0\n"})
        third.wait()
        assert res3["released"] is True and not rl.same_process(pid, ticks) and not held_by_someone(path)
        assert open(metrics).read() == "inferops_recover_in_progress 0\n" and open(path).read() == ""
    finally:
        wrapper.kill()
        wrapper.wait()


def test_the_holder_ends_with_the_connection_it_came_through(tmp_path):
    lock_dir = str(tmp_path / "locks")
    wrapper, res = run_module({"_dir": str(tmp_path), "vmid": 130, "state": "acquired", "lease_s": 600,
                               "lock_dir": lock_dir}, wrapper_sleep=60)
    pid, ticks = res["holder_pid"], res["holder_start_ticks"]
    assert rl.same_process(pid, ticks)
    wrapper.send_signal(signal.SIGKILL)   # the controller's connection is gone
    wrapper.wait()
    deadline = time.monotonic() + 10
    while rl.same_process(pid, ticks) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not rl.same_process(pid, ticks)
    assert not held_by_someone(os.path.join(lock_dir, "recover-ct-130.lock"))


def test_the_holder_ends_with_its_lease(tmp_path):
    lock_dir = str(tmp_path / "locks")
    wrapper, res = run_module({"_dir": str(tmp_path), "vmid": 131, "state": "acquired", "lease_s": 1,
                               "lock_dir": lock_dir}, wrapper_sleep=30)
    try:
        pid, ticks = res["holder_pid"], res["holder_start_ticks"]
        deadline = time.monotonic() + 10
        while rl.same_process(pid, ticks) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not rl.same_process(pid, ticks) and wrapper.poll() is None
    finally:
        wrapper.kill()
        wrapper.wait()


def test_role_seconds_accepts_the_old_names_for_one_release():
    new = {k + "_s": v for k, v in ladder.DEFAULT_SECONDS.items()}
    out, warnings = ladder.role_seconds(new, {"term_grace": 3})
    assert out["term_grace"] == 3 and out["kill_wait"] == 60 and len(warnings) == 1
    assert "use gpu_recover_term_grace_s" in warnings[0]
    out, warnings = ladder.role_seconds(dict(new, term_grace_s=3), {"term_grace": 3})
    assert out["term_grace"] == 3
    with pytest.raises(ladder.LadderError, match="both set"):
        ladder.role_seconds(dict(new, term_grace_s=20), {"term_grace": 3})
    with pytest.raises(ladder.LadderError, match="no deprecated setting gpu_recover_lock_wait"):
        ladder.role_seconds(new, {"lock_wait": 3})


def test_the_seconds_defaults_are_the_roles():
    import yaml
    path = os.path.join(os.path.dirname(rl.__file__), "..", "..", "..", "roles", "gpu_recover", "defaults", "main.yml")
    with open(path) as handle:
        defaults = yaml.safe_load(handle)
    assert {k: defaults["gpu_recover_%s_s" % k] for k in ladder.SECONDS_SETTINGS} == ladder.DEFAULT_SECONDS
    assert not [k for k in defaults if k[len("gpu_recover_"):] in ladder.SECONDS_SETTINGS]


def test_stale_run_only_for_this_controller_and_a_gone_run():
    rec = rl.holder_record(77, 5, "recover ladder", 129, controller="root@ctl boot b",
                           run={"pid": 1234, "start_ticks": 9})
    assert rl.stale_run(rec, "root@ctl boot b", lambda pid, ticks: False) is True
    assert rl.stale_run(rec, "root@ctl boot b", lambda pid, ticks: True) is False
    assert rl.stale_run(rec, "root@other boot b", lambda pid, ticks: False) is False
    assert rl.stale_run(dict(rec, run_pid=None), "root@ctl boot b", lambda pid, ticks: False) is False
    assert rl.stale_run(None, "root@ctl boot b", lambda pid, ticks: False) is False


def test_flock_holders_reads_the_kernels_table(tmp_path):
    path = str(tmp_path / "x.lock")
    fd = rl.open_lock(path)
    try:
        assert rl.try_flock(fd)
        with open("/proc/locks") as handle:
            assert os.getpid() in rl.flock_holders(path, handle.read())
        st = os.stat(path)
        ident = "%02x:%02x:%d" % (os.major(st.st_dev), os.minor(st.st_dev), st.st_ino)
        table = "1: FLOCK  ADVISORY  WRITE 10 %s 0 EOF\n1: -> FLOCK  ADVISORY  WRITE 11 %s 0 EOF\n" \
                "2: POSIX  ADVISORY  WRITE 12 %s 0 EOF\n" % (ident, ident, ident)
        assert rl.flock_holders(path, table) == {10}
    finally:
        os.close(fd)


def test_the_module_ends_a_stale_holder_only_when_the_kernel_names_it(tmp_path):
    lock_dir = str(tmp_path / "locks")
    wrapper, res = run_module({"_dir": str(tmp_path), "vmid": 132, "state": "acquired", "lease_s": 120,
                               "lock_dir": lock_dir}, wrapper_sleep=60)
    bystander = subprocess.Popen(["sleep", "60"])
    try:
        pid, ticks = res["holder_pid"], res["holder_start_ticks"]
        # A pid that holds nothing (here a bystander process) is not ended, whatever a record says.
        other, res2 = run_module({"_dir": str(tmp_path), "vmid": 132, "state": "acquired", "lock_dir": lock_dir,
                                  "break_pid": bystander.pid, "break_start_ticks": rl.start_ticks(bystander.pid)})
        other.wait()
        assert res2["failed"] is True and bystander.poll() is None and rl.same_process(pid, ticks)
        # The holder the kernel names is ended, and the lock taken.
        third, res3 = run_module({"_dir": str(tmp_path), "vmid": 132, "state": "acquired", "lock_dir": lock_dir,
                                  "break_pid": pid, "break_start_ticks": ticks, "lease_s": 5})
        third.wait()
        assert not res3.get("failed") and "ended pid %d" % pid in res3["broken"]
        assert not rl.same_process(pid, ticks) and rl.same_process(res3["holder_pid"], res3["holder_start_ticks"])
        os.kill(res3["holder_pid"], signal.SIGTERM)
    finally:
        bystander.kill()
        bystander.wait()
        wrapper.kill()
        wrapper.wait()


@pytest.mark.parametrize("vmid", [99, "x", 1000000000])
def test_no_lock_path_for_a_vmid_outside_the_proxmox_range(vmid, tmp_path):
    with pytest.raises(rl.LockError, match="vmid must be"):
        rl.ladder_path(vmid, str(tmp_path))
    assert os.listdir(str(tmp_path)) == []
