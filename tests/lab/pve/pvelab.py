"""The lab's simulated Proxmox VE node: one backend shared by the REST API (api.py) and pct (pct.py).

Runs with the node's /usr/bin/python3 (3.11, stdlib only). Every behaviour that imitates PVE names its
source in docs/lab.md ("PVE node: behaviours and sources"); "PVE:" comments below point at the same
places in /work/shared/reference/proxmox-lxc.md.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import random
import re
import shutil
import stat
import subprocess
import sys
import time
import traceback

from pve import apischema

# The lab's entry point, through which a task's worker runs (`labctl task-worker`).
LABCTL = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "labctl")

# The lab's cluster (docs/lab.md, "Two nodes"): each node's name and its address (API on <address>:8006, sshd on
# <address>:2222). Which of them form the cluster is what /etc/pve/corosync.conf lists (labctl up writes it; without
# it pve1 is a node without a cluster). The process's own node: INFEROPS_LAB_NODE (api.py --node sets it; pve2's sshd
# sets it for its sessions, so `pct` over SSH to pve2 is pve2's), else pve1.
NODE_ADDRESSES = {"pve1": "127.0.0.1", "pve2": "127.0.0.2"}
CLUSTER_NAME = "inferops-lab"
NODE = os.environ.get("INFEROPS_LAB_NODE") or "pve1"
if NODE not in NODE_ADDRESSES:
    raise SystemExit(f"INFEROPS_LAB_NODE={NODE!r}: the lab's nodes are {', '.join(NODE_ADDRESSES)}")
LAB = "/var/lib/inferops-lab"
RUN = "/run/inferops-lab"
PVE_ETC = "/etc/pve"
CONF_DIR = f"{PVE_ETC}/nodes/{NODE}/lxc"
COROSYNC_CONF = f"{PVE_ETC}/corosync.conf"
VMLIST = f"{PVE_ETC}/.vmlist"
LXC_DIR = "/var/lib/lxc"
VZ_DIR = "/var/lib/vz"
TMPL_DIR = f"{VZ_DIR}/template/cache"
TASK_DIR = f"{LAB}/tasks"
LOCK_DIR = "/run/lock/lxc"
BRIDGE = "vmbr0"
BRIDGE_ADDR = "10.77.0.1/24"
NVIDIA_RUN = "/run/nvidia-lab"
# pve-manager 9.1.9 (ee7bad0a, "bump version to 9.1.9", 2026-04-21): the release current when pve-docs dumped the
# schema the lab serves (apidata-slice.json, a8736b6 of 2026-04-30). PVE's repoid is the release commit's prefix.
PVE_VERSION = {"version": "9.1.9", "release": "9.1", "repoid": "ee7bad0a3d1546c9"}
MIB = 1024 * 1024
CLI_PATH = "/sbin:/bin:/usr/sbin:/usr/bin"
# Storages of the simulated node: both are plain directories (docs/lab.md, "Storage").
STORAGES = {
    "local": {"type": "dir", "path": VZ_DIR, "content": "vztmpl,iso,backup,rootdir,images"},
    "local-lvm": {"type": "lvmthin", "path": f"{VZ_DIR}/lab-lvm", "content": "rootdir,images"},
}
LOCK_VALUES = {"backup", "create", "destroyed", "disk", "fstrim", "migrate", "mounted", "rollback",
               "snapshot", "snapshot-delete"}


class PVEError(Exception):
    """An error as PVE reports it: HTTP code, message, optional per-parameter errors."""

    def __init__(self, msg: str, code: int = 500, errors: dict | None = None):
        super().__init__(msg)
        self.msg = msg
        self.code = code
        self.errors = errors


def param_error(errors: dict) -> PVEError:
    # PVE::Exception::raise_param_exc: code 400, "Parameter verification failed."
    return PVEError("Parameter verification failed.", 400, errors)


def perm_error(what: str) -> PVEError:
    # PVE::Exception::raise_perm_exc: code 403, "Permission check failed (<what>)"
    return PVEError(f"Permission check failed ({what})", 403)


# ---------------------------------------------------------------------------------------------
# Config files: /etc/pve/lxc/<vmid>.conf in pct.conf(5) format
# ---------------------------------------------------------------------------------------------

def set_node(name: str) -> None:
    """Makes this process node `name` (api.py --node); its task workers inherit it through the environment."""
    global NODE, CONF_DIR
    if name not in NODE_ADDRESSES:
        raise ValueError(f"unknown lab node {name!r}")
    NODE = name
    CONF_DIR = f"{PVE_ETC}/nodes/{NODE}/lxc"
    os.environ["INFEROPS_LAB_NODE"] = name


def conf_dir(node: str | None = None) -> str:
    return CONF_DIR if node is None or node == NODE else f"{PVE_ETC}/nodes/{node}/lxc"


def conf_path(vmid: int, node: str | None = None) -> str:
    return f"{conf_dir(node)}/{int(vmid)}.conf"


# ---------------------------------------------------------------------------------------------
# The cluster: members (corosync.conf), the VMID list (pmxcfs' .vmlist), quorum
# ---------------------------------------------------------------------------------------------

def cluster_nodes() -> list[dict]:
    """The nodelist of /etc/pve/corosync.conf (`node { name: ..  nodeid: ..  ring0_addr: .. }`), as pmxcfs reads
    it; [] without the file (a node without a cluster)."""
    try:
        with open(COROSYNC_CONF) as f:
            text = f.read()
    except FileNotFoundError:
        return []
    nodes = []
    for block in re.findall(r"\bnode\s*\{([^}]*)\}", text):
        kv = dict(re.findall(r"^\s*([a-z0-9_]+):\s*(\S+)\s*$", block, re.M))
        if kv.get("name") in NODE_ADDRESSES:
            nodes.append({"name": kv["name"], "nodeid": int(kv.get("nodeid", 0)), "ip": kv.get("ring0_addr", "")})
    return sorted(nodes, key=lambda n: n["nodeid"])


def api_pidfile(node: str) -> str:
    return f"{RUN}/pve-api.pid" if node == "pve1" else f"{RUN}/pve-api-{node}.pid"


def node_online(node: str) -> bool:
    """A lab node is online while its API daemon runs (the lab's stand-in for corosync membership)."""
    if node == NODE:
        return True
    try:
        with open(api_pidfile(node)) as f:
            os.kill(int(f.read().split()[0]), 0)
        return True
    except (OSError, ValueError, IndexError):
        return False


def is_quorate() -> bool:
    """votequorum with one vote per node: quorate while more than half of the nodes are members."""
    nodes = cluster_nodes()
    if not nodes:
        return True
    return 2 * sum(1 for n in nodes if node_online(n["name"])) > len(nodes)


def check_cfs_quorum() -> None:
    # pve-cluster src/PVE/Cluster.pm check_cfs_quorum
    if not is_quorate():
        raise PVEError("cluster not ready - no quorum?")


def vmlist() -> dict[int, str]:
    """The cluster's VMID list, {vmid: node}, from every node's config directory, as pmxcfs builds .vmlist."""
    res = {}
    nodes_dir = f"{PVE_ETC}/nodes"
    for node in sorted(os.listdir(nodes_dir)) if os.path.isdir(nodes_dir) else []:
        d = f"{nodes_dir}/{node}/lxc"
        for n in os.listdir(d) if os.path.isdir(d) else []:
            if re.fullmatch(r"\d+\.conf", n):
                res.setdefault(int(n[:-5]), node)
    return res


def write_vmlist() -> None:
    """/etc/pve/.vmlist in pmxcfs' format (pve-cluster src/pmxcfs/status.c cfs_create_vmlist_msg)."""
    ids = {str(v): {"node": n, "type": "lxc", "version": 1} for v, n in sorted(vmlist().items())}
    text = json.dumps({"version": len(ids), "ids": ids}, indent=0) + "\n"
    with contextlib.suppress(OSError):
        tmp = f"{VMLIST}.tmp.{os.getpid()}"
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, VMLIST)


def check_vmid_unused(vmid: int) -> None:
    # pve-cluster src/PVE/Cluster.pm check_vmid_unused
    node = vmlist().get(int(vmid))
    if node is not None:
        raise PVEError(f"CT {int(vmid)} already exists on node '{node}'")


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
    return os.path.exists(conf_path(vmid))


def load_config(vmid: int, node: str | None = None) -> dict:
    try:
        with open(conf_path(vmid, node)) as f:
            raw = f.read()
    except FileNotFoundError:
        raise PVEError(f"Configuration file 'nodes/{node or NODE}/lxc/{int(vmid)}.conf' does not exist") from None
    conf = parse_conf(raw)
    conf["digest"] = digest_of(raw)
    return conf


def write_config(vmid: int, conf: dict) -> None:
    os.makedirs(CONF_DIR, exist_ok=True)
    path = conf_path(vmid)
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(format_conf(conf))
    os.replace(tmp, path)
    write_vmlist()


@contextlib.contextmanager
def config_lock(vmid: int, timeout: float = 10.0):
    """PVE::AbstractConfig::lock_config: flock on /run/lock/lxc/pve-config-<vmid>.lock, 10 s timeout."""
    os.makedirs(LOCK_DIR, exist_ok=True)
    path = f"{LOCK_DIR}/pve-config-{int(vmid)}.lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    deadline = time.time() + timeout
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError:
                if time.time() > deadline:
                    raise PVEError(f"can't lock file '{path}' - got timeout") from None
                time.sleep(0.1)
        yield
    finally:
        os.close(fd)


def check_lock(conf: dict) -> None:
    # PVE::AbstractConfig::check_lock: "CT is locked (<lock>)"
    if conf.get("lock"):
        raise PVEError(f"CT is locked ({conf['lock']})")


# ---------------------------------------------------------------------------------------------
# Option parsing and validation (the subset of pct.conf(5) the collection uses)
# ---------------------------------------------------------------------------------------------

def parse_prop_string(value: str, default_key: str | None = None) -> dict:
    res: dict = {}
    for part in str(value).split(","):
        if not part:
            continue
        if "=" in part:
            k, v = part.split("=", 1)
            res[k.strip()] = v.strip()
        elif default_key and default_key not in res:
            res[default_key] = part.strip()
        else:
            raise ValueError(f"invalid format - missing key in comma-separated list property: '{part}'")
    return res


def parse_dev(value: str) -> dict:
    # pct.conf: dev[n]: [[path=]<Path>] [,deny-write=<1|0>] [,gid=<integer>] [,mode=<Octal access mode>] [,uid=<integer>]
    d = parse_prop_string(value, "path")
    for k in d:
        if k not in ("path", "deny-write", "gid", "mode", "uid"):
            raise ValueError(f"invalid format - property '{k}' is not defined in schema")
    path = d.get("path", "")
    if not path.startswith("/dev/") or "/./" in path or "/../" in path:
        raise ValueError("invalid format - value does not look like a valid device path")
    if "mode" in d and not re.fullmatch(r"0[0-7]{3}", d["mode"]):
        raise ValueError("invalid format - value does not look like a valid file access mode")
    for k in ("uid", "gid"):
        if k in d and not re.fullmatch(r"\d+", d[k]):
            raise ValueError(f"invalid format - {k}: type check ('integer') failed")
    return d


def device_mode_and_rdev(path: str) -> os.stat_result:
    # PVE::LXC::Tools::get_device_mode_and_rdev
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise PVEError(f"Device {path} does not exist") from None
    if not (stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode)):
        raise PVEError(f"{path} is not a device")
    return st


def parse_net(value: str) -> dict:
    d = parse_prop_string(value)
    if "name" not in d:
        raise ValueError("invalid format - missing property 'name'")
    return d


def _bool_opt(v):
    """A config boolean as PVE stores it: 1 or 0 (the schema check before it takes only 1, 0 or a JSON
    boolean; a property string's booleans pass through parse_boolean)."""
    s = str(v).lower()
    if s in ("1", "true", "yes", "on"):
        return "1"
    if s in ("0", "false", "no", "off"):
        return "0"
    raise ValueError(f"type check ('boolean') failed - got '{v}'")


# pve-container src/PVE/LXC/Config.pm $features_desc: the keys of the `features` property string.
FEATURE_KEYS = ("mount", "nesting", "keyctl", "fuse", "mknod", "force_rw_sys")
BOOL_FEATURES = ("nesting", "keyctl", "fuse", "mknod", "force_rw_sys")


def parse_features(value) -> dict:
    """PVE::LXC::Config::parse_features: {} for an empty value, else the property string checked."""
    if not value:
        return {}
    d = parse_prop_string(value)
    for k, v in d.items():
        if k not in FEATURE_KEYS:
            raise ValueError(f"invalid format - property '{k}' is not defined in schema")
        if k in BOOL_FEATURES:
            d[k] = _bool_opt(v)
    return d


# The config options are the properties of update_vm (PUT /nodes/{node}/lxc/{vmid}/config) in PVE's schema
# (apidata-slice.json) besides the method's own parameters; the schema checks them (apischema.py).
UPDATE_METHOD = "PUT /nodes/{node}/lxc/{vmid}/config"
CREATE_METHOD = "POST /nodes/{node}/lxc"
UPDATE_VM_EXTRA = ("node", "vmid", "delete", "revert", "digest")


def option_checker(key: str):
    """The schema of config option `key`, or None when pct.conf(5) has no such option."""
    if key in UPDATE_VM_EXTRA:
        return None
    return apischema.METHODS[UPDATE_METHOD].properties.get(key)


def validate_options(params: dict, allowed_extra=(), method: str = UPDATE_METHOD) -> dict:
    """Checks the given parameters against the method's schema (JSONSchema.pm check_object on the keys
    given: types, formats, property strings, enums, ranges, additionalProperties 0) and returns the config
    options among them as PVE stores them (booleans 1/0, a MAC generated for a netN without one)."""
    props = apischema.METHODS[method].properties
    errors: dict = {}
    apischema.check_keys(props, params, errors)
    if errors:
        raise param_error(errors)
    out = {}
    for key, value in params.items():
        if key in allowed_extra or key in UPDATE_VM_EXTRA or option_checker(key) is None:
            continue
        value = "1" if value is True else "0" if value is False else str(value)
        if option_checker(key).get("type") == "boolean":
            value = _bool_opt(value)
        if re.fullmatch(r"net\d+", key) and "hwaddr" not in parse_prop_string(value, "name"):
            # PVE generates a MAC when none is given (pve-container LXC/Config.pm parse_lxc_network)
            value = f"{value},hwaddr=" + "BC:24:11:%02X:%02X:%02X" % tuple(random.randrange(256) for _ in range(3))
        out[key] = value
    return out


# ---------------------------------------------------------------------------------------------
# Users, API tokens and privileges (pve-access-control src/PVE/RPCEnvironment.pm)
# ---------------------------------------------------------------------------------------------

# The privileges the lab checks; root@pam has all of them (RPCEnvironment::permissions returns the
# Administrator role's privileges for root@pam). Role "Administrator" = all of these, "NoAccess" = none.
PRIVILEGES = ("VM.Allocate", "VM.Audit", "VM.Config.CPU", "VM.Config.Disk", "VM.Config.Memory",
              "VM.Config.Network", "VM.Config.Options", "VM.PowerMgmt", "Datastore.AllocateSpace", "Sys.Modify",
              "Sys.Audit", "Datastore.Audit", "Datastore.Allocate")
# update_vm's handler-level check: any of these on /vms/{vmid} (pve-container API2/LXC/Config.pm)
VM_CONFIG_PERM_LIST = ("VM.Config.Disk", "VM.Config.CPU", "VM.Config.Memory", "VM.Config.Network",
                       "VM.Config.Options")
# The lab's access configuration (its own JSON format, not PVE's user.cfg): tokens with their
# privilege-separation flag, ACL entries, custom roles. Without the file: the one token root@pam!lab,
# privsep 0 (full privileges), as `labctl up` sets it up.
ACCESS_FILE = f"{LAB}/access.json"
DEFAULT_ACCESS = {"tokens": {"root@pam!lab": {"privsep": 0}}, "acl": [], "roles": {}}


def load_access(path: str = ACCESS_FILE) -> dict:
    try:
        with open(path) as f:
            cfg = json.load(f)
    except FileNotFoundError:
        return json.loads(json.dumps(DEFAULT_ACCESS))
    return {"tokens": cfg.get("tokens", {}), "acl": cfg.get("acl", []), "roles": cfg.get("roles", {})}


def _role_privs(cfg: dict, role: str) -> set:
    if role == "Administrator":
        return set(PRIVILEGES)
    return set(cfg.get("roles", {}).get(role, ()))


def _acl_roles(cfg: dict, ugid: str, path: str) -> set:
    """Roles of `ugid` on `path`: ACLs on the path itself, else the nearest propagating one above it
    (PVE::AccessControl::roles; the most specific path wins)."""
    parts = [p for p in path.split("/") if p]
    prefixes = ["/"] + ["/" + "/".join(parts[:i]) for i in range(1, len(parts) + 1)]
    roles: set = set()
    for prefix in prefixes:
        entries = [e for e in cfg.get("acl", []) if e.get("path") == prefix and ugid in e.get("ugids", ())]
        if not entries:
            continue
        exact = prefix == (prefixes[-1] if parts else "/")
        found = {r for e in entries if exact or e.get("propagate", 1) for r in e.get("roles", ())}
        if found or exact:
            roles = found
    return roles


def permissions(user: str, path: str, cfg: dict | None = None) -> set:
    """PVE::RPCEnvironment::permissions: root@pam has every privilege; a token unknown to the config
    has none; a token without privilege separation has its owner's privileges; a privilege-separated
    token has the privileges of its own ACLs, intersected with its owner's unless the owner is root@pam
    (compile_acl_path)."""
    cfg = load_access() if cfg is None else cfg
    if user == "root@pam":
        return set(PRIVILEGES)
    if "!" in user:
        owner = user.split("!", 1)[0]
        info = cfg.get("tokens", {}).get(user)
        if info is None:
            return set()
        owner_privs = permissions(owner, path, cfg)
        if not int(info.get("privsep", 1)):
            return owner_privs
        privs = set()
        for role in _acl_roles(cfg, user, path):
            privs |= _role_privs(cfg, role)
        if owner != "root@pam":
            privs &= owner_privs
        return privs
    privs = set()
    for role in _acl_roles(cfg, user, path):
        privs |= _role_privs(cfg, role)
    return privs


def check_perm(user: str, path: str, privs, cfg: dict | None = None, any_: bool = False) -> None:
    """RPCEnvironment::check / check_any: 403 `Permission check failed (<path>, <priv>)`."""
    have = permissions(user, path, cfg)
    if any_:
        if not have & set(privs):
            raise perm_error(f"{path}, " + "|".join(privs))
        return
    for priv in privs:
        if priv not in have:
            raise perm_error(f"{path}, {priv}")


def check_vm_perm(user: str, vmid, privs, cfg: dict | None = None, any_: bool = False) -> None:
    check_perm(user, f"/vms/{int(vmid)}", privs, cfg, any_)


def _mp_type(value) -> str:
    """The mount point type from its volume (PVE::LXC::Config::classify_mountpoint): an absolute path is
    a bind mount, a /dev/ path a device, anything else a volume."""
    volume = str(value).split(",")[0]
    if volume.startswith("volume="):
        volume = volume[len("volume="):]
    if volume.startswith("/dev/"):
        return "device"
    if volume.startswith("/"):
        return "bind"
    return "volume"


def features_changed(oldconf: dict | None, newvalue, delete: bool) -> tuple[bool, bool]:
    """(nesting_changed, other_changed) as PVE::LXC::check_ct_modify_config_perm computes them."""
    nesting_changed = other_changed = False
    if not delete:
        features = parse_features(newvalue)
        if oldconf is not None and oldconf.get("features"):
            old = parse_features(oldconf["features"])
            for feature in list(old) + list(features):
                if old.get(feature, "") != features.get(feature, ""):
                    if feature == "nesting":
                        nesting_changed = True
                        continue
                    other_changed = True
                    break
        elif len(features) == 1 and "nesting" in features:
            nesting_changed = True
        elif features:
            other_changed = True
    else:
        features = parse_features((oldconf or {}).get("features"))
        if len(features) == 1 and "nesting" in features:
            nesting_changed = True
        elif features:
            other_changed = True
    return nesting_changed, other_changed


def check_modify_perm(user: str, vmid, oldconf: dict | None, newconf: dict, delete=(), unprivileged=None,
                      cfg: dict | None = None) -> None:
    """PVE::LXC::check_ct_modify_config_perm (pve-container src/PVE/LXC.pm), option by option."""
    if user == "root@pam":
        return
    cfg = load_access() if cfg is None else cfg
    unpriv = str(unprivileged) in ("1", "true")

    def check(opt: str, is_delete: bool) -> None:
        if opt in ("cores", "cpuunits", "cpulimit"):
            check_vm_perm(user, vmid, ["VM.Config.CPU"], cfg)
        elif opt == "rootfs" or re.fullmatch(r"mp\d+", opt):
            check_vm_perm(user, vmid, ["VM.Config.Disk"], cfg)
            if is_delete:
                return
            kind = _mp_type(newconf[opt])
            if kind != "volume":
                raise perm_error(f"mount point type {kind} is only allowed for root@pam")
        elif opt in ("memory", "swap"):
            check_vm_perm(user, vmid, ["VM.Config.Memory"], cfg)
        elif re.fullmatch(r"net\d+", opt):
            check_vm_perm(user, vmid, ["VM.Config.Network"], cfg)
        elif re.fullmatch(r"dev\d+", opt):
            raise perm_error("configuring device passthrough is only allowed for root@pam")
        elif opt in ("nameserver", "searchdomain", "hostname"):
            check_vm_perm(user, vmid, ["VM.Config.Network"], cfg)
        elif opt == "features":
            if not unpriv:
                raise perm_error("changing feature flags for privileged container is only allowed for root@pam")
            nesting_changed, other_changed = features_changed(oldconf, newconf.get(opt), is_delete)
            if other_changed:
                raise perm_error("changing feature flags (except nesting) is only allowed for root@pam")
            if nesting_changed:
                check_vm_perm(user, vmid, ["VM.Allocate"], cfg)
        elif opt == "hookscript":
            raise perm_error("changing the hookscript is only allowed for root@pam")
        else:  # tags included (assert_tag_permissions starts with VM.Config.Options)
            check_vm_perm(user, vmid, ["VM.Config.Options"], cfg)

    for opt in newconf:
        check(opt, False)
    for opt in delete:
        check(opt, True)


# ---------------------------------------------------------------------------------------------
# Tasks: UPIDs, logs, status (PVE::RESTEnvironment::fork_worker semantics)
# ---------------------------------------------------------------------------------------------

def proc_starttime(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            data = f.read()
        return int(data.rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def make_upid(pid: int, ttype: str, tid: str, user: str, starttime: int | None = None) -> str:
    # proxmox-lxc.md §3: UPID:<node>:<pid hex>:<pstart hex>:<starttime hex>:<type>:<id>:<user>:
    pstart = proc_starttime(pid) or 0
    starttime = starttime or int(time.time())
    return f"UPID:{NODE}:{pid:08X}:{pstart:08X}:{starttime:08X}:{ttype}:{tid}:{user}:"


def parse_upid(upid: str) -> dict:
    """pve-common PVE::Tools::upid_decode; an unparsable UPID is 400 `{"upid": "unable to parse worker upid"}`
    (pve-manager PVE/API2/Tasks.pm, `raise_param_exc`)."""
    m = re.fullmatch(r"UPID:([a-zA-Z0-9]([a-zA-Z0-9\-]*[a-zA-Z0-9])?):([0-9A-Fa-f]{8}):([0-9A-Fa-f]{8,9}):"
                     r"([0-9A-Fa-f]{8}):([^:\s]+):([^:\s]*):([^:\s]+):", upid or "")
    if not m:
        raise param_error({"upid": "unable to parse worker upid"})
    return {"upid": upid, "node": m.group(1), "pid": int(m.group(3), 16), "pstart": int(m.group(4), 16),
            "starttime": int(m.group(5), 16), "type": m.group(6), "id": m.group(7), "user": m.group(8)}


def task_file_checked(upid: str) -> dict:
    """upid_decode plus the task's file: 400 `{"upid": "no such task"}` without it (Tasks.pm)."""
    info = parse_upid(upid)
    if info["node"] != NODE or not os.path.exists(task_file(upid, "log")):
        raise param_error({"upid": "no such task"})
    return info


def task_file(upid: str, ext: str) -> str:
    return f"{TASK_DIR}/{upid.replace(':', '_')}.{ext}"


class Task:
    """One running task: writes its log like PVE (lines, then TASK OK / TASK ERROR: ...)."""

    def __init__(self, ttype: str, tid, user: str, echo: bool = False):
        os.makedirs(TASK_DIR, exist_ok=True)
        self.upid = make_upid(os.getpid(), ttype, str(tid), user)
        self.echo = echo
        self.log = open(task_file(self.upid, "log"), "a", buffering=1)

    def say(self, line: str) -> None:
        self.log.write(line.rstrip("\n") + "\n")
        if self.echo:
            print(line, flush=True)

    def finish(self, error: str | None) -> None:
        status = "OK" if error is None else error.strip()
        if error is None:
            self.log.write("TASK OK\n")
        else:
            self.log.write(f"TASK ERROR: {status}\n")
            if self.echo:
                print(status, file=sys.stderr, flush=True)
        self.log.close()
        tmp = task_file(self.upid, "status.tmp")
        with open(tmp, "w") as f:
            json.dump({"exitstatus": status, "endtime": int(time.time())}, f)
        os.replace(tmp, task_file(self.upid, "status"))


def run_task(task: Task, func, *args) -> bool:
    try:
        func(task, *args)
    except PVEError as e:
        task.finish(e.msg)
        return False
    except Exception as e:  # a lab bug: keep the traceback in the task log
        task.say(traceback.format_exc())
        task.finish(str(e) or e.__class__.__name__)
        return False
    task.finish(None)
    return True


def _task_exitstatus(upid: str) -> str | None:
    try:
        with open(task_file(upid, "status")) as f:
            return json.load(f)["exitstatus"]
    except FileNotFoundError:
        return None


def task_status(upid: str) -> dict:
    """GET tasks/{upid}/status (pve-manager PVE/API2/Tasks.pm read_task_status): running while the worker
    (pid + start time) lives; stopped with `exitstatus` (upid_read_status: `OK`, the error, or
    `unexpected status` when the log has no end line) otherwise."""
    info = task_file_checked(upid)
    res = dict(info)
    if proc_starttime(info["pid"]) == info["pstart"]:
        res["status"] = "running"
        return res
    res["status"] = "stopped"
    res["exitstatus"] = _task_exitstatus(upid) or "unexpected status"
    return res


def task_log(upid: str, start: int = 0, limit: int = 50) -> list:
    task_file_checked(upid)
    with open(task_file(upid, "log")) as f:
        lines = f.read().splitlines()
    sel = lines[start:start + limit] if limit else lines[start:]
    return [{"n": start + i + 1, "t": t} for i, t in enumerate(sel)]


def _status_type(status: str | None) -> str:
    """pve-common PVE::Tools::upid_normalize_status_type."""
    if not status:
        return "unknown"
    if status == "OK":
        return "ok"
    if status.startswith("WARNINGS:"):
        return "warning"
    if status == "RUNNING":
        return "unknown"
    return "error"


def list_tasks(p: dict | None = None) -> list:
    """GET /nodes/{node}/tasks as pve-manager PVE/API2/Tasks.pm node_tasks: `source` archive (default: the
    finished tasks, newest first, `status` = the exit text), active (the running ones, status `RUNNING`) or
    all; the filters userfilter (substring, case-insensitive), typefilter, vmid, since/until, statusfilter or
    errors, then start/limit."""
    p = dict(p or {})
    start, limit = int(p.get("start") or 0), int(p.get("limit") if p.get("limit") not in (None, "") else 50)
    source = p.get("source") or "archive"
    statusfilter = {"ok": True, "warning": True, "error": True, "unknown": True}
    errors_only = p.get("errors") == "1"
    if p.get("statusfilter") is not None and not errors_only:
        statusfilter = {k: False for k in statusfilter}
        for f in apischema.split_list(p["statusfilter"]):
            statusfilter[f.lower()] = True
    elif errors_only:
        statusfilter["ok"] = False
    tasks = []
    if os.path.isdir(TASK_DIR):
        for name in os.listdir(TASK_DIR):
            if not name.endswith(".log"):
                continue
            upid = name[:-4].replace("_", ":")
            try:
                info = parse_upid(upid)
            except PVEError:
                continue
            if info["node"] != NODE:  # another node's task (each node lists its own, /var/log/pve/tasks)
                continue
            exit_text = _task_exitstatus(upid)
            running = exit_text is None and proc_starttime(info["pid"]) == info["pstart"]
            if running:
                info["status"] = "RUNNING"
            else:
                info["status"] = exit_text or "unexpected status"
                with contextlib.suppress(OSError, ValueError, KeyError):
                    with open(task_file(upid, "status")) as f:
                        info["endtime"] = int(json.load(f)["endtime"])
            info["_running"] = running
            tasks.append(info)
    tasks.sort(key=lambda t: t["starttime"], reverse=True)
    res, count = [], 0
    for t in tasks:
        if source == "archive" and t["_running"] or source == "active" and not t["_running"]:
            continue
        if p.get("userfilter") and p["userfilter"].lower() not in t["user"].lower():
            continue
        if p.get("typefilter") and t["type"] != p["typefilter"]:
            continue
        if p.get("vmid") and t["id"] != str(p["vmid"]):
            continue
        if p.get("since") not in (None, "") and t["starttime"] < int(p["since"]):
            continue
        if p.get("until") not in (None, "") and t["starttime"] > int(p["until"]):
            continue
        if not statusfilter.get(_status_type(t["status"])):
            continue
        count += 1
        if count <= start or len(res) >= limit:
            continue
        t.pop("_running")
        res.append(t)
    return res


def spawn_task(ttype: str, tid, user: str, func_name: str, args: list) -> str:
    """Runs a task in a detached worker process (like fork_worker) and returns its UPID at once."""
    cmd = [sys.executable, LABCTL, "task-worker", json.dumps(
        {"type": ttype, "id": str(tid), "user": user, "func": func_name, "args": args})]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, start_new_session=True,
                         close_fds=True)
    line = p.stdout.readline().decode().strip()
    p.stdout.close()
    import threading
    threading.Thread(target=p.wait, daemon=True).start()
    if not line.startswith("UPID:"):
        raise PVEError(f"unable to start worker: {line}")
    return line


def worker_main(spec: dict) -> int:
    task = Task(spec["type"], spec["id"], spec["user"])
    print(task.upid, flush=True)
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    ok = run_task(task, TASK_FUNCS[spec["func"]], *spec["args"])
    return 0 if ok else 1


# ---------------------------------------------------------------------------------------------
# Container state
# ---------------------------------------------------------------------------------------------

def lxc_info(vmid: int) -> tuple[str, int | None]:
    r = subprocess.run(["lxc-info", "-n", str(vmid), "-s", "-p"], capture_output=True, text=True)
    if r.returncode != 0:
        return "stopped", None
    info = {}
    for line in r.stdout.splitlines():
        k, _, v = line.partition(":")
        info[k.strip()] = v.strip()
    pid = int(info["PID"]) if info.get("PID", "").isdigit() else None
    return ("running" if info.get("State") == "RUNNING" else "stopped"), pid


def lxc_raw_state(vmid: int) -> str:
    """LXC's own state name (RUNNING, STOPPING, STOPPED, ...); STOPPED when lxc-info knows no such CT."""
    r = subprocess.run(["lxc-info", "-n", str(vmid), "-s"], capture_output=True, text=True)
    m = re.search(r"State:\s*(\S+)", r.stdout or "")
    return m.group(1) if r.returncode == 0 and m else "STOPPED"


def is_running(vmid: int) -> bool:
    return lxc_info(vmid)[0] == "running"


def cgroup_dir(pid: int, controller: str = "memory") -> str | None:
    """The container's limiting cgroup (lxc/<vmid>, the parent of the CT's inner 'ns')."""
    try:
        with open(f"/proc/{pid}/cgroup") as f:
            for line in f:
                _, ctrls, path = line.rstrip("\n").split(":", 2)
                if controller in ctrls.split(","):
                    m = re.match(r"^(/lxc/\d+)(/|$)", path)  # the CT's own tree lives below lxc/<vmid>/ns
                    return f"/sys/fs/cgroup/{controller}{m.group(1) if m else path}"
    except OSError:
        pass
    return None


def _read_int(path: str, default: int = 0) -> int:
    try:
        with open(path) as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return default


# PVE 9 (pve-container src/PVE/LXC.pm vmstatus, running CTs only): `pressure<type><some|full>` = the avg10 of
# /sys/fs/cgroup/lxc/<vmid>/<type>.pressure (pve-common ProcFSTools read_cgroup_pressure, parse_pressure: the
# regex capture, so a JSON string such as "0.00"); a file or line that is missing leaves the value undefined
# (JSON null). The lab host's cgroups are v1 hybrid: the same files live in its v2 tree, /sys/fs/cgroup/unified.
PRESSURE_KEYS = [(t, kind) for t in ("cpu", "io", "memory") for kind in ("some", "full")]
_PRESSURE_RE = re.compile(r"^(some|full)\s+avg10=(\d+\.\d+)\s+avg60=(\d+\.\d+)\s+avg300=(\d+\.\d+)\s+total=(\d+)")


def cgroup_pressure(vmid: int) -> dict:
    base = next((d for d in ("/sys/fs/cgroup/unified", "/sys/fs/cgroup") if os.path.isdir(f"{d}/lxc/{int(vmid)}")),
                "/sys/fs/cgroup/unified")
    found: dict = {}
    for typ in ("cpu", "io", "memory"):
        with contextlib.suppress(OSError):
            with open(f"{base}/lxc/{int(vmid)}/{typ}.pressure") as f:
                for line in f:
                    m = _PRESSURE_RE.match(line)
                    if m:
                        found[(typ, m.group(1))] = m.group(2)
    return {f"pressure{t}{kind}": found.get((t, kind)) for t, kind in PRESSURE_KEYS}


def vm_status(vmid: int, node: str | None = None) -> dict:
    conf = load_config(vmid, node)
    state, pid = lxc_info(vmid)
    mem = int(conf.get("memory", 512)) * MIB
    swap = int(conf.get("swap", 512)) * MIB
    res = {"vmid": int(vmid), "name": conf.get("hostname", f"CT{vmid}"), "status": state, "type": "lxc",
           "maxmem": mem, "maxswap": swap, "mem": 0, "swap": 0, "cpus": int(conf.get("cores", 1) or 1),
           "cpu": 0, "uptime": 0, "maxdisk": 8 * 1024 ** 3, "disk": 0, "netin": 0, "netout": 0,
           "diskread": 0, "diskwrite": 0, "ha": {"managed": 0}, "tags": conf.get("tags", "")}
    if conf.get("lock"):
        res["lock"] = conf["lock"]
    if conf.get("template") == "1":
        res["template"] = 1
    if state == "running" and pid:
        res["pid"] = pid
        cg = cgroup_dir(pid)
        if cg:
            usage = _read_int(f"{cg}/memory.usage_in_bytes")
            cache = 0
            with contextlib.suppress(OSError):
                for line in open(f"{cg}/memory.stat"):
                    k, v = line.split()
                    if k == "total_cache":
                        cache = int(v)
            # PVE: mem = usage minus page cache (pve-common CGroup.pm get_memory_stat), cgroup v1 analogue
            res["mem"] = max(0, usage - cache)
            res["swap"] = max(0, _read_int(f"{cg}/memory.memsw.usage_in_bytes") - usage)
        res.update(cgroup_pressure(vmid))
        st = proc_starttime(pid)
        if st is not None:
            hz = os.sysconf("SC_CLK_TCK")
            with open("/proc/uptime") as f:
                up = float(f.read().split()[0])
            res["uptime"] = max(0, int(up - st / hz))
    return res


def list_cts(node: str | None = None) -> list[int]:
    d = conf_dir(node)
    if not os.path.isdir(d):
        return []
    return sorted(int(n[:-5]) for n in os.listdir(d) if re.fullmatch(r"\d+\.conf", n))


# ---------------------------------------------------------------------------------------------
# Translation of the PVE config into a real LXC config (PVE::LXC::update_lxc_config's job)
# ---------------------------------------------------------------------------------------------

IDMAP_BASE = 100000


def rootfs_dir(vmid: int) -> str:
    return f"{LXC_DIR}/{int(vmid)}/rootfs"


def nvidia_dev(path: str) -> bool:
    return os.path.basename(path).startswith("nvidia")


def translate_raw_lxc(key: str, value: str) -> list[tuple[str, str]]:
    """Raw lxc.* keys pass through; lxc.cgroup2.* keys are rewritten for this cgroup v1 host."""
    if key.startswith("lxc.cgroup2."):
        sub = key[len("lxc.cgroup2."):]
        v1 = {"memory.max": "memory.limit_in_bytes", "memory.high": "memory.soft_limit_in_bytes",
              "devices.allow": "devices.allow", "devices.deny": "devices.deny",
              "cpuset.cpus": "cpuset.cpus", "pids.max": "pids.max"}.get(sub)
        if v1 is None:
            return []  # no cgroup v1 equivalent: dropped (documented in docs/lab.md)
        return [(f"lxc.cgroup.{v1}", value)]
    return [(key, value)]


def build_lxc_config(vmid: int, conf: dict) -> str:
    """The real LXC config for a PVE config. Dies like the prestart hook if a devN path is missing."""
    vmid = int(vmid)
    unpriv = conf.get("unprivileged") == "1"
    mem = int(conf.get("memory", 512))
    swap = int(conf.get("swap", 512))
    lines = [
        f"# generated by the inferops lab from {conf_path(vmid)}; do not edit",
        "lxc.arch = amd64",
        "lxc.include = /usr/share/lxc/config/debian.common.conf",
    ]
    if unpriv:
        lines += ["lxc.include = /usr/share/lxc/config/debian.userns.conf",
                  f"lxc.idmap = u 0 {IDMAP_BASE} 65536", f"lxc.idmap = g 0 {IDMAP_BASE} 65536"]
    lines += [
        "lxc.apparmor.profile = unconfined",
        f"lxc.uts.name = {conf.get('hostname', f'CT{vmid}')}",
        f"lxc.rootfs.path = dir:{rootfs_dir(vmid)}",
    ]
    if conf.get("entrypoint") is not None:
        # PVE 9 (pve-container src/PVE/LXC.pm update_lxc_config): `lxc.init.cmd = <entrypoint>`, and a tmpfs on
        # /dev/shm when it is not /sbin/init (no init system to mount one; pve-container 6.1.10)
        lines.append(f"lxc.init.cmd = {conf['entrypoint']}")
        if conf["entrypoint"] != "/sbin/init":
            lines.append("lxc.mount.entry = shm dev/shm tmpfs rw,nosuid,nodev,create=dir 0 0")
    lines += [
        f"lxc.tty.max = {conf.get('tty', 2)}",
        "lxc.signal.halt = SIGRTMIN+4",
        # PVE's cgroup layout (proxmox-lxc.md §2.1): lxc/<vmid> limits, lxc/<vmid>/ns the CT's own tree.
        "lxc.cgroup.relative = 0",
        f"lxc.cgroup.dir.monitor = lxc.monitor/{vmid}",
        f"lxc.cgroup.dir.container = lxc/{vmid}",
        "lxc.cgroup.dir.container.inner = ns",
        # memory/swap (MiB) -> cgroup v1 keys; PVE (v2) writes memory.max and memory.swap.max (§1.6).
        f"lxc.cgroup.memory.limit_in_bytes = {mem * MIB}",
        f"lxc.cgroup.memory.memsw.limit_in_bytes = {(mem + swap) * MIB}",
    ]
    if mem >= 16 * 1024:
        lines.append(f"lxc.cgroup.memory.soft_limit_in_bytes = {(mem - 128) * MIB}")
    if conf.get("cores"):
        ncpu = os.cpu_count() or 1
        lines.append(f"lxc.cgroup.cpuset.cpus = 0-{min(int(conf['cores']), ncpu) - 1}")
    for key in sorted((k for k in conf if re.fullmatch(r"net\d+", k)), key=lambda k: int(k[3:])):
        n = int(key[3:])
        net = parse_net(conf[key])
        lines += [f"lxc.net.{n}.type = veth", f"lxc.net.{n}.veth.pair = veth{vmid}i{n}",
                  f"lxc.net.{n}.name = {net['name']}", f"lxc.net.{n}.flags = up"]
        if net.get("bridge"):
            lines.append(f"lxc.net.{n}.link = {net['bridge']}")
        if net.get("hwaddr"):
            lines.append(f"lxc.net.{n}.hwaddr = {net['hwaddr']}")
        if net.get("ip") and net["ip"] not in ("dhcp", "manual"):
            lines.append(f"lxc.net.{n}.ipv4.address = {net['ip']}")
            if net.get("gw"):
                lines.append(f"lxc.net.{n}.ipv4.gateway = {net['gw']}")
        if net.get("mtu"):
            lines.append(f"lxc.net.{n}.mtu = {net['mtu']}")
    if not any(re.fullmatch(r"net\d+", k) for k in conf):
        lines.append("lxc.net.0.type = empty")
    # PVE 9 writes each `env` variable as `lxc.environment.runtime` (LXC 6); the lab host's LXC 5 has only
    # lxc.environment, which also reaches lxc-attach (docs/lab.md, deviations)
    for variable in (v for v in str(conf.get("env") or "").split("\0") if v):
        lines.append(f"lxc.environment = {variable}")
    devs = [(k, parse_dev(conf[k])) for k in sorted((k for k in conf if re.fullmatch(r"dev\d+", k)),
                                                    key=lambda k: int(k[3:]))]
    has_nvidia = False
    for key, dev in devs:
        path = dev["path"]
        try:  # PVE: the prestart hook stats every devN path at each start (proxmox-lxc.md §1.1)
            st = device_mode_and_rdev(path)
        except PVEError:
            raise PVEError(f"Could not get mode or device ID of {path}") from None
        kind = "c" if stat.S_ISCHR(st.st_mode) else "b"
        perm = "r" if dev.get("deny-write") == "1" else "rw"
        lines.append(f"lxc.cgroup.devices.allow = {kind} {os.major(st.st_rdev)}:{os.minor(st.st_rdev)} {perm}")
        if perm == "r":
            lines.append(f"lxc.cgroup.devices.deny = {kind} {os.major(st.st_rdev)}:{os.minor(st.st_rdev)} w")
        lines.append(f"lxc.mount.entry = {path} {path.lstrip('/')} none bind,create=file 0 0")
        has_nvidia = has_nvidia or nvidia_dev(path)
    # GPUs passed the pre-devN way (raw lxc.mount.entry lines of /dev/nvidia*, the community scripts' way) reach the
    # same global driver as devN ones: the kernel module does not know how a device node came into the container.
    has_nvidia = has_nvidia or any(
        key == "lxc.mount.entry" and value.split() and nvidia_dev(value.split()[0]) and value.split()[0].startswith("/dev/")
        for key, value in conf.get("lxc", []))
    if has_nvidia:
        # The simulated driver is global, like the kernel module (docs/lab.md, GPU driver contract).
        # /run is mounted first so the CT's systemd finds it mounted and keeps the bind below visible.
        os.makedirs(NVIDIA_RUN, exist_ok=True)
        lines += ["lxc.mount.entry = tmpfs run tmpfs rw,nosuid,nodev,mode=755,create=dir 0 0",
                  f"lxc.mount.entry = {NVIDIA_RUN} {NVIDIA_RUN.lstrip('/')} none bind,create=dir 0 0"]
    for key, value in conf.get("lxc", []):
        lines += [f"{k} = {v}" for k, v in translate_raw_lxc(key, value)]
    return "\n".join(lines) + "\n"


def _chown_ct(path: str, unpriv: bool) -> None:
    if unpriv:
        os.lchown(path, IDMAP_BASE, IDMAP_BASE)


def setup_ct_files(vmid: int, conf: dict) -> None:
    """What PVE::LXC::Setup::Debian writes into the CT before start: hostname, hosts, interfaces."""
    root = rootfs_dir(vmid)
    unpriv = conf.get("unprivileged") == "1"
    hostname = conf.get("hostname", f"CT{vmid}")

    def put(rel: str, text: str) -> None:
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if os.path.islink(path):
            os.unlink(path)
        with open(path, "w") as f:
            f.write(text)
        _chown_ct(path, unpriv)

    put("etc/hostname", hostname + "\n")
    put("etc/hosts", f"127.0.0.1 localhost\n::1 localhost ip6-localhost ip6-loopback\n127.0.1.1 {hostname}\n")
    ifaces = ["auto lo", "iface lo inet loopback", ""]
    for key in sorted(k for k in conf if re.fullmatch(r"net\d+", k)):
        net = parse_net(conf[key])
        name = net["name"]
        ip = net.get("ip")
        if ip == "dhcp":
            ifaces += [f"auto {name}", f"iface {name} inet dhcp", ""]
        elif ip and ip != "manual":
            ifaces += [f"auto {name}", f"iface {name} inet static", f"\taddress {ip}"]
            if net.get("gw"):
                ifaces.append(f"\tgateway {net['gw']}")
            ifaces.append("")
    put("etc/network/interfaces", "\n".join(ifaces) + "\n")


def write_lxc_config(vmid: int, conf: dict) -> None:
    text = build_lxc_config(vmid, conf)
    os.makedirs(f"{LXC_DIR}/{int(vmid)}", exist_ok=True)
    with open(f"{LXC_DIR}/{int(vmid)}/config", "w") as f:
        f.write(text)


# ---------------------------------------------------------------------------------------------
# Operations (task bodies). Each takes the Task first.
# ---------------------------------------------------------------------------------------------

def template_path(volid: str) -> str:
    m = re.fullmatch(r"([a-zA-Z0-9\-_.]+):vztmpl/([^/]+)", volid)
    if not m or m.group(1) not in STORAGES:
        raise param_error({"ostemplate": f"unable to parse volume ID '{volid}'"})
    return f"{TMPL_DIR}/{m.group(2)}"


def check_storage_for_ct(sid: str) -> None:
    """create_vm's `$check_and_activate_storage` (pve-storage storage_check_enabled, the rootdir content)."""
    if sid not in STORAGES:
        raise PVEError(f"storage '{sid}' does not exist")
    if "rootdir" not in STORAGES[sid]["content"].split(","):
        raise param_error({"storage": f"storage '{sid}' does not support container directories"})


def rootfs_volume(vmid: int, spec: str) -> str:
    """`<storage>:<size in GiB>` allocates vm-<vmid>-disk-0 (recorded, no size limit enforced: docs/lab.md)."""
    d = parse_prop_string(spec, "volume")
    vol = d.get("volume", "")
    storage, _, size = vol.partition(":")
    if re.fullmatch(r"\d+(\.\d+)?", size):
        check_storage_for_ct(storage)
        name = f"{vmid}/vm-{vmid}-disk-0.raw" if STORAGES[storage]["type"] == "dir" else f"vm-{vmid}-disk-0"
        d["volume"] = f"{storage}:{name}"
        d["size"] = f"{size}G"
    elif storage not in STORAGES and vol.partition(":")[1]:
        raise PVEError(f"storage '{storage}' does not exist")
    return ",".join([d.pop("volume")] + [f"{k}={v}" for k, v in d.items()])


def _extract_template(task: Task, tmpl: str, root: str, unpriv: bool) -> None:
    os.makedirs(root, exist_ok=True)
    task.say(f"extracting archive '{tmpl}'")
    r = subprocess.run(f"zstd -dc '{tmpl}' | tar -C '{root}' --numeric-owner --xattrs -xf -", shell=True,
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise PVEError(f"unable to extract template: {r.stderr.strip()}")
    task.say(f"Total bytes read: {os.path.getsize(tmpl)}")
    if unpriv:  # shift the ownership into the CT's idmap (PVE extracts with lxc-usernsexec)
        for dirpath, dirnames, filenames in os.walk(root):
            for name in [dirpath] + [os.path.join(dirpath, n) for n in dirnames + filenames]:
                st = os.lstat(name)
                if st.st_uid < IDMAP_BASE:
                    mode = stat.S_IMODE(st.st_mode)
                    os.lchown(name, st.st_uid + IDMAP_BASE, st.st_gid + IDMAP_BASE)
                    if not stat.S_ISLNK(st.st_mode) and mode & 0o6000:
                        os.chmod(name, mode)  # chown clears setuid/setgid bits


def do_create(task: Task, vmid: int, params: dict, tmpl: str) -> None:
    vmid = int(vmid)
    conf = load_config(vmid)
    unpriv = conf.get("unprivileged") == "1"
    root = rootfs_dir(vmid)
    try:
        if os.path.exists(f"{LXC_DIR}/{vmid}"):
            shutil.rmtree(f"{LXC_DIR}/{vmid}")
        _extract_template(task, tmpl, root, unpriv)
        hostname = conf.get("hostname", f"CT{vmid}")
        task.say("Creating SSH host key 'ssh_host_ed25519_key' - this may take some time ...")
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"root@{hostname}", "-f",
                        f"{root}/etc/ssh/ssh_host_ed25519_key"], check=True, capture_output=True)
        for suffix in ("", ".pub"):
            _chown_ct(f"{root}/etc/ssh/ssh_host_ed25519_key{suffix}", unpriv)
        with open(f"{root}/etc/machine-id", "w") as f:
            f.write(os.urandom(16).hex() + "\n")
        if params.get("ssh-public-keys"):
            os.makedirs(f"{root}/root/.ssh", mode=0o700, exist_ok=True)
            with open(f"{root}/root/.ssh/authorized_keys", "w") as f:
                f.write(params["ssh-public-keys"].rstrip("\n") + "\n")
            for p in (f"{root}/root/.ssh", f"{root}/root/.ssh/authorized_keys"):
                _chown_ct(p, unpriv)
        if params.get("password"):
            subprocess.run(["chpasswd", "-R", root], input=f"root:{params['password']}\n", text=True,
                           check=True, capture_output=True)
        setup_ct_files(vmid, conf)
        with config_lock(vmid):
            conf = load_config(vmid)
            conf.pop("lock", None)
            write_config(vmid, conf)
    except Exception:
        # PVE removes the config of a failed create
        with contextlib.suppress(OSError):
            os.unlink(conf_path(vmid))
        write_vmlist()
        shutil.rmtree(f"{LXC_DIR}/{vmid}", ignore_errors=True)
        raise
    if params.get("start") in ("1", 1, True, "true"):
        do_start(task, vmid, False)


def cleanup_cgroups(vmid: int) -> None:
    """Removes empty cgroups a stopped or failed CT left behind (with fixed cgroup dirs, LXC refuses to
    start when lxc.monitor/<vmid> still exists)."""
    base = "/sys/fs/cgroup"
    for hier in os.listdir(base):
        for top in (f"lxc/{vmid}", f"lxc.monitor/{vmid}", f"lxc.pivot/{vmid}"):
            root = os.path.join(base, hier, top)
            if not os.path.isdir(root) or os.path.islink(os.path.join(base, hier)):
                continue
            for dirpath, _dirs, _files in sorted(os.walk(root), key=lambda e: -e[0].count("/")):
                with contextlib.suppress(OSError):
                    os.rmdir(dirpath)


def _start_container(task: Task, vmid: int, conf: dict) -> None:
    cleanup_cgroups(vmid)
    write_lxc_config(vmid, conf)  # dies "Could not get mode or device ID of ..." like the prestart hook
    setup_ct_files(vmid, conf)
    os.makedirs("/var/log/lxc", exist_ok=True)
    r = subprocess.run(["lxc-start", "-n", str(vmid), "-d", "-o", f"/var/log/lxc/{vmid}.log", "-l", "INFO"],
                       capture_output=True, text=True)
    ok = r.returncode == 0 and subprocess.run(["lxc-wait", "-n", str(vmid), "-s", "RUNNING", "-t", "15"],
                                              capture_output=True).returncode == 0
    if not ok:
        for line in (r.stderr or "").splitlines():
            task.say(line)
        raise PVEError(f"startup for container '{vmid}' failed")


def do_start(task: Task, vmid: int, skiplock: bool) -> None:
    vmid = int(vmid)
    with config_lock(vmid):
        conf = load_config(vmid)
        if not skiplock:
            check_lock(conf)
        if is_running(vmid):
            raise PVEError(f"CT {vmid} already running")
        try:
            _start_container(task, vmid, conf)
        except PVEError as e:
            if e.msg.startswith("Could not get mode"):
                task.say(f"{e.msg}")
                raise PVEError(f"startup for container '{vmid}' failed") from None
            raise


def _lxc_stop(vmid: int, args: list[str]) -> int:
    return subprocess.run(["lxc-stop", "-n", str(vmid)] + args, capture_output=True).returncode


def stop_outcome(vmid: int, cmd: list[str], rc: int, still_running: bool) -> tuple[list[str], str | None]:
    """PVE::LXC::vm_stop after `lxc-stop`: a failed command is a warning in the task log (run_command's
    `command '...' failed: exit code N`); a container still running afterwards fails the task with
    `container did not stop`. Returns (log lines, error or None)."""
    log = []
    if rc != 0:
        log.append(f"command '{' '.join(cmd)}' failed: exit code {rc}")
    return log, ("container did not stop" if still_running else None)


def do_stop(task: Task, vmid: int, skiplock: bool) -> None:
    vmid = int(vmid)
    with config_lock(vmid):
        conf = load_config(vmid)
        # vm_stop's worker: a `mounted` lock does not block a stop
        if not skiplock and conf.get("lock") != "mounted":
            check_lock(conf)
    if not is_running(vmid):
        raise PVEError(f"CT {vmid} not running")
    cmd = ["lxc-stop", "-n", str(vmid), "--kill"]
    rc = _lxc_stop(vmid, ["--kill"])
    # PVE waits for the monitor to close the command socket; the lab waits up to 30 s for STOPPED.
    subprocess.run(["lxc-wait", "-n", str(vmid), "-s", "STOPPED", "-t", "30"], capture_output=True)
    # A CT whose init is gone but whose namespace cannot end (a task in D state) is STOPPING, not
    # STOPPED: PVE's vm_stop would still see the monitor's socket open. Anything but STOPPED is a failure.
    log, error = stop_outcome(vmid, cmd, rc, lxc_raw_state(vmid) != "STOPPED")
    for line in log:
        task.say(line)
    if error:
        raise PVEError(error)


def do_shutdown(task: Task, vmid: int, timeout: int, force: bool) -> None:
    vmid = int(vmid)
    with config_lock(vmid):
        check_lock(load_config(vmid))
    if not is_running(vmid):
        raise PVEError(f"CT {vmid} not running")
    args = ["--timeout", str(int(timeout))]
    if not force:
        args.append("--nokill")
    _lxc_stop(vmid, args)
    if is_running(vmid):
        if force:
            _lxc_stop(vmid, ["--kill"])
        else:
            raise PVEError("container did not stop")


def do_reboot(task: Task, vmid: int, timeout: int | None) -> None:
    vmid = int(vmid)
    with config_lock(vmid):
        check_lock(load_config(vmid))
    if not is_running(vmid):
        raise PVEError(f"CT {vmid} not running")
    _lxc_stop(vmid, ["--timeout", str(int(timeout or 60))])
    if is_running(vmid):
        _lxc_stop(vmid, ["--kill"])
    do_start(task, vmid, False)


def do_destroy(task: Task, vmid: int, purge: bool, force: bool) -> None:
    vmid = int(vmid)
    with config_lock(vmid):
        conf = load_config(vmid)
        check_lock(conf)
        if conf.get("protection") == "1":
            raise PVEError("can't remove CT - protection mode enabled")
        if is_running(vmid):
            if not force:
                raise PVEError(f"CT {vmid} is running - destroy failed")
            _lxc_stop(vmid, ["--kill"])
        task.say(f"destroying CT {vmid}")
        subprocess.run(["lxc-destroy", "-n", str(vmid)], capture_output=True)
        shutil.rmtree(f"{LXC_DIR}/{vmid}", ignore_errors=True)
        os.unlink(conf_path(vmid))
        write_vmlist()


TASK_FUNCS = {"create": do_create, "start": do_start, "stop": do_stop, "shutdown": do_shutdown,
              "reboot": do_reboot, "destroy": do_destroy}


# ---------------------------------------------------------------------------------------------
# Synchronous API operations
# ---------------------------------------------------------------------------------------------

def create_ct(vmid, params: dict, user: str) -> tuple:
    """Validates and writes the config (lock: create); returns the task spec to run."""
    try:
        vmid = int(vmid)
        assert 100 <= vmid <= 999999999
    except (TypeError, ValueError, AssertionError):
        raise param_error({"vmid": "invalid format - value does not look like a valid VM ID"}) from None
    check_cfs_quorum()  # create_vm's first step
    params = dict(params)
    tmpl_volid = params.pop("ostemplate", None)
    if not tmpl_volid:
        raise param_error({"ostemplate": "property is missing and it is not optional"})
    # create_vm's parameters besides the config options (pve-container API2/LXC.pm, PVE's schema); api.py
    # has already dropped the ones the lab does not simulate when they have their default (501 otherwise).
    extra = ("password", "ssh-public-keys", "start", "storage", "node", "vmid")
    opts = validate_options(params, allowed_extra=extra, method=CREATE_METHOD)
    leftover = sorted(k for k in params if k not in extra and option_checker(k) is None)
    if leftover:
        raise PVEError(f"lab: parameter '{leftover[0]}' is not simulated by the lab", 501)
    # PVE 9 create_vm (pve-container 6.0.6, src/PVE/API2/LXC.pm ~270): `$unprivileged = 1 if !defined(...)`
    # (8.x: 0), and a privileged container needs Sys.Modify on / before anything else is checked; the config
    # holds `unprivileged: 1` only when set (`$conf->{unprivileged} = 1 if $unprivileged`)
    unpriv = opts.pop("unprivileged", "1")
    if unpriv == "1":
        opts["unprivileged"] = "1"
    else:
        check_perm(user, "/", ["Sys.Modify"])
    check_vmid_unused(vmid)  # create_vm (not a restore): the cluster's VMID list, any node
    check_vm_perm(user, vmid, ["VM.Allocate"])  # create_vm: VM.Allocate on /vms/{vmid}
    check_modify_perm(user, vmid, None, opts, [], unpriv)
    tmpl = template_path(tmpl_volid)
    if not os.path.isfile(tmpl):
        raise PVEError(f"volume '{tmpl_volid}' does not exist")
    for key in (k for k in opts if re.fullmatch(r"dev\d+", k)):
        device_mode_and_rdev(parse_dev(opts[key])["path"])
    # create_vm: `my $storage = extract_param($param, 'storage') // 'local'`; a bare number as rootfs/mpN is a
    # size on that storage (`$storage:$value`); without rootfs: `$storage:4` ("defaults to 4GB"), once the
    # default storage passed `$check_and_activate_storage`; mount points without rootfs are refused.
    storage = params.get("storage") or "local"
    for key in [k for k in opts if k == "rootfs" or re.fullmatch(r"mp\d+", k)]:
        if re.fullmatch(r"\d+(\.\d+)?", opts[key]):
            opts[key] = f"{storage}:{opts[key]}"
    if "rootfs" not in opts:
        if any(re.fullmatch(r"mp\d+", k) for k in opts):
            raise PVEError("mount points configured, but 'rootfs' not set - aborting")
        check_storage_for_ct(storage)
        opts["rootfs"] = f"{storage}:4"
    # the defaults create_vm sets (`$conf->{hostname} ||= "CT$vmid"; memory ||= 512; swap //= 512`); arch and
    # ostype are what PVE::LXC::Setup detects in the lab's Debian amd64 template
    if not opts.get("hostname"):
        opts["hostname"] = f"CT{vmid}"
    if not opts.get("memory") or opts["memory"] == "0":
        opts["memory"] = "512"
    opts.setdefault("swap", "512")
    opts.setdefault("arch", "amd64")
    opts.setdefault("ostype", "debian")
    opts["rootfs"] = rootfs_volume(vmid, opts["rootfs"])
    with config_lock(vmid):
        if ct_exists(vmid) or vmlist().get(vmid, NODE) != NODE:
            raise PVEError(f"unable to create CT {vmid} - CT {vmid} already exists on node "
                           f"'{vmlist().get(vmid, NODE)}'")
        conf = dict(opts)
        conf["lock"] = "create"
        conf["lxc"] = []
        write_config(vmid, conf)
    keep = {k: params[k] for k in ("password", "ssh-public-keys", "start") if k in params}
    return "vzcreate", vmid, "create", [vmid, keep, tmpl]


# PVE::LXC::Config::update_pct_config: options that cannot be deleted / changed
REQUIRED_OPTIONS = ("memory", "rootfs", "ostype")
READ_ONLY_OPTIONS = ("unprivileged",)


def split_list(value) -> list[str]:
    """PVE::Tools::split_list: separators are commas, semicolons and whitespace."""
    return [k for k in re.split(r"[,;\s]+", str(value or "")) if k]


def check_update_params(params: dict) -> tuple[dict, list[str], list[str], str | None]:
    """update_vm's parameter checks that need no config: PVE's schema (additionalProperties 0, so `skiplock`
    and unknown keys are 400 errors; types, formats, enums, ranges), `no options specified`, and the
    delete/revert lists. Returns (options, delete, revert, digest)."""
    params = dict(params)
    opts = validate_options(params)
    params.pop("node", None)
    params.pop("vmid", None)
    digest = params.pop("digest", None)
    if not params:
        raise PVEError("no options specified")
    delete = split_list(params.pop("delete", ""))
    revert = split_list(params.pop("revert", ""))
    for opt in revert:
        if option_checker(opt) is None:
            raise param_error({"revert": f"unknown option '{opt}'"})
        if opt in opts:
            raise param_error({"revert": f"you can't use '-{opt}' and '-revert {opt}' at the same time"})
    for opt in delete:
        if option_checker(opt) is None:
            raise param_error({"delete": f"unknown option '{opt}'"})
        if opt in opts:
            raise param_error({"delete": f"you can't use '-{opt}' and -delete {opt}' at the same time"})
        if opt in revert:
            raise param_error({"delete": f"you can't use '-delete {opt}' and '-revert {opt}' at the same time"})
    return opts, delete, revert, digest


def plan_update(conf: dict, opts: dict, delete: list[str]) -> tuple[list[str], list[str]]:
    """PVE::LXC::Config::update_pct_config's checks, in its order: each deleted option (not set: a
    warning and skipped; memory/rootfs/ostype: `unable to delete required option`; unprivileged:
    `unable to delete read-only option`), then each set option
    (unprivileged: `unable to modify read-only option`). Returns (keys to delete, warnings)."""
    warnings, to_delete = [], []
    for opt in delete:
        if conf.get(opt) is None:
            warnings.append(f"cannot delete '{opt}' - not set in current configuration!")
            continue
        if opt in REQUIRED_OPTIONS:
            raise PVEError(f"unable to delete required option '{opt}'")
        if opt in READ_ONLY_OPTIONS:
            raise PVEError(f"unable to delete read-only option: '{opt}'")
        to_delete.append(opt)
    for opt in sorted(opts):
        if opt in READ_ONLY_OPTIONS:
            raise PVEError(f"unable to modify read-only option: '{opt}'")
    return to_delete, warnings


def update_config(vmid, params: dict, user: str, cfg: dict | None = None) -> list[str]:
    """PUT /config (synchronous), in update_vm's order: schema, lock, digest, permissions, delete list,
    update_pct_config. Returns the warnings PVE prints (`cannot delete ... not set`)."""
    vmid = int(vmid)
    opts, delete, revert, digest = check_update_params(params)
    check_vm_perm(user, vmid, VM_CONFIG_PERM_LIST, cfg, any_=True)  # the handler's permission check
    with config_lock(vmid):
        conf = load_config(vmid)
        check_lock(conf)
        # PVE::Tools::assert_if_modified
        if digest and digest != conf["digest"]:
            raise PVEError("detected modified configuration - file changed by other user? Try again.")
        unpriv = conf.get("unprivileged")
        check_modify_perm(user, vmid, conf, {}, delete, unpriv, cfg)
        check_modify_perm(user, vmid, conf, {}, revert, unpriv, cfg)
        check_modify_perm(user, vmid, conf, opts, [], unpriv, cfg)
        # revert: the lab writes every change at once, so there is no pending value to drop (update_vm
        # deletes `$conf->{pending}->{$opt}` for each; without a [pending] section that changes nothing)
        to_delete, warnings = plan_update(conf, opts, delete)
        for key in (k for k in opts if re.fullmatch(r"dev\d+", k)):
            device_mode_and_rdev(parse_dev(opts[key])["path"])
        for key in to_delete:
            conf.pop(key, None)
        conf.update(opts)
        conf.pop("digest", None)
        running = is_running(vmid)
        write_config(vmid, conf)
        if running and ({"memory", "swap"} & (set(opts) | set(to_delete))):
            hotplug_memory(vmid, conf)
    return warnings


def hotplug_memory(vmid: int, conf: dict) -> None:
    """PVE writes memory.max / memory.swap.max on a running CT; the lab writes the v1 equivalents."""
    _, pid = lxc_info(vmid)
    cg = cgroup_dir(pid) if pid else None
    if not cg:
        return
    mem = int(conf.get("memory", 512)) * MIB
    memsw = mem + int(conf.get("swap", 512)) * MIB
    order = ["memory.memsw.limit_in_bytes", "memory.limit_in_bytes"]
    if mem < _read_int(f"{cg}/memory.limit_in_bytes"):
        order.reverse()  # v1 requires limit <= memsw at every step
    for name in order:
        value = memsw if "memsw" in name else mem
        try:
            with open(f"{cg}/{name}", "w") as f:
                f.write(str(value))
        except OSError as e:
            raise PVEError(f"unable to hotplug memory: {name}: {e.strerror}") from None


# PVE 9 (pve-container src/PVE/LXC.pm delete_read_restricted_options, 9ec1a04 "censor env property for users
# without VM.Config.Options"): GET config and GET pending leave these out for a user without the privilege.
READ_RESTRICTED = {"env": "VM.Config.Options"}


def delete_read_restricted(conf: dict, user: str | None, vmid) -> dict:
    for key, priv in READ_RESTRICTED.items():
        if key in conf and user and priv not in permissions(user, f"/vms/{int(vmid)}"):
            del conf[key]
    return conf


def get_config(vmid, user: str | None = None) -> dict:
    conf = delete_read_restricted(load_config(int(vmid)), user, vmid)
    res = {k: v for k, v in conf.items() if k not in ("lxc", "_rest")}
    for k in ("memory", "swap", "cores", "tty", "cpuunits"):
        if k in res and str(res[k]).isdigit():
            res[k] = int(res[k])
    for k in ("onboot", "unprivileged", "protection", "console", "template"):
        if k in res:
            res[k] = int(res[k])
    if conf["lxc"]:
        res["lxc"] = [[k, v] for k, v in conf["lxc"]]
    return res


def config_with_pending_array(conf: dict, pending: dict | None = None, pending_delete: dict | None = None) -> list:
    """PVE::GuestHelpers::config_with_pending_array (pve-guest-common): one entry per current option
    {key, value} (digest included, raw lxc.* keys left out), plus `pending` when a new value waits and
    `delete` (1, or 2 when forced) when a deletion waits; then pending-only and delete-only entries."""
    pending = dict(pending or {})
    pending_delete = dict(pending_delete or {})
    res = []
    for opt, value in conf.items():
        if opt in ("lxc", "_rest", "pending", "snapshots") or isinstance(value, (list, dict)):
            continue
        item = {"key": opt, "value": value}
        if pending.get(opt) is not None:
            item["pending"] = pending.pop(opt)
        if opt in pending_delete:
            item["delete"] = 2 if pending_delete.pop(opt) else 1
        res.append(item)
    for opt, value in pending.items():
        if opt != "delete":
            res.append({"key": opt, "pending": value})
    for opt, force in pending_delete.items():
        res.append({"key": opt, "delete": 2 if force else 1})
    return res


def get_pending(vmid, user: str | None = None) -> list:
    """GET /pending. The lab writes every change at once (no [pending] section), so no entry carries
    `pending` or `delete`; values are typed as GET /config returns them (PVE's parser runs check_type on
    each value, so integers and booleans are JSON numbers), digest included."""
    return config_with_pending_array(get_config(int(vmid), user))


def unlock(vmid) -> None:
    vmid = int(vmid)
    with config_lock(vmid):
        conf = load_config(vmid)
        conf.pop("lock", None)
        conf.pop("digest", None)
        write_config(vmid, conf)


def node_status() -> dict:
    mi = {}
    with open("/proc/meminfo") as f:
        for line in f:
            k, v = line.split(":", 1)
            mi[k] = int(v.split()[0]) * 1024
    with open("/proc/loadavg") as f:
        load = f.read().split()[:3]
    with open("/proc/uptime") as f:
        uptime = int(float(f.read().split()[0]))
    u = os.uname()
    total = mi["MemTotal"]
    avail = mi.get("MemAvailable", mi["MemFree"])
    return {
        "memory": {"total": total, "used": total - avail, "free": avail, "available": avail},
        "swap": {"total": mi.get("SwapTotal", 0), "free": mi.get("SwapFree", 0),
                 "used": mi.get("SwapTotal", 0) - mi.get("SwapFree", 0)},
        "uptime": uptime, "loadavg": load, "cpu": node_cpu_fraction(),
        "cpuinfo": {"cpus": os.cpu_count(), "cores": os.cpu_count(), "sockets": 1, "model": "lab"},
        "kversion": f"{u.sysname} {u.release} {u.version}", "pveversion": f"pve-manager/{PVE_VERSION['version']}/{PVE_VERSION['repoid']}",
        "rootfs": {"total": shutil.disk_usage("/").total, "used": shutil.disk_usage("/").used,
                   "free": shutil.disk_usage("/").free},
    }


def node_cpu_fraction() -> float:
    """The node's CPU use since boot as a fraction (PVE's `cpu` is the rrd's recent fraction; the lab has no
    rrd, so the average since boot stands in for it)."""
    with open("/proc/stat") as f:
        vals = [int(v) for v in f.readline().split()[1:]]
    total = sum(vals[:8]) or 1
    return round(1 - (vals[3] + vals[4]) / total, 4)


def _storage_usage(sid: str) -> dict:
    path = STORAGES[sid]["path"]
    os.makedirs(path, exist_ok=True)
    du = shutil.disk_usage(path)
    return {"total": du.total, "used": du.used, "avail": du.free}


def storage_digest() -> str:
    """The digest of storage.cfg (a SHA1 of the file); the lab renders its STORAGES as storage.cfg lines."""
    text = "".join(f"{v['type']}: {k}\n\tpath {v['path']}\n\tcontent {v['content']}\n\n" for k, v in STORAGES.items())
    return hashlib.sha1(text.encode()).hexdigest()


def storage_config(sid: str) -> dict:
    """GET /storage/{storage} (pve-storage src/PVE/API2/Storage/Config.pm `$api_storage_config`): the section
    with `storage`, `digest` and `content` as a string; an unknown ID: `storage '<id>' does not exist`."""
    if sid not in STORAGES:
        raise PVEError(f"storage '{sid}' does not exist")
    v = STORAGES[sid]
    res = {"storage": sid, "type": v["type"], "content": v["content"], "digest": storage_digest()}
    if v["type"] == "dir":
        res["path"] = v["path"]
    else:
        res.update(vgname="pve", thinpool="data")  # the lab keeps an lvmthin storage in a directory
    return res


def node_storage_list(p: dict) -> list:
    """GET /nodes/{node}/storage (pve-storage src/PVE/API2/Storage/Status.pm index): storages supporting any of
    `content`, only `storage`, `enabled`; `target` = this node or localhost is no target (501 otherwise)."""
    target = p.get("target")
    if target and target not in (NODE, "localhost"):
        raise PVEError("lab: parameter 'target' is not simulated by the lab (only this node)", 501)
    wanted = set(apischema.split_list(p.get("content")))
    if p.get("storage") and p["storage"] not in STORAGES:
        raise param_error({"storage": "No such storage."})
    res = []
    for sid, v in sorted(STORAGES.items()):
        content = set(v["content"].split(","))
        if wanted and not wanted & content or p.get("storage") and p["storage"] != sid:
            continue
        u = _storage_usage(sid)
        res.append({"storage": sid, "type": v["type"], "content": v["content"], "active": 1, "enabled": 1,
                    "shared": 0, **u, "used_fraction": u["used"] / u["total"] if u["total"] else 0})
    return res


def storage_content(sid: str, content: str | None, vmid) -> list:
    """GET /nodes/{node}/storage/{storage}/content: templates of `local` (vztmpl) and the CTs' root volumes
    (rootdir); `content` and `vmid` filter (a template belongs to no guest)."""
    if sid not in STORAGES:
        raise PVEError(f"storage '{sid}' does not exist")
    res = []
    if sid == "local":
        res += template_list()
    for ct in list_cts():
        with contextlib.suppress(PVEError):
            rootfs = load_config(ct).get("rootfs", "")
            d = parse_prop_string(rootfs, "volume")
            if d.get("volume", "").startswith(f"{sid}:"):
                size = apischema.parse_size(d.get("size", "0")) or 0
                res.append({"volid": d["volume"], "content": "rootdir", "vmid": ct, "size": size,
                            "format": "raw", "ctime": int(os.path.getmtime(conf_path(ct)))})
    if content:
        res = [r for r in res if r["content"] == content]
    if vmid:
        res = [r for r in res if str(r.get("vmid", "")) == str(vmid)]
    return res


def node_network(type_filter: str | None) -> list:
    """GET /nodes/{node}/network (pve-manager PVE/API2/Network.pm index): the simulated node's interfaces are
    its bridge vmbr0 (docs/lab.md, "Network"); `type` keeps those of the type, any_bridge and any_local_bridge
    the bridges."""
    addr, bits = BRIDGE_ADDR.split("/")
    iface = {"iface": BRIDGE, "type": "bridge", "method": "static", "families": ["inet"], "autostart": 1,
             "active": 1 if os.path.isdir(f"/sys/class/net/{BRIDGE}") else 0, "exists": 1,
             "address": addr, "netmask": bits, "cidr": BRIDGE_ADDR, "bridge_ports": "", "bridge_stp": "off",
             "bridge_fd": "0", "priority": 1}
    if type_filter and not (type_filter == "bridge" or re.fullmatch(r"any(_local)?_bridge", type_filter)):
        return []
    return [iface]


def cluster_status() -> list:
    """GET /cluster/status (pve-manager PVE/API2/Cluster.pm get_status): with a cluster, its entry (`nodes`,
    `version`, `name`, `quorate`) and one per member (`nodeid`, `local`, `online`, `ip`, `level` when online);
    without one, the "fake entry for local node if no cluster defined"."""
    nodes = cluster_nodes()
    if not nodes:
        return [{"type": "node", "id": f"node/{NODE}", "name": NODE, "ip": NODE_ADDRESSES[NODE], "local": 1,
                 "nodeid": 0, "online": 1, "level": ""}]
    res = [{"type": "cluster", "id": "cluster", "nodes": len(nodes), "version": len(nodes), "name": CLUSTER_NAME,
            "quorate": 1 if is_quorate() else 0}]
    for n in nodes:
        online = node_online(n["name"])
        entry = {"type": "node", "id": f"node/{n['name']}", "name": n["name"], "nodeid": n["nodeid"],
                 "local": 1 if n["name"] == NODE else 0, "online": 1 if online else 0, "ip": n["ip"]}
        if online:
            entry["level"] = ""
        res.append(entry)
    return res


def node_names() -> list[str]:
    """The cluster's nodes, or this node without a cluster."""
    return [n["name"] for n in cluster_nodes()] or [NODE]


def node_entry(node: str) -> dict:
    """pve-manager PVE/API2Tools.pm extract_node_stats: the stats of an online node, `status offline` and only
    the maxima for a member that is not online. All lab nodes share this machine's memory, CPUs and disk."""
    ns = node_status()
    entry = {"id": f"node/{node}", "node": node, "type": "node", "status": "online", "level": "",
             "maxcpu": ns["cpuinfo"]["cpus"], "maxmem": ns["memory"]["total"], "maxdisk": ns["rootfs"]["total"]}
    if node_online(node):
        entry.update(uptime=ns["uptime"], cpu=ns["cpu"], mem=ns["memory"]["used"], disk=ns["rootfs"]["used"])
    else:
        entry["status"] = "offline"
    return entry


def cluster_resources(type_filter: str | None) -> list:
    """GET /cluster/resources (pve-manager PVE/API2/Cluster.pm resources; PVE/API2Tools.pm extract_vm_stats,
    extract_node_stats, extract_storage_stats): the guests of every node (the cluster's VMID list), then the
    nodes, then each node's storages."""
    res = []
    if type_filter in (None, "", "vm"):
        for vmid, node in sorted(vmlist().items()):
            if node not in node_names():
                continue
            try:
                st = vm_status(vmid, node)
            except PVEError:  # removed meanwhile
                continue
            entry = {"id": f"lxc/{vmid}", "vmid": vmid, "node": node, "type": "lxc", "status": st["status"],
                     "uptime": st["uptime"], "name": st["name"], "template": st.get("template", 0),
                     "maxcpu": st["cpus"], "cpu": st["cpu"], "maxmem": st["maxmem"], "mem": st["mem"],
                     "maxdisk": st["maxdisk"], "disk": st["disk"], "netin": st["netin"], "netout": st["netout"],
                     "diskread": st["diskread"], "diskwrite": st["diskwrite"]}
            if st.get("tags"):
                entry["tags"] = st["tags"]
            if st.get("lock"):
                entry["lock"] = st["lock"]
            res.append(entry)
    if type_filter in (None, "", "node"):
        for node in node_names():
            entry = node_entry(node)
            if entry["status"] == "online":
                entry["cgroup-mode"] = 1
            res.append(entry)
    if type_filter in (None, "", "storage"):
        for node in node_names():
            for sid, v in sorted(STORAGES.items()):
                u = _storage_usage(sid)
                entry = {"id": f"storage/{node}/{sid}", "storage": sid, "node": node, "type": "storage",
                         "plugintype": v["type"], "status": "available", "shared": 0, "content": v["content"],
                         "maxdisk": u["total"], "disk": u["used"]}
                if not node_online(node):
                    entry = {k: entry[k] for k in ("id", "storage", "node", "type", "plugintype", "shared",
                                                   "content")}
                    entry["status"] = "unknown"
                res.append(entry)
    return res


def snapshot_list(vmid) -> list:
    """GET /nodes/{node}/lxc/{vmid}/snapshot (pve-container src/PVE/API2/LXC/Snapshot.pm list): the lab's CTs
    have no snapshots (taking one is not simulated), so only `current`."""
    conf = load_config(int(vmid))
    return [{"name": "current", "digest": conf["digest"], "running": 1 if is_running(int(vmid)) else 0,
             "description": "You are here!"}]


def ct_interfaces(vmid):
    """GET /nodes/{node}/lxc/{vmid}/interfaces (pve-container src/PVE/LXC.pm get_interfaces): `ip --json a` in the
    CT's network namespace; null for a stopped CT."""
    load_config(int(vmid))
    state, pid = lxc_info(int(vmid))
    if state != "running" or not pid:
        return None
    r = subprocess.run(["nsenter", "-t", str(pid), "--net", "--", "ip", "--json", "a"], capture_output=True,
                       text=True)
    if r.returncode != 0:
        raise PVEError(f"command 'nsenter -t {pid} --net -- ip --json a' failed: exit code {r.returncode}")
    res = []
    for itf in json.loads(r.stdout or "[]"):
        obj = {"name": itf["ifname"]}
        addrs = []
        for ip in itf.get("addr_info", []):
            obj[ip["family"]] = f"{ip['local']}/{ip['prefixlen']}"
            addrs.append({"ip-address-type": ip["family"], "ip-address": ip["local"], "prefix": ip["prefixlen"]})
        obj["ip-addresses"] = addrs
        obj["hardware-address"] = itf.get("address")
        obj["hwaddr"] = itf.get("address")
        res.append(obj)
    return res


def template_list() -> list:
    res = []
    if os.path.isdir(TMPL_DIR):
        for name in sorted(os.listdir(TMPL_DIR)):
            if name.endswith((".tar.zst", ".tar.gz", ".tar.xz")):
                p = f"{TMPL_DIR}/{name}"
                res.append({"volid": f"local:vztmpl/{name}", "content": "vztmpl", "format": name.split(".", 1)[1],
                            "size": os.path.getsize(p), "ctime": int(os.path.getmtime(p))})
    return res


def main(argv: list[str]) -> int:
    if len(argv) >= 2 and argv[0] == "worker":
        return worker_main(json.loads(argv[1]))
    print("usage: labctl task-worker JSON", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
