"""The stand-in's "CUDA": the lab's GPU driver contract (docs/lab.md, "GPU driver contract").

A rank holds its GPU by opening the device node with O_PATH and keeping the fd, and registers its
GPU memory with the driver daemon over a unix socket (one JSON object per line).  Failures are
raised with the messages PyTorch/CUDA print in the same situations.
"""

import json
import os
import socket

DEFAULT_SOCK = "/run/nvidia-lab/driver.sock"

NO_DRIVER = (
    "Found no NVIDIA driver on your system. Please check that you have an NVIDIA GPU and installed "
    "a driver from http://www.nvidia.com/Download/index.aspx"
)
NO_GPUS = "No CUDA GPUs are available"
UNKNOWN_ERROR = (
    "Unexpected error from cudaGetDeviceCount(). Did you run some cuda functions before calling "
    "NumCudaDevices() that might have already set an error? Error 999: unknown error"
)
INVALID_ORDINAL = (
    "CUDA error: invalid device ordinal\nCUDA kernel errors might be asynchronously reported at some "
    "other API call, so the stacktrace below might be incorrect.\nFor debugging consider passing "
    "CUDA_LAUNCH_BLOCKING=1"
)


class OutOfMemoryError(RuntimeError):
    """torch.OutOfMemoryError (torch.cuda.OutOfMemoryError)."""


def sock_path() -> str:
    return os.environ.get("NVLAB_DRIVER_SOCK", DEFAULT_SOCK)


def dev_dir() -> str:
    return os.environ.get("NVLAB_DEV_DIR", "/dev")


class Device:
    """One rank's CUDA context on one GPU."""

    def __init__(self, ordinal: int):
        self.ordinal = ordinal
        self.fds = []
        self.handles = []
        self._sock = None
        self._buf = b""
        d = dev_dir()
        ctl = os.path.join(d, "nvidiactl")
        if not os.path.exists(ctl) or not os.path.exists(sock_path()):
            raise RuntimeError(NO_DRIVER)
        try:
            self.fds.append(os.open(ctl, os.O_PATH))
        except OSError:
            raise RuntimeError(NO_DRIVER)
        uvm = os.path.join(d, "nvidia-uvm")
        if not os.path.exists(uvm):
            # CUDA cannot create /dev/nvidia-uvm inside a container: cuInit fails with 999
            raise RuntimeError(UNKNOWN_ERROR)
        self.fds.append(os.open(uvm, os.O_PATH))
        try:
            reply = self.request({"op": "query"})
        except OSError:
            raise RuntimeError(UNKNOWN_ERROR)
        if not reply.get("ok"):
            raise RuntimeError(UNKNOWN_ERROR)
        self.driver = reply
        visible = [g for g in reply.get("gpus", []) if os.path.exists(os.path.join(d, "nvidia%d" % int(g["index"])))]
        cvd = os.environ.get("CUDA_VISIBLE_DEVICES")
        if cvd is not None:
            chosen = []
            for item in [x.strip() for x in cvd.split(",") if x.strip()]:
                if item.isdigit():
                    if int(item) < len(visible):
                        chosen.append(visible[int(item)])
                    else:
                        break  # CUDA stops at the first invalid entry
                else:
                    match = [g for g in visible if g.get("uuid") == item]
                    if not match:
                        break
                    chosen.append(match[0])
            visible = chosen
        if not visible:
            raise RuntimeError(NO_GPUS)
        if ordinal >= len(visible):
            raise RuntimeError(INVALID_ORDINAL)
        self.gpu = visible[ordinal]
        self.index = int(self.gpu["index"])
        self.name = self.gpu.get("name", "NVIDIA GPU")
        self.fds.append(os.open(os.path.join(d, "nvidia%d" % self.index), os.O_PATH))
        self.total_bytes = int(self.gpu["memory_total_mib"]) * 1024 * 1024

    # -- driver socket ---------------------------------------------------------------------
    def _connect(self):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(30)
        s.connect(sock_path())
        self._sock = s
        self._buf = b""

    def request(self, obj: dict) -> dict:
        for attempt in (0, 1):
            try:
                if self._sock is None:
                    self._connect()
                self._sock.sendall((json.dumps(obj) + "\n").encode())
                while b"\n" not in self._buf:
                    chunk = self._sock.recv(65536)
                    if not chunk:
                        raise ConnectionError("driver closed the connection")
                    self._buf += chunk
                line, _, self._buf = self._buf.partition(b"\n")
                return json.loads(line)
            except (OSError, ValueError):
                self.close_socket()
                if attempt:
                    raise
        raise OSError("unreachable")

    def close_socket(self):
        if self._sock is not None:
            try:
                self._sock.close()
            except OSError:
                pass
            self._sock = None

    # -- memory ------------------------------------------------------------------------------
    def free_bytes(self) -> int:
        reply = self.request({"op": "query"})
        for g in reply.get("gpus", []):
            if int(g["index"]) == self.index:
                if "memory_free_mib" in g:
                    return int(g["memory_free_mib"]) * 1024 * 1024
                return (int(g["memory_total_mib"]) - int(g.get("memory_used_mib", 0))) * 1024 * 1024
        raise RuntimeError(UNKNOWN_ERROR)

    def alloc(self, nbytes: int, tag: str) -> str:
        reply = self.request({"op": "alloc", "gpu": self.index, "bytes": int(nbytes), "tag": tag})
        if not reply.get("ok"):
            try:
                free = self.free_bytes()
            except Exception:
                free = 0
            raise OutOfMemoryError(
                "CUDA out of memory. Tried to allocate %.2f GiB. GPU %d has a total capacity of %.2f GiB "
                "of which %.2f GiB is free. (driver: %s)"
                % (nbytes / 2 ** 30, self.ordinal, self.total_bytes / 2 ** 30, free / 2 ** 30, reply.get("error", "?"))
            )
        self.handles.append(reply["handle"])
        return reply["handle"]

    def free_all(self):
        while self.handles:
            h = self.handles.pop()
            try:
                self.request({"op": "free", "handle": h})
            except (OSError, ValueError):
                pass

    def close(self):
        self.free_all()
        self.close_socket()
        for fd in self.fds:
            try:
                os.close(fd)
            except OSError:
                pass
        self.fds = []
