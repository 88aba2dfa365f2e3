# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Values that reach the systemd unit, its environment file or a command's arguments: control characters and
option-like values refused with the variable named, before any change (the request stage runs on the controller
before the node play touches anything)."""
from __future__ import annotations

import json

import pytest

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.testing import patch_module_args

from ansible_collections.inferops.gpu_inference.plugins.module_utils.common import safe_text
from ansible_collections.inferops.gpu_inference.plugins.module_utils.deploy import sglang_request as rq
from ansible_collections.inferops.gpu_inference.plugins.modules import gpu_diagnose, gpu_recover_action

SETTINGS = {
    "version": "0.5.9", "tp_size": 1, "model_preset": "kimi-k2", "extra_args": [], "host": "127.0.0.1",
    "port": 30000, "api_key_set": True, "model_path": "/models/kimi", "served_model_name": "kimi",
    "user": "sglang", "environment": {"HF_HUB_OFFLINE": "1", "NCCL_DEBUG": "WARN"},
}
CONTROLS = ["\n", "\r", "\r\n", "\t", "\x00", "\x1b", "\x7f", "\x85", "\u2028"]


def req(**overrides):
    return rq.request(dict(SETTINGS, **overrides))


def test_the_sound_settings_pass():
    r = req()
    assert r["service"]["model_path"] == "/models/kimi" and r["service"]["served_model_name"] == "kimi"
    assert "environment" not in json.dumps(r)  # the environment (maybe secret) is checked, never returned


@pytest.mark.parametrize("char", CONTROLS)
@pytest.mark.parametrize("key", ["model_path", "served_model_name", "dist_init_host"])
def test_a_control_character_in_a_unit_value_is_refused_naming_the_variable(key, char):
    value = "/models/kimi" + char + "ExecStartPre=/bin/touch /tmp/pwned"
    with pytest.raises(rq.DeployError, match=r"^sglang_server_%s=.* contains the control character" % key):
        req(**{key: value})


@pytest.mark.parametrize("char", CONTROLS)
def test_a_trailing_line_break_is_refused_not_stripped(char):
    with pytest.raises(rq.DeployError, match="sglang_server_model_path=.*control character"):
        req(model_path="/models/kimi" + char)


@pytest.mark.parametrize("key", ["served_model_name", "dist_init_host"])
def test_an_option_like_value_is_refused(key):
    with pytest.raises(rq.DeployError, match=r"^sglang_server_%s='--api-key=x' starts with '-'" % key):
        req(**{key: "--api-key=x"})


@pytest.mark.parametrize("char", CONTROLS)
def test_an_extra_argument_with_a_control_character_is_refused(char):
    with pytest.raises(rq.DeployError, match="sglang_server_extra_args: the argument .* control character"):
        req(extra_args=["--max-running-requests", "64" + char + "ExecStartPre=/bin/true"])


@pytest.mark.parametrize("user", ["-o", "root\nExecStartPre=/bin/true", "a b", "a:b", "", "x" * 33, "9x"])
def test_a_service_user_that_is_no_user_name_is_refused(user):
    if user == "":
        req(user=user)  # blank: the role's default applies
        return
    with pytest.raises(rq.DeployError, match="^sglang_server_user must be a user name"):
        req(user=user)


@pytest.mark.parametrize("key", ["A-B", "1X", "X\nY", "X Y", "", "X=Y"])
def test_an_environment_key_that_is_no_variable_name_is_refused(key):
    with pytest.raises(rq.DeployError, match="^sglang_server_environment has the key .* not an environment variable name"):
        req(environment={key: "1"})


@pytest.mark.parametrize("char", CONTROLS)
def test_an_environment_value_with_a_control_character_is_refused_without_showing_it(char):
    with pytest.raises(rq.DeployError) as exc:
        req(environment={"HF_TOKEN": "hf_SECRET" + char + "LD_PRELOAD=/tmp/x.so"})
    msg = str(exc.value)
    assert msg.startswith("sglang_server_environment: the value of HF_TOKEN contains the control character")
    assert "SECRET" not in msg and "LD_PRELOAD" not in msg


def test_an_environment_that_is_no_dict_is_refused():
    with pytest.raises(rq.DeployError, match="must be a dict"):
        req(environment=["A=1"])
    with pytest.raises(rq.DeployError, match="HF_TOKEN must be a string or a number"):
        req(environment={"HF_TOKEN": ["x"]})


@pytest.mark.parametrize("name,ok", [("sglang.service", True), ("sglang", True), ("getty@tty1.service", True),
                                     ("-.mount", False), ("--now", False), ("-H", False), ("a b", False),
                                     ("a\nb", False), ("a;b", False), ("", False), ("x" * 256, False)])
def test_unit_names(name, ok):
    assert (safe_text.unit_name_message("recover_service", name) == "") is ok


def _main(module, args, monkeypatch, capsys):
    ran = []
    monkeypatch.setattr(AnsibleModule, "run_command", lambda self, argv, **kw: ran.append(argv) or (0, "", ""))
    monkeypatch.setattr(AnsibleModule, "get_bin_path", lambda self, name, required=False, opt_dirs=None: "/usr/bin/" + name)
    with patch_module_args(args):
        with pytest.raises(SystemExit):
            module.main()
    return json.loads(capsys.readouterr().out), ran


@pytest.mark.parametrize("service", ["--now", "-H", "sglang.service\n", "a b"])
def test_gpu_recover_action_refuses_an_option_like_service_before_running_anything(service, monkeypatch, capsys):
    out, ran = _main(gpu_recover_action, {"vmid": 129, "action": "stop_service", "service": service}, monkeypatch, capsys)
    assert out["failed"] and "must be a systemd unit name" in out["msg"] and ran == []


@pytest.mark.parametrize("service", ["--now", "-H"])
def test_gpu_diagnose_refuses_an_option_like_service_before_running_anything(service, monkeypatch, capsys):
    out, ran = _main(gpu_diagnose, {"vmid": 129, "node": "pve1", "service": service}, monkeypatch, capsys)
    assert out["failed"] and "must be a systemd unit name" in out["msg"] and ran == []


def test_the_unit_name_goes_after_a_double_dash():
    class Module:
        params = {"service": "sglang.service", "service_stop_timeout": 90}
        check_mode = False
        calls = []

        def get_bin_path(self, name, opt_dirs=None):
            return "/usr/bin/" + name

        def run_command(self, argv, environ_update=None):
            self.calls.append(argv)
            return 0, "", ""

    module = Module()
    gpu_recover_action.stop_service(module, 129, {"changed": False, "planned": {}, "commands": []})
    assert module.calls[0][-3:] == ["--now", "--", "sglang.service"]


@pytest.mark.parametrize("item", ["--index-url=http://evil/simple", "-i", "a b", "x\n--pre", "", 3])
def test_an_extra_package_that_is_no_requirement_is_refused(item):
    with pytest.raises(rq.DeployError, match="^sglang_server_pip_extra_packages: .* is not one requirement"):
        req(pip_extra_packages=["hf_transfer", item])


def test_extra_packages_that_are_requirements_pass():
    req(pip_extra_packages=["hf_transfer", "flashinfer-python==0.2.5", "torch>=2.5"])
    with pytest.raises(rq.DeployError, match="must be a list"):
        req(pip_extra_packages="hf_transfer")
