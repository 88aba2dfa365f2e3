"""The detokenizer process (`sglang::detokenizer`): idles; dies with its parent; SIGTERM exits 0."""

import os
import signal
import sys
import time

from sglang.srt import utils


def main(argv):
    utils.kill_itself_when_parent_died()
    utils.setproctitle("sglang::detokenizer")
    state = {"stop": False}

    def on_term(signum, frame):
        if signum == signal.SIGTERM and utils.read_faults().get("ignore_sigterm"):
            return
        state["stop"] = True

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    parent = os.getppid()
    while not state["stop"] and os.getppid() == parent:
        time.sleep(0.5)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
