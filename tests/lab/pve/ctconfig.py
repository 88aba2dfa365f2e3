"""Container config files: /etc/pve/nodes/<node>/lxc/<vmid>.conf in pct.conf(5) format, their digest and lock.

Part of the simulated PVE node (tests/lab/pve/__init__.py).
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import time

from pve import pvecluster, pvenode


def parse_conf(raw: str) -> dict:
    conf: dict = {}
    desc: list[str] = []
    lxc: list[tuple[str, str]] = []
    env: list[str] = []
    rest: list[str] = []
    in_section = False
    for line in raw.splitlines():
        if in_section or line.startswith("["):
            in_section = True  # [pending] and snapshot sections: kept verbatim, not interpreted
            rest.append(line)
            continue
        if line.startswith("#"):
            desc.append(line[1:])
            continue
        if not line.strip():
            continue
        m = re.match(r"^(lxc\.[a-z0-9_.\-]+)\s*[:=]\s*(.*)$", line)
        if m:
            if m.group(1) == "lxc.environment.runtime":
                # PVE 9 (pve-container src/PVE/LXC/Config.pm parse_pct_config): these lines are the `env`
                # option, NUL-joined in file order; write_pct_config writes `env` back as such lines.
                env.append(m.group(2).strip())
            else:
                lxc.append((m.group(1), m.group(2).strip()))
            continue
        m = re.match(r"^([a-z][a-z0-9_\-]*):\s*(.*)$", line)
        if m:
            conf[m.group(1)] = m.group(2).strip()
    if desc:
        conf["description"] = "\n".join(desc)
    if env:
        conf["env"] = "\0".join(env)
    conf["lxc"] = lxc
    conf["_rest"] = rest
    return conf


def format_conf(conf: dict) -> str:
    out = []
    if conf.get("description"):
        out += ["#" + line for line in str(conf["description"]).split("\n")]
    for key in sorted(k for k in conf if k not in ("lxc", "description", "digest", "_rest", "env")):
        out.append(f"{key}: {conf[key]}")
    # pve-container write_pct_config: `env` as lxc.environment.runtime lines (split on runs of NUL), before the
    # other raw keys
    for variable in (v for v in str(conf.get("env") or "").split("\0") if v):
        out.append(f"lxc.environment.runtime: {variable}")
    for key, value in conf.get("lxc", []):
        out.append(f"{key}: {value}")
    if conf.get("_rest"):
        out.append("")
        out += conf["_rest"]
    return "\n".join(out) + "\n"


def digest_of(raw: str) -> str:
    # PVE: the config digest is the SHA1 of the raw file (PVE::Tools, pct.conf parser).
    return hashlib.sha1(raw.encode()).hexdigest()


def ct_exists(vmid: int) -> bool:
    return os.path.exists(pvenode.conf_path(vmid))


def load_config(vmid: int, node: str | None = None) -> dict:
    try:
        with open(pvenode.conf_path(vmid, node)) as f:
            raw = f.read()
    except FileNotFoundError:
        raise pvenode.PVEError(f"Configuration file 'nodes/{node or pvenode.NODE}/lxc/{int(vmid)}.conf' does not exist") from None
    conf = parse_conf(raw)
    conf["digest"] = digest_of(raw)
    return conf


def write_config(vmid: int, conf: dict) -> None:
    os.makedirs(pvenode.CONF_DIR, exist_ok=True)
    path = pvenode.conf_path(vmid)
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(format_conf(conf))
    os.replace(tmp, path)
    pvecluster.write_vmlist()


@contextlib.contextmanager
def config_lock(vmid: int, timeout: float = 10.0):
    """PVE::AbstractConfig::lock_config: flock on /run/lock/lxc/pve-config-<vmid>.lock, 10 s timeout."""
    os.makedirs(pvenode.LOCK_DIR, exist_ok=True)
    path = f"{pvenode.LOCK_DIR}/pve-config-{int(vmid)}.lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    deadline = time.time() + timeout
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError:
                if time.time() > deadline:
                    raise pvenode.PVEError(f"can't lock file '{path}' - got timeout") from None
                time.sleep(0.1)
        yield
    finally:
        os.close(fd)


def check_lock(conf: dict) -> None:
    # PVE::AbstractConfig::check_lock: "CT is locked (<lock>)"
    if conf.get("lock"):
        raise pvenode.PVEError(f"CT is locked ({conf['lock']})")
