#!/usr/bin/env python3
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Run inside a lab container by benchmarks/sizing_bench.py (stdlib only): launch one or more SGLang servers,
wait until each is healthy or has exited, run a load phase, report, stop them all.

    python3 sizing_probe.py '<json spec>'

spec: {"engines": [{"python": ..., "args": [...], "port": N}], "env": {...}, "load_seconds": S, "start_timeout": S}
Prints JSON lines on stdout: {"event": "healthy"} once every engine answers /health 200 (the host starts
sampling the container's memory cgroup then), then {"event": "result", ...}. Everything is stopped before it exits.
"""
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request


def emit(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def http(port, path, body=None, timeout=5.0):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request("http://127.0.0.1:%d%s" % (port, path), data=data,
                                 headers={"Content-Type": "application/json"} if data else {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode(errors="replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")
    except (urllib.error.URLError, OSError):
        return None, ""


def tree(pid):
    """pid and its descendants (from /proc)."""
    children = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % name, "rb") as f:
                st = f.read()
            ppid = int(st[st.rindex(b")") + 2:].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(name))
    out, todo = [pid], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def alive(pid):
    try:
        with open("/proc/%d/stat" % pid, "rb") as f:
            st = f.read()
        return st[st.rindex(b")") + 2:st.rindex(b")") + 3] not in (b"Z", b"X")
    except (OSError, ValueError):
        return False


def tail(path, n=12):
    try:
        with open(path, "rb") as f:
            return f.read().decode(errors="replace").splitlines()[-n:]
    except OSError:
        return []


def main():
    spec = json.loads(sys.argv[1])
    env = dict(os.environ)
    env.update(spec.get("env", {}))
    engines = []
    for i, eng in enumerate(spec["engines"]):
        log = "/root/bench/engine-%d.log" % i
        proc = subprocess.Popen([eng["python"], "-m", "sglang.launch_server"] + eng["args"], env=env,
                                stdout=open(log, "wb"), stderr=subprocess.STDOUT, start_new_session=True)
        engines.append({"proc": proc, "port": eng["port"], "log": log, "health": None})
    deadline = time.time() + spec.get("start_timeout", 180)
    while time.time() < deadline:
        for e in engines:
            if e["health"] is None and e["proc"].poll() is None and http(e["port"], "/health", timeout=2)[0] == 200:
                e["health"] = "ok"
        if all(e["health"] == "ok" or e["proc"].poll() is not None for e in engines):
            break
        time.sleep(0.2)
    started = all(e["health"] == "ok" and e["proc"].poll() is None for e in engines)
    result = {"event": "result", "started": started, "engines": []}
    if started:
        ranks_before = {id(e): [p for p in tree(e["proc"].pid)] for e in engines}
        emit({"event": "healthy"})
        end = time.time() + spec.get("load_seconds", 3)
        requests = 0
        while time.time() < end:
            for e in engines:
                code, _ = http(e["port"], "/generate", {"text": "hello", "sampling_params": {"max_new_tokens": 8}})
                requests += code == 200
            time.sleep(0.05)
        result["requests_ok"] = requests
        for e in engines:
            # SGLang logs each rank's host pool ("Allocating ... GB host memory"); the stand-in reports it per rank.
            code, body = http(e["port"], "/_standin/ranks")
            ranks = json.loads(body) if code == 200 else []
            tokens = [int(r.get("hicache_host_tokens") or 0) for r in ranks]
            lost = [p for p in ranks_before[id(e)] if not alive(p)]
            result["engines"].append({"host_tokens_per_rank": tokens, "processes": len(ranks_before[id(e)]),
                                      "processes_lost_in_load": len(lost), "exit": e["proc"].poll()})
        result["survived_load"] = all(x["processes_lost_in_load"] == 0 and x["exit"] is None for x in result["engines"])
    else:
        for e in engines:
            result["engines"].append({"exit": e["proc"].poll(), "healthy": e["health"] == "ok", "log_tail": tail(e["log"])})
    # Stop everything: SIGTERM to each engine's process group, SIGKILL what is left after 30 s.
    for e in engines:
        try:
            os.killpg(e["proc"].pid, signal.SIGTERM)
        except OSError:
            pass
    stop_deadline = time.time() + 30
    for e in engines:
        try:
            e["proc"].wait(max(0.1, stop_deadline - time.time()))
        except subprocess.TimeoutExpired:
            pass
    for e in engines:
        for p in tree(e["proc"].pid):
            try:
                os.kill(p, signal.SIGKILL)
            except OSError:
                pass
        try:
            os.killpg(e["proc"].pid, signal.SIGKILL)
        except OSError:
            pass
        e["proc"].wait()
    for e in engines:
        e_log = tail(e["log"], 40)
        idx = engines.index(e)
        result["engines"][idx]["refusal"] = next((line for line in e_log if "Not enough host memory" in line
                                                  or "AssertionError" in line or "host memory should be larger" in line
                                                  or "Cannot automatically size" in line), None)
    emit(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
