# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""A bound on every command the recover modules run on the node, that nothing the command starts can stretch.

coreutils timeout(1) alone is not such a bound. The modules read the command's output through pipes until they
close (AnsibleModule.run_command waits for every holder of the pipe, as long as output keeps coming), and a command
such as ``pct exec <vmid> -- systemctl show`` runs a binary of the container, which its tenant controls: it can
leave its own session (escaping timeout's kill of the process group), keep the pipe and write to it forever. A task
waiting on FUSE can also outlive SIGKILL while it holds the pipe.

So each command runs under a small supervisor (``argv``): the command gets pipes of the supervisor's own, in a new
session, stdin from /dev/null; the supervisor relays its output, and at the deadline (or once the output passes its
limit) SIGKILLs the command's process group and exits with ``TIMED_OUT_RC`` (``OUTPUT_LIMIT_RC``), closing the
only pipe the module reads. It never waits for a process that does not die. No Ansible imports; the supervisor's
code runs with the module's own Python (``python -c``), so nothing is installed on the node.
Unit-tested with real processes in tests/unit/plugins/module_utils/host/test_bounded_command.py.
"""

from __future__ import annotations

from typing import Sequence

TIMED_OUT_RC = 124           # as timeout(1)
OUTPUT_LIMIT_RC = 125
DEFAULT_MAX_OUTPUT_BYTES = 32 * 1024 * 1024
# After the command itself has exited, how long its output may still come (a child it left holding the pipe).
AFTER_EXIT_S = 1.0

SUPERVISOR = r"""
import os, select, signal, sys, time
timeout_s, cap, after_exit_s = float(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
argv = sys.argv[5:]
deadline = time.monotonic() + timeout_s
r_out, w_out = os.pipe()
r_err, w_err = os.pipe()
pid = os.fork()
if pid == 0:
    try:
        os.setsid()
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(w_out, 1)
        os.dup2(w_err, 2)
        os.closerange(3, 65536)
        os.execvp(argv[0], argv)
    except BaseException as exc:
        try:
            os.write(2, ("cannot run %s: %s\n" % (argv[0], exc)).encode())
        finally:
            os._exit(127)
os.close(w_out)
os.close(w_err)
open_fds = {r_out: 1, r_err: 2}
total, status, exited_at, reason = 0, None, None, None
while True:
    now = time.monotonic()
    if status is None:
        done, st = os.waitpid(pid, os.WNOHANG)
        if done:
            status, exited_at = st, now
    if not open_fds and status is not None:
        break
    if status is not None and now - exited_at >= after_exit_s:
        break
    if now >= deadline:
        reason = "timed out after %g s" % timeout_s
        break
    wait_s = min(deadline - now, 0.2)
    ready = select.select(list(open_fds), [], [], wait_s)[0] if open_fds else (time.sleep(wait_s) or [])
    for fd in ready:
        data = os.read(fd, 65536)
        if not data:
            del open_fds[fd]
            os.close(fd)
            continue
        total += len(data)
        os.write(open_fds[fd], data)
    if total > cap:
        reason = "output over %d bytes" % cap
        break
if reason is not None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        pass
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass
    os.write(2, ("\n%s: %s: killed\n" % (argv[0], reason)).encode())
    os._exit(124 if reason.startswith("timed out") else 125)
if os.WIFSIGNALED(status):
    os._exit(128 + os.WTERMSIG(status))
os._exit(os.WEXITSTATUS(status))
"""


def argv(python: str, timeout_s: float, command: Sequence[str],
         max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES) -> list[str]:
    """The argv that runs ``command`` under the supervisor with ``python`` (the module's sys.executable): exit status
    the command's (128 + N when a signal N ended it, 127 when it cannot be run), TIMED_OUT_RC when it ran out of
    ``timeout_s``, OUTPUT_LIMIT_RC when its output passed ``max_output_bytes``."""
    if timeout_s <= 0:
        raise ValueError("a command's timeout must be above 0 s, got %r" % (timeout_s,))
    if not command:
        raise ValueError("no command to run")
    return [python, "-c", SUPERVISOR, "%g" % timeout_s, str(int(max_output_bytes)), "%g" % AFTER_EXIT_S, "--"] \
        + [str(a) for a in command]


def timed_out(rc: int) -> bool:
    """Whether a supervised command was killed at its deadline or its output limit."""
    return rc in (TIMED_OUT_RC, OUTPUT_LIMIT_RC)
