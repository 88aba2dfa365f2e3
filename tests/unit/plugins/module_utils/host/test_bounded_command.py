# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The supervisor every recover command runs under, run for real: its rc and output, a command that sleeps past its
deadline, one that leaves its session and keeps writing to the pipe (a tenant's binary behind pct exec), one that
floods its output. The bound is the test's own subprocess timeout: a supervisor that does not end fails the test."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from ansible_collections.inferops.gpu_inference.plugins.module_utils.host import bounded_command as bc

PY = sys.executable


def run(command, timeout_s, **kw):
    """As AnsibleModule.run_command reads a command: both pipes until they close."""
    return subprocess.run(bc.argv(PY, timeout_s, command, **kw), capture_output=True, text=True, timeout=60, check=False)


def test_rc_and_output_pass_through():
    r = run([PY, "-c", "import sys; print('out'); print('err', file=sys.stderr); sys.exit(3)"], 10)
    assert (r.returncode, r.stdout, r.stderr) == (3, "out\n", "err\n")
    r = run([PY, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"], 10)
    assert r.returncode == 128 + signal.SIGKILL and not bc.timed_out(r.returncode)
    r = run(["/nonexistent/cmd"], 10)
    assert r.returncode == 127 and "cannot run /nonexistent/cmd" in r.stderr


def test_stdin_is_not_the_callers():
    r = subprocess.run(bc.argv(PY, 10, [PY, "-c", "import sys; print(repr(sys.stdin.read()))"]), input="secret",
                       capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 0 and r.stdout == "''\n"


def test_a_command_past_its_deadline_is_killed_with_its_group(tmp_path):
    pidfile = tmp_path / "pids"
    script = ("import os, time\n"
              "child = os.fork()\n"
              "if child == 0:\n    time.sleep(600)\n    os._exit(0)\n"
              "open(%r, 'w').write('%%d %%d' %% (os.getpid(), child))\n"
              "time.sleep(600)\n" % str(pidfile))
    started = time.monotonic()
    r = run([PY, "-c", script], 2)
    assert r.returncode == bc.TIMED_OUT_RC and bc.timed_out(r.returncode)
    assert "timed out after 2 s: killed" in r.stderr
    assert time.monotonic() - started < 60
    for pid in map(int, pidfile.read_text().split()):
        assert _gone(pid), "pid %d of the command's group survived" % pid


def _gone(pid):
    for _attempt in range(100):
        try:
            with open("/proc/%d/stat" % pid) as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return True
        except OSError:
            return True
        time.sleep(0.05)
    return False


def test_a_child_that_leaves_the_session_and_keeps_writing_cannot_hold_the_caller(tmp_path):
    """What a container's own `systemctl` can do behind `pct exec`: daemonize into a session of its own, keep the
    inherited stdout and write to it forever. The caller reads the supervisor's pipe, which closes at the deadline."""
    pidfile = tmp_path / "escaped"
    script = ("import os, sys, time\n"
              "if os.fork() == 0:\n"
              "    os.setsid()\n"
              "    open(%r, 'w').write(str(os.getpid()))\n"
              "    while True:\n        sys.stdout.write('x\\n'); sys.stdout.flush(); time.sleep(0.1)\n"
              "time.sleep(600)\n" % str(pidfile))
    r = run([PY, "-c", script], 2)
    assert r.returncode == bc.TIMED_OUT_RC and "x\n" in r.stdout
    escaped = int(pidfile.read_text())
    # It left the group, so it was not killed with it; it no longer holds anything the caller reads.
    try:
        os.kill(escaped, signal.SIGKILL)
    except OSError:
        pass


def test_a_command_that_exits_but_leaves_a_writer_returns_its_own_status(tmp_path):
    pidfile = tmp_path / "writer"
    script = ("import os, sys, time\n"
              "if os.fork() == 0:\n"
              "    os.setsid()\n"
              "    open(%r, 'w').write(str(os.getpid()))\n"
              "    while True:\n        sys.stdout.write('y\\n'); sys.stdout.flush(); time.sleep(0.1)\n"
              "time.sleep(0.5); print('done'); sys.stdout.flush(); os._exit(0)\n" % str(pidfile))
    r = run([PY, "-c", script], 30)
    assert r.returncode == 0 and "done\n" in r.stdout
    try:
        os.kill(int(pidfile.read_text()), signal.SIGKILL)  # the writer it left, which no longer holds the caller
    except OSError:
        pass


def test_a_flood_of_output_is_cut_at_the_limit():
    r = run([PY, "-c", "import sys\nwhile True: sys.stdout.write('z' * 65536)"], 30, max_output_bytes=1 << 20)
    assert r.returncode == bc.OUTPUT_LIMIT_RC and bc.timed_out(r.returncode)
    assert (1 << 20) <= len(r.stdout) <= (1 << 20) + (1 << 17)
    assert "output over 1048576 bytes: killed" in r.stderr


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="above 0 s"):
        bc.argv(PY, 0, ["true"])
    with pytest.raises(ValueError, match="no command"):
        bc.argv(PY, 5, [])
