# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""pve_config: the declared config, the plan, ownership and the conf text."""
from __future__ import annotations

import pytest

from ansible_collections.inferops.gpu_inference.plugins.module_utils.pve import pve_config as pc
from ansible_collections.inferops.gpu_inference.plugins.module_utils.pve.pve_options import ConfigError
from ansible_collections.inferops.gpu_inference.tests.unit.plugins.module_utils.pve_current import CURRENT


# ---- desired config and plan ---------------------------------------------------------------


# The options that declare CURRENT, as a playbook gives them.
DECLARED = dict(
    hostname="sglang-129",
    cores=8,
    memory_mib=65536,
    swap_mib=0,
    rootfs="local-lvm:200",
    net={"net0": "name=eth0,bridge=vmbr0,ip=dhcp"},
    features="keyctl=1,nesting=1",
)


def test_build_desired_config():
    desired, delete = pc.build_desired_config(
        **{**DECLARED,
           "net": {"net0": {"name": "eth0", "bridge": "vmbr0", "ip": "dhcp"}},
           "features": {"nesting": True, "keyctl": False}},
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
    with pytest.raises(ConfigError, match=match):
        pc.build_desired_config(**kwargs)


def test_plan_config_idempotent_against_pve_formatting():
    desired, _unused = pc.build_desired_config(**DECLARED, extra_config={"unprivileged": True})
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


# ---- from the module's parameters -----------------------------------------------------------

PARAMS = dict(DECLARED, extra_config={"unprivileged": True, "description": None}, delete=["mp0"],
              gpu_passthrough=2, gpu_device_options=None)


def test_declared_state():
    declared = pc.declared_state(PARAMS)
    assert declared.config["memory"] == "65536" and "dev0" not in declared.config
    assert declared.delete == ["description", "mp0"]
    assert declared.gpu_paths[:2] == ["/dev/nvidia0", "/dev/nvidia1"] and declared.dev_options == {}
    assert pc.declared_state({**PARAMS, "gpu_passthrough": None}).gpu_paths is None
    with pytest.raises(ConfigError, match="must start with /dev/"):
        pc.declared_state({**PARAMS, "gpu_passthrough": ["nvidia0"]})
    with pytest.raises(ConfigError, match="unknown key"):
        pc.declared_state({**PARAMS, "gpu_device_options": {"owner": 1}})


def test_plan_update_against_the_current_config():
    plan = pc.plan_update(CURRENT, pc.declared_state(PARAMS))
    assert not plan.changed  # the GPUs keep dev0..dev4; description and mp0 are not there
    plan = pc.plan_update(CURRENT, pc.declared_state({**PARAMS, "gpu_passthrough": 1, "memory_mib": 4096}))
    assert plan.set == {"memory": "4096"} and plan.delete == ["dev1"]
    assert plan.device_keys() == ["dev1"] and plan.touches_devices()
    assert plan.put_params("abc") == {"memory": "4096", "delete": "dev1", "digest": "abc"}
    assert plan.changes() == {"set": {"memory": "4096"}, "delete": ["dev1"]}
    # gpu_passthrough unset: devN entries are left alone.
    assert not pc.plan_update(CURRENT, pc.declared_state({**PARAMS, "gpu_passthrough": None})).changed


def test_create_config_and_params():
    declared = pc.declared_state({**PARAMS, "extra_config": {"dev0": "/dev/net/tun"}})
    config = pc.create_config(declared)
    assert config["dev0"] == "/dev/net/tun" and config["dev1"] == "/dev/nvidia0" and config["dev5"] == "/dev/nvidia-uvm-tools"
    post = pc.create_params(config, 129, dict(ostemplate="local:vztmpl/t.tar.zst", unprivileged=True, password=None,
                                              ssh_public_keys="ssh-ed25519 AAAA", pool=None))
    assert post["vmid"] == 129 and post["unprivileged"] == 1 and post["ssh-public-keys"] == "ssh-ed25519 AAAA"
    assert "password" not in post and "pool" not in post and post["memory"] == "65536"
    assert pc.ConfigPlan().put_params(None) == {}


def test_pending_keys():
    pending = [{"key": "dev8", "pending": "/dev/nvidia8"}, {"key": "memory", "value": 2048},
               {"key": "dev1", "delete": 1}, {"key": "cores", "value": 2, "delete": 0}]
    assert pc.pending_keys(pending) == ["dev1", "dev8"]


def test_owner_tag():
    assert pc.owner_refusal(129, "pve", "inferops-gpu", ["inferops-gpu"], False) is None
    assert pc.owner_refusal(129, "pve", None, [], False) is None
    assert pc.owner_refusal(129, "pve", "inferops-gpu", ["team-a"], True) is None
    msg = pc.owner_refusal(129, "pve", "inferops-gpu", [], False)
    assert "CT 129" in msg and "(its tags: none)" in msg and "adopt=true" in msg
    assert pc.tags_with_owner(["team-a", "inferops-gpu"], "inferops-gpu") == "inferops-gpu;team-a"


def test_creation_messages():
    assert "ostemplate is not set" in pc.missing_ostemplate(129, "pve")
    msg = pc.missing_template(129, "pve", "local:vztmpl/debian-12.tar.zst")
    assert "pveam download local debian-12.tar.zst" in msg


def test_pve9_entrypoint_and_env():
    """PVE 9's entrypoint and env: declared through extra_config (env as a list, sent NUL-separated), compared as
    PVE returns them; undeclared, an operator's values are not in the plan."""
    desired, delete = pc.build_desired_config(extra_config={"env": ["A=1", "B=two words"], "entrypoint": "/sbin/init"})
    assert desired == {"env": "A=1\0B=two words", "entrypoint": "/sbin/init"} and delete == []
    current = {**CURRENT, "env": "A=1\0B=two words", "entrypoint": "/sbin/init"}
    assert not pc.plan_config(current, desired).changed
    assert pc.plan_config(current, {"env": "A=1"}).set == {"env": "A=1"}
    operator = {**CURRENT, "env": "HF_HOME=/models", "entrypoint": "/usr/local/bin/init"}
    assert not pc.plan_config(operator, {"memory": str(CURRENT["memory"])}).changed
    with pytest.raises(ConfigError, match="NAME=value"):
        pc.build_desired_config(extra_config={"env": ["A=1", "not a variable"]})
    text = pc.render_conf({"hostname": "g", "env": "A=1\0B=2", "lxc": [["lxc.apparmor.profile", "unconfined"]]})
    assert text == ("hostname: g\nlxc.environment.runtime: A=1\nlxc.environment.runtime: B=2\n"
                    "lxc.apparmor.profile: unconfined\n")
