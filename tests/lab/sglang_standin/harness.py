"""Helpers for tests/lab/test_sglang_*.py: build the wheels once, install a version into a throwaway
venv, run a fake GPU driver daemon, launch the stand-in on the node and inspect its processes."""

import glob
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
BUILD = os.path.join(HERE, "build_wheels.py")
FAKE_DRIVER = os.path.join(HERE, "fake_driver.py")
SRC = os.path.join(HERE, "src")


def base_python() -> str:
    """The interpreter for the throwaway venvs: Debian's /usr/bin/python3 (as in the containers)."""
    return "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable


def _pip_python() -> str:
    """An interpreter with pip >= 22.3 (for `pip --python`)."""
    for cand in (base_python(), sys.executable, shutil.which("python3") or ""):
        if not cand:
            continue
        r = subprocess.run([cand, "-m", "pip", "--version"], capture_output=True, text=True)
        if r.returncode == 0:
            ver = tuple(int(x) for x in r.stdout.split()[1].split(".")[:2])
            if ver >= (22, 3):
                return cand
    raise RuntimeError("no pip >= 22.3 found")


class Wheels:
    def __init__(self, root: str):
        self.root = root
        self.out = os.path.join(root, "packages")
        self.venvs = {}

    def build(self):
        r = subprocess.run([sys.executable, BUILD, "--out", self.out], capture_output=True, text=True, timeout=600)
        if r.returncode != 0:
            raise RuntimeError("build_wheels failed:\n%s\n%s" % (r.stdout, r.stderr))
        return self

    def venv(self, version: str) -> str:
        """A venv with sglang==version installed from the built folder (offline); returns its python."""
        if version in self.venvs:
            return self.venvs[version]
        path = os.path.join(self.root, "venv-" + version)
        subprocess.run([base_python(), "-m", "venv", "--without-pip", path], check=True)
        py = os.path.join(path, "bin", "python")
        r = subprocess.run([_pip_python(), "-m", "pip", "--python", py, "install", "--quiet", "--disable-pip-version-check",
                            "--no-index", "--find-links", self.out, "sglang==" + version],
                           capture_output=True, text=True, timeout=300)
        if r.returncode != 0:
            raise RuntimeError("pip install sglang==%s failed:\n%s\n%s" % (version, r.stdout, r.stderr))
        self.venvs[version] = py
        return py


class FakeDriver:
    def __init__(self, root: str, gpus: int = 8, mib: int = 40960):
        self.root = root
        self.sock = os.path.join(root, "driver.sock")
        self.dev = os.path.join(root, "dev")
        self.proc = subprocess.Popen([sys.executable, FAKE_DRIVER, "--sock", self.sock, "--dev-dir", self.dev,
                                      "--gpus", str(gpus), "--mib", str(mib)])
        deadline = time.time() + 10
        while not os.path.exists(self.sock):
            if time.time() > deadline:
                raise RuntimeError("fake driver did not start")
            time.sleep(0.05)

    def request(self, obj: dict) -> dict:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(self.sock)
        f = s.makefile("rwb")
        f.write((json.dumps(obj) + "\n").encode())
        f.flush()
        reply = json.loads(f.readline())
        s.close()
        return reply

    def allocs(self):
        return self.request({"op": "dump"})["allocs"]

    def stop(self):
        self.proc.kill()
        self.proc.wait()


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class Server:
    """One `python -m sglang.launch_server` run on the node."""

    def __init__(self, python: str, args, env=None, log_path=None):
        self.port = None
        if "--port" not in args and "--help" not in args:
            self.port = free_port()
            args = list(args) + ["--port", str(self.port)]
        elif "--port" in args:
            self.port = int(args[args.index("--port") + 1])
        self.args = list(args)
        self.log_path = log_path
        self.log = open(log_path, "w+b") if log_path else subprocess.PIPE
        full_env = dict(os.environ)
        full_env.update(env or {})
        self.proc = subprocess.Popen([python, "-m", "sglang.launch_server"] + self.args, env=full_env,
                                     stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def output(self) -> str:
        if self.log_path:
            with open(self.log_path, "rb") as f:
                return f.read().decode(errors="replace")
        return ""

    def wait(self, timeout: float = 60) -> int:
        return self.proc.wait(timeout)

    def get(self, path: str, headers=None, timeout: float = 30):
        req = urllib.request.Request("http://127.0.0.1:%d%s" % (self.port, path), headers=headers or {})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    def json(self, path: str, headers=None):
        code, body = self.get(path, headers)
        assert code == 200, (path, code, body)
        return json.loads(body)

    def wait_healthy(self, timeout: float = 120):
        """Poll /health; returns the list of distinct states seen ('refused', 503, 200)."""
        seen = []
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError("server exited with %s:\n%s" % (self.proc.returncode, self.output()))
            try:
                code, _ = self.get("/health", timeout=5)
            except (urllib.error.URLError, ConnectionError, OSError):
                code = "refused"
            if not seen or seen[-1] != code:
                seen.append(code)
            if code == 200:
                return seen
            time.sleep(0.05)
        raise AssertionError("not healthy after %ss (seen %s):\n%s" % (timeout, seen, self.output()))

    def tree(self):
        """[(pid, args)] of this server's process tree (main first)."""
        return [(self.pid, cmdline(self.pid))] + [(p, cmdline(p)) for p in descendants(self.pid)]

    def terminate(self, timeout: float = 30) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def kill(self):
        pids = descendants(self.pid)
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except OSError:
            pass
        for p in pids:
            try:
                os.kill(p, signal.SIGKILL)
            except OSError:
                pass
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            pass
        if self.log_path and not isinstance(self.log, int):
            self.log.close()


def cmdline(pid: int) -> str:
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def descendants(pid: int):
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
    out, todo = [], [pid]
    while todo:
        for c in sorted(children.get(todo.pop(), [])):
            out.append(c)
            todo.append(c)
    return out


def alive(pid: int) -> bool:
    try:
        with open("/proc/%d/stat" % pid, "rb") as f:
            st = f.read()
        return st[st.rindex(b")") + 2:st.rindex(b")") + 3] not in (b"Z", b"X")
    except (OSError, ValueError):
        return False


def proc_status(pid: int) -> dict:
    out = {}
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            k, _, v = line.partition(":")
            parts = v.split()
            if len(parts) == 2 and parts[1] == "kB":
                out[k] = int(parts[0]) * 1024
    return out


def pgrep(pattern: str):
    """Matching processes in this (the host's) PID namespace only: a server running in a lab container (CT 129
    after a deploy) has processes of the same names."""
    r = subprocess.run(["pgrep", "--ns", str(os.getpid()), "--nslist", "pid", "-f", pattern], capture_output=True, text=True)
    return [int(x) for x in r.stdout.split()]


def mem_available() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no MemAvailable")


def write_tiny_model(directory: str, layers=2, heads=8, kv_heads=8, head_dim=128, weights=1 << 30, mla=False):
    from sglang_standin import build_wheels

    if mla:
        cfg = dict(build_wheels.MODELS["kimi-k2-tiny"]["config"], num_hidden_layers=layers)
    else:
        cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": layers,
               "num_attention_heads": heads, "num_key_value_heads": kv_heads, "head_dim": head_dim,
               "hidden_size": heads * head_dim, "torch_dtype": "bfloat16", "max_position_embeddings": 8192}
    build_wheels.write_model(directory, cfg, weights)
    return directory


def wait_gone(pids, timeout: float = 15) -> bool:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if not any(alive(p) for p in pids):
            return True
        time.sleep(0.05)
    return False


def wheel_files(out: str):
    return sorted(os.path.basename(p) for p in glob.glob(os.path.join(out, "*.whl")))
