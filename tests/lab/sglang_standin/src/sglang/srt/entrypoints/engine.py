"""The main process of `python3 -m sglang.launch_server` (HTTP server + "tokenizer manager").

Process layout as SGLang's (sglang-hicache.md sections 3 and 4): the main process, one
`sglang::detokenizer`, `sglang::data_parallel_controller` only when dp > 1 (it starts the
schedulers), and one `sglang::scheduler...` per rank on this node.  Every child dies with its parent
(PR_SET_PDEATHSIG SIGKILL).
"""

import json
import os
import signal
import subprocess
import sys
import threading
import time
import traceback

from sglang.srt import utils
from sglang.version import __version__, parse


class _Shutdown(BaseException):
    pass


def _spawn(module: str, payload: str, ready_w=None):
    argv = [sys.executable, "-m", module, payload]
    pass_fds = ()
    if ready_w is not None:
        argv.append(str(ready_w))
        pass_fds = (ready_w,)
    return subprocess.Popen(argv, pass_fds=pass_fds, preexec_fn=utils.set_pdeathsig_preexec, close_fds=True)


def spawn_schedulers(cfg: dict, ranks: list):
    """Start one scheduler process per rank; returns [(Popen, ready_read_fd)]."""
    procs = []
    for rank in ranks:
        r, w = os.pipe()
        payload = json.dumps(dict(cfg, rank=rank, ranks=None))
        p = _spawn("sglang.srt.managers.scheduler", payload, w)
        os.close(w)
        procs.append((p, r))
    return procs


def _read_line(fd: int) -> bytes:
    buf = b""
    while not buf.endswith(b"\n"):
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        buf += chunk
    return buf


def wait_schedulers_ready(procs, log):
    """Wait for every scheduler's ready message, in order (as SGLang reads its pipes).  None when
    one of them died during init."""
    infos = []
    for p, fd in procs:
        line = _read_line(fd)
        os.close(fd)
        try:
            data = json.loads(line)
        except ValueError:
            data = None
        if not data or data.get("status") != "ready":
            log.error("Rank %d scheduler is dead. Please check if there are relevant logs." % len(infos))
            return None
        if "ranks" in data:  # from a data parallel controller
            infos.extend(data["ranks"])
        else:
            infos.append(data)
    return infos


def stop_children(procs, log, timeout: float = 30.0):
    """Graceful stop: SIGTERM, wait, then SIGKILL what is left."""
    for p in procs:
        if p.poll() is None:
            try:
                p.send_signal(signal.SIGTERM)
            except OSError:
                pass
    deadline = time.time() + timeout
    for p in procs:
        try:
            p.wait(max(deadline - time.time(), 0.01))
        except subprocess.TimeoutExpired:
            pass
    for p in procs:
        if p.poll() is None:
            log.warning("Process %d did not exit after SIGTERM; sending SIGKILL." % p.pid)
            utils.kill_process_tree(p.pid, include_parent=True)
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                pass


def main(argv) -> int:
    from sglang.srt.server_args import local_ranks, prepare_server_args, public

    version = __version__
    vt = parse(version)
    try:
        args = prepare_server_args(argv, version)
    except (ValueError, AssertionError):  # check_server_args asserts, as SGLang's does
        traceback.print_exc()
        return 1
    log = utils.Logger("", args["log_level"])
    log.info("server_args=ServerArgs(%s)" % ", ".join("%s=%r" % kv for kv in public(args).items()))

    from sglang.srt.model_config import ModelConfig

    try:
        model = ModelConfig(args["model_path"])
    except (OSError, ValueError, KeyError):
        traceback.print_exc()
        return 1

    ranks = local_ranks(args)
    # The children get their arguments in argv (the stand-in's way); SGLang hands server_args to its scheduler
    # processes through multiprocessing's spawn pipe, never in a command line, so the API keys, which no child
    # uses, stay out of the children's argv here too (sglang 0.5.9 entrypoints/engine.py: mp.set_start_method("spawn"),
    # mp.Process(target=run_scheduler_process, args=(server_args, ...)); docs/lab.md).
    child_args = {k: v for k, v in args.items() if k not in ("api_key", "admin_api_key")}
    cfg = {"server_args": child_args, "version": version, "version_tuple": list(vt)}
    state = {"phase": "launch", "stop": False}
    children = []  # Popen objects of direct children

    def sigquit_handler(signum, frame):
        log.error("Received sigquit from a child process. It usually means the child failed.")
        utils.kill_process_tree(os.getpid(), include_parent=True)

    def sigterm_handler(signum, frame):
        if signum == signal.SIGTERM and utils.read_faults().get("ignore_sigterm"):
            log.warning("SIGTERM ignored (lab fault ignore_sigterm)")
            return
        if state["stop"]:
            return
        log.warning("SIGTERM received. signum=%r frame=None. Draining requests and shutting down..." % signum)
        state["stop"] = True
        if state["phase"] == "launch":
            raise _Shutdown()

    signal.signal(signal.SIGQUIT, sigquit_handler)
    signal.signal(signal.SIGTERM, sigterm_handler)
    signal.signal(signal.SIGINT, sigterm_handler)

    def shutdown(code: int) -> int:
        stop_children(list(reversed(children)), log)
        return code

    try:
        if args["dp_size"] > 1:
            r, w = os.pipe()
            ctrl = _spawn("sglang.srt.managers.data_parallel_controller", json.dumps(dict(cfg, ranks=ranks)), w)
            os.close(w)
            children.append(ctrl)
            procs = [(ctrl, r)]
        else:
            procs = spawn_schedulers(cfg, ranks)
            children.extend(p for p, _ in procs)
        if args["node_rank"] == 0:
            children.append(_spawn("sglang.srt.managers.detokenizer_manager", args["log_level"]))
        infos = wait_schedulers_ready(procs, log)
        if infos is None:
            utils.kill_process_tree(os.getpid(), include_parent=False)
            raise RuntimeError("Initialization failed. Please see the error messages above.")
    except _Shutdown:
        return shutdown(0)

    from sglang.srt.entrypoints import http_server

    server_state = http_server.ServerState(args, version, model, infos)
    try:
        httpd = http_server.make_server(server_state, dummy=args["node_rank"] >= 1)
    except OSError as e:
        log.error("[Errno %s] error while attempting to bind on address (%r, %d): %s"
                  % (e.errno, args["host"], args["port"], (e.strerror or str(e)).lower()))
        return shutdown(1)
    state["phase"] = "running"
    if state["stop"]:
        httpd.server_close()
        return shutdown(0)
    t = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True)
    t.start()
    if args["node_rank"] >= 1:
        server_state.status = "Up"
        log.info("Node rank %d: schedulers ready; dummy health check server on %s:%d"
                 % (args["node_rank"], args["host"], args["port"]))
    else:
        log.info("Uvicorn running on http://%s:%d (Press CTRL+C to quit)" % (args["host"], args["port"]))
        threading.Thread(target=http_server.warmup, args=(server_state, log), daemon=True).start()

    if args["node_rank"] >= 1:
        # SGLang 0.5.9 entrypoints/engine.py _launch_subprocesses, node_rank >= 1: after the dummy health check server,
        # the main process joins its scheduler processes in order, logging "Scheduler or DataParallelController <pid>
        # terminated with <exitcode>" for each; then http_server.launch_server goes on to uvicorn.run on the host and
        # port the dummy server (a daemon thread) still holds, so uvicorn logs the bind error and exits 1
        # (uvicorn/server.py startup: sys.exit(1) on OSError). A node whose ranks died ends its launcher.
        pending = list(children)
        while not state["stop"] and pending:
            time.sleep(0.2)
            while pending and pending[0].poll() is not None:
                p = pending.pop(0)
                log.error("Scheduler or DataParallelController %d terminated with %s" % (p.pid, p.returncode))
        if not pending and not state["stop"]:
            log.error("[Errno 98] error while attempting to bind on address (%r, %d): address already in use"
                      % (args["host"], args["port"]))
            server_state.status = "Exiting"
            httpd.shutdown()
            httpd.server_close()
            return 1

    warned = set()
    while not state["stop"]:
        time.sleep(0.2)
        for info in infos:
            pid = info["pid"]
            if pid not in warned and not utils.pid_alive(pid):
                warned.add(pid)
                log.warning("Child process unexpectedly failed with exitcode=%s. pid=%d" % ("?", pid))
        for p in children:
            if p.pid not in warned and p.poll() is not None:
                warned.add(p.pid)
                log.warning("Child process unexpectedly failed with exitcode=%s. pid=%d" % (p.returncode, p.pid))
    server_state.status = "Exiting"
    code = shutdown(0)
    httpd.shutdown()
    httpd.server_close()
    log.info("Shutdown complete.")
    return code
