"""Users, API tokens and privileges (pve-access-control src/PVE/RPCEnvironment.pm).

Part of the simulated PVE node (tests/lab/pve/__init__.py).
"""
from __future__ import annotations

import json
import re

from pve import ctoptions, pvenode


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
ACCESS_FILE = f"{pvenode.LAB}/access.json"
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
            raise pvenode.perm_error(f"{path}, " + "|".join(privs))
        return
    for priv in privs:
        if priv not in have:
            raise pvenode.perm_error(f"{path}, {priv}")


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
        features = ctoptions.parse_features(newvalue)
        if oldconf is not None and oldconf.get("features"):
            old = ctoptions.parse_features(oldconf["features"])
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
        features = ctoptions.parse_features((oldconf or {}).get("features"))
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
                raise pvenode.perm_error(f"mount point type {kind} is only allowed for root@pam")
        elif opt in ("memory", "swap"):
            check_vm_perm(user, vmid, ["VM.Config.Memory"], cfg)
        elif re.fullmatch(r"net\d+", opt):
            check_vm_perm(user, vmid, ["VM.Config.Network"], cfg)
        elif re.fullmatch(r"dev\d+", opt):
            raise pvenode.perm_error("configuring device passthrough is only allowed for root@pam")
        elif opt in ("nameserver", "searchdomain", "hostname"):
            check_vm_perm(user, vmid, ["VM.Config.Network"], cfg)
        elif opt == "features":
            if not unpriv:
                raise pvenode.perm_error("changing feature flags for privileged container is only allowed for root@pam")
            nesting_changed, other_changed = features_changed(oldconf, newconf.get(opt), is_delete)
            if other_changed:
                raise pvenode.perm_error("changing feature flags (except nesting) is only allowed for root@pam")
            if nesting_changed:
                check_vm_perm(user, vmid, ["VM.Allocate"], cfg)
        elif opt == "hookscript":
            raise pvenode.perm_error("changing the hookscript is only allowed for root@pam")
        else:  # tags included (assert_tag_permissions starts with VM.Config.Options)
            check_vm_perm(user, vmid, ["VM.Config.Options"], cfg)

    for opt in newconf:
        check(opt, False)
    for opt in delete:
        check(opt, True)
