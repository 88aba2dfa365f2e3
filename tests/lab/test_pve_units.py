"""In-process checks of the simulated PVE node's rules (no root, no lab: pure functions of pvelab, pct, api).

Each rule names its source in docs/lab.md ("Strictness: parameters, privileges, stop").
"""
from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "pve"))

import api  # noqa: E402
import pct  # noqa: E402
import pvelab as pve  # noqa: E402
from pvelab import PVEError  # noqa: E402

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
        pve.check_update_params({"memory": "512", "skiplock": "1"})
    assert e.value.code == 400 and e.value.msg == "Parameter verification failed."
    assert e.value.errors == {"skiplock": SCHEMA_ERROR}


def test_update_unknown_keys_all_reported():
    with pytest.raises(PVEError) as e:
        pve.check_update_params({"bogus": "1", "other": "2", "memory": "x"})
    assert e.value.code == 400
    assert e.value.errors["bogus"] == SCHEMA_ERROR and e.value.errors["other"] == SCHEMA_ERROR
    assert e.value.errors["memory"].startswith("type check ('integer') failed")


def test_update_error_body_shape():
    err = pve.param_error({"skiplock": SCHEMA_ERROR})
    # api.Handler.reply sends {"data": null, "message": ..., "errors": {...}}
    body = {"data": None, "message": err.msg + "\n", "errors": err.errors}
    assert body == {"data": None, "message": "Parameter verification failed.\n", "errors": {"skiplock": SCHEMA_ERROR}}


def test_update_no_options():
    with pytest.raises(PVEError) as e:
        pve.check_update_params({"node": "pve1", "vmid": "129", "digest": "0" * 40})
    assert e.value.code == 500 and e.value.msg == "no options specified"


@pytest.mark.parametrize("params,errors", [
    ({"delete": "bogus"}, {"delete": "unknown option 'bogus'"}),
    ({"delete": "memory", "memory": "512"}, {"delete": "you can't use '-memory' and -delete memory' at the same time"}),
    ({"revert": "bogus"}, {"revert": "unknown option 'bogus'"}),
    ({"delete": "tags", "revert": "tags"}, {"delete": "you can't use '-delete tags' and '-revert tags' at the same time"}),
])
def test_update_delete_and_revert_lists(params, errors):
    with pytest.raises(PVEError) as e:
        pve.check_update_params(params)
    assert e.value.code == 400 and e.value.errors == errors


def test_update_splits_delete_lists_like_pve():
    opts, delete, revert, digest = pve.check_update_params({"delete": "tags; description ,onboot", "digest": "d"})
    assert delete == ["tags", "description", "onboot"] and opts == {} and digest == "d"


@pytest.mark.parametrize("opt", ["memory", "rootfs", "ostype"])
def test_required_options_cannot_be_deleted(opt):
    conf = {"memory": "512", "rootfs": "local:129/vm-129-disk-0.raw,size=8G", "ostype": "debian"}
    with pytest.raises(PVEError) as e:
        pve.plan_update(conf, {}, [opt])
    assert e.value.code == 500 and e.value.msg == f"unable to delete required option '{opt}'"


def test_unprivileged_is_read_only():
    conf = {"memory": "512", "unprivileged": "1"}
    with pytest.raises(PVEError) as e:
        pve.plan_update(conf, {"unprivileged": "1"}, [])
    assert e.value.msg == "unable to modify read-only option: 'unprivileged'"
    with pytest.raises(PVEError) as e:
        pve.plan_update(conf, {}, ["unprivileged"])
    assert e.value.msg == "unable to delete read-only option: 'unprivileged'"


def test_deleting_an_unset_option_only_warns():
    to_delete, warnings = pve.plan_update({"memory": "512", "tags": "a"}, {"cores": "2"}, ["description", "tags"])
    assert to_delete == ["tags"]
    assert warnings == ["cannot delete 'description' - not set in current configuration!"]


def test_features_schema():
    assert pve.parse_features("nesting=1,keyctl=1,mount=nfs;cifs") == {"nesting": "1", "keyctl": "1", "mount": "nfs;cifs"}
    with pytest.raises(PVEError) as e:
        pve.check_update_params({"features": "nesting=1,bogus=1"})
    assert "features" in e.value.errors


# ---- 3. privileges: tokens, features, devN ----------------------------------------------------------------

def test_root_pam_has_every_privilege():
    assert pve.permissions("root@pam", "/vms/129", ROOT_TOKEN) == set(pve.PRIVILEGES)


def test_token_without_privsep_has_its_owners_privileges():
    assert pve.permissions("root@pam!lab", "/vms/129", ROOT_TOKEN) == set(pve.PRIVILEGES)


def test_unknown_token_has_none():
    assert pve.permissions("root@pam!other", "/vms/129", ROOT_TOKEN) == set()


def test_privsep_token_has_at_most_its_acl_privileges():
    cfg = {"tokens": {"root@pam!ro": {"privsep": 1}, "ops@pve!t": {"privsep": 1}},
           "roles": {"Audit": ["VM.Audit"], "Power": ["VM.Audit", "VM.PowerMgmt"], "Mem": ["VM.Config.Memory"]},
           "acl": [{"path": "/vms", "ugids": ["root@pam!ro"], "roles": ["Audit"], "propagate": 1},
                   {"path": "/vms/130", "ugids": ["root@pam!ro"], "roles": ["NoAccess"], "propagate": 1},
                   {"path": "/vms", "ugids": ["ops@pve"], "roles": ["Power"], "propagate": 1},
                   {"path": "/vms", "ugids": ["ops@pve!t"], "roles": ["Power", "Mem"], "propagate": 1}]}
    assert pve.permissions("root@pam!ro", "/vms/129", cfg) == {"VM.Audit"}
    assert pve.permissions("root@pam!ro", "/vms/130", cfg) == set()   # the more specific ACL wins
    # a privsep token of another user: its ACL privileges intersected with the user's
    assert pve.permissions("ops@pve!t", "/vms/129", cfg) == {"VM.Audit", "VM.PowerMgmt"}
    with pytest.raises(PVEError) as e:
        pve.check_vm_perm("root@pam!ro", 129, ["VM.PowerMgmt"], cfg)
    assert e.value.code == 403 and e.value.msg == "Permission check failed (/vms/129, VM.PowerMgmt)"
    with pytest.raises(PVEError) as e:
        pve.check_vm_perm("root@pam!ro", 129, pve.VM_CONFIG_PERM_LIST, cfg, any_=True)
    assert e.value.msg == ("Permission check failed (/vms/129, VM.Config.Disk|VM.Config.CPU|VM.Config.Memory|"
                           "VM.Config.Network|VM.Config.Options)")
    with pytest.raises(PVEError) as e:  # memory needs VM.Config.Memory
        pve.check_modify_perm("root@pam!ro", 129, {"memory": "512"}, {"memory": "1024"}, [], "1", cfg)
    assert e.value.msg == "Permission check failed (/vms/129, VM.Config.Memory)"


def test_dev_is_root_pam_only_even_for_full_tokens():
    with pytest.raises(PVEError) as e:
        pve.check_modify_perm("root@pam!lab", 129, {}, {"dev0": "/dev/nvidia0"}, [], "1", ROOT_TOKEN)
    assert e.value.code == 403
    assert e.value.msg == "Permission check failed (configuring device passthrough is only allowed for root@pam)"
    with pytest.raises(PVEError):
        pve.check_modify_perm("root@pam!lab", 129, {"dev0": "/dev/nvidia0"}, {}, ["dev0"], "1", ROOT_TOKEN)
    pve.check_modify_perm("root@pam", 129, {}, {"dev0": "/dev/nvidia0"}, ["dev1"], "0", ROOT_TOKEN)


def test_features_of_privileged_ct_root_pam_only():
    with pytest.raises(PVEError) as e:
        pve.check_modify_perm("root@pam!lab", 129, {}, {"features": "nesting=1"}, [], "0", ROOT_TOKEN)
    assert e.value.msg == ("Permission check failed (changing feature flags for privileged container is only "
                           "allowed for root@pam)")
    with pytest.raises(PVEError):
        pve.check_modify_perm("root@pam!lab", 129, {"features": "nesting=1"}, {}, ["features"], None, ROOT_TOKEN)


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
    call = lambda: pve.check_modify_perm("root@pam!lab", 129, oldconf, newconf,  # noqa: E731
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
        pve.check_modify_perm("root@pam!cfg", 129, {"unprivileged": "1"}, {"features": "nesting=1"}, [], "1", cfg)
    assert e.value.msg == "Permission check failed (/vms/129, VM.Allocate)"


def test_bind_mount_points_root_pam_only():
    with pytest.raises(PVEError) as e:
        pve.check_modify_perm("root@pam!lab", 129, {}, {"mp0": "/srv/models,mp=/models"}, [], "1", ROOT_TOKEN)
    assert e.value.msg == "Permission check failed (mount point type bind is only allowed for root@pam)"
    pve.check_modify_perm("root@pam!lab", 129, {}, {"mp0": "local-lvm:8,mp=/models"}, [], "1", ROOT_TOKEN)


def test_lock_follows_vm_config_options():
    # check_ct_modify_config_perm has no root@pam rule for `lock`: VM.Config.Options, like any other option
    pve.check_modify_perm("root@pam!lab", 129, {}, {"lock": "backup"}, [], "1", ROOT_TOKEN)
    cfg = {"tokens": {"root@pam!ro": {"privsep": 1}}, "roles": {"Audit": ["VM.Audit"]},
           "acl": [{"path": "/", "ugids": ["root@pam!ro"], "roles": ["Audit"], "propagate": 1}]}
    with pytest.raises(PVEError) as e:
        pve.check_modify_perm("root@pam!ro", 129, {}, {"lock": "backup"}, [], "1", cfg)
    assert e.value.msg == "Permission check failed (/vms/129, VM.Config.Options)"


# ---- 4. GET /pending ----------------------------------------------------------------------------------

def test_pending_array_shape():
    conf = {"memory": "512", "cores": "2", "digest": "ab" * 20, "lxc": [("lxc.x", "y")], "_rest": []}
    res = pve.config_with_pending_array(conf, {"memory": "1024", "swap": "0"}, {"cores": 0, "dev0": 1})
    by_key = {r["key"]: r for r in res}
    assert by_key["memory"] == {"key": "memory", "value": "512", "pending": "1024"}
    assert by_key["cores"] == {"key": "cores", "value": "2", "delete": 1}
    assert by_key["digest"] == {"key": "digest", "value": "ab" * 20}
    assert by_key["swap"] == {"key": "swap", "pending": "0"}
    assert by_key["dev0"] == {"key": "dev0", "delete": 2}
    assert "lxc" not in by_key and "_rest" not in by_key


def test_pending_without_pending_changes_is_the_config():
    res = pve.config_with_pending_array({"memory": "512", "digest": "d"})
    assert sorted(res, key=lambda r: r["key"]) == [{"key": "digest", "value": "d"}, {"key": "memory", "value": "512"}]


# ---- 5. a stop that does not stop ------------------------------------------------------------------------

def test_stop_failure_is_reported():
    cmd = ["lxc-stop", "-n", "129", "--kill"]
    log, error = pve.stop_outcome(129, cmd, 1, True)
    assert log == ["command 'lxc-stop -n 129 --kill' failed: exit code 1"]
    assert error == "container did not stop"
    assert pve.stop_outcome(129, cmd, 0, False) == ([], None)
    assert pve.stop_outcome(129, cmd, 0, True) == ([], "container did not stop")
    assert pve.stop_outcome(129, cmd, 2, False) == (["command 'lxc-stop -n 129 --kill' failed: exit code 2"], None)


# ---- API parameter schemas -------------------------------------------------------------------------------

def test_api_status_parameters():
    api.check_params({"skiplock": "1", "node": "pve1"}, api.STATUS_PARAMS["stop"])
    with pytest.raises(PVEError) as e:
        api.check_params({"forceStop": "1"}, api.STATUS_PARAMS["stop"])
    assert e.value.code == 400 and e.value.errors == {"forceStop": SCHEMA_ERROR}
    with pytest.raises(PVEError) as e:
        api.check_params({"overrule-shutdown": "1"}, api.STATUS_PARAMS["stop"])
    assert e.value.errors == {"overrule-shutdown": "not simulated by the lab"}
    with pytest.raises(PVEError) as e:
        api.check_params({"skiplock": "1"}, api.STATUS_PARAMS["shutdown"])
    assert e.value.errors == {"skiplock": SCHEMA_ERROR}
