"""The AWX credential types (awx/credential_types/*.yml): AWX's rules, and injection that never overrides the
inventory (environment variables only, each read by a role default as a fallback)."""

from __future__ import annotations

import glob
import os
import re

import pytest

from conftest import ROOT, awx_config, load
import awx_rules

from ansible_collections.inferops.gpu_inference.plugins.module_utils.deploy import sglang_extra_vars

TYPES = sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "awx", "credential_types", "*.yml")))
SECRET_WORDS = re.compile(r"secret|password|api_key")


def _defaults_text():
    text = ""
    for path in sorted(glob.glob(os.path.join(ROOT, "roles", "*", "defaults", "main.yml"))):
        with open(path, encoding="utf-8") as f:
            text += f.read()
    return text


def _env_read_by_roles():
    return set(re.findall(r"lookup\('ansible\.builtin\.env', '([A-Z0-9_]+)'\)", _defaults_text()))


def test_every_type_is_applied():
    assert sorted("awx/" + p for p in awx_config()["inferops_awx_credential_types"]) == TYPES


@pytest.mark.parametrize("path", TYPES)
def test_type_follows_awx_rules(path):
    assert awx_rules.credential_type_errors(load(path)) == []


@pytest.mark.parametrize("path", TYPES)
def test_injects_only_credential_only_environment_variables(path):
    """No extra_vars injector: AWX's extra vars outrank every host var, so a credential injected there would override
    each node's own values. Environment variables named INFEROPS_* are the credential's alone."""
    injectors = load(path)["injectors"]
    assert "extra_vars" not in injectors
    for var in injectors["env"]:
        assert var.startswith("INFEROPS_"), var
        assert not var.lower().startswith(sglang_extra_vars.ROLE_PREFIXES)


@pytest.mark.parametrize("path", TYPES)
def test_every_injected_variable_is_read_by_a_role_default(path):
    read = _env_read_by_roles()
    for var in load(path)["injectors"]["env"]:
        assert var in read, "%s is injected but no roles/*/defaults/main.yml reads it" % var


def test_every_environment_fallback_of_the_roles_is_injected():
    injected = set()
    for path in TYPES:
        injected.update(load(path)["injectors"]["env"])
    # INFEROPS_REPORT_DIR is a setting of the controller, not a credential; other names (HOME) are not ours.
    assert {v for v in _env_read_by_roles() if v.startswith("INFEROPS_")} - {"INFEROPS_REPORT_DIR"} == injected


def test_fallbacks_come_after_the_inventory():
    """Each credential fallback is the default() of the inventory's own variable, never the other way round."""
    for line in _defaults_text().splitlines():
        if "INFEROPS_PVE_API_" in line and not line.lstrip().startswith("#"):
            assert re.search(r'"\{\{ proxmox_api_\w+ \| default\(lookup\(', line), line


@pytest.mark.parametrize("path", TYPES)
def test_every_input_is_injected(path):
    ct = load(path)
    templates = " ".join(str(v) for kind in ct["injectors"].values() for v in kind.values())
    for field in ct["inputs"]["fields"]:
        assert re.search(r"\b%s\b" % field["id"], templates), "%s is never injected" % field["id"]


@pytest.mark.parametrize("path", TYPES)
def test_secrets_are_secret(path):
    for field in load(path)["inputs"]["fields"]:
        assert field.get("secret", False) is bool(SECRET_WORDS.search(field["id"])), field["id"]


def test_blank_fields_inject_empty_strings_and_no_ca_path():
    """What AWX injects when the optional fields are left empty: '' (never null), and no CA path to an empty file."""
    ct = load("awx/credential_types/proxmox_ve.yml")
    env = awx_rules.render_injectors(ct, {"api_token_id": "ansible", "api_token_secret": "s", "api_password": "",
                                          "api_user": "", "ca_bundle": ""})["env"]
    assert env == {"INFEROPS_PVE_API_USER": "", "INFEROPS_PVE_API_TOKEN_ID": "ansible", "INFEROPS_PVE_API_TOKEN_SECRET": "s",
                   "INFEROPS_PVE_API_PASSWORD": "", "INFEROPS_PVE_API_CA_PATH": ""}
    full = awx_rules.render_injectors(ct, {"api_token_id": "a", "api_token_secret": "s", "ca_bundle": "-----BEGIN"},
                                      filename="/runner/env/tmpCA")
    assert full["env"]["INFEROPS_PVE_API_CA_PATH"] == "/runner/env/tmpCA"
    assert full["file"]["template"] == "-----BEGIN"


@pytest.mark.parametrize("bad, expected", [
    ({"env": {"ANSIBLE_CONFIG": "{{ a }}"}}, "may affect Ansible configuration"),
    ({"env": {"PATH": "{{ a }}"}}, "not allowed to be used in credentials"),
    ({"env": {"X": "{{ b }}"}}, "does not render"),
    ({"file": {"template": "{{ a }}", "template.x": "{{ a }}"}}, "multi-file syntax"),
])
def test_validator_refuses_what_awx_refuses(bad, expected):
    ct = {"name": "t", "kind": "cloud", "inputs": {"fields": [{"id": "a", "label": "A"}]}, "injectors": bad}
    assert any(expected in e for e in awx_rules.credential_type_errors(ct)), awx_rules.credential_type_errors(ct)
