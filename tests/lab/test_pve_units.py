"""In-process checks of the simulated PVE node's rules (no root, no lab: pure functions of the pve package: its backend modules, pct, api).

Each rule names its source in docs/lab.md ("Strictness: parameters, privileges, stop").
"""
from __future__ import annotations

import json
import os

import pytest


from pve import access, api, ctapi, ctconfig, ctoptions, ctstate, nodeapi, pct, pvecluster, pvenode, pvetasks, taskops
from pve.pvenode import PVEError

SCHEMA_ERROR = "property is not defined in schema and the schema does not allow additional properties"
ROOT_TOKEN = {"tokens": {"root@pam!lab": {"privsep": 0}}, "acl": [], "roles": {}}


# ---- 1. pct: unknown options and commands ---------------------------------------------------------------

@pytest.mark.parametrize("cmd,args", [
    ("set", ["129", "--skiplock", "1"]),       # update_vm has no skiplock
    ("set", ["129", "--bogus", "1"]),
    ("status", ["129", "--current"]),          # that is `pct config`'s
    ("config", ["129", "--verbose"]),
    ("start", ["129", "--timeout", "5"]),
    ("stop", ["129", "--forceStop", "1"]),
    ("shutdown", ["129", "--skiplock"]),       # vm_shutdown has no skiplock
    ("reboot", ["129", "--forceStop", "1"]),
    ("unlock", ["129", "--force"]),
    ("list", ["--full"]),
    ("exec", ["129", "--user", "root"]),
    ("create", ["129", "local:vztmpl/t.tar.zst", "--node", "pve1"]),  # node is fixed by pct
    ("destroy", ["129", "--skiplock"]),
])
def test_pct_unknown_option_is_refused(cmd, args):
    with pytest.raises(pct.OptionError) as e:
        pct.parse_args(args, pct.SCHEMAS[cmd])
    assert e.value.msg == "unable to parse option"
    assert e.value.warnings and e.value.warnings[0].startswith("Unknown option: ")


def test_pct_option_error_output_and_exit_code(capsys):
    with pytest.raises(SystemExit) as e:
        pct.usage_error("set", "unable to parse option", ["Unknown option: skiplock"])
    assert e.value.code == 255
    err = capsys.readouterr().err
    assert err.startswith("Unknown option: skiplock\n400 unable to parse option\n")


def test_pct_unknown_command(capsys):
    with pytest.raises(SystemExit) as e:
        pct.main(["frobnicate", "129"])
    assert e.value.code == 255
    assert "ERROR: unknown command 'pct frobnicate'" in capsys.readouterr().err


@pytest.mark.parametrize("cmd,args", [
    ("stop", ["129", "--overrule-shutdown", "1"]),
    ("start", ["129", "--debug"]),
    ("config", ["129", "--snapshot", "s1"]),
    ("destroy", ["129", "--destroy-unreferenced-disks", "1"]),
    ("create", ["129", "local:vztmpl/t.tar.zst", "--pool", "p"]),
    ("create", ["129", "local:vztmpl/t.tar.zst", "--force", "1"]),
])
def test_pct_options_the_lab_does_not_simulate_are_refused_not_ignored(cmd, args):
    with pytest.raises(pct.OptionError) as e:
        pct.parse_args(args, pct.SCHEMAS[cmd])
    assert "not simulated" in e.value.msg and not e.value.warnings


@pytest.mark.parametrize("cmd,args,expected", [
    ("status", ["129", "--verbose"], {"verbose": "1"}),
    ("stop", ["129", "--skiplock"], {"skiplock": "1"}),
    ("start", ["129", "-skiplock", "1"], {"skiplock": "1"}),
    ("shutdown", ["129", "--timeout", "5", "--forceStop", "1"], {"timeout": "5", "forceStop": "1"}),
    ("reboot", ["129", "--timeout=30"], {"timeout": "30"}),
    ("set", ["129", "-memory", "512", "--delete", "a", "-delete", "b", "--lock", "backup"],
     {"memory": "512", "delete": "a,b", "lock": "backup"}),
    ("set", ["129", "--dev0", "/dev/nvidia0,gid=44", "--features", "nesting=1"],
     {"dev0": "/dev/nvidia0,gid=44", "features": "nesting=1"}),
    ("create", ["129", "local:vztmpl/t.tar.zst", "--hostname", "g", "--memory", "1024", "--unprivileged", "1",
                "--password", "secret", "--start", "1"],
     {"hostname": "g", "memory": "1024", "unprivileged": "1", "password": "secret", "start": "1"}),
    ("exec", ["129", "--keep-env", "0"], {"keep-env": "0"}),
    ("destroy", ["129", "--purge", "--force"], {"purge": "1", "force": "1"}),
])
def test_pct_accepts_the_real_options(cmd, args, expected):
    pos, opts = pct.parse_args(args, pct.SCHEMAS[cmd])
    assert opts == expected and pos[0] == "129"


def test_pct_value_option_needs_a_value():
    with pytest.raises(pct.OptionError) as e:
        pct.parse_args(["129", "--timeout"], pct.SCHEMAS["shutdown"])
    assert e.value.warnings == ["Option timeout requires an argument"]


# ---- 2. PUT /config: update_vm's schema and update_pct_config ------------------------------------------

def test_update_skiplock_is_not_a_parameter():
    with pytest.raises(PVEError) as e:
        ctapi.check_update_params({"memory": "512", "skiplock": "1"})
    assert e.value.code == 400 and e.value.msg == "Parameter verification failed."
    assert e.value.errors == {"skiplock": SCHEMA_ERROR}


def test_update_unknown_keys_all_reported():
    with pytest.raises(PVEError) as e:
        ctapi.check_update_params({"bogus": "1", "other": "2", "memory": "x"})
    assert e.value.code == 400
    assert e.value.errors["bogus"] == SCHEMA_ERROR and e.value.errors["other"] == SCHEMA_ERROR
    assert e.value.errors["memory"].startswith("type check ('integer') failed")


def test_update_error_body_shape():
    err = pvenode.param_error({"skiplock": SCHEMA_ERROR})
    # api.Handler.reply sends {"data": null, "message": ..., "errors": {...}}
    body = {"data": None, "message": err.msg + "\n", "errors": err.errors}
    assert body == {"data": None, "message": "Parameter verification failed.\n", "errors": {"skiplock": SCHEMA_ERROR}}


def test_update_no_options():
    with pytest.raises(PVEError) as e:
        ctapi.check_update_params({"node": "pve1", "vmid": "129", "digest": "0" * 40})
    assert e.value.code == 500 and e.value.msg == "no options specified"


@pytest.mark.parametrize("params,errors", [
    ({"delete": "bogus"}, {"delete": "unknown option 'bogus'"}),
    ({"delete": "memory", "memory": "512"}, {"delete": "you can't use '-memory' and -delete memory' at the same time"}),
    ({"revert": "bogus"}, {"revert": "unknown option 'bogus'"}),
    ({"delete": "tags", "revert": "tags"}, {"delete": "you can't use '-delete tags' and '-revert tags' at the same time"}),
])
def test_update_delete_and_revert_lists(params, errors):
    with pytest.raises(PVEError) as e:
        ctapi.check_update_params(params)
    assert e.value.code == 400 and e.value.errors == errors


def test_update_splits_delete_lists_like_pve():
    opts, delete, revert, digest = ctapi.check_update_params({"delete": "tags; description ,onboot", "digest": "d"})
    assert delete == ["tags", "description", "onboot"] and opts == {} and digest == "d"


@pytest.mark.parametrize("opt", ["memory", "rootfs", "ostype"])
def test_required_options_cannot_be_deleted(opt):
    conf = {"memory": "512", "rootfs": "local:129/vm-129-disk-0.raw,size=8G", "ostype": "debian"}
    with pytest.raises(PVEError) as e:
        ctapi.plan_update(conf, {}, [opt])
    assert e.value.code == 500 and e.value.msg == f"unable to delete required option '{opt}'"


def test_unprivileged_is_read_only():
    conf = {"memory": "512", "unprivileged": "1"}
    with pytest.raises(PVEError) as e:
        ctapi.plan_update(conf, {"unprivileged": "1"}, [])
    assert e.value.msg == "unable to modify read-only option: 'unprivileged'"
    with pytest.raises(PVEError) as e:
        ctapi.plan_update(conf, {}, ["unprivileged"])
    assert e.value.msg == "unable to delete read-only option: 'unprivileged'"


def test_deleting_an_unset_option_only_warns():
    to_delete, warnings = ctapi.plan_update({"memory": "512", "tags": "a"}, {"cores": "2"}, ["description", "tags"])
    assert to_delete == ["tags"]
    assert warnings == ["cannot delete 'description' - not set in current configuration!"]


def test_features_schema():
    assert ctoptions.parse_features("nesting=1,keyctl=1,mount=nfs;cifs") == {"nesting": "1", "keyctl": "1", "mount": "nfs;cifs"}
    with pytest.raises(PVEError) as e:
        ctapi.check_update_params({"features": "nesting=1,bogus=1"})
    assert "features" in e.value.errors


# ---- 3. privileges: tokens, features, devN ----------------------------------------------------------------

def test_root_pam_has_every_privilege():
    assert access.permissions("root@pam", "/vms/129", ROOT_TOKEN) == set(access.PRIVILEGES)


def test_token_without_privsep_has_its_owners_privileges():
    assert access.permissions("root@pam!lab", "/vms/129", ROOT_TOKEN) == set(access.PRIVILEGES)


def test_unknown_token_has_none():
    assert access.permissions("root@pam!other", "/vms/129", ROOT_TOKEN) == set()


def test_privsep_token_has_at_most_its_acl_privileges():
    cfg = {"tokens": {"root@pam!ro": {"privsep": 1}, "ops@pve!t": {"privsep": 1}},
           "roles": {"Audit": ["VM.Audit"], "Power": ["VM.Audit", "VM.PowerMgmt"], "Mem": ["VM.Config.Memory"]},
           "acl": [{"path": "/vms", "ugids": ["root@pam!ro"], "roles": ["Audit"], "propagate": 1},
                   {"path": "/vms/130", "ugids": ["root@pam!ro"], "roles": ["NoAccess"], "propagate": 1},
                   {"path": "/vms", "ugids": ["ops@pve"], "roles": ["Power"], "propagate": 1},
                   {"path": "/vms", "ugids": ["ops@pve!t"], "roles": ["Power", "Mem"], "propagate": 1}]}
    assert access.permissions("root@pam!ro", "/vms/129", cfg) == {"VM.Audit"}
    assert access.permissions("root@pam!ro", "/vms/130", cfg) == set()   # the more specific ACL wins
    # a privsep token of another user: its ACL privileges intersected with the user's
    assert access.permissions("ops@pve!t", "/vms/129", cfg) == {"VM.Audit", "VM.PowerMgmt"}
    with pytest.raises(PVEError) as e:
        access.check_vm_perm("root@pam!ro", 129, ["VM.PowerMgmt"], cfg)
    assert e.value.code == 403 and e.value.msg == "Permission check failed (/vms/129, VM.PowerMgmt)"
    with pytest.raises(PVEError) as e:
        access.check_vm_perm("root@pam!ro", 129, access.VM_CONFIG_PERM_LIST, cfg, any_=True)
    assert e.value.msg == ("Permission check failed (/vms/129, VM.Config.Disk|VM.Config.CPU|VM.Config.Memory|"
                           "VM.Config.Network|VM.Config.Options)")
    with pytest.raises(PVEError) as e:  # memory needs VM.Config.Memory
        access.check_modify_perm("root@pam!ro", 129, {"memory": "512"}, {"memory": "1024"}, [], "1", cfg)
    assert e.value.msg == "Permission check failed (/vms/129, VM.Config.Memory)"


def test_dev_is_root_pam_only_even_for_full_tokens():
    with pytest.raises(PVEError) as e:
        access.check_modify_perm("root@pam!lab", 129, {}, {"dev0": "/dev/nvidia0"}, [], "1", ROOT_TOKEN)
    assert e.value.code == 403
    assert e.value.msg == "Permission check failed (configuring device passthrough is only allowed for root@pam)"
    with pytest.raises(PVEError):
        access.check_modify_perm("root@pam!lab", 129, {"dev0": "/dev/nvidia0"}, {}, ["dev0"], "1", ROOT_TOKEN)
    access.check_modify_perm("root@pam", 129, {}, {"dev0": "/dev/nvidia0"}, ["dev1"], "0", ROOT_TOKEN)


def test_features_of_privileged_ct_root_pam_only():
    with pytest.raises(PVEError) as e:
        access.check_modify_perm("root@pam!lab", 129, {}, {"features": "nesting=1"}, [], "0", ROOT_TOKEN)
    assert e.value.msg == ("Permission check failed (changing feature flags for privileged container is only "
                           "allowed for root@pam)")
    with pytest.raises(PVEError):
        access.check_modify_perm("root@pam!lab", 129, {"features": "nesting=1"}, {}, ["features"], None, ROOT_TOKEN)


@pytest.mark.parametrize("old,new,delete,allowed", [
    (None, "nesting=1", False, True),                    # new CT, nesting only
    (None, "nesting=1,keyctl=1", False, False),          # any other feature: root@pam only
    (None, "keyctl=1", False, False),
    ("nesting=1", "nesting=0", False, True),             # only nesting changes
    ("nesting=1,keyctl=1", "nesting=0,keyctl=1", False, True),
    ("nesting=1,keyctl=1", "nesting=1", False, False),   # keyctl removed
    ("nesting=1", "nesting=1,fuse=1", False, False),
    ("nesting=1", None, True, True),                     # deleting nesting-only features
    ("nesting=1,mknod=1", None, True, False),
])
def test_features_of_unprivileged_ct(old, new, delete, allowed):
    oldconf = {"unprivileged": "1", **({"features": old} if old else {})}
    newconf = {} if delete else {"features": new}
    call = lambda: access.check_modify_perm("root@pam!lab", 129, oldconf, newconf,  # noqa: E731
                                            ["features"] if delete else [], "1", ROOT_TOKEN)
    if allowed:
        call()
    else:
        with pytest.raises(PVEError) as e:
            call()
        assert e.value.msg == ("Permission check failed (changing feature flags (except nesting) is only "
                               "allowed for root@pam)")


def test_nesting_change_needs_vm_allocate():
    cfg = {"tokens": {"root@pam!cfg": {"privsep": 1}}, "roles": {"Cfg": ["VM.Config.Options"]},
           "acl": [{"path": "/vms", "ugids": ["root@pam!cfg"], "roles": ["Cfg"], "propagate": 1}]}
    with pytest.raises(PVEError) as e:
        access.check_modify_perm("root@pam!cfg", 129, {"unprivileged": "1"}, {"features": "nesting=1"}, [], "1", cfg)
    assert e.value.msg == "Permission check failed (/vms/129, VM.Allocate)"


def test_bind_mount_points_root_pam_only():
    with pytest.raises(PVEError) as e:
        access.check_modify_perm("root@pam!lab", 129, {}, {"mp0": "/srv/models,mp=/models"}, [], "1", ROOT_TOKEN)
    assert e.value.msg == "Permission check failed (mount point type bind is only allowed for root@pam)"
    access.check_modify_perm("root@pam!lab", 129, {}, {"mp0": "local-lvm:8,mp=/models"}, [], "1", ROOT_TOKEN)


def test_lock_follows_vm_config_options():
    # check_ct_modify_config_perm has no root@pam rule for `lock`: VM.Config.Options, like any other option
    access.check_modify_perm("root@pam!lab", 129, {}, {"lock": "backup"}, [], "1", ROOT_TOKEN)
    cfg = {"tokens": {"root@pam!ro": {"privsep": 1}}, "roles": {"Audit": ["VM.Audit"]},
           "acl": [{"path": "/", "ugids": ["root@pam!ro"], "roles": ["Audit"], "propagate": 1}]}
    with pytest.raises(PVEError) as e:
        access.check_modify_perm("root@pam!ro", 129, {}, {"lock": "backup"}, [], "1", cfg)
    assert e.value.msg == "Permission check failed (/vms/129, VM.Config.Options)"


# ---- 4. GET /pending ----------------------------------------------------------------------------------

def test_pending_array_shape():
    conf = {"memory": "512", "cores": "2", "digest": "ab" * 20, "lxc": [("lxc.x", "y")], "_rest": []}
    res = ctapi.config_with_pending_array(conf, {"memory": "1024", "swap": "0"}, {"cores": 0, "dev0": 1})
    by_key = {r["key"]: r for r in res}
    assert by_key["memory"] == {"key": "memory", "value": "512", "pending": "1024"}
    assert by_key["cores"] == {"key": "cores", "value": "2", "delete": 1}
    assert by_key["digest"] == {"key": "digest", "value": "ab" * 20}
    assert by_key["swap"] == {"key": "swap", "pending": "0"}
    assert by_key["dev0"] == {"key": "dev0", "delete": 2}
    assert "lxc" not in by_key and "_rest" not in by_key


def test_pending_without_pending_changes_is_the_config():
    res = ctapi.config_with_pending_array({"memory": "512", "digest": "d"})
    assert sorted(res, key=lambda r: r["key"]) == [{"key": "digest", "value": "d"}, {"key": "memory", "value": "512"}]


# ---- 5. a stop that does not stop ------------------------------------------------------------------------

def test_stop_failure_is_reported():
    cmd = ["lxc-stop", "-n", "129", "--kill"]
    log, error = taskops.stop_outcome(129, cmd, 1, True)
    assert log == ["command 'lxc-stop -n 129 --kill' failed: exit code 1"]
    assert error == "container did not stop"
    assert taskops.stop_outcome(129, cmd, 0, False) == ([], None)
    assert taskops.stop_outcome(129, cmd, 0, True) == ([], "container did not stop")
    assert taskops.stop_outcome(129, cmd, 2, False) == (["command 'lxc-stop -n 129 --kill' failed: exit code 2"], None)


# ---- API parameter schemas -------------------------------------------------------------------------------

def test_api_status_parameters():
    api.prepare("POST", "/nodes/pve1/lxc/129/status/stop", {"skiplock": "1"}, "root@pam")
    with pytest.raises(PVEError) as e:
        api.prepare("POST", "/nodes/pve1/lxc/129/status/stop", {"forceStop": "1"}, "root@pam")
    assert e.value.code == 400 and e.value.errors == {"forceStop": SCHEMA_ERROR}
    with pytest.raises(PVEError) as e:
        api.prepare("POST", "/nodes/pve1/lxc/129/status/stop", {"overrule-shutdown": "1"}, "root@pam")
    assert e.value.code == 501 and "'overrule-shutdown'" in e.value.msg
    with pytest.raises(PVEError) as e:
        api.prepare("POST", "/nodes/pve1/lxc/129/status/shutdown", {"skiplock": "1"}, "root@pam")
    assert e.value.errors == {"skiplock": SCHEMA_ERROR}


# ---- 6. PVE's schema (apidata-slice.json, apischema.py) on every API request -------------------------------

def prep(method, rel, params=None, user="root@pam"):
    return api.prepare(method, rel, dict(params or {}), user)[1]


def refused(method, rel, params=None, user="root@pam"):
    with pytest.raises(PVEError) as e:
        prep(method, rel, params, user)
    return e.value


CREATE = {"vmid": "150", "ostemplate": "local:vztmpl/debian-13-standard_13.1-1_amd64.tar.zst"}


def test_slice_is_pinned_and_complete():
    from pve import apischema
    assert apischema.SLICE["commit"] == "a8736b6d6169ea9679ee02285ea36fdab42e85c3"  # pve-docs 9.1.3
    assert apischema.SLICE["source"].endswith("pve-docs api-viewer/apidata.js")
    assert len(apischema.METHODS) == 35 and apischema.FORMATS_MISSING == []
    assert pvenode.PVE_VERSION["release"] == "9.1"
    # the 8.4 profile: the same methods, from pve-docs 46601a3
    assert apischema.PROFILES["8.4"]["commit"] == "46601a32456cd5fd98f0433912dbd811984866f2"
    assert set(apischema.PROFILES["8.4"]["methods"]) == set(apischema.METHODS)
    # net[n] is net0..net31, mp/dev/unused 0..255 (pve-container LXC/Config.pm)
    props = apischema.METHODS["PUT /nodes/{node}/lxc/{vmid}/config"].properties
    assert "net31" in props and "net32" not in props and "mp255" in props and "dev255" in props


@pytest.mark.parametrize("method,rel,params", [
    ("POST", "/nodes/pve1/lxc", {"force": "0", "restore": "0", "ignore-unpack-errors": "0", "unique": "0",
                                 "restore_": None}),
    ("POST", "/nodes/pve1/lxc", {"force": False}),                      # a JSON boolean
    ("POST", "/nodes/pve1/lxc/129/status/start", {"debug": "0"}),
    ("POST", "/nodes/pve1/lxc/129/status/stop", {"overrule-shutdown": "0"}),
    ("DELETE", "/nodes/pve1/lxc/129", {"destroy-unreferenced-disks": "0", "purge": "1", "force": "1"}),
    ("GET", "/nodes/pve1/lxc/129/config", {"current": "1"}),
    ("PUT", "/nodes/pve1/lxc/129/config", {"revert": "memory"}),
    ("PUT", "/nodes/pve1/lxc/129/config", {"node": "pve1", "vmid": "129", "memory": "1024"}),  # repeated, same
    ("POST", "/access/ticket", {"username": "root@pam", "password": "x", "new-format": "1"}),
])
def test_parameters_pve_accepts_are_accepted_at_their_default(method, rel, params):
    params = {k: v for k, v in params.items() if v is not None and k != "restore_"}
    if rel == "/nodes/pve1/lxc":
        params = dict(CREATE, **params)
    p = prep(method, rel, params)
    for name in api.NOT_SIMULATED.get(api.apischema.find(method, rel)[0].key, ()):
        assert name not in p  # a default is dropped: the handler acts as without it


@pytest.mark.parametrize("method,rel,params,name", [
    ("POST", "/nodes/pve1/lxc", dict(CREATE, force="1"), "force"),
    ("POST", "/nodes/pve1/lxc", dict(CREATE, pool="gpu"), "pool"),
    ("POST", "/nodes/pve1/lxc", dict(CREATE, bwlimit="0"), "bwlimit"),
    ("POST", "/nodes/pve1/lxc/129/status/start", {"debug": "1"}, "debug"),
    ("GET", "/nodes/pve1/lxc/129/config", {"snapshot": "s1"}, "snapshot"),
    ("DELETE", "/nodes/pve1/lxc/129", {"destroy-unreferenced-disks": "1"}, "destroy-unreferenced-disks"),
])
def test_other_values_of_unsimulated_parameters_are_501_with_the_name(method, rel, params, name):
    e = refused(method, rel, params)
    assert e.code == 501 and f"'{name}'" in e.msg


@pytest.mark.parametrize("params,errors", [
    ({"onboot": "true"}, {"onboot": "type check ('boolean') failed - got 'true'"}),
    ({"onboot": "yes"}, {"onboot": "type check ('boolean') failed - got 'yes'"}),
    ({"arch": "x86"}, {"arch": "value 'x86' does not have a value in the enumeration "
                               "'amd64, i386, arm64, armhf, riscv32, riscv64'"}),
    ({"cmode": "tty2"}, {"cmode": "value 'tty2' does not have a value in the enumeration 'shell, console, tty'"}),
    ({"cpulimit": "9000"}, {"cpulimit": "value must have a maximum value of 8192"}),
    ({"cpulimit": "x"}, {"cpulimit": "type check ('number') failed - got 'x'"}),
    ({"tags": "a b!"}, {"tags": "invalid format - invalid characters in tag\n"}),
    ({"startup": "order=x"}, {"startup": "invalid format - unable to parse startup options\n"}),
    ({"net0": "name=eth0,bogus=1"},
     {"net0": "invalid format - invalid key in comma-separated list property: bogus\n"}),
    ({"net0": "name=eth0,mtu=10"},
     {"net0": "invalid format - format error\nnet0.mtu: value must have a minimum value of 64\n"}),
    ({"net0": "bridge=vmbr0"},
     {"net0": "invalid format - format error\nnet0.name: property is missing and it is not optional\n"}),
    ({"hostname": "bad_name"}, {"hostname": "invalid format - value does not look like a valid DNS name\n"}),
    ({"env": "A=1\0B"}, {"env": "value does not match the regex pattern"}),   # NUL-separated NAME=value
    ({"entrypoint": "/bin/sh\x01"}, {"entrypoint": "value does not match the regex pattern"}),
    ({"net0": "name=eth0,host-managed=maybe"},
     {"net0": "invalid format - format error\nnet0.host-managed: type check ('boolean') failed - got 'maybe'\n"}),
    ({"mp0": "/srv/x,mp=/mnt/x,idmap=passthrough"},  # mount point idmap came with pve-container 6.1.6 (9.2)
     {"mp0": "invalid format - invalid key in comma-separated list property: idmap\n"}),
    ({"net32": "name=eth0"}, {"net32": SCHEMA_ERROR}),
    ({"description": "x" * 8193}, {"description": "value may only be 8192 characters long"}),
    ({"dev0": "/tmp/x"}, {"dev0": "invalid format - format error\ndev0.path: invalid format - "
                                  "/tmp/x is not a valid device path\n\n"}),
])
def test_config_values_are_checked_as_pve_checks_them(params, errors):
    e = refused("PUT", "/nodes/pve1/lxc/129/config", params)
    assert e.code == 400 and e.msg == "Parameter verification failed." and e.errors == errors


def test_create_checks_password_length_and_requires():
    e = refused("POST", "/nodes/pve1/lxc", dict(CREATE, password="abcd", unique="1"))
    assert e.errors == {"password": "value must be at least 5 characters long",
                        "restore": "missing property required by 'unique'"}
    e = refused("POST", "/nodes/pve1/lxc", {"vmid": "150"})
    assert e.errors == {"ostemplate": "property is missing and it is not optional"}
    e = refused("POST", "/nodes/pve1/lxc", dict(CREATE, vmid="99"))
    assert e.errors == {"vmid": "invalid format - value does not look like a valid VM ID\n"}
    e = refused("POST", "/nodes/pve1/lxc", dict(CREATE, **{"ha-managed": "1"}))  # 9.x; the lab has no HA
    assert e.code == 501 and "'ha-managed'" in e.msg
    assert "ha-managed" not in prep("POST", "/nodes/pve1/lxc", dict(CREATE, **{"ha-managed": "0"}))


def test_9x_config_keys_pass_the_schema_and_8_4_refuses_them():
    """entrypoint, env, net[n] host-managed, mp[n] keepattrs: in 9.1.3's schema (the lab's), not in 8.4's."""
    params = {"entrypoint": "/usr/bin/sleep infinity", "env": "A=1\0B=two words",
              "net1": "name=eth1,bridge=vmbr0,host-managed=1", "mp0": "/srv/x,mp=/mnt/x,keepattrs=1"}
    p = prep("PUT", "/nodes/pve1/lxc/129/config", params)
    assert {k: p[k] for k in params} == params
    errors = api.apischema.profile_errors("8.4", "PUT /nodes/{node}/lxc/{vmid}/config", dict(params, node="pve1", vmid="129"))
    assert errors == {"entrypoint": SCHEMA_ERROR, "env": SCHEMA_ERROR,
                      "net1": "invalid format - invalid key in comma-separated list property: host-managed\n",
                      "mp0": "invalid format - invalid key in comma-separated list property: keepattrs\n"}
    assert api.apischema.profile_errors("8.4", "PUT /nodes/{node}/lxc/{vmid}/config",
                                        {"node": "pve1", "vmid": "129", "memory": "1024"}) is None


def test_env_is_stored_as_lxc_environment_runtime_lines():
    """pve-container LXC/Config.pm: parse_pct_config joins `lxc.environment.runtime` lines into `env` (NUL),
    write_pct_config writes them back; other raw keys stay raw."""
    raw = ("entrypoint: /bin/sh\nhostname: a\nlxc.environment.runtime: A=1\nlxc.environment.runtime: B=x y\n"
           "lxc.cgroup2.devices.allow: c 1:1 rwm\n")
    conf = ctconfig.parse_conf(raw)
    assert conf["env"] == "A=1\0B=x y" and conf["lxc"] == [("lxc.cgroup2.devices.allow", "c 1:1 rwm")]
    assert ctconfig.format_conf(conf) == raw
    conf["env"] = "C=3"
    assert "lxc.environment.runtime: C=3\n" in ctconfig.format_conf(conf) and "A=1" not in ctconfig.format_conf(conf)


def test_env_is_read_restricted_to_vm_config_options(monkeypatch):
    """PVE 9 delete_read_restricted_options: GET config/pending leave `env` out for a user without
    VM.Config.Options on the CT; the other keys stay."""
    cfg = {"tokens": {"root@pam!ro": {"privsep": 1}, "root@pam!opt": {"privsep": 1}}, "roles": {"Ro": ["VM.Audit"]},
           "acl": [{"path": "/vms", "ugids": ["root@pam!ro"], "roles": ["Ro"], "propagate": 1},
                   {"path": "/vms", "ugids": ["root@pam!opt"], "roles": ["Administrator"], "propagate": 1}]}
    monkeypatch.setattr(access, "load_access", lambda *a, **k: cfg)
    conf = {"hostname": "a", "env": "A=1"}
    assert ctapi.delete_read_restricted(dict(conf), "root@pam!ro", 129) == {"hostname": "a"}
    assert ctapi.delete_read_restricted(dict(conf), "root@pam!opt", 129) == conf
    assert ctapi.delete_read_restricted(dict(conf), "root@pam", 129) == conf


def test_privileged_create_needs_sys_modify_on_root(cluster, monkeypatch):
    """PVE 9 create_vm: unprivileged defaults to 1; 0 needs Sys.Modify on / (checked before the VMID and
    VM.Allocate). A privilege-separated token with VM.Allocate on /vms only is refused for a privileged CT."""
    cfg = {"tokens": {"root@pam!ops": {"privsep": 1}}, "acl": [
        {"path": "/vms", "ugids": ["root@pam!ops"], "roles": ["Administrator"], "propagate": 1}], "roles": {}}
    monkeypatch.setattr(access, "load_access", lambda *a, **k: cfg)
    with pytest.raises(PVEError) as e:
        ctapi.create_ct(150, {"ostemplate": "local:vztmpl/x.tar.zst", "unprivileged": "0"}, "root@pam!ops")
    assert e.value.code == 403 and e.value.msg == "Permission check failed (/, Sys.Modify)"
    with pytest.raises(PVEError) as e:  # unprivileged (the default): past the privilege, to the template
        ctapi.create_ct(150, {"ostemplate": "local:vztmpl/x.tar.zst"}, "root@pam!ops")
    assert e.value.msg == "volume 'local:vztmpl/x.tar.zst' does not exist"


@pytest.mark.parametrize("method,rel,params,errors", [
    ("GET", "/nodes/pve1/lxc", {"full": "1"}, {"full": SCHEMA_ERROR}),       # GETs: additionalProperties 0 too
    ("GET", "/nodes/pve1/tasks", {"limit": "x"}, {"limit": "type check ('integer') failed - got 'x'"}),
    ("GET", "/nodes/pve1/tasks", {"source": "old"},
     {"source": "value 'old' does not have a value in the enumeration 'archive, active, all'"}),
    ("GET", "/nodes/pve1/tasks/UPID:x/log", {"start": "-1"}, {"start": "value must have a minimum value of 0"}),
    ("GET", "/nodes/pve1/lxc/abc/status/current", {}, {"vmid": "type check ('integer') failed - got 'abc'"}),
    ("GET", "/cluster/resources", {"type": "qemu"},
     {"type": "value 'qemu' does not have a value in the enumeration 'vm, storage, node, sdn'"}),
    ("POST", "/nodes/pve1/lxc/129/status/shutdown", {"forceStop": True, "timeout": 1.5},
     {"timeout": "type check ('integer') failed - got '1.5'"}),
    ("PUT", "/nodes/pve1/lxc/129/config", {"vmid": "130", "memory": "1"},
     {"vmid": "duplicate parameter (already defined in URI) with conflicting values!"}),
])
def test_every_method_is_checked(method, rel, params, errors):
    e = refused(method, rel, params)
    assert e.code == 400 and e.errors == errors


def test_unknown_methods_are_501():
    for method, rel in (("POST", "/nodes/pve1/lxc/129/config"), ("GET", "/nodes/pve1/lxc/129/rrd"),
                        ("POST", "/nodes/pve1/lxc/129/snapshot"), ("GET", "/pools")):
        e = refused(method, rel)
        assert e.code == 501 and e.msg == f"Method '{method} {rel}' not implemented"


def test_json_booleans_and_numbers():
    p = prep("PUT", "/nodes/pve1/lxc/129/config", {"onboot": True, "memory": 2048, "cpulimit": 1.5})
    assert p["onboot"] == "1" and p["memory"] == "2048" and p["cpulimit"] == "1.5"
    e = refused("PUT", "/nodes/pve1/lxc/129/config", {"hostname": True})
    assert e.errors == {"hostname": "type check ('string') failed - got JSON::PP::Boolean"}


def test_property_string_booleans_take_parse_boolean():
    # parse_property_string runs parse_boolean on a boolean key, so `firewall=yes` is valid inside net0
    prep("PUT", "/nodes/pve1/lxc/129/config", {"net0": "name=eth0,bridge=vmbr0,firewall=yes",
                                               "features": "nesting=on"})


def test_update_checks_the_schema_without_the_api():
    # pct set reaches update_config without the API: the same schema
    with pytest.raises(PVEError) as e:
        ctapi.check_update_params({"arch": "x86"})
    assert e.value.code == 400 and "enumeration" in e.value.errors["arch"]
    opts, delete, revert, _ = ctapi.check_update_params({"revert": "memory,swap"})
    assert revert == ["memory", "swap"] and not opts and not delete


def test_pct_not_simulated_default_is_accepted_and_booleans_parsed():
    pos, opts = pct.parse_args(["129", "--debug", "0"], pct.SCHEMAS["start"])
    assert opts == {}
    pos, opts = pct.parse_args(["129", "--onboot", "yes"], pct.SCHEMAS["set"])
    assert opts == {"onboot": "1"}
    with pytest.raises(pct.OptionError) as e:
        pct.parse_args(["129", "--onboot", "maybe"], pct.SCHEMAS["set"])
    assert e.value.msg == "unable to parse boolean option"


def test_token_and_permission_order():
    e = refused("GET", "/nodes/pve1/lxc", {}, user="alice@pve")
    assert e.code == 403
    prep("GET", "/nodes/pve1/lxc", {}, user="root@pam!lab")


@pytest.mark.parametrize("upid,error", [
    ("nonsense", "unable to parse worker upid"),
    ("UPID:pve1:00000001:00000002:00000003:vzstart:129:root@pam:", "no such task"),
])
def test_task_status_of_a_bad_upid_is_400(upid, error):
    with pytest.raises(PVEError) as e:
        pvetasks.task_status(upid)
    assert e.value.code == 400 and e.value.errors == {"upid": error}


def test_task_list_reports_the_exit_text_and_hides_running_tasks(tmp_path, monkeypatch):
    monkeypatch.setattr(pvenode, "TASK_DIR", str(tmp_path))
    import json
    done = pvetasks.make_upid(1, "vzstart", "129", "root@pam", starttime=1000)
    failed = pvetasks.make_upid(1, "vzstop", "129", "root@pam", starttime=2000)
    running = pvetasks.make_upid(os.getpid(), "vzcreate", "131", "root@pam", starttime=3000)
    for upid, status in ((done, "OK"), (failed, "CT is locked (backup)"), (running, None)):
        (tmp_path / (upid.replace(":", "_") + ".log")).write_text("x\n")
        if status:
            (tmp_path / (upid.replace(":", "_") + ".status")).write_text(json.dumps({"exitstatus": status,
                                                                                    "endtime": 5}))
    res = pvetasks.list_tasks({})
    assert [t["upid"] for t in res] == [failed, done]
    assert res[0]["status"] == "CT is locked (backup)" and res[1]["status"] == "OK" and res[0]["endtime"] == 5
    assert [t["upid"] for t in pvetasks.list_tasks({"source": "active"})] == [running]
    assert pvetasks.list_tasks({"source": "active"})[0]["status"] == "RUNNING"
    assert [t["upid"] for t in pvetasks.list_tasks({"errors": "1"})] == [failed]
    assert [t["upid"] for t in pvetasks.list_tasks({"statusfilter": "ok"})] == [done]
    assert [t["upid"] for t in pvetasks.list_tasks({"source": "all", "vmid": "131"})] == [running]
    assert [t["upid"] for t in pvetasks.list_tasks({"typefilter": "vzstart"})] == [done]
    assert [t["upid"] for t in pvetasks.list_tasks({"start": "1", "limit": "1"})] == [done]
    assert pvetasks.list_tasks({"limit": "0"}) == []


def test_method_permissions_come_from_the_schema_and_precede_it():
    """check_api2_permissions before JSONSchema::validate (pve-manager HTTPServer.pm rest_handler): a token
    without VM.Audit gets 403 even for a malformed request; with it, the schema's 400."""
    cfg = {"tokens": {"root@pam!ro": {"privsep": 1}},
           "acl": [{"path": "/vms/129", "ugids": ["root@pam!ro"], "roles": ["Aud"], "propagate": 1}],
           "roles": {"Aud": ["VM.Audit"]}}
    with pytest.raises(PVEError) as e:
        api.prepare("GET", "/nodes/pve1/lxc/131/config", {"bogus": "1"}, "root@pam!ro", cfg)
    assert e.value.code == 403 and e.value.msg == "Permission check failed (/vms/131, VM.Audit)"
    with pytest.raises(PVEError) as e:
        api.prepare("GET", "/nodes/pve1/lxc/129/config", {"bogus": "1"}, "root@pam!ro", cfg)
    assert e.value.code == 400 and e.value.errors == {"bogus": SCHEMA_ERROR}
    with pytest.raises(PVEError) as e:  # any-of: the update_vm list
        api.prepare("PUT", "/nodes/pve1/lxc/129/config", {"memory": "x"}, "root@pam!ro", cfg)
    assert e.value.code == 403 and "VM.Config.Disk|VM.Config.CPU" in e.value.msg
    with pytest.raises(PVEError) as e:
        api.prepare("GET", "/nodes/pve1/status", {}, "root@pam!ro", cfg)
    assert e.value.msg == "Permission check failed (/nodes/pve1, Sys.Audit)"
    api.prepare("GET", "/nodes/pve1/lxc", {}, "root@pam!ro", cfg)   # user => 'all'
    api.prepare("GET", "/cluster/status", {}, "root@pam", cfg)


# ---- 7. Two nodes: members, the cluster's VMID list, quorum, proxying (docs/lab.md, "Two nodes") ---------------

COROSYNC_TWO = """totem {
  cluster_name: inferops-lab
}
nodelist {
  node {
    name: pve1
    nodeid: 1
    quorum_votes: 1
    ring0_addr: 127.0.0.1
  }
  node {
    name: pve2
    nodeid: 2
    quorum_votes: 1
    ring0_addr: 127.0.0.2
  }
}
"""


@pytest.fixture
def cluster(tmp_path, monkeypatch):
    """A /etc/pve of two members in tmp_path; this process is pve1; pve2 online unless a test says otherwise."""
    etc = tmp_path / "etc-pve"
    for node in ("pve1", "pve2"):
        (etc / "nodes" / node / "lxc").mkdir(parents=True)
    (etc / "corosync.conf").write_text(COROSYNC_TWO)
    monkeypatch.setattr(pvenode, "PVE_ETC", str(etc))
    monkeypatch.setattr(pvenode, "COROSYNC_CONF", str(etc / "corosync.conf"))
    monkeypatch.setattr(pvenode, "VMLIST", str(etc / ".vmlist"))
    monkeypatch.setattr(pvenode, "NODE", "pve1")
    monkeypatch.setattr(pvenode, "CONF_DIR", str(etc / "nodes" / "pve1" / "lxc"))
    online = {"pve2": True}
    monkeypatch.setattr(pvecluster, "node_online", lambda n: n == pvenode.NODE or online.get(n, False))
    return etc, online


def test_cluster_members_come_from_corosync_conf(cluster):
    assert pvecluster.cluster_nodes() == [{"name": "pve1", "nodeid": 1, "ip": "127.0.0.1"},
                                          {"name": "pve2", "nodeid": 2, "ip": "127.0.0.2"}]
    st = nodeapi.cluster_status()
    assert st[0] == {"type": "cluster", "id": "cluster", "nodes": 2, "version": 2, "name": "inferops-lab",
                     "quorate": 1}
    members = [(n["name"], n["local"], n["online"], n["ip"]) for n in st[1:]]
    assert members == [("pve1", 1, 1, "127.0.0.1"), ("pve2", 0, 1, "127.0.0.2")]
    assert api.remote_node_ip("pve2") == "127.0.0.2"
    with pytest.raises(PVEError) as e:
        api.remote_node_ip("pve3")
    assert e.value.code == 500 and e.value.msg.startswith("hostname lookup 'pve3' failed")


def test_one_node_without_corosync_conf_is_no_cluster(cluster):
    etc, _ = cluster
    (etc / "corosync.conf").unlink()
    assert pvecluster.cluster_nodes() == [] and pvecluster.is_quorate() and nodeapi.node_names() == ["pve1"]
    assert nodeapi.cluster_status() == [{"type": "node", "id": "node/pve1", "name": "pve1", "ip": "127.0.0.1",
                                         "local": 1, "nodeid": 0, "online": 1, "level": ""}]


def test_the_vmid_list_spans_the_nodes_and_refuses_a_taken_vmid(cluster):
    etc, _ = cluster
    (etc / "nodes" / "pve1" / "lxc" / "130.conf").write_text("hostname: bystander\n")
    (etc / "nodes" / "pve2" / "lxc" / "195.conf").write_text("hostname: CT195\n")
    assert pvecluster.vmlist() == {130: "pve1", 195: "pve2"}
    pvecluster.write_vmlist()
    assert json.loads((etc / ".vmlist").read_text())["ids"] == {
        "130": {"node": "pve1", "type": "lxc", "version": 1}, "195": {"node": "pve2", "type": "lxc", "version": 1}}
    with pytest.raises(PVEError) as e:
        pvecluster.check_vmid_unused(195)
    assert e.value.code == 500 and e.value.msg == "CT 195 already exists on node 'pve2'"
    pvecluster.check_vmid_unused(196)
    # pve1's own listing stays its own; pve2's CT is not pve1's
    assert ctstate.list_cts() == [130] and ctstate.list_cts("pve2") == [195]
    with pytest.raises(PVEError) as e:
        ctconfig.load_config(195)
    assert e.value.msg == "Configuration file 'nodes/pve1/lxc/195.conf' does not exist"


def test_quorum_needs_more_than_half_of_the_members(cluster):
    _, online = cluster
    assert pvecluster.is_quorate()
    online["pve2"] = False
    assert not pvecluster.is_quorate()
    with pytest.raises(PVEError) as e:
        pvecluster.check_cfs_quorum()
    assert e.value.msg == "cluster not ready - no quorum?"
    with pytest.raises(PVEError) as e:
        ctapi.create_ct(150, {"ostemplate": "local:vztmpl/x.tar.zst"}, "root@pam")
    assert e.value.msg == "cluster not ready - no quorum?"
    assert nodeapi.cluster_status()[0]["quorate"] == 0
    node2 = nodeapi.node_entry("pve2")
    assert node2["status"] == "offline" and "mem" not in node2 and "maxmem" in node2


def test_a_method_of_another_node_is_proxied_after_the_permission_check(cluster, monkeypatch):
    with pytest.raises(api.ProxyTo) as e:
        api.prepare("GET", "/nodes/pve2/lxc", {"full": "1"}, "root@pam!lab", ROOT_TOKEN)  # the schema is pve2's
    assert e.value.node == "pve2"
    # this node's own methods and methods without proxyto stay here
    info, p = api.prepare("GET", "/nodes/pve1/lxc", {}, "root@pam!lab", ROOT_TOKEN)
    assert info.key == "GET /nodes/{node}/lxc"
    info, p = api.prepare("GET", "/cluster/resources", {}, "root@pam!lab", ROOT_TOKEN)
    # the permission check comes first: a token without the privilege is refused here, not proxied
    cfg = {"tokens": {"root@pam!lab": {"privsep": 1}}, "acl": [], "roles": {}}
    with pytest.raises(PVEError) as e:
        api.prepare("GET", "/nodes/pve2/lxc/130/config", {}, "root@pam!lab", cfg)
    assert e.value.code == 403
