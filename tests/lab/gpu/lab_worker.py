#!/usr/bin/python3
"""A GPU-holding process for the lab's faults and tests (installed as /run/nvidia-lab/lab-worker.py,
which every GPU container sees).  Stdlib only.

    lab-worker.py --gpus 0,1 --mib 1024 [--name pt_main_thread] [--daemonize] [--ignore-term]
                  [--stuck-file /run/lab-stuckfs/blob]

Opens /dev/nvidiaN with O_PATH (plus nvidiactl/nvidia-uvm when present) like a CUDA client, registers
one allocation per GPU with the lab driver, then waits forever.  --name re-executes the interpreter with
that argv[0] and sets comm (what `ps`, `pgrep` and NVML show).  --daemonize double-forks so the process
is reparented to its PID namespace's init (an "escaped" worker); the parent prints one JSON line
{"pid": <pid in caller's namespace>, "handles": [...]} once the allocations are registered, and exits.
--stuck-file: after registering, read() from that file (a never-answering FUSE file), after poking the
thread with a caught signal so the task sits in D state (TASK_KILLABLE, then uninterruptible once SIGKILLed).
"""
import argparse
import ctypes
import json
import os
import signal
import socket
import sys
import threading
import time

SOCK = os.environ.get("NVIDIA_LAB_SOCKET", "/run/nvidia-lab/driver.sock")


def set_comm(name):
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(15, ctypes.c_char_p(name.encode()[:15]), 0, 0, 0)  # PR_SET_NAME
    except OSError:
        pass


def alloc(gpu, nbytes, tag):
    """One allocation on the GPU of /dev/nvidia<gpu> (a device minor: the driver knows which GPU that node is)."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(30)
    s.connect(SOCK)
    s.sendall(json.dumps({"op": "alloc", "gpu": gpu, "minor": gpu, "bytes": nbytes, "tag": tag}).encode() + b"\n")
    buf = b""
    while not buf.endswith(b"\n"):
        c = s.recv(4096)
        if not c:
            break
        buf += c
    s.close()
    return json.loads(buf)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpus", default="0")
    ap.add_argument("--mib", type=int, default=1024)
    ap.add_argument("--name")
    ap.add_argument("--tag", default="lab-worker")
    ap.add_argument("--daemonize", action="store_true")
    ap.add_argument("--ignore-term", action="store_true")
    ap.add_argument("--stuck-file")
    args = ap.parse_args()

    if args.name and os.environ.get("LABW_NAMED") != "1":
        os.environ["LABW_NAMED"] = "1"
        sys.stdout.flush()
        os.execv(sys.executable, [args.name, os.path.abspath(__file__)] + sys.argv[1:])
    os.environ.pop("LABW_NAMED", None)
    if args.name:
        set_comm(args.name)
    if args.ignore_term:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)

    rfd = wfd = None
    if args.daemonize:
        rfd, wfd = os.pipe()
        if os.fork() > 0:
            os.close(wfd)
            data = b""
            while True:
                c = os.read(rfd, 65536)
                if not c:
                    break
                data += c
            if not data:
                sys.stderr.write("lab-worker: child failed\n")
                return 1
            sys.stdout.write(data.decode())
            rep = json.loads(data)
            return 0 if rep.get("ok") else 1
        os.close(rfd)
        os.setsid()
        if os.fork() > 0:
            os._exit(0)

    fds = []
    handles = []
    err = None
    for extra in ("/dev/nvidiactl", "/dev/nvidia-uvm"):
        if os.path.exists(extra):
            fds.append(os.open(extra, os.O_PATH))
    for g in [int(x) for x in args.gpus.split(",") if x != ""]:
        try:
            fds.append(os.open("/dev/nvidia%d" % g, os.O_PATH))
            rep = alloc(g, args.mib * 1024 * 1024, args.tag)
        except OSError as e:
            rep = {"ok": False, "error": str(e)}
        if not rep.get("ok"):
            err = "GPU %d: %s" % (g, rep.get("error"))
            break
        handles.append(rep["handle"])
    result = {"ok": err is None, "pid": os.getpid(), "handles": handles}
    if err:
        result["error"] = err
    if wfd is not None:
        os.write(wfd, (json.dumps(result) + "\n").encode())
        os.close(wfd)
        null = os.open("/dev/null", os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
    else:
        print(json.dumps(result), flush=True)
    if err:
        return 1

    if args.stuck_file:
        signal.signal(signal.SIGUSR1, lambda *a: None)
        main_tid = threading.get_ident()
        fd = os.open(args.stuck_file, os.O_RDONLY)

        def poke():
            time.sleep(0.5)
            signal.pthread_kill(main_tid, signal.SIGUSR1)
        threading.Thread(target=poke, daemon=True).start()
        try:
            os.read(fd, 4096)  # never answered: S, then D after the poke; SIGKILL cannot end it
        except OSError:
            pass  # connection aborted: the task is no longer stuck, but still holds its GPU memory
    while True:
        signal.pause()


if __name__ == "__main__":
    sys.exit(main())
