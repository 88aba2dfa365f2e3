"""Small helpers shared by the stand-in's processes.  Stdlib only and cheap to import: every rank
imports this module, and eight ranks must fit in a small container."""

import ctypes
import json
import os
import signal
import sys
import time

PR_SET_NAME = 15
PR_SET_PDEATHSIG = 1

GIB = 1024 ** 3
# SGLang's HICACHE_HOST_MEMORY_RESERVE_BYTES (sglang-hicache.md section 2.4): a fixed 10 GiB.
HICACHE_HOST_MEMORY_RESERVE_BYTES = 10 * GIB

FAULTS_FILE = "/run/sglang-standin/faults.json"

_LEVELS = {"debug": 10, "info": 20, "warning": 30, "error": 40, "critical": 50}
_libc = None


def libc():
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    return _libc


class Logger:
    """SGLang's log format: `[%(asctime)s{prefix}] %(message)s` (configure_logger), on stderr."""

    def __init__(self, prefix: str = "", level: str = "info"):
        self.prefix = prefix
        self.level = _LEVELS.get(str(level).lower(), 20)

    def _emit(self, lvl: int, msg: str):
        if lvl < self.level:
            return
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        try:
            sys.stderr.write("[%s%s] %s\n" % (stamp, self.prefix, msg))
            sys.stderr.flush()
        except (OSError, ValueError):
            pass

    def debug(self, msg):
        self._emit(10, msg)

    def info(self, msg):
        self._emit(20, msg)

    def warning(self, msg):
        self._emit(30, msg)

    def error(self, msg):
        self._emit(40, msg)


def kill_itself_when_parent_died():
    """SGLang's utils.kill_itself_when_parent_died: prctl(PR_SET_PDEATHSIG, SIGKILL)."""
    libc().prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def set_pdeathsig_preexec():
    """preexec_fn for children: closes the race between fork and the child's own prctl."""
    libc().prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def setproctitle(title: str):
    """Set the process title as SGLang does (setproctitle), so that `ps -eo args` and
    `pgrep -f 'sglang::scheduler'` see it.  Without the setproctitle package, overwrite the argv
    area through /proc/self/mem (same visible effect for a process started with a long argv)."""
    try:
        import setproctitle as _spt  # SGLang's own dependency

        _spt.setproctitle(title)
    except Exception:
        _setproctitle_fallback(title)
    try:
        libc().prctl(PR_SET_NAME, ctypes.c_char_p(title.encode()[:15]), 0, 0, 0)
    except Exception:
        pass


def _setproctitle_fallback(title: str):
    try:
        with open("/proc/self/stat", "rb") as f:
            stat = f.read()
        fields = stat[stat.rindex(b")") + 2:].split()
        # fields[0] is field 3 (state); arg_start/arg_end are fields 48/49.
        arg_start, arg_end = int(fields[45]), int(fields[46])
        length = arg_end - arg_start
        if length <= 1:
            return
        data = title.encode()[: length - 1]
        with open("/proc/self/mem", "r+b", buffering=0) as mem:
            mem.seek(arg_start)
            mem.write(data + b"\0" * (length - len(data)))
    except Exception:
        pass


def read_faults() -> dict:
    """The fault contract: /run/sglang-standin/faults.json, read when a signal arrives."""
    path = os.environ.get("SGLANG_STANDIN_FAULTS_FILE", FAULTS_FILE)
    try:
        with open(path) as f:
            data = json.load(f)
        return data if isinstance(data, dict) else {}
    except Exception:
        return {}


def meminfo() -> dict:
    """/proc/meminfo in bytes (psutil.virtual_memory() reads the same file; inside an lxcfs
    container it reflects the container's limit)."""
    out = {}
    with open("/proc/meminfo") as f:
        for line in f:
            name, _, rest = line.partition(":")
            parts = rest.split()
            if parts:
                val = int(parts[0])
                if len(parts) > 1 and parts[1].lower() == "kb":
                    val *= 1024
                out[name] = val
    return out


def mem_available() -> int:
    """psutil.virtual_memory().available on Linux: MemAvailable."""
    info = meminfo()
    if "MemAvailable" in info:
        return info["MemAvailable"]
    return info.get("MemFree", 0) + info.get("Cached", 0) + info.get("Buffers", 0)


class CgroupDiscoveryError(RuntimeError):
    pass


def _read(path):
    with open(path) as f:
        return f.read().strip()


def _stat(path):
    out = {}
    with open(path) as f:
        for line in f:
            k, _, v = line.partition(" ")
            try:
                out[k] = int(v)
            except ValueError:
                pass
    return out


def cgroup_headroom():
    """Cgroup v1/v2 memory headroom: min(memory.max, memory.high) - (usage - file page cache).
    Returns None when no limit is set; raises CgroupDiscoveryError when no cgroup memory files
    can be read at all (sglang-hicache.md section 2.4, 0.5.21+)."""
    root = os.environ.get("SGLANG_STANDIN_CGROUP_ROOT", "/sys/fs/cgroup")
    v1_path = v2_path = None
    try:
        with open("/proc/self/cgroup") as f:
            for line in f:
                hid, ctrls, path = line.rstrip("\n").split(":", 2)
                if hid == "0" and ctrls == "":
                    v2_path = path
                elif "memory" in ctrls.split(","):
                    v1_path = path
    except OSError:
        pass
    # cgroup v2
    for cand in ([os.path.join(root, (v2_path or "/").lstrip("/")), root] if v2_path is not None else [root]):
        if os.path.exists(os.path.join(cand, "memory.max")):
            limits = []
            for name in ("memory.max", "memory.high"):
                try:
                    v = _read(os.path.join(cand, name))
                except OSError:
                    continue
                if v != "max":
                    limits.append(int(v))
            usage = int(_read(os.path.join(cand, "memory.current")))
            st = _stat(os.path.join(cand, "memory.stat"))
            cache = max(st.get("file", 0) - st.get("shmem", 0), 0)
            if not limits:
                return None
            return max(min(limits) - (usage - cache), 0)
    # cgroup v1
    base = os.path.join(root, "memory")
    cands = []
    if v1_path is not None:
        cands.append(os.path.join(base, v1_path.lstrip("/")))
    cands.append(base)
    for cand in cands:
        lim_file = os.path.join(cand, "memory.limit_in_bytes")
        if os.path.exists(lim_file):
            limit = int(_read(lim_file))
            usage = int(_read(os.path.join(cand, "memory.usage_in_bytes")))
            st = _stat(os.path.join(cand, "memory.stat"))
            cache = max(st.get("total_cache", st.get("cache", 0)) - st.get("total_shmem", st.get("shmem", 0)), 0)
            if limit >= (1 << 62):
                return None
            return max(limit - (usage - cache), 0)
    raise CgroupDiscoveryError("no cgroup memory controller found")


def descendants(pid: int):
    """PIDs of all descendants of pid (psutil.Process(pid).children(recursive=True))."""
    children = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % name, "rb") as f:
                stat = f.read()
            ppid = int(stat[stat.rindex(b")") + 2:].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(name))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        for c in children.get(p, []):
            out.append(c)
            todo.append(c)
    return out


def pid_alive(pid: int) -> bool:
    """True while pid exists and is neither a zombie nor dead (state Z/X in /proc/PID/stat)."""
    try:
        with open("/proc/%d/stat" % pid, "rb") as f:
            stat = f.read()
        return stat[stat.rindex(b")") + 2:stat.rindex(b")") + 3] not in (b"Z", b"X")
    except (OSError, ValueError):
        return False


def kill_process_tree(pid: int, include_parent: bool = True):
    """SGLang's kill_process_tree: SIGKILL every descendant, then the process itself."""
    for child in descendants(pid):
        try:
            os.kill(child, signal.SIGKILL)
        except OSError:
            pass
    if include_parent:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def env_float(name: str, default: float) -> float:
    try:
        return float(os.environ.get(name, default))
    except ValueError:
        return default
