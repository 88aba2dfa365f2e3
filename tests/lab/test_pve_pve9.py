"""The lab as a PVE 9 node: the version it reports, create's PVE 9 defaults, the config keys PVE 9 added, and the
collection's pve_lxc on a container whose operator set them (docs/lab.md "PVE's schema", "PVE 9").

CT 174 (created and destroyed here). What is checked is what the node holds afterwards: the config file under
/etc/pve, `pct config`, GET .../config, the container's real LXC config.
"""
from __future__ import annotations

import json
import os
import re
import subprocess

import pytest

from conftest import NODE, REPO, TEMPLATE, create_ct, destroy, pct, secret, wait_task

VMID = 174
CONF = f"/etc/pve/nodes/{NODE}/lxc/{VMID}.conf"
ENV = "HF_HOME=/models\0GREETING=two words"
ENTRYPOINT = "/sbin/init --log-level=info"
IDMAP = "u:0:1000:1;g:0:1000:1"  # mp[n] idmap: pve-container 6.1.6 (PVE 9.2), not in 9.1.3's schema


def read(path: str) -> str:
    with open(path) as f:
        return f.read()


def pve_lxc(*flags: str, **args) -> dict:
    """The collection's pve_lxc through ansible (the lab's API token, TLS checked), as a role would call it."""
    base = dict(api_host="127.0.0.1", api_user="root@pam", api_token_id="lab", api_token_secret=secret("token-secret"),
                ca_path="/var/lib/inferops-lab/pki/ca.pem", node=NODE, vmid=VMID)
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg"), ANSIBLE_LOAD_CALLBACK_PLUGINS="1",
               ANSIBLE_STDOUT_CALLBACK="json")
    r = subprocess.run([os.path.join(REPO, ".venv", "bin", "ansible"), "localhost", "-c", "local", *flags,
                        "-m", "inferops.gpu_inference.pve_lxc", "-a", json.dumps(dict(base, **args))],
                       capture_output=True, text=True, cwd=REPO, env=env, timeout=300)
    assert r.returncode in (0, 2), r.stdout[-3000:] + r.stderr[-3000:]
    return json.loads(r.stdout)["plays"][0]["tasks"][0]["hosts"]["localhost"]


def test_version_is_a_9x_release(api_token):
    for v in (api_token.version.get(), api_token.nodes(NODE).version.get()):
        assert v["release"] == "9.1" and re.fullmatch(r"9\.1\.\d+", v["version"]) and v["repoid"], v


def test_create_defaults_to_unprivileged(api_token):
    """PVE 9 create_vm: without `unprivileged` the CT is unprivileged (8.x: privileged); the file says so and the
    extracted rootfs belongs to the mapped root (100000)."""
    destroy(VMID)
    try:
        st = wait_task(api_token, api_token.nodes(NODE).lxc.post(vmid=VMID, ostemplate=TEMPLATE))
        assert st["exitstatus"] == "OK", st
        assert "unprivileged: 1\n" in read(CONF)
        assert api_token.nodes(NODE).lxc(VMID).config.get()["unprivileged"] == 1
        assert os.stat(f"/var/lib/lxc/{VMID}/rootfs/etc").st_uid == 100000
    finally:
        destroy(VMID)


@pytest.fixture
def operator_ct(api_root):
    """CT 174 as an operator of PVE 9 left it: entrypoint, env, net0 host-managed, a bind mount with keepattrs
    (root@pam: bind mounts are root's), and an idmap on that mount point written into the file as PVE 9.2 writes
    it. Stopped."""
    create_ct(api_root, VMID, tags="inferops-test")
    cfg = api_root.nodes(NODE).lxc(VMID).config
    net0 = cfg.get()["net0"] + ",host-managed=1"
    cfg.put(entrypoint=ENTRYPOINT, env=ENV, net0=net0, mp0="/srv,mp=/mnt/srv,keepattrs=1")
    text = read(CONF).replace("keepattrs=1", f"keepattrs=1,idmap={IDMAP}")
    with open(CONF, "w") as f:
        f.write(text)
    yield cfg
    destroy(VMID)


def test_pve9_keys_are_kept_and_returned(operator_ct):
    """GET config returns them as PVE 9 does (env NUL-joined from lxc.environment.runtime lines); the real LXC
    config runs the entrypoint with the environment."""
    conf = operator_ct.get()
    assert conf["entrypoint"] == ENTRYPOINT and conf["env"] == ENV
    assert "host-managed=1" in conf["net0"] and conf["mp0"] == f"/srv,mp=/mnt/srv,keepattrs=1,idmap={IDMAP}"
    text = read(CONF)
    assert "lxc.environment.runtime: HF_HOME=/models\nlxc.environment.runtime: GREETING=two words\n" in text
    assert "env:" not in text
    out = pct("config", str(VMID)).stdout
    assert f"entrypoint: {ENTRYPOINT}\nenv: {ENV}\n" in out and "lxc.environment" not in out  # pct.pm prints env


def test_pve_lxc_leaves_the_operators_pve9_keys(operator_ct):
    """pve_lxc declares hostname, memory and net0 (without host-managed); the run changes memory and the address,
    and leaves entrypoint, env, host-managed, keepattrs and idmap as the operator set them. Check mode's diff
    shows env the way PVE writes it."""
    before = operator_ct.get()
    net0 = f"name=eth0,bridge=vmbr0,ip=10.77.0.{VMID + 1}/24,gw=10.77.0.1"
    declared = dict(state="present", hostname=f"labtest{VMID}", memory_mib=640, net={"net0": net0},
                    owner_tag="inferops-test")
    res = pve_lxc("--check", "--diff", **declared)
    assert res["changed"] is True and "lxc.environment.runtime: HF_HOME=/models" in res["diff"]["before"]
    assert operator_ct.get()["digest"] == before["digest"]  # check mode changed nothing

    res = pve_lxc(**declared)
    assert res["changed"] is True and not res.get("failed"), res
    assert set(res["changes"]["set"]) == {"memory", "net0"} and res["changes"]["delete"] == []
    after = operator_ct.get()
    assert after["memory"] == 640 and f"ip=10.77.0.{VMID + 1}/24" in after["net0"]
    assert after["entrypoint"] == ENTRYPOINT and after["env"] == ENV
    assert "host-managed=1" in after["net0"] and before["net0"].split("hwaddr=")[1][:17] in after["net0"]
    assert after["mp0"] == before["mp0"] == f"/srv,mp=/mnt/srv,keepattrs=1,idmap={IDMAP}"
    text = read(CONF)
    assert "lxc.environment.runtime: HF_HOME=/models\n" in text and f"idmap={IDMAP}" in text

    assert pve_lxc(**declared)["changed"] is False  # the same declaration again: nothing to do
    # declared, they are managed: host-managed=0 is sent, env replaced
    res = pve_lxc(**dict(declared, net={"net0": net0 + ",host-managed=0"}, extra_config={"env": ["HF_HOME=/m2"]}))
    assert set(res["changes"]["set"]) == {"net0", "env"}, res
    after = operator_ct.get()
    assert after["env"] == "HF_HOME=/m2" and "host-managed=0" in after["net0"]
    assert "GREETING" not in read(CONF)


def test_entrypoint_and_env_reach_the_container(operator_ct, api_root):
    """update_lxc_config: `lxc.init.cmd = <entrypoint>`, a /dev/shm tmpfs for an entrypoint other than
    /sbin/init, each env variable for the container (the lab's LXC 5: lxc.environment)."""
    operator_ct.put(delete="mp0", entrypoint="/sbin/init")
    st = wait_task(api_root, api_root.nodes(NODE).lxc(VMID).status.start.post())
    assert st["exitstatus"] == "OK", st
    lxc_conf = read(f"/var/lib/lxc/{VMID}/config")
    assert "lxc.init.cmd = /sbin/init\n" in lxc_conf and "dev/shm tmpfs" not in lxc_conf
    assert "lxc.environment = GREETING=two words\n" in lxc_conf
    pid = int(subprocess.run(["lxc-info", "-n", str(VMID), "-p", "-H"], capture_output=True, text=True).stdout)
    environ = read(f"/proc/{pid}/environ").split("\0")
    assert "HF_HOME=/models" in environ and "GREETING=two words" in environ


def test_running_ct_reports_pressure(ct, api_token):
    """PVE 9 vmstatus: pressure{cpu,io,memory}{some,full} of a running CT, read from its cgroup's *.pressure (the
    avg10 as parse_pressure captures it: a string); list and status/current alike."""
    st = api_token.nodes(NODE).lxc(ct).status.current.get()
    listed = next(e for e in api_token.nodes(NODE).lxc.get() if e["vmid"] == ct)
    for entry in (st, listed):
        for t in ("cpu", "io", "memory"):
            for kind in ("some", "full"):
                assert re.fullmatch(r"\d+\.\d\d", entry[f"pressure{t}{kind}"]), entry
