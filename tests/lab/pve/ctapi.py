"""Synchronous API operations on a container: create, config update and hotplug, config and pending reads, unlock.

Part of the simulated PVE node (tests/lab/pve/__init__.py).
"""
from __future__ import annotations

import os
import re

from pve import access, ctconfig, ctoptions, ctstate, pvecluster, pvenode, taskops


def create_ct(vmid, params: dict, user: str) -> tuple:
    """Validates and writes the config (lock: create); returns the task spec to run."""
    try:
        vmid = int(vmid)
        assert 100 <= vmid <= 999999999
    except (TypeError, ValueError, AssertionError):
        raise pvenode.param_error({"vmid": "invalid format - value does not look like a valid VM ID"}) from None
    pvecluster.check_cfs_quorum()  # create_vm's first step
    params = dict(params)
    tmpl_volid = params.pop("ostemplate", None)
    if not tmpl_volid:
        raise pvenode.param_error({"ostemplate": "property is missing and it is not optional"})
    # create_vm's parameters besides the config options (pve-container API2/LXC.pm, PVE's schema); api.py
    # has already dropped the ones the lab does not simulate when they have their default (501 otherwise).
    extra = ("password", "ssh-public-keys", "start", "storage", "node", "vmid")
    opts = ctoptions.validate_options(params, allowed_extra=extra, method=ctoptions.CREATE_METHOD)
    leftover = sorted(k for k in params if k not in extra and ctoptions.option_checker(k) is None)
    if leftover:
        raise pvenode.PVEError(f"lab: parameter '{leftover[0]}' is not simulated by the lab", 501)
    # PVE 9 create_vm (pve-container 6.0.6, src/PVE/API2/LXC.pm ~270): `$unprivileged = 1 if !defined(...)`
    # (8.x: 0), and a privileged container needs Sys.Modify on / before anything else is checked; the config
    # holds `unprivileged: 1` only when set (`$conf->{unprivileged} = 1 if $unprivileged`)
    unpriv = opts.pop("unprivileged", "1")
    if unpriv == "1":
        opts["unprivileged"] = "1"
    else:
        access.check_perm(user, "/", ["Sys.Modify"])
    pvecluster.check_vmid_unused(vmid)  # create_vm (not a restore): the cluster's VMID list, any node
    access.check_vm_perm(user, vmid, ["VM.Allocate"])  # create_vm: VM.Allocate on /vms/{vmid}
    access.check_modify_perm(user, vmid, None, opts, [], unpriv)
    tmpl = taskops.template_path(tmpl_volid)
    if not os.path.isfile(tmpl):
        raise pvenode.PVEError(f"volume '{tmpl_volid}' does not exist")
    for key in (k for k in opts if re.fullmatch(r"dev\d+", k)):
        ctoptions.device_mode_and_rdev(ctoptions.parse_dev(opts[key])["path"])
    # create_vm: `my $storage = extract_param($param, 'storage') // 'local'`; a bare number as rootfs/mpN is a
    # size on that storage (`$storage:$value`); without rootfs: `$storage:4` ("defaults to 4GB"), once the
    # default storage passed `$check_and_activate_storage`; mount points without rootfs are refused.
    storage = params.get("storage") or "local"
    for key in [k for k in opts if k == "rootfs" or re.fullmatch(r"mp\d+", k)]:
        if re.fullmatch(r"\d+(\.\d+)?", opts[key]):
            opts[key] = f"{storage}:{opts[key]}"
    if "rootfs" not in opts:
        if any(re.fullmatch(r"mp\d+", k) for k in opts):
            raise pvenode.PVEError("mount points configured, but 'rootfs' not set - aborting")
        taskops.check_storage_for_ct(storage)
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
    opts["rootfs"] = taskops.rootfs_volume(vmid, opts["rootfs"])
    with ctconfig.config_lock(vmid):
        if ctconfig.ct_exists(vmid) or pvecluster.vmlist().get(vmid, pvenode.NODE) != pvenode.NODE:
            raise pvenode.PVEError(f"unable to create CT {vmid} - CT {vmid} already exists on node "
                                   f"'{pvecluster.vmlist().get(vmid, pvenode.NODE)}'")
        conf = dict(opts)
        conf["lock"] = "create"
        conf["lxc"] = []
        ctconfig.write_config(vmid, conf)
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
    opts = ctoptions.validate_options(params)
    params.pop("node", None)
    params.pop("vmid", None)
    digest = params.pop("digest", None)
    if not params:
        raise pvenode.PVEError("no options specified")
    delete = split_list(params.pop("delete", ""))
    revert = split_list(params.pop("revert", ""))
    for opt in revert:
        if ctoptions.option_checker(opt) is None:
            raise pvenode.param_error({"revert": f"unknown option '{opt}'"})
        if opt in opts:
            raise pvenode.param_error({"revert": f"you can't use '-{opt}' and '-revert {opt}' at the same time"})
    for opt in delete:
        if ctoptions.option_checker(opt) is None:
            raise pvenode.param_error({"delete": f"unknown option '{opt}'"})
        if opt in opts:
            raise pvenode.param_error({"delete": f"you can't use '-{opt}' and -delete {opt}' at the same time"})
        if opt in revert:
            raise pvenode.param_error({"delete": f"you can't use '-delete {opt}' and '-revert {opt}' at the same time"})
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
            raise pvenode.PVEError(f"unable to delete required option '{opt}'")
        if opt in READ_ONLY_OPTIONS:
            raise pvenode.PVEError(f"unable to delete read-only option: '{opt}'")
        to_delete.append(opt)
    for opt in sorted(opts):
        if opt in READ_ONLY_OPTIONS:
            raise pvenode.PVEError(f"unable to modify read-only option: '{opt}'")
    return to_delete, warnings


def update_config(vmid, params: dict, user: str, cfg: dict | None = None) -> list[str]:
    """PUT /config (synchronous), in update_vm's order: schema, lock, digest, permissions, delete list,
    update_pct_config. Returns the warnings PVE prints (`cannot delete ... not set`)."""
    vmid = int(vmid)
    opts, delete, revert, digest = check_update_params(params)
    access.check_vm_perm(user, vmid, access.VM_CONFIG_PERM_LIST, cfg, any_=True)  # the handler's permission check
    with ctconfig.config_lock(vmid):
        conf = ctconfig.load_config(vmid)
        ctconfig.check_lock(conf)
        # PVE::Tools::assert_if_modified
        if digest and digest != conf["digest"]:
            raise pvenode.PVEError("detected modified configuration - file changed by other user? Try again.")
        unpriv = conf.get("unprivileged")
        access.check_modify_perm(user, vmid, conf, {}, delete, unpriv, cfg)
        access.check_modify_perm(user, vmid, conf, {}, revert, unpriv, cfg)
        access.check_modify_perm(user, vmid, conf, opts, [], unpriv, cfg)
        # revert: the lab writes every change at once, so there is no pending value to drop (update_vm
        # deletes `$conf->{pending}->{$opt}` for each; without a [pending] section that changes nothing)
        to_delete, warnings = plan_update(conf, opts, delete)
        for key in (k for k in opts if re.fullmatch(r"dev\d+", k)):
            ctoptions.device_mode_and_rdev(ctoptions.parse_dev(opts[key])["path"])
        for key in to_delete:
            conf.pop(key, None)
        conf.update(opts)
        conf.pop("digest", None)
        running = ctstate.is_running(vmid)
        ctconfig.write_config(vmid, conf)
        if running and ({"memory", "swap"} & (set(opts) | set(to_delete))):
            hotplug_memory(vmid, conf)
    return warnings


def hotplug_memory(vmid: int, conf: dict) -> None:
    """PVE writes memory.max / memory.swap.max on a running CT; the lab writes the v1 equivalents."""
    _, pid = ctstate.lxc_info(vmid)
    cg = ctstate.cgroup_dir(pid) if pid else None
    if not cg:
        return
    mem = int(conf.get("memory", 512)) * pvenode.MIB
    memsw = mem + int(conf.get("swap", 512)) * pvenode.MIB
    order = ["memory.memsw.limit_in_bytes", "memory.limit_in_bytes"]
    if mem < ctstate._read_int(f"{cg}/memory.limit_in_bytes"):
        order.reverse()  # v1 requires limit <= memsw at every step
    for name in order:
        value = memsw if "memsw" in name else mem
        try:
            with open(f"{cg}/{name}", "w") as f:
                f.write(str(value))
        except OSError as e:
            raise pvenode.PVEError(f"unable to hotplug memory: {name}: {e.strerror}") from None


# PVE 9 (pve-container src/PVE/LXC.pm delete_read_restricted_options, 9ec1a04 "censor env property for users
# without VM.Config.Options"): GET config and GET pending leave these out for a user without the privilege.
READ_RESTRICTED = {"env": "VM.Config.Options"}


def delete_read_restricted(conf: dict, user: str | None, vmid) -> dict:
    for key, priv in READ_RESTRICTED.items():
        if key in conf and user and priv not in access.permissions(user, f"/vms/{int(vmid)}"):
            del conf[key]
    return conf


def get_config(vmid, user: str | None = None) -> dict:
    conf = delete_read_restricted(ctconfig.load_config(int(vmid)), user, vmid)
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
    with ctconfig.config_lock(vmid):
        conf = ctconfig.load_config(vmid)
        conf.pop("lock", None)
        conf.pop("digest", None)
        ctconfig.write_config(vmid, conf)
