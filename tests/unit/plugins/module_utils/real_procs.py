# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Real child processes for the kill tests: a test that judges a kill sends real signals to real processes."""
from __future__ import annotations

import subprocess
import sys

import pytest

from ansible_collections.inferops.gpu_inference.plugins.module_utils.recover import recover_procs as procs

CHILD = ("import signal, sys, time\n"
         "def term(*a):\n"
         "    open(sys.argv[1], 'a').write('TERM\\n')\n"
         "    if sys.argv[2] == 'exit': sys.exit(0)\n"
         "signal.signal(signal.SIGTERM, term)\n"
         "print('ready', flush=True)\n"
         "while True: time.sleep(1)\n")


class Child:
    """A real process: traps SIGTERM (notes it in a file; exits on it unless ``on_term="stay"``)."""

    def __init__(self, tmp_path, process_group=None, on_term="exit"):
        self.notes = tmp_path / ("term-%d" % len(list(tmp_path.iterdir())))
        self.notes.touch()
        self.p = subprocess.Popen([sys.executable, "-c", CHILD, str(self.notes), on_term], stdout=subprocess.PIPE,
                                  text=True, process_group=process_group)
        assert self.p.stdout.readline() == "ready\n"
        self.pid = self.p.pid

    def record(self, vmid):
        """What the scan reads of it (the real /proc), attributed to ``vmid``."""
        return dict(procs.read_process(self.pid, "/"), vmid=vmid)

    def gone(self):
        """Whether it ended (it is our child: reaped here, so a PID reuse cannot confuse the check)."""
        try:
            self.p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            return False
        return True

    def alive(self):
        return self.p.poll() is None

    def got_term(self):
        return "TERM" in self.notes.read_text()

    def stop(self):
        if self.p.poll() is None:
            self.p.kill()
        self.p.wait()


@pytest.fixture
def children(tmp_path):
    made = []

    def make(**kw):
        c = Child(tmp_path, **kw)
        made.append(c)
        return c
    yield make
    for c in made:
        c.stop()
