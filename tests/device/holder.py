#!/usr/bin/env python3
"""Hold real GPU memory through the driver API only (libcuda via ctypes, no CUDA toolkit, no torch).

    holder.py [--mib 2048] [--device 0]
Prints "READY <pid> <mib>" once the allocation exists, then sleeps until killed. SIGTERM is ignored with
--ignore-term (to exercise the SIGKILL step).
"""
import argparse
import ctypes
import signal
import sys
import time

ap = argparse.ArgumentParser()
ap.add_argument("--mib", type=int, default=2048)
ap.add_argument("--device", type=int, default=0)
ap.add_argument("--ignore-term", action="store_true")
a = ap.parse_args()
if a.ignore_term:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
try:
    cuda = ctypes.CDLL("libcuda.so.1")
except OSError as exc:
    sys.exit("holder: cannot load libcuda.so.1: %s" % exc)


def check(rc, what):
    if rc != 0:
        sys.exit("holder: %s failed with CUresult %d" % (what, rc))


check(cuda.cuInit(0), "cuInit")
dev = ctypes.c_int()
check(cuda.cuDeviceGet(ctypes.byref(dev), a.device), "cuDeviceGet")
ctx = ctypes.c_void_p()
check(cuda.cuCtxCreate_v2(ctypes.byref(ctx), 0, dev), "cuCtxCreate_v2")
ptr = ctypes.c_uint64()
check(cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(a.mib * 1024 * 1024)), "cuMemAlloc_v2")
check(cuda.cuMemsetD8_v2(ptr, 1, ctypes.c_size_t(a.mib * 1024 * 1024)), "cuMemsetD8_v2")
print("READY %d %d" % (__import__("os").getpid(), a.mib), flush=True)
while True:
    time.sleep(3600)
