"""The simulated PVE node's REST API, driven by proxmoxer unchanged (TLS verified with the lab CA)."""
from __future__ import annotations

import os
import re
import stat

import pytest
from proxmoxer.core import ResourceException

from conftest import LIFECYCLE_VMID, NODE, NODE2, create_ct, destroy, pct, wait_task

UPID_RE = re.compile(r"^UPID:pve1:[0-9A-F]{8}:[0-9A-F]{8}:[0-9A-F]{8}:[a-z]+:\d+:root@pam(!lab)?:$")
DEV_REFUSED = "Permission check failed (configuring device passthrough is only allowed for root@pam)"


def test_version_nodes_and_node_memory(api_token):
    assert api_token.version.get()["release"]
    nodes = api_token.nodes.get()
    assert [n["node"] for n in nodes] == [NODE, NODE2] and {n["status"] for n in nodes} == {"online"}
    assert nodes[0]["ssl_fingerprint"] != nodes[1]["ssl_fingerprint"]
    mem = api_token.nodes(NODE).status.get()["memory"]
    with open("/proc/meminfo") as f:
        total = int(f.readline().split()[1]) * 1024
    assert mem["total"] == total


def test_bad_credentials_are_refused(lab):
    from proxmoxer import ProxmoxAPI
    from proxmoxer.core import AuthenticationError
    with pytest.raises(AuthenticationError):
        ProxmoxAPI("127.0.0.1", user="root@pam", password="wrong", verify_ssl="/var/lib/inferops-lab/pki/ca.pem")
    bad = ProxmoxAPI("127.0.0.1", user="root@pam", token_name="lab", token_value="nope",
                     verify_ssl="/var/lib/inferops-lab/pki/ca.pem")
    with pytest.raises(ResourceException) as e:
        bad.nodes.get()
    assert e.value.status_code == 401


def test_tls_needs_the_lab_ca(lab):
    import requests
    with pytest.raises(requests.exceptions.SSLError):
        requests.get("https://127.0.0.1:8006/api2/json/version", timeout=5)


def test_create_configure_start_stop_destroy(api_token):
    vmid = LIFECYCLE_VMID
    nodeapi = api_token.nodes(NODE)
    try:
        create_ct(api_token, vmid, memory=256)
        conf = nodeapi.lxc(vmid).config.get()
        assert conf["memory"] == 256 and "lock" not in conf and re.fullmatch(r"[0-9a-f]{40}", conf["digest"])
        assert conf["net0"].startswith("name=eth0,bridge=vmbr0,ip=10.77.0.198/24")
        nodeapi.lxc(vmid).config.put(memory=320, description="lab test", digest=conf["digest"])
        conf2 = nodeapi.lxc(vmid).config.get()
        assert conf2["memory"] == 320 and conf2["digest"] != conf["digest"]
        with open(f"/etc/pve/lxc/{vmid}.conf") as f:
            raw = f.read()
        assert raw.startswith("#lab test\n") and "memory: 320\n" in raw
        assert "lxc.cgroup.memory.limit_in_bytes" not in raw  # the translation lives in /var/lib/lxc
        upid = nodeapi.lxc(vmid).status.start.post()
        assert UPID_RE.match(upid), upid
        st = wait_task(api_token, upid)
        assert st["status"] == "stopped" and st["exitstatus"] == "OK" and st["type"] == "vzstart"
        cur = nodeapi.lxc(vmid).status.current.get()
        assert cur["status"] == "running" and cur["maxmem"] == 320 * 1024 ** 2 and cur["pid"] > 1
        with open(f"/var/lib/lxc/{vmid}/config") as f:
            lxc = f.read()
        assert f"lxc.cgroup.memory.limit_in_bytes = {320 * 1024 ** 2}" in lxc
        assert [c["vmid"] for c in nodeapi.lxc.get() if c["vmid"] == vmid]
        upid = nodeapi.lxc(vmid).status.stop.post()
        assert wait_task(api_token, upid)["exitstatus"] == "OK"
        assert nodeapi.lxc(vmid).status.current.get()["status"] == "stopped"
        log = nodeapi.tasks(upid).log.get()
        assert log[-1]["t"] == "TASK OK"
        upid = nodeapi.lxc(vmid).delete()
        assert wait_task(api_token, upid)["exitstatus"] == "OK"
        assert not os.path.exists(f"/etc/pve/lxc/{vmid}.conf")
        with pytest.raises(ResourceException) as e:
            nodeapi.lxc(vmid).config.get()
        assert e.value.status_code == 500 and "does not exist" in e.value.content
    finally:
        destroy(vmid)


def test_stale_digest_is_refused(api_token, ct):
    cfg = api_token.nodes(NODE).lxc(ct).config
    old = cfg.get()["digest"]
    cfg.put(description="first writer", digest=old)
    with pytest.raises(ResourceException) as e:
        cfg.put(description="second writer", digest=old)
    assert e.value.status_code == 500
    assert e.value.content == "detected modified configuration - file changed by other user? Try again."
    assert cfg.get()["description"] == "first writer"


def test_delete_list(api_root, ct):
    cfg = api_root.nodes(NODE).lxc(ct).config
    cfg.put(description="x", tags="a")
    cfg.put(delete="description,tags")
    conf = cfg.get()
    assert "description" not in conf and "tags" not in conf


def test_unknown_option_is_a_parameter_error(api_root, ct):
    with pytest.raises(ResourceException) as e:
        api_root.nodes(NODE).lxc(ct).config.put(bogus=1)
    assert e.value.status_code == 400 and "bogus" in e.value.errors


def test_dev_passthrough_only_for_root_pam(api_root, api_token, ct):
    cfg_tok = api_token.nodes(NODE).lxc(ct).config
    with pytest.raises(ResourceException) as e:
        cfg_tok.put(dev0="/dev/null")
    assert e.value.status_code == 403 and e.value.content == DEV_REFUSED
    assert "dev0" not in cfg_tok.get()
    api_root.nodes(NODE).lxc(ct).config.put(dev0="/dev/null,mode=0666")
    assert api_root.nodes(NODE).lxc(ct).config.get()["dev0"] == "/dev/null,mode=0666"
    with pytest.raises(ResourceException) as e:  # a token may not remove it either
        cfg_tok.put(delete="dev0")
    assert e.value.status_code == 403
    api_root.nodes(NODE).lxc(ct).config.put(delete="dev0")


def test_missing_device_refuses_start(api_root, ct):
    node = "/dev/inferops-labtest-gpu"
    nodeapi = api_root.nodes(NODE)
    with pytest.raises(ResourceException) as e:
        nodeapi.lxc(ct).config.put(dev1=node)
    assert e.value.content == f"Device {node} does not exist"
    os.mknod(node, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    try:
        nodeapi.lxc(ct).config.put(dev1=node)
    finally:
        os.unlink(node)
    assert wait_task(api_root, nodeapi.lxc(ct).status.stop.post())["exitstatus"] == "OK"
    try:
        upid = nodeapi.lxc(ct).status.start.post()
        st = wait_task(api_root, upid)
        assert st["exitstatus"] == f"startup for container '{ct}' failed"
        log = [ln["t"] for ln in nodeapi.tasks(upid).log.get()]
        assert f"Could not get mode or device ID of {node}" in log
        assert nodeapi.lxc(ct).status.current.get()["status"] == "stopped"
    finally:
        nodeapi.lxc(ct).config.put(delete="dev1")
        assert wait_task(api_root, nodeapi.lxc(ct).status.start.post())["exitstatus"] == "OK"


def test_nvidia_dev_binds_driver_dir(api_root, ct):
    """An NVIDIA devN entry becomes a bind mount of the node plus /run/nvidia-lab inside the CT."""
    node = "/dev/nvidia-labtest"
    created = not os.path.exists(node)
    if created:
        os.mknod(node, 0o666 | stat.S_IFCHR, os.makedev(195, 200))
    os.makedirs("/run/nvidia-lab", exist_ok=True)
    nodeapi = api_root.nodes(NODE)
    try:
        nodeapi.lxc(ct).config.put(dev5=node)
        assert wait_task(api_root, nodeapi.lxc(ct).status.reboot.post(timeout=10))["exitstatus"] == "OK"
        with open(f"/var/lib/lxc/{ct}/config") as f:
            lxc = f.read()
        assert "lxc.cgroup.devices.allow = c 195:200 rw" in lxc
        r = pct("exec", str(ct), "--", "stat", "-c", "%F %t:%T", node)
        assert r.returncode == 0 and r.stdout.strip() == "character special file c3:c8", r
        r = pct("exec", str(ct), "--", "findmnt", "-n", "-o", "TARGET", "/run/nvidia-lab")
        assert r.stdout.strip() == "/run/nvidia-lab", r
    finally:
        nodeapi.lxc(ct).config.put(delete="dev5")
        if created:
            os.unlink(node)


def test_lock_refuses_start_and_stop_without_skiplock(api_root, api_token, ct):
    nodeapi = api_root.nodes(NODE)
    # `lock` needs VM.Config.Options (check_ct_modify_config_perm has no root@pam rule for it), which the
    # full-privilege token has
    api_token.nodes(NODE).lxc(ct).config.put(lock="backup")
    try:
        with pytest.raises(ResourceException) as e:  # skiplock: root@pam only, a 400 parameter error
            api_token.nodes(NODE).lxc(ct).status.stop.post(skiplock=1)
        assert e.value.status_code == 400 and e.value.errors == {"skiplock": "Only root may use this option."}
        st = wait_task(api_root, nodeapi.lxc(ct).status.shutdown.post(timeout=5))
        assert st["exitstatus"] == "CT is locked (backup)"
        with pytest.raises(ResourceException) as e:
            nodeapi.lxc(ct).config.put(description="while locked")
        assert e.value.content == "CT is locked (backup)"
        assert nodeapi.lxc(ct).status.current.get()["lock"] == "backup"
    finally:
        assert pct("unlock", str(ct)).returncode == 0
    assert "lock" not in nodeapi.lxc(ct).config.get()


SCHEMA_ERROR = "property is not defined in schema and the schema does not allow additional properties"


def test_update_vm_schema_and_read_only_options(api_root, ct):
    cfg = api_root.nodes(NODE).lxc(ct).config
    with pytest.raises(ResourceException) as e:  # update_vm has no skiplock
        cfg.put(memory=300, skiplock=1)
    assert e.value.status_code == 400 and e.value.errors == {"skiplock": SCHEMA_ERROR}
    with pytest.raises(ResourceException) as e:
        cfg.put(unprivileged=1)
    assert e.value.status_code == 500 and e.value.content == "unable to modify read-only option: 'unprivileged'"
    for opt in ("memory", "rootfs", "ostype"):
        with pytest.raises(ResourceException) as e:
            cfg.put(delete=opt)
        assert e.value.status_code == 500 and e.value.content == f"unable to delete required option '{opt}'"
    with pytest.raises(ResourceException) as e:
        cfg.put(delete="unprivileged")
    assert e.value.content == "unable to delete read-only option: 'unprivileged'"
    with pytest.raises(ResourceException) as e:
        cfg.put(delete="bogus")
    assert e.value.status_code == 400 and e.value.errors == {"delete": "unknown option 'bogus'"}
    conf = cfg.get()
    assert conf["memory"] == 512 and conf["unprivileged"] == 1


def test_feature_flags_for_tokens(api_root, api_token, ct):
    """Unprivileged CT: a token may change `nesting` only; other features and privileged CTs are root@pam's."""
    tok = api_token.nodes(NODE).lxc(ct).config
    root = api_root.nodes(NODE).lxc(ct).config
    try:
        tok.put(features="nesting=1")
        with pytest.raises(ResourceException) as e:
            tok.put(features="nesting=1,keyctl=1")
        assert e.value.status_code == 403 and e.value.content == (
            "Permission check failed (changing feature flags (except nesting) is only allowed for root@pam)")
        root.put(features="nesting=1,keyctl=1")
        with pytest.raises(ResourceException) as e:
            tok.put(delete="features")
        assert e.value.status_code == 403
    finally:
        root.put(delete="features")


def test_pending_is_pves_array(api_token, ct):
    conf = api_token.nodes(NODE).lxc(ct).config.get()
    pending = api_token.nodes(NODE).lxc(ct).pending.get()
    by_key = {item["key"]: item for item in pending}
    assert by_key["memory"] == {"key": "memory", "value": conf["memory"]}
    assert by_key["digest"] == {"key": "digest", "value": conf["digest"]}
    assert all(set(item) <= {"key", "value", "pending", "delete"} for item in pending)
    assert "lxc" not in by_key


def test_status_parameters_are_checked(api_root, ct):
    st = api_root.nodes(NODE).lxc(ct).status
    with pytest.raises(ResourceException) as e:
        st.stop.post(forceStop=1)
    assert e.value.status_code == 400 and e.value.errors == {"forceStop": SCHEMA_ERROR}
    with pytest.raises(ResourceException) as e:
        st.start.post()
    assert e.value.status_code == 500 and e.value.content == f"CT {ct} already running"
