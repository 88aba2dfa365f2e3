"""labctl: bring the inferops lab up or down, show its state, inject faults.

  labctl up                 build/start everything (idempotent; a second run changes nothing): the two-node
                            cluster pve1 + pve2, or pve1 alone with INFEROPS_LAB_NODES=pve1 (docs/lab.md)
  labctl down [--purge] [--remove-packages]
                            destroy the lab's containers, stop its daemons (--purge: also the
                            template, keys, CA, secrets and wheels; --remove-packages: also the apt
                            packages only the lab uses, as on a fresh machine; CI does both)
  labctl build-template OUT [--mirror URL] [--suite trixie|bookworm]
                            build the container template into OUT (what `up` does once)
  labctl status             what runs, the containers, the bystander's PID and heartbeat
  labctl ct-destroy VMID    stop and destroy one container (test clean-up, e.g. 129 or 199)
  labctl fault ...          the GPU simulator's fault injection (tests/lab/gpu/fault.py)
  labctl gpu up|down|status the GPU simulator alone (tests/lab/gpu/labgpu.py; `up` runs it)
  labctl incident [--vmid 129] [--tp 8] [--hicache-size 2] [--version 0.5.9] [--gpus 0,1,5,6]
                            replay the incident by hand in a container, outside the collection: TP N
                            with --hicache-size read as a total, until the cgroup OOM-kills a rank
                            (on the container's GPUs and free ones: never another container's)

The lab's programs run through labctl too (pct, the API server, task workers, gpu, fault): tests/lab/programs.py.

Runs as root with the node's /usr/bin/python3 (3.11). See docs/lab.md.
"""
from __future__ import annotations

import contextlib
import errno
import glob
import hashlib
import importlib.machinery
import importlib.util
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid

from pve import ctapi, ctconfig, ctstate, lxcconf, nodens, pvecluster, pvenode, pvetasks, taskops, template

HERE = os.path.dirname(os.path.realpath(__file__))
REPO = os.path.realpath(os.path.join(HERE, "..", ".."))
# The lab's entry point (a thin script over this module): its own commands and the programs below run through it.
LABCTL = os.path.join(HERE, "labctl")

LAB = pvenode.LAB
RUN = pvenode.RUN
PKI = f"{LAB}/pki"
SSH = f"{LAB}/ssh"
SECRETS = f"{LAB}/secrets"
LOGDIR = f"{LAB}/log"
PACKAGES_DIR = f"{LAB}/packages"
# The lab's template: Debian 13, as PVE 9.1's debian-13-standard (tests/lab/pve/template.py SUITES)
TEMPLATE = f"{pvenode.TMPL_DIR}/{template.SUITES[template.SUITE]}"
TEMPLATE_VOLID = f"local:vztmpl/{template.SUITES[template.SUITE]}"
API_PORT = 8006
SSH_PORT = 2222
TOKEN_ID = "root@pam!lab"
BYSTANDER = 130
MARKER = f"{pvenode.PVE_ETC}/.inferops-lab"
PCT = "/usr/sbin/pct"
KNOWN_HOSTS_SYSTEM = "/etc/ssh/ssh_known_hosts"
KH_BEGIN = "# BEGIN inferops-lab pve1"
KH_END = "# END inferops-lab pve1"
# The nodes `up` brings up: both (one cluster, docs/lab.md "Two nodes"), or pve1 alone without a cluster
# (INFEROPS_LAB_NODES=pve1, e.g. for a quick `make demo`).
DEFAULT_NODES = "pve1,pve2"
# What the lab needs from apt. BASE_PACKAGES are part of a usual Debian machine and stay; LAB_PACKAGES
# (and what apt pulled in for them) are removed again by `labctl down --remove-packages`.
BASE_PACKAGES = ["psmisc", "zstd", "iproute2", "openssl", "xz-utils", "ca-certificates", "debian-archive-keyring"]
# lxc-templates is there for /usr/share/lxc/config/debian.{common,userns}.conf, which every CT's LXC config
# includes (as PVE's lxc-pve ships them), not for its template scripts.
LAB_PACKAGES = ["lxc", "lxc-templates", "lxcfs", "debootstrap", "openssh-server", "bridge-utils", "rsync",
                # ansible-rulebook's Java runtime (Event-Driven Ansible, molecule recover's eda case; extensions/eda/requirements.txt)
                "openjdk-17-jre-headless"]
APT_PACKAGES = LAB_PACKAGES + BASE_PACKAGES
# A fresh machine often runs apt-daily / unattended-upgrades right after boot: wait for its dpkg lock (apt >= 1.9.11,
# apt.conf(5) DPkg::Lock::Timeout) instead of failing the first `make test` with "Could not get lock".
APT_WAIT = ["-o", "DPkg::Lock::Timeout=600"]
# What the lab runs or includes from those packages, checked once they are installed.
LAB_FILES = {"/usr/bin/lxc-start": "lxc", "/usr/bin/lxc-attach": "lxc", "/usr/bin/lxcfs": "lxcfs",
             "/usr/sbin/debootstrap": "debootstrap",
             "/usr/sbin/sshd": "openssh-server", "/usr/bin/ssh-keygen": "openssh-client",
             "/usr/share/lxc/config/debian.common.conf": "lxc-templates",
             "/usr/share/lxc/config/debian.userns.conf": "lxc-templates",
             "/usr/bin/zstd": "zstd", "/usr/bin/fuser": "psmisc", "/usr/bin/openssl": "openssl"}
VENV = os.path.join(REPO, ".venv")
VAULT_FILE = os.path.join(REPO, "inventories", "lab", "group_vars", "all", "vault.yml")
VAULT_PASS = f"{LAB}/vault-pass"

verbose = True
step = ""  # the step of `up` under way, named in every error


def say(msg: str) -> None:
    if verbose:
        print(f"labctl: {msg}", flush=True)


def die(msg: str, code: int = 1, log: str | None = None, fix: str | None = None) -> None:
    """Stop with what failed, in which step, the log to read and what to do."""
    where = f" in step '{step}'" if step else ""
    lines = [f"labctl: error{where}: {msg}"]
    if log:
        lines.append(f"  log: {log}")
    lines.append("  what to do: " + (fix or "fix the cause above, then run `make lab` again (it resumes where it "
                                     "stopped); `tests/lab/labctl down --purge` starts the lab over"))
    print("\n".join(lines), file=sys.stderr, flush=True)
    sys.exit(code)


def sh(cmd, check=True, log: str | None = None, fix: str | None = None, **kw) -> subprocess.CompletedProcess:
    kw.setdefault("capture_output", True)
    kw.setdefault("text", True)
    try:
        r = subprocess.run(cmd, shell=isinstance(cmd, str), **kw)
    except FileNotFoundError as e:  # a program that is not installed (yet, or any more)
        r = subprocess.CompletedProcess(cmd, 127, "", str(e))
    if check and r.returncode != 0:
        die(f"command failed ({r.returncode}): {cmd if isinstance(cmd, str) else ' '.join(cmd)}\n"
            f"{(r.stderr or '') + (r.stdout or '')}".rstrip(), log=log, fix=fix)
    return r


def write_if_changed(path: str, text: str, mode: int = 0o644) -> bool:
    try:
        with open(path) as f:
            if f.read() == text:
                os.chmod(path, mode)
                return False
    except FileNotFoundError:
        pass
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.chmod(tmp, mode)
    os.replace(tmp, path)
    return True


def pid_alive(pidfile: str) -> int | None:
    try:
        with open(pidfile) as f:
            pid = int(f.read().split()[0])
        os.kill(pid, 0)
        return pid
    except (OSError, ValueError, IndexError):
        return None


def stop_pidfile(pidfile: str, what: str) -> None:
    pid = pid_alive(pidfile)
    if pid:
        say(f"stopping {what} (pid {pid})")
        os.kill(pid, signal.SIGTERM)
        for _ in range(50):
            try:
                os.kill(pid, 0)
            except OSError:
                break
            time.sleep(0.1)
        else:
            os.kill(pid, signal.SIGKILL)
    if os.path.exists(pidfile):
        os.unlink(pidfile)


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


def lab_nodes() -> list[str]:
    """The nodes of this lab: INFEROPS_LAB_NODES (pve1 first, always), default both."""
    names = [n.strip() for n in (os.environ.get("INFEROPS_LAB_NODES") or DEFAULT_NODES).split(",") if n.strip()]
    bad = [n for n in names if n not in pvenode.NODE_ADDRESSES]
    if bad or not names or names[0] != "pve1" or len(set(names)) != len(names):
        die(f"INFEROPS_LAB_NODES={os.environ.get('INFEROPS_LAB_NODES')!r}: give pve1 or pve1,pve2", 2)
    return names


def extra_nodes() -> list[str]:
    return [n for n in pvenode.NODE_ADDRESSES if n != "pve1"]


def node_sshd_pidfile(node: str) -> str:
    return f"{RUN}/sshd.pid" if node == "pve1" else f"{RUN}/sshd-{node}.pid"


def node_sshd_config(node: str) -> str:
    return f"{SSH}/sshd_config" if node == "pve1" else f"{SSH}/sshd_config_{node}"


def node_host_key(node: str) -> str:
    return f"{SSH}/ssh_host_ed25519_key" if node == "pve1" else f"{SSH}/ssh_host_ed25519_key_{node}"


def is_api_argv(argv: list[str]) -> bool:
    """A PVE API daemon of this checkout's lab: `labctl api ...`, or pve/api.py run as a script (before the lab's
    programs ran through labctl)."""
    return argv[1:3] == [LABCTL, "api"] or os.path.join(HERE, "pve", "api.py") in argv


def daemon_pids(script_or_cfg: str, node: str) -> list[int]:
    """The lab daemons of one node whose pid file is gone: the API daemon (script_or_cfg "api"; its --node, none
    means pve1) or sshd (its config file), found in /proc by their command line."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().decode(errors="replace").split("\0")
        except OSError:
            continue
        if not (is_api_argv(argv) if script_or_cfg == "api" else script_or_cfg in argv):
            continue
        if script_or_cfg == "api":
            who = argv[argv.index("--node") + 1] if "--node" in argv[:-1] else "pve1"
            if who != node:
                continue
        pids.append(int(entry))
    return pids


# --------------------------------------------------------------------------------------------------
# Steps of `up`
# --------------------------------------------------------------------------------------------------

def refuse_real_pve() -> None:
    reasons = []
    if os.path.exists("/usr/bin/pveversion"):
        reasons.append("/usr/bin/pveversion exists")
    with open("/proc/mounts") as f:
        for line in f:
            parts = line.split()
            if len(parts) > 2 and parts[1] == "/etc/pve":
                reasons.append(f"/etc/pve is a mount ({parts[2]}, pmxcfs)")
    if os.path.isdir("/etc/pve") and os.listdir("/etc/pve") and not os.path.exists(MARKER):
        reasons.append("/etc/pve exists and was not made by the lab")
    if reasons:
        die("this looks like a real Proxmox VE node (" + "; ".join(reasons) + "). The lab simulates a PVE "
            "node and would overwrite /usr/sbin/pct and /etc/pve: refusing to install here.", 2)


def ensure_packages() -> None:
    r = sh(["dpkg-query", "-W", "-f=${Package} ${db:Status-Status}\n"] + APT_PACKAGES, check=False)
    installed = {ln.split()[0] for ln in r.stdout.splitlines() if ln.endswith(" installed")}
    missing = [p for p in APT_PACKAGES if p not in installed]
    if missing:
        say(f"installing {' '.join(missing)} (apt-get)")
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        fix = ("check that this machine reaches its Debian mirror (apt-get update) and that no other apt/dpkg "
               "runs, then run `make lab` again")
        sh(["apt-get", *APT_WAIT, "update", "-qq"], env=env, fix=fix)
        sh(["apt-get", *APT_WAIT, "install", "-y", "-qq", "--no-install-recommends"] + missing, env=env, fix=fix)
    absent = [f"{path} ({pkg})" for path, pkg in LAB_FILES.items() if not os.path.exists(path)]
    if absent:
        die(f"installed packages lack what the lab uses: {', '.join(absent)}",
            fix="reinstall those packages (apt-get install --reinstall ...), then run `make lab` again")


def ensure_dirs() -> None:
    for d in (LAB, RUN, PKI, SSH, SECRETS, LOGDIR, pvenode.TASK_DIR, pvenode.CONF_DIR, f"{pvenode.PVE_ETC}/priv",
              pvenode.TMPL_DIR, pvenode.LXC_DIR, PACKAGES_DIR):
        os.makedirs(d, exist_ok=True)
    for d in (SSH, SECRETS, f"{pvenode.PVE_ETC}/priv"):
        os.chmod(d, 0o700)
    if not os.path.exists(MARKER):
        with open(MARKER, "w") as f:
            f.write("This /etc/pve is the inferops lab's simulated PVE node (tests/lab/labctl), not pmxcfs.\n")
    for node in pvenode.NODE_ADDRESSES:
        os.makedirs(f"{pvenode.PVE_ETC}/nodes/{node}/lxc", exist_ok=True)
    link = f"{pvenode.PVE_ETC}/lxc"  # as on PVE: /etc/pve/lxc -> nodes/<this node>/lxc
    if not os.path.islink(link):
        if os.path.isdir(link):
            shutil.rmtree(link)
        os.symlink(f"nodes/{pvenode.NODE}/lxc", link)


def ensure_subids() -> None:
    """Unprivileged CTs map root to 100000 (pct.adoc); PVE ships root:100000:65536 in /etc/sub[ug]id."""
    for path in ("/etc/subuid", "/etc/subgid"):
        try:
            with open(path) as f:
                text = f.read()
        except FileNotFoundError:
            text = ""
        if "root:100000:65536" not in text.split():
            with open(path, "a") as f:
                f.write(("" if not text or text.endswith("\n") else "\n") + "root:100000:65536\n")


def ensure_lxcfs() -> None:
    if sh(["mountpoint", "-q", "/var/lib/lxcfs"], check=False).returncode == 0:
        return
    stale = pid_alive(f"{RUN}/lxcfs.pid")
    if stale:
        os.kill(stale, signal.SIGTERM)
        time.sleep(0.5)
    # A lab whose lxcfs was killed (a session or CI run ending) leaves a dead FUSE mount behind: stat() on it
    # fails with ENOTCONN until it is unmounted.
    sh("fusermount -u /var/lib/lxcfs 2>/dev/null || umount -l /var/lib/lxcfs 2>/dev/null || true", check=False)
    os.makedirs("/var/lib/lxcfs", exist_ok=True)
    say("starting lxcfs")
    log = open(f"{LOGDIR}/lxcfs.log", "a")
    p = subprocess.Popen(["lxcfs", "/var/lib/lxcfs"], stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                         start_new_session=True)
    with open(f"{RUN}/lxcfs.pid", "w") as f:
        f.write(f"{p.pid}\n")
    for _ in range(50):
        if sh(["mountpoint", "-q", "/var/lib/lxcfs"], check=False).returncode == 0:
            return
        time.sleep(0.1)
    die("lxcfs did not mount /var/lib/lxcfs", log=f"{LOGDIR}/lxcfs.log",
        fix="check that /dev/fuse exists and that FUSE works here (lxcfs needs it), then run `make lab` again")


def ensure_bridge() -> None:
    if sh(["ip", "link", "show", pvenode.BRIDGE], check=False).returncode != 0:
        say(f"creating bridge {pvenode.BRIDGE} {pvenode.BRIDGE_ADDR}")
        sh(["ip", "link", "add", pvenode.BRIDGE, "type", "bridge"])
    addrs = sh(["ip", "-o", "-4", "addr", "show", "dev", pvenode.BRIDGE]).stdout
    if pvenode.BRIDGE_ADDR not in addrs:
        sh(["ip", "addr", "add", pvenode.BRIDGE_ADDR, "dev", pvenode.BRIDGE])
    if "UP" not in sh(["ip", "-br", "link", "show", pvenode.BRIDGE]).stdout.split()[1]:
        sh(["ip", "link", "set", pvenode.BRIDGE, "up"])


def ensure_pki() -> None:
    ca_key, ca = f"{PKI}/ca.key", f"{PKI}/ca.pem"
    if not (os.path.exists(ca) and os.path.exists(ca_key)):
        say("creating the lab CA")
        sh(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", ca_key, "-out", ca,
            "-days", "3650", "-subj", "/CN=inferops lab CA/O=inferops-lab",
            "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign"])
        os.chmod(ca_key, 0o600)
        for node in pvenode.NODE_ADDRESSES:
            for p in node_cert(node):
                if os.path.exists(p):
                    os.unlink(p)
    for node in lab_nodes():
        ensure_node_cert(node, ca, ca_key)


def node_cert(node: str) -> tuple[str, str]:
    """(certificate, key) of a node's API (PVE: /etc/pve/nodes/<node>/pve-ssl.pem, signed by the cluster CA)."""
    d = PKI if node == "pve1" else f"{PKI}/{node}"
    return f"{d}/pve-ssl.pem", f"{d}/pve-ssl.key"


def ensure_node_cert(node: str, ca: str, ca_key: str) -> None:
    cert, key = node_cert(node)
    if os.path.exists(cert) and sh(["openssl", "verify", "-CAfile", ca, cert], check=False).returncode == 0:
        return
    say(f"creating the {node} server certificate")
    d = os.path.dirname(cert)
    os.makedirs(d, exist_ok=True)
    ip = pvenode.NODE_ADDRESSES[node]
    names = f"IP:{ip},DNS:{node},DNS:{node}.lab" + (",DNS:localhost" if ip == "127.0.0.1" else "")
    ext = f"{d}/pve-ssl.ext"
    with open(ext, "w") as f:
        f.write("basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
                f"extendedKeyUsage=serverAuth\nsubjectAltName={names}\n")
    sh(["openssl", "req", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", f"{d}/pve-ssl.csr",
        "-subj", f"/CN={node}/OU=PVE Cluster Node/O=inferops-lab"])
    sh(["openssl", "x509", "-req", "-in", f"{d}/pve-ssl.csr", "-CA", ca, "-CAkey", ca_key, "-CAcreateserial",
        "-out", cert, "-days", "825", "-sha256", "-extfile", ext])
    os.chmod(key, 0o600)


COROSYNC = """# inferops lab (tests/lab/labctl): the simulated cluster's members; pve/pvecluster.py cluster_nodes reads the nodelist.
totem {{
  cluster_name: {name}
  config_version: {count}
  ip_version: ipv4
  version: 2
}}

nodelist {{
{nodes}}}

quorum {{
  provider: corosync_votequorum
}}
"""


def ensure_cluster() -> None:
    """/etc/pve/corosync.conf naming the members (two nodes), or none (pve1 alone, no cluster); the stopped
    daemons of a node that is no longer a member; /etc/pve/.vmlist."""
    nodes = lab_nodes()
    if len(nodes) == 1:
        if os.path.exists(pvenode.COROSYNC_CONF):
            say("one node (INFEROPS_LAB_NODES=pve1): removing the cluster")
            os.unlink(pvenode.COROSYNC_CONF)
    else:
        blocks = "".join(f"  node {{\n    name: {n}\n    nodeid: {i}\n    quorum_votes: 1\n"
                         f"    ring0_addr: {pvenode.NODE_ADDRESSES[n]}\n  }}\n" for i, n in enumerate(nodes, 1))
        if write_if_changed(pvenode.COROSYNC_CONF, COROSYNC.format(name=pvenode.CLUSTER_NAME, count=len(nodes), nodes=blocks)):
            say(f"cluster {pvenode.CLUSTER_NAME}: {', '.join(nodes)}")
    for node in extra_nodes():
        if node not in nodes:
            stop_node_daemons(node)
    pvecluster.write_vmlist()


def stop_node_daemons(node: str) -> None:
    stop_pidfile(pvecluster.api_pidfile(node), f"{node}'s PVE API")
    stop_pidfile(node_sshd_pidfile(node), f"{node}'s sshd")
    for pid in daemon_pids("api", node) + daemon_pids(node_sshd_config(node), node):
        say(f"stopping {node}'s daemon pid {pid} (no pid file)")
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    if os.path.exists(f"{RUN}/pve-api-{node}.hash"):
        os.unlink(f"{RUN}/pve-api-{node}.hash")
    if nodens.is_created(node) or os.path.exists(nodens.ns_file(node)):
        say(f"removing {node}'s mount namespace")
        nodens.remove(node)


def ensure_node_namespaces() -> None:
    """pve2's own mount namespace (tests/lab/pve/nodens.py): its /dev shows pve2's NVIDIA nodes only and its
    /run/nvidia-lab pve2's driver; its sshd, API daemon and task workers run there (docs/lab.md, "GPUs of pve2")."""
    for node in lab_nodes()[1:]:
        did = nodens.ensure(node)
        if did != "kept":
            say(f"{node}'s mount namespace: {did}")


def in_node_ns(pid: int | None, node: str) -> bool:
    """A daemon of pve1 runs in this machine's namespace; one of another node in that node's (current) namespace."""
    if not pid:
        return False
    if node == "pve1":
        return True
    return nodens.ns_of_pid(pid) == nodens.current_ns(node)


def secret(path: str, make) -> str:
    try:
        with open(path) as f:
            value = f.read().strip()
        if value:
            return value
    except FileNotFoundError:
        pass
    value = make()
    with open(path, "w") as f:
        f.write(value + "\n")
    os.chmod(path, 0o600)
    return value


def ensure_secrets() -> dict:
    s = {
        "password": secret(f"{SECRETS}/root-password", lambda: secrets.token_urlsafe(18)),
        "authkey": secret(f"{SECRETS}/authkey", lambda: secrets.token_hex(32)),
        "token": secret(f"{SECRETS}/token-secret", lambda: str(uuid.uuid4())),
        "api_key": secret(f"{SECRETS}/sglang-api-key", lambda: secrets.token_urlsafe(24)),
        "vault": secret(VAULT_PASS, lambda: secrets.token_urlsafe(32)),
    }
    write_if_changed(f"{pvenode.PVE_ETC}/priv/token.cfg", f"{TOKEN_ID} {s['token']}\n", 0o600)
    return s


def build_template(out: str, mirror: str | None = None, suite: str = template.SUITE) -> None:
    mirror = mirror or template.default_mirror()
    say(f"building the container template {out} (Debian {suite}, debootstrap from {mirror}, a few minutes the "
        "first time)")
    try:
        secs = template.build(out, mirror, f"{LOGDIR}/template-build.log", f"{LAB}/template-build", suite)
    except template.BuildError as e:
        die(f"the container template was not built ({e.step}): {e.reason}", log=e.log, fix=e.fix)
    say(f"template built in {secs:.0f}s")


def ensure_template() -> None:
    if not os.path.exists(TEMPLATE):
        build_template(TEMPLATE)


def ensure_pct() -> None:
    text = f'#!/bin/sh\n# inferops lab: the simulated PVE node\'s pct (tests/lab/pve/pct.py)\nexec /usr/bin/python3 {LABCTL} pct "$@"\n'
    if write_if_changed(PCT, text, 0o755):
        say(f"installed {PCT}")


def code_hash(node: str) -> str:
    h = hashlib.sha256()
    # the daemon's code: the PVE package and the entry point it runs through
    pve_dir = os.path.join(HERE, "pve")
    names = sorted(n for n in os.listdir(pve_dir) if n.endswith(".py") or n.startswith("apidata-slice"))
    for path in [os.path.join(pve_dir, n) for n in names] + [os.path.join(HERE, "labctl.py"), LABCTL]:
        with open(path, "rb") as f:
            h.update(f.read())
    for path in node_cert(node):
        with open(path, "rb") as f:
            h.update(f.read())
    return h.hexdigest()


def ensure_api() -> None:
    for node in lab_nodes():
        ensure_node_api(node)


def ensure_node_api(node: str) -> None:
    host = pvenode.NODE_ADDRESSES[node]
    pidfile = pvecluster.api_pidfile(node)
    hashfile = f"{RUN}/pve-api.hash" if node == "pve1" else f"{RUN}/pve-api-{node}.hash"
    want = code_hash(node)
    pid = pid_alive(pidfile)
    have = open(hashfile).read().strip() if os.path.exists(hashfile) else ""
    if pid and have == want and port_open(API_PORT, host) and in_node_ns(pid, node):
        return
    stop_pidfile(pidfile, f"stale PVE API server of {node}")
    # a server from an earlier run whose pid file is gone still holds the port (only this node's)
    for stale in daemon_pids("api", node):
        with contextlib.suppress(OSError):
            os.kill(stale, signal.SIGTERM)
    for _ in range(30):
        if not port_open(API_PORT, host):
            break
        time.sleep(0.1)
    say(f"starting the PVE API of {node} on https://{host}:{API_PORT}")
    log = f"{LOGDIR}/pve-api.log" if node == "pve1" else f"{LOGDIR}/pve-api-{node}.log"
    sh(["/usr/bin/python3", LABCTL, "api", "--daemon", "--node", node])
    for _ in range(50):
        if port_open(API_PORT, host):
            break
        time.sleep(0.1)
    else:
        die(f"the API server of {node} did not come up", log=log,
            fix=f"read the log; check that nothing else holds {host}:{API_PORT} (ss -ltnp), then run `make lab` again")
    with open(hashfile, "w") as f:
        f.write(want + "\n")


def ensure_ssh() -> None:
    """Root SSH to each node: sshd on <node address>:2222 with the node's host key; the session's environment
    names the node (INFEROPS_LAB_NODE, sshd_config SetEnv), so `pct` there acts on that node's containers."""
    client_key = f"{SSH}/id_ed25519"
    if not os.path.exists(client_key):
        sh(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "inferops-lab", "-f", client_key])
    with open(f"{client_key}.pub") as f:
        pub = f.read().strip()
    write_if_changed(f"{SSH}/authorized_keys", pub + "\n", 0o600)
    kh = ""
    for node in lab_nodes():
        host_key = node_host_key(node)
        if not os.path.exists(host_key):
            sh(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", node, "-f", host_key])
        with open(f"{host_key}.pub") as f:
            host_pub = " ".join(f.read().split()[:2])
        ip = pvenode.NODE_ADDRESSES[node]
        names = [f"[{ip}]:{SSH_PORT}", f"[{node}]:{SSH_PORT}"] + ([f"[localhost]:{SSH_PORT}"] if node == "pve1" else [])
        kh += "".join(f"{h} {host_pub}\n" for h in names)
    write_if_changed(f"{SSH}/known_hosts", kh)
    # proxmox_pct_remote (paramiko) reads only /etc/ssh/ssh_known_hosts and ~/.ssh/known_hosts.
    install_known_hosts_block(kh)
    for node in lab_nodes():
        ensure_node_sshd(node)


def ensure_node_sshd(node: str) -> None:
    ip = pvenode.NODE_ADDRESSES[node]
    pidfile = node_sshd_pidfile(node)
    cfg = f"""# sshd of the simulated PVE node {node} (inferops lab); root by key only
Port {SSH_PORT}
ListenAddress {ip}
HostKey {node_host_key(node)}
PidFile {pidfile}
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
PubkeyAuthentication yes
AuthorizedKeysFile {SSH}/authorized_keys
UsePAM no
StrictModes yes
X11Forwarding no
PrintMotd no
AcceptEnv LANG LC_*
SetEnv INFEROPS_LAB_NODE={node}
Subsystem sftp /usr/lib/openssh/sftp-server
"""
    path = node_sshd_config(node)
    changed = write_if_changed(path, cfg, 0o600)
    pid = pid_alive(pidfile)
    if pid and not changed and port_open(SSH_PORT, ip) and in_node_ns(pid, node):
        return
    stop_pidfile(pidfile, f"sshd of {node}")
    os.makedirs("/run/sshd", exist_ok=True)
    sh(["/usr/sbin/sshd", "-t", "-f", path])
    log = f"{LOGDIR}/sshd.log" if node == "pve1" else f"{LOGDIR}/sshd-{node}.log"
    say(f"starting sshd of {node} on {ip}:{SSH_PORT}")
    # another node's sshd runs in that node's mount namespace, so its sessions (and pct there) see its GPUs
    launch = [] if node == "pve1" else ["/usr/bin/python3", os.path.join(HERE, "pve", "nodens.py"), "exec", node, "--"]
    sh(launch + ["/usr/sbin/sshd", "-f", path, "-E", log])
    for _ in range(50):
        if port_open(SSH_PORT, ip):
            return
        time.sleep(0.1)
    die(f"sshd did not start on {ip}:{SSH_PORT}", log=log,
        fix=f"read the log; check that nothing else holds {ip}:{SSH_PORT} (ss -ltnp), then run `make lab` again")


def install_known_hosts_block(kh: str) -> None:
    try:
        with open(KNOWN_HOSTS_SYSTEM) as f:
            old = f.read()
    except FileNotFoundError:
        old = ""
    new = remove_block(old) + f"{KH_BEGIN}\n{kh}{KH_END}\n"
    if new != old:
        write_if_changed(KNOWN_HOSTS_SYSTEM, new)


def remove_block(text: str) -> str:
    out, skip = [], False
    for line in text.splitlines(keepends=True):
        if line.strip() == KH_BEGIN:
            skip = True
        elif line.strip() == KH_END:
            skip = False
        elif not skip:
            out.append(line)
    return "".join(out)


def cleanup_stale_containers() -> None:
    """LXC containers without a PVE config (leftovers of an interrupted build or run) are removed."""
    known = {str(v) for v in pvecluster.vmlist()}  # every node's (the cluster's VMID list)
    for name in sorted(os.listdir(pvenode.LXC_DIR)) if os.path.isdir(pvenode.LXC_DIR) else []:
        if name in known or not os.path.isdir(os.path.join(pvenode.LXC_DIR, name)):
            continue
        if name.isdigit() or name.startswith("inferops-lab"):
            say(f"removing stale container {name}")
            sh(["lxc-stop", "-n", name, "--kill"], check=False)
            sh(["lxc-destroy", "-n", name], check=False)
            shutil.rmtree(os.path.join(pvenode.LXC_DIR, name), ignore_errors=True)
    # configs left with 'lock: create' by a create that never finished
    for vmid, node in pvecluster.vmlist().items():
        conf = ctconfig.load_config(vmid, node)
        if conf.get("lock") == "create" and not ctstate.is_running(vmid) and not create_task_running(vmid, node):
            say(f"removing half-created CT {vmid}")
            destroy_ct(vmid)


def create_task_running(vmid: int, node: str = "pve1") -> bool:
    saved = pvenode.NODE
    pvenode.set_node(node)
    try:
        return bool(pvetasks.list_tasks({"source": "active", "typefilter": "vzcreate", "vmid": str(vmid)}))
    finally:
        pvenode.set_node(saved)


BYSTANDERD = """#!/bin/sh
# The lab's bystander: a long-running process no playbook may ever touch (docs/lab.md).
mkdir -p /var/lib/bystander
echo $$ > /run/bystanderd.pid
n=0
while :; do
  n=$((n + 1))
  echo "$(date +%s) $n $$" > /var/lib/bystander/heartbeat.tmp
  mv /var/lib/bystander/heartbeat.tmp /var/lib/bystander/heartbeat
  sleep 2
done
"""
BYSTANDER_UNIT = """[Unit]
Description=inferops lab bystander (must never be touched)

[Service]
ExecStart=/usr/local/bin/bystanderd
Restart=no

[Install]
WantedBy=multi-user.target
"""


# Another tenant's GPU work on the same node: GPU 7 passed to the bystander as dev0, with a process that holds
# BYSTANDER_GPU_MIB on it for as long as the CT runs. Recovery of CT 129 must never touch either.
BYSTANDER_GPU = 4
BYSTANDER_GPU_MIB = 512
BYSTANDER_GPU_UNIT = f"""[Unit]
Description=inferops lab bystander's GPU work (must never be touched)

[Service]
ExecStart=/usr/bin/python3 /run/nvidia-lab/lab-worker.py --gpus {BYSTANDER_GPU} --mib {BYSTANDER_GPU_MIB} --name bystander-gpu
Restart=no

[Install]
WantedBy=multi-user.target
"""


def ensure_bystander() -> None:
    vmid = BYSTANDER
    conf_path = f"/etc/pve/lxc/{vmid}.conf"
    if ctconfig.ct_exists(vmid) and f"dev0: /dev/nvidia{BYSTANDER_GPU}" not in open(conf_path).read():
        say(f"bystander CT {vmid} is from a lab without its GPU work: destroying it to create it again")
        sh(["/usr/sbin/pct", "stop", str(vmid)], check=False)
        sh(["/usr/sbin/pct", "destroy", str(vmid), "--force", "1"])
    if not ctconfig.ct_exists(vmid):
        say(f"creating bystander CT {vmid}")
        params = {"hostname": "bystander", "memory": "256", "swap": "0", "cores": "1", "unprivileged": "1",
                  "net0": f"name=eth0,bridge={pvenode.BRIDGE},ip=10.77.0.{vmid}/24,gw=10.77.0.1",
                  "dev0": f"/dev/nvidia{BYSTANDER_GPU}",
                  "ostemplate": TEMPLATE_VOLID, "description": "inferops lab bystander: never touch"}
        ttype, tid, func, args = ctapi.create_ct(vmid, params, "root@pam")
        task = pvetasks.Task(ttype, tid, "root@pam")
        if not pvetasks.run_task(task, taskops.TASK_FUNCS[func], *args):
            die(f"creating CT {vmid} failed: {pvetasks.task_status(task.upid)['exitstatus']}",
                log=pvetasks.task_file(task.upid, "log"))
        root = lxcconf.rootfs_dir(vmid)
        files = {"usr/local/bin/bystanderd": (BYSTANDERD, 0o755),
                 "etc/systemd/system/bystanderd.service": (BYSTANDER_UNIT, 0o644),
                 "etc/systemd/system/bystander-gpu.service": (BYSTANDER_GPU_UNIT, 0o644)}
        for rel, (text, mode) in files.items():
            path = os.path.join(root, rel)
            write_if_changed(path, text, mode)
            os.lchown(path, lxcconf.IDMAP_BASE, lxcconf.IDMAP_BASE)
        wants = os.path.join(root, "etc/systemd/system/multi-user.target.wants")
        os.makedirs(wants, exist_ok=True)
        for unit in ("bystanderd.service", "bystander-gpu.service"):
            link = os.path.join(wants, unit)
            if not os.path.islink(link):
                os.symlink(f"/etc/systemd/system/{unit}", link)
                os.lchown(link, lxcconf.IDMAP_BASE, lxcconf.IDMAP_BASE)
    if not ctstate.is_running(vmid):
        say(f"starting bystander CT {vmid}")
        task = pvetasks.Task("vzstart", vmid, "root@pam")
        if not pvetasks.run_task(task, taskops.do_start, vmid, False):
            die(f"starting CT {vmid} failed: {pvetasks.task_status(task.upid)['exitstatus']}",
                log=f"/var/log/lxc/{vmid}.log and {pvetasks.task_file(task.upid, 'log')}")
        for _ in range(60):  # its GPU worker registers its allocation once the CT's systemd started it
            if bystander_info()["gpu_mib"] == BYSTANDER_GPU_MIB:
                break
            time.sleep(0.5)
        else:
            die(f"the bystander's GPU worker did not allocate {BYSTANDER_GPU_MIB} MiB on GPU {BYSTANDER_GPU}: "
                f"{bystander_info()}", log=f"pct exec {vmid} -- journalctl -u bystander-gpu")


def bystander_info() -> dict:
    """The bystander's processes (host PIDs), the GPU memory of its GPU worker as nvidia-smi on the node reports
    it (compute apps), the digest of its PVE config, and its heartbeat."""
    res = {"pid": None, "gpu_pid": None, "gpu_mib": None, "conf_sha256": None, "heartbeat": None, "age": None}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read().split(b"\0")
            with open(f"/proc/{entry}/cgroup") as f:
                cg = f.read()
        except OSError:
            continue
        if f"/lxc/{BYSTANDER}/" not in cg:
            continue
        if any(c.endswith(b"/usr/local/bin/bystanderd") for c in cmd[:2]):
            res["pid"] = int(entry)
        elif any(c.endswith(b"/run/nvidia-lab/lab-worker.py") for c in cmd[:2]):
            res["gpu_pid"] = int(entry)
    # Its own process's memory (CT 129 may share GPU 4 while the incident replay runs there).
    smi = sh(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"], check=False)
    for line in smi.stdout.splitlines() if smi.returncode == 0 else []:
        pid, _, mib = line.partition(",")
        if res["gpu_pid"] is not None and pid.strip() == str(res["gpu_pid"]) and mib.strip().isdigit():
            res["gpu_mib"] = int(mib.strip())
    try:
        with open(f"/etc/pve/lxc/{BYSTANDER}.conf", "rb") as f:
            res["conf_sha256"] = hashlib.sha256(f.read()).hexdigest()
    except OSError:
        pass
    try:
        with open(os.path.join(lxcconf.rootfs_dir(BYSTANDER), "var/lib/bystander/heartbeat")) as f:
            res["heartbeat"] = f.read().strip()
        res["age"] = round(time.time() - int(res["heartbeat"].split()[0]), 1)
    except (OSError, ValueError, IndexError):
        pass
    return res


def run_peer(args: list[str], what: str) -> None:
    say(what)
    if not os.access(args[0], os.X_OK):  # peer file not marked executable (yet): use its #! line
        with open(args[0]) as f:
            first = f.readline()
        args = (first[2:].split() if first.startswith("#!") else ["/bin/sh"]) + args
    r = subprocess.run(args)
    if r.returncode != 0:
        die(f"{what} failed (exit {r.returncode})", log="its output above")


def gpu_up() -> None:
    if os.environ.get("INFEROPS_LAB_SKIP_GPU") == "1":
        say("INFEROPS_LAB_SKIP_GPU=1: skipping the GPU simulator and the SGLang wheels")
        return
    run_peer(["/usr/bin/python3", LABCTL, "gpu", "up"], "labctl gpu up")
    wheels = os.path.join(HERE, "sglang_standin", "build_wheels.py")
    if os.path.exists(wheels):
        run_peer(["/usr/bin/python3", wheels, "--out", PACKAGES_DIR], "building the SGLang stand-in wheels")
    else:
        say("tests/lab/sglang_standin/build_wheels.py not present yet: skipping the wheels")


def ensure_vault(s: dict) -> None:
    """inventories/lab/group_vars/all/vault.yml: this lab's secrets, encrypted with ansible-vault."""
    vault_bin = os.path.join(VENV, "bin", "ansible-vault")
    if not os.path.exists(vault_bin):
        say(f"{vault_bin} missing (run `make setup`): not writing {VAULT_FILE}")
        return
    plain = ("---\n# Written by tests/lab/labctl up with this lab's generated secrets; git-ignored.\n"
             f"proxmox_api_password: {s['password']}\n"
             f"proxmox_api_token_secret: {s['token']}\n"
             f"sglang_server_api_key: {s['api_key']}\n")
    stamp = f"{LAB}/vault.stamp"
    want = hashlib.sha256((plain + s["vault"]).encode()).hexdigest()
    if os.path.exists(VAULT_FILE) and os.path.exists(stamp):
        with open(VAULT_FILE, "rb") as f:
            have = hashlib.sha256(f.read()).hexdigest()
        if open(stamp).read().split() == [want, have]:
            return
    say(f"writing {os.path.relpath(VAULT_FILE, REPO)} (ansible-vault, password file {VAULT_PASS})")
    # Values encrypted one by one (`!vault |` in plain YAML): the file stays valid YAML for yamllint.
    out = ["---", "# Written by tests/lab/labctl up with this lab's generated secrets; git-ignored.",
           "# Encrypted with ansible-vault, password file /var/lib/inferops-lab/vault-pass."]
    # The inventory's own names, set here only: the tracked files name no secret, so the inventory AWX imports
    # from the committed project has none and the job takes them from its credentials (README.md, "AWX").
    for name, value in (("proxmox_api_password", s["password"]),
                        ("proxmox_api_token_secret", s["token"]),
                        ("sglang_server_api_key", s["api_key"])):
        # Only this password file: an ANSIBLE_VAULT_PASSWORD_FILE in the environment (the Makefile exports
        # it) would add a second default vault id and make encrypt_string refuse to choose.
        env = {k: v for k, v in os.environ.items() if k not in ("ANSIBLE_VAULT_PASSWORD_FILE", "ANSIBLE_VAULT_IDENTITY_LIST")}
        r = sh([vault_bin, "encrypt_string", "--vault-password-file", VAULT_PASS, "--stdin-name",
                name], input=value, env=env)
        out.append(r.stdout.strip())
    os.makedirs(os.path.dirname(VAULT_FILE), exist_ok=True)
    write_if_changed(VAULT_FILE, "\n".join(out) + "\n", 0o600)
    with open(VAULT_FILE, "rb") as f:
        have = hashlib.sha256(f.read()).hexdigest()
    with open(stamp, "w") as f:
        f.write(f"{want} {have}\n")


def cmd_up(args: list[str]) -> int:
    global step
    t0 = time.time()
    s: dict = {}
    steps = [
        ("refuse a real PVE node", refuse_real_pve),
        ("install apt packages", ensure_packages),
        ("make the lab's directories", ensure_dirs),
        ("subordinate ids", ensure_subids),
        ("remove stale containers", cleanup_stale_containers),
        ("start lxcfs", ensure_lxcfs),
        ("bridge vmbr0", ensure_bridge),
        ("CA and certificate", ensure_pki),
        ("secrets", lambda: s.update(ensure_secrets())),
        ("install pct", ensure_pct),
        ("cluster", ensure_cluster),
        ("container template", ensure_template),
        ("mount namespace of pve2", ensure_node_namespaces),
        ("PVE API server", ensure_api),
        ("sshd", ensure_ssh),
        ("GPU simulator and SGLang wheels", gpu_up),
        ("bystander CT 130", ensure_bystander),
        ("inventory vault", lambda: ensure_vault(s)),
    ]
    for step, func in steps:
        func()
    step = ""
    say(f"lab is up ({time.time() - t0:.1f}s)")
    return 0


def cmd_build_template(args: list[str]) -> int:
    global step
    usage = f"usage: labctl build-template OUT [--mirror URL] [--suite {'|'.join(template.SUITES)}]"
    if not args or args[0].startswith("-") or len(args) % 2 != 1:
        die(usage, 2)
    opts = dict(zip(args[1::2], args[2::2]))
    if set(opts) - {"--mirror", "--suite"} or opts.get("--suite", template.SUITE) not in template.SUITES:
        die(usage, 2)
    step = "container template"
    build_template(os.path.abspath(args[0]), opts.get("--mirror"), opts.get("--suite", template.SUITE))
    return 0


def destroy_ct(vmid) -> None:
    sh(["lxc-stop", "-n", str(vmid), "--kill"], check=False)
    sh(["lxc-destroy", "-n", str(vmid)], check=False)
    shutil.rmtree(os.path.join(pvenode.LXC_DIR, str(vmid)), ignore_errors=True)
    if str(vmid).isdigit():  # on whichever node it is
        node = pvecluster.vmlist().get(int(vmid))
        if node and os.path.exists(pvenode.conf_path(int(vmid), node)):
            os.unlink(pvenode.conf_path(int(vmid), node))
            pvecluster.write_vmlist()


def cmd_ct_destroy(args: list[str]) -> int:
    if len(args) != 1 or not args[0].isdigit():
        die("usage: labctl ct-destroy VMID")
    vmid = int(args[0])
    if vmid not in pvecluster.vmlist() and not os.path.isdir(os.path.join(pvenode.LXC_DIR, str(vmid))):
        say(f"CT {vmid} does not exist")
        return 0
    say(f"destroying CT {vmid}")
    destroy_ct(vmid)
    return 0


def lab_lxc_names() -> list[str]:
    """The LXC containers that belong to the lab: every PVE config, and LXC dirs named like a VMID or
    inferops-lab-* (left by an interrupted run, or by the template build of older labs)."""
    names = {str(v) for v in pvecluster.vmlist()}
    if os.path.isdir(pvenode.LXC_DIR):
        names |= {n for n in os.listdir(pvenode.LXC_DIR) if n.isdigit() or n.startswith("inferops-lab")}
    return sorted(names)


def kill_listener(port: int, needle: str, what: str) -> None:
    """A lab daemon whose pid file is gone (a killed lab) still holds its port: end it, and nothing else."""
    r = sh(["fuser", f"{port}/tcp"], check=False)
    for pid in r.stdout.split():
        try:
            with open(f"/proc/{int(pid)}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, ValueError):
            continue
        if needle in cmd:
            say(f"stopping {what} (pid {pid}, no pid file)")
            os.kill(int(pid), signal.SIGKILL)


def unmount_lxcfs() -> None:
    stale = False
    try:
        os.stat("/var/lib/lxcfs")
    except OSError as e:
        stale = e.errno == errno.ENOTCONN  # the FUSE mount of a killed lxcfs
    if stale or sh(["mountpoint", "-q", "/var/lib/lxcfs"], check=False).returncode == 0:
        say("unmounting lxcfs")
        sh("fusermount -u /var/lib/lxcfs 2>/dev/null || umount -l /var/lib/lxcfs", check=False)


def vm_packages() -> list[str]:
    """What the cgroup v2 kernel test installs for itself (tests/v2kernel/vmctl's PACKAGES, `make v2kernel`; lxc is
    the lab's too): removed with the lab's by `down --remove-packages`, so that CI's `make test` installs them again
    as on a fresh machine."""
    path = os.path.join(REPO, "tests", "v2kernel", "vmctl")
    if not os.path.exists(path):
        return []
    spec = importlib.util.spec_from_loader("vmctl", importlib.machinery.SourceFileLoader("vmctl", path))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return list(module.PACKAGES)


def remove_packages() -> None:
    """Take the machine's packages back to what it had before the lab: apt removes LAB_PACKAGES, the VM test's
    (vm_packages) and what it pulled in for them."""
    packages = LAB_PACKAGES + [p for p in vm_packages() if p not in LAB_PACKAGES]
    r = sh(["dpkg-query", "-W", "-f=${Package} ${db:Status-Status}\n"] + packages, check=False)
    installed = [ln.split()[0] for ln in r.stdout.splitlines() if ln.endswith(" installed")]
    if not installed:
        say("none of the lab's apt packages is installed")
        return
    say(f"removing the lab's apt packages: {' '.join(installed)} (apt-get purge --autoremove)")
    sh(["apt-get", *APT_WAIT, "purge", "-y", "-qq", "--autoremove"] + installed,
       env=dict(os.environ, DEBIAN_FRONTEND="noninteractive"),
       fix="check that no other apt/dpkg runs (fuser /var/lib/dpkg/lock-frontend), then run it again")


def cmd_down(args: list[str]) -> int:
    unknown = [a for a in args if a not in ("--purge", "--remove-packages")]
    if unknown:
        die(f"unknown option {' '.join(unknown)} (labctl down [--purge] [--remove-packages])", 2)
    purge = "--purge" in args
    refuse_real_pve()
    for name in lab_lxc_names():
        say(f"destroying CT {name}")
        destroy_ct(name)
    say("labctl gpu down")
    subprocess.run(["/usr/bin/python3", LABCTL, "gpu", "down"])
    for node in extra_nodes():
        stop_node_daemons(node)
    stop_pidfile(f"{RUN}/pve-api.pid", "PVE API")
    stop_pidfile(f"{RUN}/sshd.pid", "sshd")
    kill_listener(API_PORT, f"{LABCTL} api", "PVE API")
    kill_listener(API_PORT, os.path.join(HERE, "pve", "api.py"), "PVE API")
    kill_listener(SSH_PORT, f"{SSH}/sshd_config", "sshd")
    for f in ("pve-api.hash",):
        if os.path.exists(f"{RUN}/{f}"):
            os.unlink(f"{RUN}/{f}")
    if os.path.exists(KNOWN_HOSTS_SYSTEM):
        with open(KNOWN_HOSTS_SYSTEM) as f:
            old = f.read()
        if KH_BEGIN in old:
            write_if_changed(KNOWN_HOSTS_SYSTEM, remove_block(old))
    unmount_lxcfs()
    stop_pidfile(f"{RUN}/lxcfs.pid", "lxcfs")
    if sh(["ip", "link", "show", pvenode.BRIDGE], check=False).returncode == 0:
        say(f"removing bridge {pvenode.BRIDGE}")
        sh(["ip", "link", "del", pvenode.BRIDGE], check=False)
    if os.path.exists(pvenode.COROSYNC_CONF) and os.path.exists(MARKER):
        os.unlink(pvenode.COROSYNC_CONF)
    if os.path.exists(PCT) and "inferops lab" in open(PCT).read():
        os.unlink(PCT)
    if os.path.exists(VAULT_FILE):
        os.unlink(VAULT_FILE)
    if purge:
        say("purging lab state (template, CA, keys, secrets, wheels)")
        shutil.rmtree(LAB, ignore_errors=True)
        for path in [p for name in template.SUITES.values() for p in (f"{pvenode.TMPL_DIR}/{name}",
                                                                      f"{pvenode.TMPL_DIR}/{name}.tmp")]:
            try:
                os.unlink(path)
            except FileNotFoundError:  # never made, or another `labctl down` was first
                pass
        shutil.rmtree(pvenode.STORAGES["local-lvm"]["path"], ignore_errors=True)
        if os.path.exists(MARKER):
            shutil.rmtree(pvenode.PVE_ETC, ignore_errors=True)
    shutil.rmtree(RUN, ignore_errors=True)
    if "--remove-packages" in args:
        remove_packages()
    say("lab is down")
    return 0


def cmd_status(args: list[str]) -> int:
    api = pid_alive(f"{RUN}/pve-api.pid")
    sshd = pid_alive(f"{RUN}/sshd.pid")
    lxcfs = sh(["mountpoint", "-q", "/var/lib/lxcfs"], check=False).returncode == 0
    br = sh(["ip", "-br", "-4", "addr", "show", pvenode.BRIDGE], check=False).stdout.split()
    print(f"PVE API  https://127.0.0.1:{API_PORT}  {'running pid ' + str(api) if api else 'stopped'}")
    print(f"sshd     127.0.0.1:{SSH_PORT}         {'running pid ' + str(sshd) if sshd else 'stopped'}")
    members = [n["name"] for n in pvecluster.cluster_nodes()]
    print(f"cluster  {pvenode.CLUSTER_NAME + ': ' + ', '.join(members) if members else 'none (pve1 alone)'}"
          f"{'  quorate' if members and pvecluster.is_quorate() else '  NOT QUORATE' if members else ''}")
    for node in members[1:]:
        napi, nssh = pid_alive(pvecluster.api_pidfile(node)), pid_alive(node_sshd_pidfile(node))
        ip = pvenode.NODE_ADDRESSES[node]
        print(f"{node}: PVE API https://{ip}:{API_PORT} {'running pid ' + str(napi) if napi else 'stopped'}; "
              f"sshd {ip}:{SSH_PORT} {'running pid ' + str(nssh) if nssh else 'stopped'}")
        ok_extra = bool(napi and nssh)
        if not ok_extra:
            api = None
    print(f"lxcfs    {'mounted' if lxcfs else 'not mounted'}")
    print(f"bridge   {pvenode.BRIDGE} {' '.join(br[2:]) if br else 'missing'}")
    print(f"template {'present' if os.path.exists(TEMPLATE) else 'missing'}  {TEMPLATE}")
    print(f"pct      {'installed' if os.path.exists(PCT) else 'missing'}")
    print("containers:")
    for vmid, node in sorted(pvecluster.vmlist().items()):
        st = ctstate.vm_status(vmid, node)
        print(f"  {vmid:<6} {node:<5} {st['status']:<8} pid={st.get('pid', '-'):<8} mem={st['mem'] // 1048576}/"
              f"{st['maxmem'] // 1048576} MiB  {st['name']}{'  lock=' + st['lock'] if st.get('lock') else ''}")
    if ctconfig.ct_exists(BYSTANDER):
        b = bystander_info()
        print(f"bystander CT {BYSTANDER}: bystanderd host pid {b['pid'] or 'NOT RUNNING'}, "
              f"heartbeat {b['heartbeat'] or '-'} ({b['age']}s ago)")
        print(f"bystander CT {BYSTANDER} GPU: worker host pid {b['gpu_pid'] or 'NOT RUNNING'}, "
              f"GPU {BYSTANDER_GPU} {b['gpu_mib'] if b['gpu_mib'] is not None else '?'} MiB, "
              f"config sha256 {b['conf_sha256'] or '-'}")
    else:
        print(f"bystander CT {BYSTANDER}: missing")
    info = bystander_info() if ctconfig.ct_exists(BYSTANDER) else {}
    ok = bool(api and sshd and lxcfs and info.get("pid") and info.get("gpu_pid"))
    return 0 if ok else 3


def incident_gpus(vmid: int, tp: int, asked: str) -> list[int]:
    """The GPUs the replay gives the container: --gpus as given, else the container's own and then the lowest
    that no other container has as devN. An operator on a shared node takes the free GPUs; a GPU another
    container's server holds cannot load a rank (SGLang: "Not enough memory", CUDA OOM), so the lab refuses
    to pick one."""
    owners = {}
    for path in sorted(glob.glob("/etc/pve/lxc/*.conf")):
        other = int(os.path.basename(path).split(".")[0])
        with open(path) as f:
            for gpu in re.findall(r"^dev\d+: /dev/nvidia(\d+)\b", f.read(), re.M):
                owners.setdefault(int(gpu), set()).add(other)
    if asked:
        gpus = [int(g) for g in asked.split(",")]
        taken = {g: sorted(owners[g] - {vmid}) for g in gpus if owners.get(g, set()) - {vmid}}
        if taken:
            die(f"incident: GPUs {taken} are passed through to other containers; give --gpus that no other holds")
        if len(gpus) != tp:
            die(f"incident: --gpus names {len(gpus)} GPUs for --tp {tp}")
        return gpus
    count = len(sh(["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"]).stdout.split())
    own = sorted(g for g, who in owners.items() if who == {vmid})
    rest = [g for g in range(count) if g not in owners]
    gpus = (own + rest)[:tp]
    if len(gpus) < tp:
        die(f"incident: --tp {tp} needs {tp} GPUs, but only {own + rest} are not another container's "
            f"(owners: {owners}); use a smaller --tp")
    return sorted(gpus)


def cmd_incident(args: list[str]) -> int:
    """The incident replayed by hand, outside the collection, the way the operator did it (incident.md):
    give the container as many GPUs as --tp asks (pct set devN + reboot, root on the node), install SGLang
    <version> by hand in a venv of its own, stop the managed unit, and start `python -m sglang.launch_server
    --tp-size N --enable-hierarchical-cache --hicache-size S` detached in the container, reading S as a total.
    Waits until the kernel reports an OOM kill in the container's memory cgroup, the server exits, or --wait
    seconds pass, and says which. The collection never launches this: deploy.yml refuses it (tests/corpus)."""
    import argparse
    ap = argparse.ArgumentParser(prog="labctl incident")
    ap.add_argument("--vmid", type=int, default=129)
    ap.add_argument("--tp", type=int, default=8)
    ap.add_argument("--hicache-size", type=int, default=2)
    ap.add_argument("--version", default="0.5.9")
    ap.add_argument("--model-path", default="/opt/models/kimi-k2-tiny")
    ap.add_argument("--wait", type=int, default=180)
    ap.add_argument("--gpus", default="", help="GPU indices to pass (default: the container's own, then the lowest "
                    "that no other container passes through)")
    a = ap.parse_args(args)
    global step
    vmid = str(a.vmid)
    step = "incident: GPUs"
    conf = open(f"/etc/pve/lxc/{vmid}.conf").read()
    devs = dict(re.findall(r"^(dev\d+): ([^,\s]+)", conf, re.M))
    have = set(devs.values())
    gpus = incident_gpus(a.vmid, a.tp, a.gpus)
    free = (f"dev{i}" for i in range(0, 256) if f"dev{i}" not in devs)
    added = []
    for gpu in gpus:
        path = f"/dev/nvidia{gpu}"
        if path not in have:
            key = next(free)
            sh(["/usr/sbin/pct", "set", vmid, f"--{key}", path])
            added.append(path)
    if added:
        sh(["/usr/sbin/pct", "reboot", vmid])
    for _ in range(60):
        if sh(["/usr/sbin/pct", "exec", vmid, "--", "true"], check=False).returncode == 0:
            break
        time.sleep(1)
    step = "incident: SGLang by hand"
    sh(["/usr/sbin/pct", "exec", vmid, "--", "systemctl", "stop", "sglang.service"], check=False)
    wheel = f"{LAB}/packages/sglang-{a.version}-py3-none-any.whl"
    spt = sorted(glob.glob(f"{LAB}/packages/setproctitle-*-cp3*.whl"))  # pip takes the one of the CT's Python
    for path in [wheel] + spt:
        with open(path, "rb") as f:
            sh(["/usr/sbin/pct", "exec", vmid, "--", "sh", "-c", f"cat > /root/{os.path.basename(path)}"], stdin=f)
    sh(["/usr/sbin/pct", "exec", vmid, "--", "sh", "-c",
        "python3 -m venv /root/incident-venv && /root/incident-venv/bin/pip install -q --no-index --find-links /root "
        f"sglang=={a.version}"])
    marker = f"inferops labctl incident {time.time():.0f} starts"
    with open("/dev/kmsg", "w") as f:
        f.write(marker + "\n")
    cmd = (f"/root/incident-venv/bin/python3 -m sglang.launch_server --model-path {a.model_path} --tp-size {a.tp} "
           f"--enable-hierarchical-cache --hicache-size {a.hicache_size} --max-total-tokens 16384 --port 30001")
    sh(["/usr/sbin/pct", "exec", vmid, "--", "sh", "-c", f"cd /root && nohup setsid {cmd} >/root/incident.log 2>&1 &"])
    print(f"labctl incident: started in CT {vmid}: {cmd}")
    deadline = time.time() + a.wait
    outcome = "still running after %ds" % a.wait
    while time.time() < deadline:
        time.sleep(3)
        kmsg = sh(["dmesg"], check=False).stdout.split(marker)[-1]
        if re.search(rf"oom-kill:.*oom_memcg=/lxc/{vmid}[,/]", kmsg):
            outcome = "the container's memory cgroup OOM-killed a rank"
            break
        alive = sh(["/usr/sbin/pct", "exec", vmid, "--", "pgrep", "-f", "sglang.launch_server --model-path"], check=False)
        if alive.returncode != 0:
            outcome = "the server exited"
            break
    log = sh(["/usr/sbin/pct", "exec", vmid, "--", "tail", "-n", "5", "/root/incident.log"], check=False).stdout
    print(f"labctl incident: {outcome}\n{log}")
    return 0


def main(argv: list[str]) -> int:
    global verbose
    pvenode.set_node("pve1")  # labctl is pve1's (a shell of pve2's sshd names pve2 in its environment)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(__doc__)
        return 0 if argv else 2
    if "-q" in argv:
        verbose = False
        argv = [a for a in argv if a != "-q"]
    cmd, args = argv[0], argv[1:]
    if os.geteuid() != 0:
        die("labctl must run as root")
    cmds = {"up": cmd_up, "down": cmd_down, "status": cmd_status, "ct-destroy": cmd_ct_destroy,
            "build-template": cmd_build_template, "incident": cmd_incident}
    if cmd not in cmds:
        die(f"unknown command '{cmd}' (try labctl --help)", 2)
    os.environ["PATH"] = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    return cmds[cmd](args)
