"""A tiny stand-in for the lab's GPU driver daemon, for the stand-in's own tests only.

Speaks the protocol of docs/lab.md ("Driver socket protocol") on a unix socket; allocations belong
to the caller's PID (SO_PEERCRED) and are released when that process is gone.  Also makes a device
directory with /dev/nvidia*-style character nodes (195:N, 195:255) for NVLAB_DEV_DIR.

    python3 fake_driver.py --sock /tmp/x/driver.sock --dev-dir /tmp/x/dev --gpus 8 --mib 8192
"""

import argparse
import itertools
import json
import os
import socket
import stat
import struct
import sys
import threading
import time


def make_dev_dir(path: str, gpus: int):
    os.makedirs(path, exist_ok=True)
    nodes = [("nvidia%d" % i, 195, i) for i in range(gpus)]
    nodes += [("nvidiactl", 195, 255), ("nvidia-uvm", 511, 0), ("nvidia-uvm-tools", 511, 1)]
    for name, major, minor in nodes:
        p = os.path.join(path, name)
        if not os.path.exists(p):
            try:
                os.mknod(p, stat.S_IFCHR | 0o666, os.makedev(major, minor))
            except (PermissionError, OSError):
                open(p, "w").close()  # without CAP_MKNOD a plain file serves O_PATH just as well


def _alive(pid: int) -> bool:
    try:
        with open("/proc/%d/stat" % pid, "rb") as f:
            s = f.read()
        return s[s.rindex(b")") + 2:s.rindex(b")") + 3] not in (b"Z", b"X")
    except (OSError, ValueError):
        return False


class Driver:
    def __init__(self, gpus: int, mib: int):
        self.gpus = [{"index": i, "uuid": "GPU-fake-%04d" % i, "name": "NVIDIA H100 NVL (fake)",
                      "pci_bus_id": "00000000:%02X:00.0" % (0x18 + i), "memory_total_mib": mib} for i in range(gpus)]
        self.allocs = {}
        self.lock = threading.Lock()
        self.ids = itertools.count(1)

    def used(self, gpu: int) -> int:
        return sum(b for (p, g, b, t) in self.allocs.values() if g == gpu)

    def handle(self, req: dict, pid: int) -> dict:
        op = req.get("op")
        with self.lock:
            if op == "query":
                gpus = []
                for g in self.gpus:
                    procs = {}
                    for (p, gi, b, t) in self.allocs.values():
                        if gi == g["index"]:
                            procs[p] = procs.get(p, 0) + b
                    gpus.append(dict(g, memory_used_mib=-(-self.used(g["index"]) // 2 ** 20), persistence_mode="Enabled",
                                     processes=[{"pid": p, "name": "?", "used_memory_mib": -(-b // 2 ** 20)}
                                                for p, b in sorted(procs.items())]))
                return {"ok": True, "driver_version": "550.00", "cuda_version": "12.4", "in_container": False, "gpus": gpus}
            if op == "alloc":
                gpu, nbytes = int(req["gpu"]), int(req["bytes"])
                if gpu >= len(self.gpus):
                    return {"ok": False, "error": "invalid device"}
                if self.used(gpu) + nbytes > self.gpus[gpu]["memory_total_mib"] * 2 ** 20:
                    return {"ok": False, "error": "out of memory"}
                h = "h-%d" % next(self.ids)
                self.allocs[h] = (pid, gpu, nbytes, req.get("tag", ""))
                return {"ok": True, "handle": h}
            if op == "free":
                self.allocs.pop(req.get("handle"), None)
                return {"ok": True}
            if op == "dump":  # test helper
                return {"ok": True, "allocs": [{"handle": h, "pid": p, "gpu": g, "bytes": b, "tag": t}
                                               for h, (p, g, b, t) in sorted(self.allocs.items())]}
        return {"ok": False, "error": "unknown op"}

    def reap(self):
        while True:
            time.sleep(0.3)
            with self.lock:
                for h, (p, g, b, t) in list(self.allocs.items()):
                    if not _alive(p):
                        del self.allocs[h]


def serve(sock_path: str, drv: Driver):
    try:
        os.unlink(sock_path)
    except FileNotFoundError:
        pass
    os.makedirs(os.path.dirname(sock_path), exist_ok=True)
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(sock_path)
    os.chmod(sock_path, 0o666)
    srv.listen(64)
    threading.Thread(target=drv.reap, daemon=True).start()

    def client(conn):
        cred = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        pid = struct.unpack("3i", cred)[0]
        f = conn.makefile("rwb")
        try:
            for line in f:
                try:
                    reply = drv.handle(json.loads(line), pid)
                except Exception as e:  # noqa: BLE001
                    reply = {"ok": False, "error": str(e)}
                f.write((json.dumps(reply) + "\n").encode())
                f.flush()
        except OSError:
            pass
        finally:
            conn.close()

    while True:
        conn, _ = srv.accept()
        threading.Thread(target=client, args=(conn,), daemon=True).start()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--sock", required=True)
    p.add_argument("--dev-dir")
    p.add_argument("--gpus", type=int, default=8)
    p.add_argument("--mib", type=int, default=8192)
    a = p.parse_args()
    if a.dev_dir:
        make_dev_dir(a.dev_dir, a.gpus)
    serve(a.sock, Driver(a.gpus, a.mib))


if __name__ == "__main__":
    sys.exit(main())
