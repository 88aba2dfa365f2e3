"""`sglang::data_parallel_controller` (only when dp > 1): starts the scheduler processes itself, as
SGLang's run_data_parallel_controller_process does, and reports them ready to the main process.

    python3 -m sglang.srt.managers.data_parallel_controller '<json config>' <ready fd>
"""

import json
import os
import signal
import sys
import time

from sglang.srt import utils


def main(argv):
    cfg = json.loads(argv[0])
    ready_fd = int(argv[1])
    utils.kill_itself_when_parent_died()
    utils.setproctitle("sglang::data_parallel_controller")
    args = cfg["server_args"]
    log = utils.Logger("", args.get("log_level", "info"))
    parent = os.getppid()
    state = {"stop": False}

    def on_quit(signum, frame):
        # a scheduler failed: tell the main process, which kills the whole tree
        log.error("Received sigquit from a scheduler process. It usually means the scheduler failed.")
        try:
            os.kill(parent, signal.SIGQUIT)
        except OSError:
            pass
        utils.kill_process_tree(os.getpid(), include_parent=True)

    def on_term(signum, frame):
        if signum == signal.SIGTERM and utils.read_faults().get("ignore_sigterm"):
            return
        state["stop"] = True

    signal.signal(signal.SIGQUIT, on_quit)
    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, signal.SIG_IGN)

    from sglang.srt.entrypoints.engine import spawn_schedulers, wait_schedulers_ready, stop_children

    procs = spawn_schedulers(cfg, cfg["ranks"])
    infos = wait_schedulers_ready(procs, log)
    if infos is None:
        try:
            os.kill(parent, signal.SIGQUIT)
        except OSError:
            pass
        utils.kill_process_tree(os.getpid(), include_parent=False)
        return 1
    os.write(ready_fd, (json.dumps({"status": "ready", "ranks": infos}) + "\n").encode())
    os.close(ready_fd)
    warned = set()
    while not state["stop"] and os.getppid() == parent:
        time.sleep(0.2)
        for p, _ in procs:
            if p.poll() is not None and p.pid not in warned:
                warned.add(p.pid)
                log.warning("Child process unexpectedly failed with exitcode=%s. pid=%d" % (p.returncode, p.pid))
    stop_children([p for p, _ in procs], log)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
