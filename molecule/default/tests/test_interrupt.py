# -*- coding: utf-8 -*-
"""A deploy killed after it wrote a new unit and before it restarted the server, then run again (docs/deploy.md,
"Restarts"): the re-run, which changes no file, must still restart the server, so that the process running is the one
the installed unit describes.

Checked from the world: the unit file read through the container's root (/proc/<init>/root), and the argv of the
unit's MainPID read from /proc inside the container; ansible-playbook is killed with SIGKILL (its whole process
group), at the moment the unit file in the container changes. Runs on the CT 129 that converge deployed, and leaves it
deployed as converge did (a last run with the inventory as it is). About three deploy runs of CT 129.
"""
from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.environ.get("MOLECULE_PROJECT_DIRECTORY", os.getcwd())
sys.path.insert(0, os.path.join(ROOT, "tests", "corpus"))
import labstate  # noqa: E402

REPORTS = os.environ.get("INFEROPS_REPORT_DIR", os.path.join(ROOT, "reports"))
VMID = labstate.VMID
UNIT = "/etc/systemd/system/sglang.service"
# An argument the stand-in (and SGLang) accepts and that the plan does not own: only the unit's argv changes.
EXTRA = ["--log-level", "warning"]


def init_pid() -> int:
    out = subprocess.run(["lxc-info", "-n", str(VMID), "-p", "-H"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0 and out.stdout.strip().isdigit(), out
    return int(out.stdout.strip())


def unit_text(init: int) -> str:
    try:
        with open("/proc/%d/root%s" % (init, UNIT)) as f:
            return f.read()
    except OSError:
        return ""


def unit_argv(text: str) -> list:
    """ExecStart of the unit file as systemd splits it (the role quotes with "...", $$ and %%)."""
    lines = [line for line in text.splitlines() if line.startswith("ExecStart=")]
    assert len(lines) == 1, text
    return [a.replace("$$", "$").replace("%%", "%") for a in shlex.split(lines[0][len("ExecStart="):])]


def running() -> tuple:
    """The unit's MainPID and its argv, read inside the container (systemctl, /proc/PID/cmdline)."""
    pid = labstate.in_ct(VMID, "systemctl", "show", "--property=MainPID", "--value", "sglang.service")
    assert pid.isdigit() and int(pid) > 0, "sglang.service has no MainPID in CT %d: %r" % (VMID, pid)
    raw = subprocess.run(["/usr/sbin/pct", "exec", str(VMID), "--", "cat", "/proc/%s/cmdline" % pid],
                         capture_output=True, timeout=60)
    assert raw.returncode == 0, raw.stderr
    return int(pid), [a.decode() for a in raw.stdout.split(b"\0")[:-1]]


def deploy(label: str, extra_args: bool, kill_when=None) -> int:
    """deploy.yml on the lab inventory (plus, with extra_args, a second inventory source that gives CT 129 EXTRA);
    with kill_when, SIGKILL to ansible-playbook's process group as soon as kill_when() is true."""
    inventories = ["-i", labstate.INVENTORY]
    override = None
    if extra_args:
        override = tempfile.NamedTemporaryFile("w", suffix=".yml", delete=False)
        override.write("all:\n  hosts:\n    ct129:\n      sglang_server_extra_args: %s\n" % (EXTRA,))
        override.close()
        inventories += ["-i", override.name]
    os.makedirs(REPORTS, exist_ok=True)
    log = open(os.path.join(REPORTS, "interrupt-%s.log" % label), "w")
    try:
        proc = subprocess.Popen([labstate.ansible_playbook(), *inventories, os.path.join(ROOT, "playbooks", "deploy.yml")],
                                stdout=log, stderr=subprocess.STDOUT, env=labstate.playbook_env(), cwd=ROOT,
                                start_new_session=True)
        if kill_when is not None:
            while proc.poll() is None and not kill_when():
                time.sleep(0.05)
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
        return proc.wait(timeout=1200)
    finally:
        log.close()
        if override:
            os.unlink(override.name)


def test_a_deploy_killed_between_the_unit_and_the_restart_is_finished_by_the_next_run():
    init = init_pid()
    pid0, argv0 = running()
    assert argv0 == unit_argv(unit_text(init)), "before the test the server runs what the unit says"
    assert EXTRA[0] not in argv0

    rc = deploy("killed", True, kill_when=lambda: EXTRA[0] in unit_text(init))
    assert rc == -signal.SIGKILL, "ansible-playbook ended (rc %s) before the unit changed: see reports/interrupt-killed.log" % rc
    installed = unit_argv(unit_text(init))
    pid, argv = running()
    assert EXTRA[0] in installed
    # The state the issue is about: a new unit under the old process. If the kill came after the restart began, this
    # run cannot show anything: it says so rather than passing.
    assert (pid, argv) == (pid0, argv0), "the kill came too late (the server was already restarted)"

    try:
        assert deploy("rerun", True) == 0, "see reports/interrupt-rerun.log"
        pid1, argv1 = running()
        assert argv1 == unit_argv(unit_text(init)), "the re-run left the old process under the new unit"
        assert pid1 != pid0 and argv1[-2:] == EXTRA
    finally:
        # Back to converge's deployment (the tests after this one read it); a change of the unit restarts it too.
        assert deploy("restore", False) == 0, "see reports/interrupt-restore.log"
    pid2, argv2 = running()
    assert argv2 == unit_argv(unit_text(init)) and EXTRA[0] not in argv2 and pid2 != pid1
