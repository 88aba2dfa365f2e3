"""labctl gpu up|down|status (labgpu) -- the simulated NVIDIA driver and GPUs of the inferops lab nodes.

up (idempotent): device nodes with NVIDIA's numbers, the driver daemon (detached), the node's
/usr/bin/nvidia-smi and userspace markers, and the fake installers
/var/lib/inferops-lab/nvidia/NVIDIA-Linux-x86_64-<ver>.run (node version and one other).
pve2 (when INFEROPS_LAB_NODES, default pve1,pve2, names it) gets GPUs of its own: its nodes in
/run/inferops-lab/pve2/dev, its own driver daemon on /run/inferops-lab/pve2/nvidia-lab, both shown at /dev and
/run/nvidia-lab in pve2's mount namespace (tests/lab/pve/nodens.py), and its nvidia-persistenced there.
down: removes all of it.  status: prints the state, exit 0 when up, 1 when down or broken.

Configuration: defaults < /var/lib/inferops-lab/gpu/config.json < LABGPU_* environment variables
(see driverd.load_config and docs/lab.md).
"""
import hashlib
import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time

from gpu import driverd
from pve import nodens

HERE = os.path.dirname(os.path.abspath(__file__))
LABCTL = os.path.join(os.path.dirname(HERE), "labctl")

RUN = "/run/inferops-lab"
GPU_RUN = RUN + "/gpu"
PIDFILE = RUN + "/gpu-driverd.pid"
EFFECTIVE = GPU_RUN + "/config.json"
LOGFILE = GPU_RUN + "/driverd.log"
DEVICES = GPU_RUN + "/devices"
SOCK_DIR = driverd.SOCK_DIR
INSTALLER_DIR = "/var/lib/inferops-lab/nvidia"
LIBDIR = "/usr/lib/x86_64-linux-gnu"
SMI_DST = "/usr/bin/nvidia-smi"
SMI_SRC = os.path.join(HERE, "nvidia-smi")
PERSISTENCED_DST = "/usr/bin/nvidia-persistenced"
PERSISTENCED_SRC = os.path.join(HERE, "nvidia-persistenced")
PERSISTENCED_PIDFILE = "/var/run/nvidia-persistenced/nvidia-persistenced.pid"
# pve1 runs its nvidia-persistenced as a PVE node does: under a root-owned systemd unit, which the lab's service
# manager stand-in starts and stops (docs/lab.md, "Service manager").
PERSISTENCED_UNIT = "nvidia-persistenced.service"
UNIT_SRC = os.path.join(HERE, PERSISTENCED_UNIT)
UNIT_DST = "/lib/systemd/system/" + PERSISTENCED_UNIT
SYSTEMCTL_SRC = os.path.join(HERE, "systemctl")
SYSTEMCTL_DST = "/usr/local/sbin/systemctl"
MARK = "nvidia-smi of the inferops lab"
NODENS = os.path.join(os.path.dirname(HERE), "pve", "nodens.py")
OTHER_NODES = ("pve2",)


def lab_nodes():
    """The lab's nodes, as labctl reads them (INFEROPS_LAB_NODES, default pve1,pve2)."""
    return [n.strip() for n in (os.environ.get("INFEROPS_LAB_NODES") or "pve1,pve2").split(",") if n.strip()]


def files(node):
    """The files of one node's driver daemon and nvidia-persistenced, as seen from this machine's own namespace."""
    if node == "pve1":
        return {"pid": PIDFILE, "effective": EFFECTIVE, "log": LOGFILE, "sock": driverd.SOCK_PATH,
                "pers_pid": PERSISTENCED_PIDFILE}
    return {"pid": "%s/gpu-driverd-%s.pid" % (RUN, node), "effective": "%s/config-%s.json" % (GPU_RUN, node),
            "log": "%s/driverd-%s.log" % (GPU_RUN, node), "sock": driverd.node_paths(node)["sock_dir"] + "/driver.sock",
            "pers_pid": "%s/nvidia-persistenced.pid" % nodens.binds(node)[1][0]}


def log(msg):
    print("labgpu: " + msg)


# --------------------------------------------------------------------------- device nodes

def wanted_nodes(cfg, dev="/dev"):
    nodes = [("%s/nvidia%d" % (dev, i), 195, i) for i in range(int(cfg["gpu_count"]))]
    nodes += [(dev + "/nvidiactl", 195, 255), (dev + "/nvidia-uvm", int(cfg["uvm_major"]), 0),
              (dev + "/nvidia-uvm-tools", int(cfg["uvm_major"]), 1)]
    return nodes


def our_nodes(cfg, dev="/dev"):
    """Every nvidia* char node the lab may have made in `dev` (any GPU count, this uvm major)."""
    out = []
    if not os.path.isdir(dev):
        return out
    for n in sorted(os.listdir(dev)):
        if not n.startswith("nvidia"):
            continue
        p = dev + "/" + n
        try:
            st = os.lstat(p)
        except OSError:
            continue
        if stat.S_ISCHR(st.st_mode) and os.major(st.st_rdev) in (195, int(cfg["uvm_major"])):
            out.append(p)
    return out


def make_nodes(cfg, dev="/dev"):
    want = wanted_nodes(cfg, dev)
    names = {p for p, _, _ in want}
    for p in our_nodes(cfg, dev):
        if p not in names:
            os.unlink(p)
    for p, major, minor in want:
        dev = os.makedev(major, minor)
        try:
            st = os.lstat(p)
            if stat.S_ISCHR(st.st_mode) and st.st_rdev == dev:
                os.chmod(p, 0o666)
                continue
            os.unlink(p)
        except FileNotFoundError:
            pass
        os.mknod(p, stat.S_IFCHR | 0o666, dev)
        os.chmod(p, 0o666)


# --------------------------------------------------------------------------- daemon

def daemon_pid(node="pve1"):
    try:
        pid = int(open(files(node)["pid"]).read().strip())
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            if b"driverd.py" not in f.read():
                return None
        st = driverd.proc_stat(pid)
        if st is None or st[0] in ("Z", "X"):
            return None
        return pid
    except (OSError, ValueError):
        return None


def socket_ok(node="pve1"):
    try:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(5)
        s.connect(files(node)["sock"])
        s.sendall(b'{"op": "version"}\n')
        data = s.recv(4096)
        s.close()
        return json.loads(data)
    except (OSError, ValueError):
        return None


def persistenced_pid(node="pve1"):
    try:
        pid = int(open(files(node)["pers_pid"]).read().strip())
        with open("/proc/%d/comm" % pid) as f:
            return pid if f.read().strip() == "nvidia-persiste" else None
    except (OSError, ValueError):
        return None


def install_root_file(src, dst, mode):
    """``dst`` as a copy of ``src``, owned by root with ``mode``; True when it changed."""
    with open(src, "rb") as f:
        code = f.read()
    try:
        with open(dst, "rb") as f:
            same = f.read() == code
        st = os.stat(dst)
        same = same and st.st_uid == 0 and st.st_gid == 0 and (st.st_mode & 0o7777) == mode
    except OSError:
        same = False
    if same:
        return False
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    with open(dst + ".tmp", "wb") as f:
        f.write(code)
    os.chown(dst + ".tmp", 0, 0)
    os.chmod(dst + ".tmp", mode)
    os.replace(dst + ".tmp", dst)
    return True


def unit_main_pid():
    """The MainPID the lab's service manager reports for pve1's nvidia-persistenced.service (0: not running)."""
    if not (os.path.exists(SYSTEMCTL_DST) and os.path.exists(UNIT_DST)):
        return 0
    r = subprocess.run([SYSTEMCTL_DST, "show", "--property=MainPID", PERSISTENCED_UNIT], capture_output=True,
                       text=True, timeout=150)
    try:
        return int(r.stdout.strip().split("=", 1)[1])
    except (IndexError, ValueError):
        return 0


def strays(main):
    """pve1's nvidia-persistenced processes other than the unit's main process ``main``: started by hand, outside
    the unit (this machine's mount namespace; another node's run in its own)."""
    own_ns = os.readlink("/proc/self/ns/mnt")
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == main:
            continue
        try:
            argv = open("/proc/%s/cmdline" % name, "rb").read().split(b"\0")
            state = open("/proc/%s/stat" % name).read().rsplit(")", 1)[1].split()[0]
            same_ns = os.readlink("/proc/%s/ns/mnt" % name) == own_ns
        except OSError:
            continue
        if state != "Z" and same_ns and PERSISTENCED_DST.encode() in argv[:2]:
            found.append(int(name))
    return found


def stop_strays(main):
    for pid in strays(main):
        try:
            os.kill(pid, signal.SIGTERM)
        except OSError:
            continue
        for _ in range(100):
            if pid not in strays(main):
                break
            time.sleep(0.05)
        else:
            os.kill(pid, signal.SIGKILL)


def stop_persistenced(node="pve1"):
    if node == "pve1" and unit_main_pid():
        subprocess.run([SYSTEMCTL_DST, "stop", PERSISTENCED_UNIT], timeout=150)
    pid = persistenced_pid(node)   # one started outside its unit (by hand)
    if pid is None:
        return
    os.kill(pid, signal.SIGTERM)
    for _ in range(100):
        if persistenced_pid(node) is None:
            return
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)


def start_persistenced(node="pve1"):
    """Install the node's nvidia-persistenced and start it as the node's init would (once; again when its code
    changed). It holds every /dev/nvidiaN, so it must be (re)started after the device nodes exist. pve1's runs under
    its systemd unit (started through the lab's service manager; one found running outside the unit, started by
    hand, is stopped first). Another node's runs in that node's mount namespace (its /dev/nvidia*, its pid file
    directory), started directly."""
    with open(PERSISTENCED_SRC, "rb") as f:
        code = f.read()
    try:
        installed = open(PERSISTENCED_DST, "rb").read()
    except OSError:
        installed = None
    if installed != code:
        for n in ("pve1",) + OTHER_NODES:
            stop_persistenced(n)
        shutil.copyfile(PERSISTENCED_SRC, PERSISTENCED_DST + ".tmp")
        os.chmod(PERSISTENCED_DST + ".tmp", 0o755)
        os.replace(PERSISTENCED_DST + ".tmp", PERSISTENCED_DST)
    if node == "pve1":
        if install_root_file(SYSTEMCTL_SRC, SYSTEMCTL_DST, 0o755) | install_root_file(UNIT_SRC, UNIT_DST, 0o644):
            stop_persistenced(node)
        main = unit_main_pid()
        stop_strays(main)
        if not main:
            subprocess.run([SYSTEMCTL_DST, "start", PERSISTENCED_UNIT], check=True, timeout=150)
            return persistenced_pid(node), True
        return persistenced_pid(node), False
    if persistenced_pid(node) is None:
        launch = [sys.executable, NODENS, "exec", node, "--"]
        subprocess.run(launch + [PERSISTENCED_DST], check=True, timeout=30, cwd="/")
        return persistenced_pid(node), True
    return persistenced_pid(node), False


def stop_daemon(node="pve1"):
    pid = daemon_pid(node)
    if pid is None:
        return
    os.kill(pid, signal.SIGTERM)
    for _ in range(100):
        if daemon_pid(node) is None:
            break
        time.sleep(0.05)
    else:
        os.kill(pid, signal.SIGKILL)
    try:
        os.unlink(files(node)["pid"])
    except OSError:
        pass


def start_daemon(cfg, node="pve1"):
    """One node's driver daemon (cfg: driverd.node_config); it runs in this machine's own namespace, like every
    lab daemon, and serves the socket its node shows at /run/nvidia-lab."""
    f_ = files(node)
    pid = daemon_pid(node)
    try:
        running_cfg = json.load(open(f_["effective"]))
    except (OSError, ValueError):
        running_cfg = None
    with open(os.path.join(HERE, "driverd.py"), "rb") as f:
        code = hashlib.sha256(f.read()).hexdigest()
    try:
        running_code = open(f_["pid"] + ".code").read().strip()
    except OSError:
        running_code = None
    # restarted when its settings or its code changed (like the PVE API server)
    if pid is not None and running_cfg == cfg and running_code == code and socket_ok(node):
        return pid, False
    stop_daemon(node)
    with open(f_["pid"] + ".code", "w") as f:
        f.write(code + "\n")
    with open(f_["effective"] + ".tmp", "w") as f:
        json.dump(cfg, f, indent=1)
    os.replace(f_["effective"] + ".tmp", f_["effective"])
    logf = open(f_["log"], "a")
    p = subprocess.Popen([sys.executable, os.path.join(HERE, "driverd.py"), "--config", f_["effective"]],
                         stdin=subprocess.DEVNULL, stdout=logf, stderr=logf, start_new_session=True,
                         close_fds=True, cwd="/")
    with open(f_["pid"], "w") as f:
        f.write("%d\n" % p.pid)
    for _ in range(200):
        if socket_ok(node):
            return p.pid, True
        if p.poll() is not None:
            break
        time.sleep(0.05)
    sys.exit("labgpu: driver daemon of %s failed to start; see %s" % (node, f_["log"]))


# --------------------------------------------------------------------------- files

def write(path, data, mode=0o644):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(data)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def build_installer(version):
    tpl = open(os.path.join(HERE, "installer.sh.in")).read()
    smi = open(SMI_SRC).read()
    return tpl.replace("@VERSION@", version).replace("@NVIDIA_SMI@", smi.rstrip("\n"))


def install_userspace(version):
    """The node's own userspace: what the host's .run install leaves (nvidia-smi, NVML/CUDA libs)."""
    if os.path.exists(SMI_DST) and MARK not in open(SMI_DST, errors="replace").read(2000):
        sys.exit("labgpu: %s exists and is not the lab's; refusing to overwrite" % SMI_DST)
    remove_userspace()
    shutil.copyfile(SMI_SRC, SMI_DST + ".tmp")
    os.chmod(SMI_DST + ".tmp", 0o755)
    os.replace(SMI_DST + ".tmp", SMI_DST)
    for lib in ("libnvidia-ml.so", "libcuda.so"):
        open(os.path.join(LIBDIR, "%s.%s" % (lib, version)), "w").close()
        os.symlink("%s.%s" % (lib, version), os.path.join(LIBDIR, lib + ".1"))


def remove_userspace():
    if os.path.exists(SMI_DST) and MARK in open(SMI_DST, errors="replace").read(2000):
        os.unlink(SMI_DST)
    for n in os.listdir(LIBDIR):
        if n.startswith("libnvidia-ml.so.") or n.startswith("libcuda.so."):
            p = os.path.join(LIBDIR, n)
            if os.path.islink(p) or os.path.getsize(p) == 0:  # only the lab's empty markers
                os.unlink(p)


def proc_version_text(cfg):
    # Format of /proc/driver/nvidia/version for the open kernel module.
    return ("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  %s  Release Build  "
            "(dvs-builder@U22-I3-AF03-09-1)  Tue Sep 23 09:47:15 UTC 2025\n"
            "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14+deb12u1)\n" % cfg["driver_version"])


# --------------------------------------------------------------------------- commands

def socket_dir_files(cfg, sock_dir):
    """What the driver shows in /run/nvidia-lab besides its socket: the version text and the lab worker."""
    os.makedirs(sock_dir, exist_ok=True)
    os.chmod(sock_dir, 0o755)
    write(os.path.join(sock_dir, "version"), proc_version_text(cfg))
    shutil.copyfile(os.path.join(HERE, "lab_worker.py"), os.path.join(sock_dir, "lab-worker.py"))
    os.chmod(os.path.join(sock_dir, "lab-worker.py"), 0o755)


def node_up(cfg, node):
    """Another node's GPUs: its device nodes, its driver daemon, its namespace's view of both (when the namespace
    exists: labctl makes it), and its nvidia-persistenced there."""
    ncfg = driverd.node_config(cfg, node)
    paths = driverd.node_paths(node)
    os.makedirs(paths["dev_dir"], exist_ok=True)
    make_nodes(ncfg, paths["dev_dir"])
    socket_dir_files(ncfg, paths["sock_dir"])
    pid, started = start_daemon(ncfg, node)
    if not nodens.is_created(node):
        log("up: %s: %d GPU(s), daemon pid %d; no mount namespace of %s yet (labctl up makes it)" % (
            node, int(ncfg["gpu_count"]), pid, node))
        return
    subprocess.run([sys.executable, NODENS, "sync", node], check=True, timeout=60)
    if os.environ.get("LABGPU_PVE2_PERSISTENCED") != "1":
        # Not by default: both nodes' processes share this machine's /proc and their GPU nodes the same device
        # numbers, so pve1's scan for the holders of its GPUs (recover's rung 5) would find pve2's daemon too, which
        # no real node can see (docs/lab.md, "GPUs of pve2"). The test of pve2's reset starts it itself.
        stop_persistenced(node)
        log("up: %s: %d GPU(s), daemon pid %d%s, no nvidia-persistenced (LABGPU_PVE2_PERSISTENCED=1 starts it)" % (
            node, int(ncfg["gpu_count"]), pid, " (started)" if started else " (already running)"))
        return
    ppid, pstarted = start_persistenced(node)
    log("up: %s: %d GPU(s), daemon pid %d%s, nvidia-persistenced pid %d%s" % (
        node, int(ncfg["gpu_count"]), pid, " (started)" if started else " (already running)", ppid,
        " (started)" if pstarted else " (already running)"))


def node_down(cfg, node):
    ncfg = driverd.node_config(cfg, node)
    paths = driverd.node_paths(node)
    stop_persistenced(node)
    stop_daemon(node)
    for p in our_nodes(ncfg, paths["dev_dir"]):
        os.unlink(p)
    for n in ("driver.sock", "version", "lab-worker.py"):
        try:
            os.unlink(os.path.join(paths["sock_dir"], n))
        except OSError:
            pass
    for path in (files(node)["effective"], paths["state"]):
        try:
            os.unlink(path)
        except OSError:
            pass
    if nodens.is_created(node):  # the namespace shows none of them any more
        subprocess.run([sys.executable, NODENS, "sync", node], timeout=60)


def up():
    cfg = driverd.load_config()
    for d in (RUN, GPU_RUN, SOCK_DIR, INSTALLER_DIR, os.path.dirname(driverd.CONFIG_PATH)):
        os.makedirs(d, exist_ok=True)
    make_nodes(driverd.node_config(cfg, "pve1"))
    write(DEVICES, "Character devices:\n195 nvidia-frontend\n%d nvidia-uvm\n" % int(cfg["uvm_major"]))
    socket_dir_files(cfg, SOCK_DIR)
    pid, started = start_daemon(driverd.node_config(cfg, "pve1"))
    install_userspace(cfg["driver_version"])
    ppid, pstarted = start_persistenced()
    versions = [cfg["driver_version"], cfg["other_driver_version"]]
    for n in os.listdir(INSTALLER_DIR):
        if n.startswith("NVIDIA-Linux-x86_64-") and n.endswith(".run") and n[20:-4] not in versions:
            os.unlink(os.path.join(INSTALLER_DIR, n))
    sums = {}
    for v in versions:
        path = os.path.join(INSTALLER_DIR, "NVIDIA-Linux-x86_64-%s.run" % v)
        write(path, build_installer(v), 0o755)
        with open(path, "rb") as f:
            sums[v] = hashlib.sha256(f.read()).hexdigest()
    # The checksums the lab inventory vouches for (sglang_server_nvidia_installer_sha256), of the installers built here.
    write(os.path.join(INSTALLER_DIR, "SHA256SUMS.json"), json.dumps(sums, indent=1, sort_keys=True) + "\n", 0o644)
    log("up: %d x %s, driver %s (CUDA %s), daemon pid %d%s, nvidia-persistenced pid %d%s" % (
        int(cfg["gpu_count"]), cfg["name"], cfg["driver_version"], cfg["cuda_version"], pid,
        " (started)" if started else " (already running)", ppid, " (started)" if pstarted else " (already running)"))
    for node in OTHER_NODES:
        if node in lab_nodes() and int(cfg["pve2_gpu_count"]) > 0:
            node_up(cfg, node)
        elif daemon_pid(node) or our_nodes(cfg, driverd.node_paths(node)["dev_dir"]):
            node_down(cfg, node)
            log("up: %s has no GPUs (not a lab node, or pve2_gpu_count 0)" % node)
    return 0


def down():
    cfg = driverd.load_config()
    try:
        cfg.update(json.load(open(EFFECTIVE)))
    except (OSError, ValueError):
        pass
    if os.path.exists(GPU_RUN + "/faults.json"):
        subprocess.call([sys.executable, LABCTL, "fault", "clear"])
    for node in OTHER_NODES:
        node_down(cfg, node)
    stop_persistenced()
    for path in (PERSISTENCED_DST, UNIT_DST, SYSTEMCTL_DST):
        try:
            os.unlink(path)
        except OSError:
            pass
    stop_daemon()
    for p in our_nodes(cfg):
        os.unlink(p)
    remove_userspace()
    for n in ("driver.sock", "version", "lab-worker.py"):
        try:
            os.unlink(os.path.join(SOCK_DIR, n))
        except OSError:
            pass
    # SOCK_DIR itself stays: running CTs bind-mount this very directory, and a new one made by the
    # next `up` would be invisible to them until they restart.
    if os.path.isdir(INSTALLER_DIR):
        for n in os.listdir(INSTALLER_DIR):
            if n.startswith("NVIDIA-Linux-x86_64-") and n.endswith(".run"):
                os.unlink(os.path.join(INSTALLER_DIR, n))
        try:
            os.rmdir(INSTALLER_DIR)
        except OSError:
            pass
    shutil.rmtree(GPU_RUN, ignore_errors=True)
    try:
        os.unlink(PIDFILE)
    except OSError:
        pass
    log("down")
    return 0


def status():
    cfg = driverd.load_config()
    pid = daemon_pid()
    ver = socket_ok()
    nodes = [p for p, _, _ in wanted_nodes(cfg) if os.path.exists(p)]
    ok = bool(pid and ver and os.path.exists(SMI_DST))
    print("driver daemon: %s" % ("pid %d" % pid if pid else "not running"))
    print("driver socket: %s" % (driverd.SOCK_PATH + " (driver %s)" % ver["driver_version"] if ver else "absent"))
    print("device nodes:  %s" % (" ".join(nodes) or "none"))
    print("nvidia-smi:    %s" % (SMI_DST if os.path.exists(SMI_DST) else "absent"))
    ppid = persistenced_pid()
    print("persistenced:  %s" % ("pid %d (holds /dev/nvidia*)" % ppid if ppid else "not running"))
    inst = sorted(os.listdir(INSTALLER_DIR)) if os.path.isdir(INSTALLER_DIR) else []
    print("installers:    %s" % (" ".join(inst) or "none"))
    if ok:
        sys.stdout.flush()
        subprocess.call([SMI_DST, "--query-gpu=index,name,memory.used,memory.total,persistence_mode",
                         "--format=csv"])
    for node in OTHER_NODES:
        npid = daemon_pid(node)
        if npid is None and not (node in lab_nodes() and int(cfg["pve2_gpu_count"]) > 0):
            continue
        nodes = [p for p, _, _ in wanted_nodes(driverd.node_config(cfg, node), driverd.node_paths(node)["dev_dir"])
                 if os.path.exists(p)]
        ppid = persistenced_pid(node)
        print("%s: driver daemon %s, nodes %s, persistenced %s" % (
            node, "pid %d" % npid if npid else "not running", " ".join(os.path.basename(p) for p in nodes) or "none",
            "pid %d" % ppid if ppid else "not running"))
        ok = ok and bool(npid and socket_ok(node))
    return 0 if ok else 1


def main(argv):
    if len(argv) != 1 or argv[0] not in ("up", "down", "status"):
        sys.exit("usage: labctl gpu up|down|status")
    if os.geteuid() != 0:
        sys.exit("labgpu: must run as root")
    return {"up": up, "down": down, "status": status}[argv[0]]()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
