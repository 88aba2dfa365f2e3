# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

import pytest

from ansible_collections.inferops.gpu_inference.plugins.module_utils import pve_config as pc

# GET /nodes/pve/lxc/129/config as PVE returns it (ints for integer options).
CURRENT = {
    "arch": "amd64",
    "cores": 8,
    "digest": "1f2e3d4c5b6a79881f2e3d4c5b6a79881f2e3d4c",
    "features": "nesting=1,keyctl=1",
    "hostname": "sglang-129",
    "memory": 65536,
    "net0": "name=eth0,bridge=vmbr0,hwaddr=BC:24:11:2A:3B:4C,ip=dhcp,type=veth",
    "ostype": "debian",
    "rootfs": "local-lvm:vm-129-disk-0,size=200G",
    "swap": 0,
    "unprivileged": 1,
    "dev0": "/dev/nvidia0",
    "dev1": "/dev/nvidia1",
    "dev2": "/dev/nvidiactl",
    "dev3": "/dev/nvidia-uvm",
    "dev4": "/dev/nvidia-uvm-tools",
    "dev5": "/dev/dri/renderD128,gid=104",
}


# ---- property strings -----------------------------------------------------------------------


def test_parse_property_string_default_key():
    assert pc.parse_property_string("local-lvm:vm-129-disk-0,size=8G", "volume") == {
        "volume": "local-lvm:vm-129-disk-0",
        "size": "8G",
    }
    assert pc.parse_property_string("/dev/nvidia0,gid=44", "path") == {"path": "/dev/nvidia0", "gid": "44"}
    assert pc.parse_property_string("path=/dev/nvidia0", "path") == {"path": "/dev/nvidia0"}
    assert pc.parse_property_string("") == {}


def test_parse_property_string_errors():
    with pytest.raises(pc.ConfigError, match="not key=value"):
        pc.parse_property_string("name=eth0,bridge")
    with pytest.raises(pc.ConfigError, match="appears twice"):
        pc.parse_property_string("name=eth0,name=eth1")


def test_format_roundtrip():
    props = {"path": "/dev/nvidia0", "gid": "44"}
    assert pc.format_property_string(props, "path") == "/dev/nvidia0,gid=44"


def test_parse_size_bytes():
    assert pc.parse_size_bytes("8G") == 8 * 1024**3
    assert pc.parse_size_bytes("512M") == 512 * 1024**2
    assert pc.parse_size_bytes("1024") == 1024
    assert pc.parse_size_bytes("0.5T") == 512 * 1024**3
    with pytest.raises(pc.ConfigError, match="disk size"):
        pc.parse_size_bytes("eight")


# ---- option comparison ----------------------------------------------------------------------


def test_compare_key_order_and_booleans():
    assert pc.compare_option("features", "nesting=1,keyctl=1", "keyctl=true,nesting=yes").equal
    assert pc.compare_option("features", "nesting=1", "nesting=1,keyctl=0").equal  # default dropped
    assert not pc.compare_option("features", "nesting=1", "nesting=1,keyctl=1").equal


def test_compare_net_keeps_pve_filled_keys():
    current = CURRENT["net0"]
    cmp = pc.compare_option("net0", current, "name=eth0,bridge=vmbr0,ip=dhcp")
    assert cmp.equal
    cmp = pc.compare_option("net0", current, "name=eth0,bridge=vmbr1,ip=dhcp")
    assert not cmp.equal
    # The MAC address PVE generated is kept when the new value does not name one.
    assert pc.parse_property_string(cmp.put_value)["hwaddr"] == "BC:24:11:2A:3B:4C"
    assert pc.compare_option("net0", current, "name=eth0,bridge=vmbr0,ip=dhcp,hwaddr=bc:24:11:2a:3b:4c").equal


def test_compare_rootfs_allocation_form():
    current = "local-lvm:vm-129-disk-0,size=200G"
    assert pc.compare_option("rootfs", current, "local-lvm:200").equal
    assert pc.compare_option("rootfs", current, "local-lvm:vm-129-disk-0").equal  # size filled by PVE
    assert pc.compare_option("rootfs", current, "local-lvm:vm-129-disk-0,size=204800M").equal
    cmp = pc.compare_option("rootfs", current, "local-lvm:200,mountoptions=noatime")
    assert not cmp.equal
    # Never send the allocation form for an existing volume: that would allocate a new disk.
    assert cmp.put_value == "local-lvm:vm-129-disk-0,mountoptions=noatime,size=200G"


def test_compare_rootfs_refuses_resize_and_move():
    current = "local-lvm:vm-129-disk-0,size=200G"
    with pytest.raises(pc.ConfigError, match="does not resize"):
        pc.compare_option("rootfs", current, "local-lvm:300")
    with pytest.raises(pc.ConfigError, match="does not move"):
        pc.compare_option("rootfs", current, "zfs:200")
    with pytest.raises(pc.ConfigError, match="does not swap or move"):
        pc.compare_option("rootfs", current, "local-lvm:vm-129-disk-1")


def test_compare_scalars():
    assert pc.compare_option("memory", 65536, "65536").equal
    assert pc.compare_option("onboot", 1, "true").equal
    assert not pc.compare_option("cores", 8, "16").equal
    assert pc.compare_option("cpulimit", 2.0, "2").equal


# ---- devN ------------------------------------------------------------------------------------


def test_gpu_device_paths_count():
    assert pc.gpu_device_paths(2) == [
        "/dev/nvidia0",
        "/dev/nvidia1",
        "/dev/nvidiactl",
        "/dev/nvidia-uvm",
        "/dev/nvidia-uvm-tools",
    ]
    assert pc.gpu_device_paths(0) == []
    assert pc.gpu_device_paths([]) == []
    assert pc.gpu_device_paths("1") == ["/dev/nvidia0", "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]


def test_gpu_device_paths_list():
    paths = pc.gpu_device_paths(["/dev/nvidia3", 5, "/dev/nvidia-caps/nvidia-cap1", "/dev/nvidiactl"])
    assert paths == [
        "/dev/nvidia3",
        "/dev/nvidia5",
        "/dev/nvidia-caps/nvidia-cap1",
        "/dev/nvidiactl",
        "/dev/nvidia-uvm",
        "/dev/nvidia-uvm-tools",
    ]


@pytest.mark.parametrize(
    "spec,match",
    [
        (True, "not a boolean"),
        (-1, ">= 0"),
        ({"a": 1}, "GPU count"),
        (["nvidia0"], "must start with /dev/"),
        (["/dev/../etc/passwd"], "/../"),
        (["/dev/nvidia-caps"], "is a directory"),
        (300, "at most 256"),
    ],
)
def test_gpu_device_paths_errors(spec, match):
    with pytest.raises(pc.ConfigError, match=match):
        pc.gpu_device_paths(spec)


def test_device_options():
    assert pc.device_options_suffix({"gid": 44, "mode": "0666", "uid": None}) == {"gid": "44", "mode": "0666"}
    assert pc.device_options_suffix({"deny_write": True}) == {"deny-write": "1"}
    with pytest.raises(pc.ConfigError, match="quoted octal string"):
        pc.device_options_suffix({"mode": 438})
    with pytest.raises(pc.ConfigError, match="0\\[0-7\\]"):
        pc.device_options_suffix({"mode": "666"})
    with pytest.raises(pc.ConfigError, match="unknown key"):
        pc.device_options_suffix({"owner": 1})
    assert pc.device_entry("/dev/nvidia0", {"gid": "44"}) == "/dev/nvidia0,gid=44"


def test_plan_gpu_devices_idempotent_keeps_indices():
    desired, delete = pc.plan_gpu_devices(CURRENT, pc.gpu_device_paths(2), {})
    assert desired == {
        "dev0": "/dev/nvidia0",
        "dev1": "/dev/nvidia1",
        "dev2": "/dev/nvidiactl",
        "dev3": "/dev/nvidia-uvm",
        "dev4": "/dev/nvidia-uvm-tools",
    }
    assert delete == []
    assert not pc.plan_config(CURRENT, desired).changed


def test_plan_gpu_devices_reordered_is_not_a_change():
    current = {"dev0": "/dev/nvidia1", "dev1": "/dev/nvidia0", "dev2": "path=/dev/nvidiactl",
               "dev3": "/dev/nvidia-uvm", "dev4": "/dev/nvidia-uvm-tools"}
    desired, delete = pc.plan_gpu_devices(current, pc.gpu_device_paths(2), {})
    assert not pc.plan_config(current, desired, delete).changed


def test_plan_gpu_devices_grow_shrink_and_options():
    # Grow to 3 GPUs: the new one takes the lowest free index (dev6; dev5 is a non-NVIDIA device).
    desired, delete = pc.plan_gpu_devices(CURRENT, pc.gpu_device_paths(3), {})
    plan = pc.plan_config(CURRENT, desired, delete)
    assert plan.set == {"dev6": "/dev/nvidia2"} and plan.delete == []
    # Shrink to one GPU: dev1 goes, the render node is left alone.
    desired, delete = pc.plan_gpu_devices(CURRENT, pc.gpu_device_paths(1), {})
    plan = pc.plan_config(CURRENT, desired, delete)
    assert plan.set == {} and plan.delete == ["dev1"]
    assert plan.touches_devices()
    # No GPUs at all.
    desired, delete = pc.plan_gpu_devices(CURRENT, [], {})
    assert desired == {} and delete == ["dev0", "dev1", "dev2", "dev3", "dev4"]
    # New options change every entry in place.
    desired, _unused = pc.plan_gpu_devices(CURRENT, pc.gpu_device_paths(2), {"gid": "44"})
    plan = pc.plan_config(CURRENT, desired)
    assert plan.set["dev0"] == "/dev/nvidia0,gid=44" and len(plan.set) == 5


def test_plan_gpu_devices_reserved_and_replacement():
    current = {"dev0": "/dev/nvidia0", "dev1": "/dev/nvidiactl"}
    desired, delete = pc.plan_gpu_devices(current, pc.gpu_device_paths(["/dev/nvidia1"]), {}, reserved_keys={"dev2": "/dev/net/tun"})
    # nvidia0 is replaced: its index is reused; dev2 is reserved by extra_config.
    assert desired["dev1"] == "/dev/nvidiactl"
    assert "dev2" not in desired
    assert sorted(desired.values()) == sorted(["/dev/nvidia1", "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"])
    assert delete == []
    assert desired["dev0"] == "/dev/nvidia1"


# ---- desired config and plan ---------------------------------------------------------------


def test_build_desired_config():
    desired, delete = pc.build_desired_config(
        hostname="sglang-129",
        cores=8,
        memory_mib=65536,
        swap_mib=0,
        rootfs="local-lvm:200",
        net={"net0": {"name": "eth0", "bridge": "vmbr0", "ip": "dhcp"}},
        features={"nesting": True, "keyctl": False},
        extra_config={"onboot": True, "tags": "sglang", "description": None},
    )
    assert desired == {
        "hostname": "sglang-129",
        "cores": "8",
        "memory": "65536",
        "swap": "0",
        "rootfs": "local-lvm:200",
        "net0": "name=eth0,bridge=vmbr0,ip=dhcp",
        "features": "nesting=1,keyctl=0",
        "onboot": "1",
        "tags": "sglang",
    }
    assert delete == ["description"]


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"memory_mib": 8}, "MiB and PVE's minimum is 16"),
        ({"hostname": "bad_name"}, "not a valid DNS name"),
        ({"net": {"eth0": "name=eth0"}}, "net0, net1"),
        ({"extra_config": {"lxc.cgroup2.devices.allow": "c 195:* rwm"}}, "not PVE API parameters"),
        ({"extra_config": {"digest": "x"}}, "not a container option"),
        ({"memory_mib": 1024, "extra_config": {"memory": 2048}}, "also set by the option memory_mib"),
        ({"features": 5}, "must be a string"),
        ({"extra_config": {"dev9": "nvidia0"}}, "must start with /dev/"),
        ({"cores": 0}, "between 1 and 8192"),
    ],
)
def test_build_desired_config_errors(kwargs, match):
    with pytest.raises(pc.ConfigError, match=match):
        pc.build_desired_config(**kwargs)


def test_plan_config_idempotent_against_pve_formatting():
    desired, _unused = pc.build_desired_config(
        hostname="sglang-129",
        cores=8,
        memory_mib=65536,
        swap_mib=0,
        rootfs="local-lvm:200",
        net={"net0": "name=eth0,bridge=vmbr0,ip=dhcp"},
        features="keyctl=1,nesting=1",
        extra_config={"unprivileged": True},
    )
    plan = pc.plan_config(CURRENT, desired)
    assert not plan.changed, plan


def test_plan_config_changes_and_delete():
    desired, delete = pc.build_desired_config(memory_mib=131072, extra_config={"onboot": 1, "ostype": None})
    plan = pc.plan_config(CURRENT, desired, delete + ["mp0"])
    assert plan.set == {"memory": "131072", "onboot": "1"}
    assert plan.delete == ["ostype"]  # mp0 is not present: nothing to delete
    after = pc.apply_plan(CURRENT, plan)
    assert after["memory"] == "131072" and "ostype" not in after and "digest" not in after


# ---- conf text ---------------------------------------------------------------------------------


def test_render_conf():
    text = pc.render_conf({**CURRENT, "description": "SGLang\nline 2", "lxc": [["lxc.apparmor.profile", "unconfined"]]})
    lines = text.splitlines()
    assert lines[0] == "#SGLang" and lines[1] == "#line 2"
    assert "digest" not in text
    assert lines[-1] == "lxc.apparmor.profile: unconfined"
    keys = [line.split(":")[0] for line in lines[2:-1]]
    assert keys == sorted(keys)
    assert "memory: 65536" in lines
    assert pc.render_conf(None) == ""


# ---- tasks -------------------------------------------------------------------------------------


def test_upid_and_task_status():
    upid = "UPID:pve:000A1B2C:0234ABCD:6650F00D:vzcreate:198:root@pam:"
    assert pc.upid_node(upid) == "pve"
    with pytest.raises(pc.ConfigError, match="unexpected task ID"):
        pc.upid_node("nope")
    assert pc.task_succeeded({"status": "stopped", "exitstatus": "OK"})
    assert pc.task_succeeded({"status": "stopped", "exitstatus": "WARNINGS: 2"})
    assert not pc.task_succeeded({"status": "stopped", "exitstatus": "command 'lxc-start' failed: exit code 1"})
    assert not pc.task_succeeded({"status": "running"})
    log = [{"n": 2, "t": "second"}, {"n": 1, "t": "first"}, {"n": 3, "t": "TASK ERROR: boom"}]
    assert pc.task_log_tail(log, 2) == "second\nTASK ERROR: boom"


# ---- auth and errors ------------------------------------------------------------------------------


def test_normalize_token():
    assert pc.normalize_token("root@pam", "ansible") == ("root@pam", "ansible")
    assert pc.normalize_token(None, "root@pam!ansible") == ("root@pam", "ansible")
    with pytest.raises(pc.ConfigError, match="belongs to ops@pve"):
        pc.normalize_token("root@pam", "ops@pve!ansible")
    with pytest.raises(pc.ConfigError, match="api_user is required"):
        pc.normalize_token(None, "ansible")


def test_passthrough_auth_problem():
    assert pc.passthrough_auth_problem("password", "root@pam") is None
    assert pc.passthrough_auth_problem("local", None) is None
    msg = pc.passthrough_auth_problem("token", "root@pam")
    assert "API token" in msg and "api_password" in msg and "root@pam" in msg
    assert "ops@pve" in pc.passthrough_auth_problem("password", "ops@pve")


def _classify(names, text, code=None, **kw):
    return pc.classify_api_error(names, text, code, url="https://127.0.0.1:8006", **kw)


def test_classify_passthrough_refusal():
    err = _classify(
        ["ResourceException", "Exception"],
        "403 Forbidden: Permission check failed (configuring device passthrough is only allowed for root@pam)",
        403,
        auth_method="token",
    )
    assert err.kind == "passthrough_root_only"
    assert "api_user: root@pam" in err.message and "Vault" in err.message
    assert "configuring device passthrough is only allowed for root@pam" in err.message


def test_classify_other_root_only():
    err = _classify(["ResourceException"], "403 Forbidden: Permission check failed (changing the hookscript is only allowed for root@pam)", 403)
    assert err.kind == "root_only"


def test_classify_tls_and_connection():
    tls = _classify(
        ["SSLError", "ConnectionError", "RequestException", "OSError"],
        "HTTPSConnectionPool(host='127.0.0.1', port=8006): Max retries exceeded (Caused by SSLError(SSLCertVerificationError(1, "
        "'[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: self-signed certificate in certificate chain')))",
    )
    assert tls.kind == "tls_verify" and "ca_path" in tls.message and "validate_certs off" in tls.message
    with_ca = _classify(["SSLError"], "certificate verify failed", ca_path="/etc/ca.pem")
    assert "/etc/ca.pem" in with_ca.message
    refused = _classify(
        ["ConnectionError", "RequestException"],
        "HTTPSConnectionPool(host='127.0.0.1', port=8006): Max retries exceeded "
        "(Caused by NewConnectionError(': Failed to establish a new connection: [Errno 111] Connection refused'))",
    )
    assert refused.kind == "connection_refused" and "ca_path is not the cause" in refused.message
    timeout = _classify(["ConnectTimeout", "Timeout"], "timed out")
    assert timeout.kind == "timeout"
    dns = _classify(["ConnectionError"], "Failed to resolve 'pve.invalid' ([Errno -2] Name or service not known)")
    assert dns.kind == "name_resolution"


def test_classify_auth():
    pw = _classify(
        ["AuthenticationError", "Exception"],
        "Couldn't authenticate user: root@pam to https://127.0.0.1:8006/api2/json/access/ticket code: 401",
        auth_method="password",
        api_user="root@pam",
    )
    assert pw.kind == "auth_failed" and "api_password" in pw.message
    tok = _classify(["ResourceException"], "401 Unauthorized: authentication failure", 401, auth_method="token")
    assert tok.kind == "auth_failed" and "api_token_secret" in tok.message


def test_classify_digest_permission_other():
    dig = _classify(["ResourceException"], "500 Internal Server Error: detected modified configuration - file changed by other user? Try again.", 500)
    assert dig.kind == "digest_mismatch" and "Re-run" in dig.message
    perm = _classify(["ResourceException"], "403 Forbidden: Permission check failed (/vms/198, VM.Allocate)", 403, api_user="ops@pve")
    assert perm.kind == "permission" and "ops@pve" in perm.message
    other = _classify(["ResourceException"], "500 Internal Server Error: boom", 500)
    assert other.kind == "api_error" and "boom" in other.message
