# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""pve_api: tasks (UPIDs), the login, and API errors turned into messages."""
from __future__ import annotations

import pytest

from ansible_collections.inferops.gpu_inference.plugins.module_utils.pve import pve_api as pa
from ansible_collections.inferops.gpu_inference.plugins.module_utils.pve.pve_options import ConfigError


# ---- tasks -------------------------------------------------------------------------------------


def test_upid_and_task_status():
    upid = "UPID:pve:000A1B2C:0234ABCD:6650F00D:vzcreate:198:root@pam:"
    assert pa.upid_node(upid) == "pve"
    with pytest.raises(ConfigError, match="unexpected task ID"):
        pa.upid_node("nope")
    assert pa.task_succeeded({"status": "stopped", "exitstatus": "OK"})
    assert pa.task_succeeded({"status": "stopped", "exitstatus": "WARNINGS: 2"})
    assert not pa.task_succeeded({"status": "stopped", "exitstatus": "command 'lxc-start' failed: exit code 1"})
    assert not pa.task_succeeded({"status": "running"})
    log = [{"n": 2, "t": "second"}, {"n": 1, "t": "first"}, {"n": 3, "t": "TASK ERROR: boom"}]
    assert pa.task_log_tail(log, 2) == "second\nTASK ERROR: boom"


# ---- auth and errors ------------------------------------------------------------------------------


def test_normalize_token():
    assert pa.normalize_token("root@pam", "ansible") == ("root@pam", "ansible")
    assert pa.normalize_token(None, "root@pam!ansible") == ("root@pam", "ansible")
    with pytest.raises(ConfigError, match="belongs to ops@pve"):
        pa.normalize_token("root@pam", "ops@pve!ansible")
    with pytest.raises(ConfigError, match="api_user is required"):
        pa.normalize_token(None, "ansible")


def test_passthrough_auth_problem():
    assert pa.passthrough_auth_problem("password", "root@pam") is None
    assert pa.passthrough_auth_problem("local", None) is None
    msg = pa.passthrough_auth_problem("token", "root@pam")
    assert "API token" in msg and "api_password" in msg and "root@pam" in msg
    assert "ops@pve" in pa.passthrough_auth_problem("password", "ops@pve")


def _classify(names, text, code=None, **kw):
    return pa.classify_api_error(names, text, code, url="https://127.0.0.1:8006", **kw)


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


def test_classify_ca_file_empty_names_the_file_first():
    # What requests raised for an empty (or non-PEM) CA file, read on this machine with requests/urllib3 and a
    # socket that accepts: the cause is the file, not the server's certificate.
    text = (
        "HTTPSConnectionPool(host='127.0.0.1', port=46155): Max retries exceeded with url: / (Caused by "
        "SSLError(SSLError(136, '[X509: NO_CERTIFICATE_OR_CRL_FOUND] no certificate or crl found (_ssl.c:4147)')))"
    )
    err = _classify(["SSLError", "ConnectionError", "RequestException", "OSError"], text,
                    ca_path="/etc/inferops/pve-root-ca.pem")
    assert err.kind == "ca_file_empty"
    assert err.message.startswith("The CA file /etc/inferops/pve-root-ca.pem holds no certificate")
    assert "/etc/pve/pve-root-ca.pem" in err.message and "proxmox_api_ca_path" in err.message
    assert "not signed by a CA" not in err.message


def test_classify_ca_file_missing():
    err = _classify(["OSError"], "Could not find a suitable TLS CA certificate bundle, invalid path: /etc/nope.pem",
                    ca_path="/etc/nope.pem")
    assert err.kind == "ca_file_missing"
    assert err.message.startswith("The CA file /etc/nope.pem does not exist")


def test_classify_timeout_names_the_variable_a_user_sets():
    err = _classify(["ReadTimeout", "Timeout"], "Read timed out. (read timeout=10)", api_timeout_s=10)
    assert err.kind == "timeout"
    assert "(10 s per request)" in err.message
    # The roles' users set these; the module's own option is named as well for a direct module call.
    assert "proxmox_api_timeout" in err.message and "pve_gpu_container_api_timeout_s" in err.message
    assert "raise api_timeout" not in err.message
    unknown = _classify(["ConnectTimeout", "Timeout"], "timed out")
    assert "s per request)" not in unknown.message


def test_timeout_variable_named_in_the_message_is_the_roles():
    # The message names a role variable: it must exist in the role's argument_specs and reach the module.
    import pathlib

    import yaml

    role = pathlib.Path(pa.__file__).resolve().parents[3] / "roles" / "pve_gpu_container"
    spec = yaml.safe_load((role / "meta" / "argument_specs.yml").read_text())["argument_specs"]["main"]["options"]
    assert "proxmox_api_timeout" in spec["pve_gpu_container_api_timeout_s"]["default"]
    assert "api_timeout: \"{{ pve_gpu_container_api_timeout_s | int }}\"" in (role / "tasks" / "main.yml").read_text()


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


def test_passthrough_refusal():
    assert pa.passthrough_refusal([], 129, "token", "root@pam") is None
    assert pa.passthrough_refusal(["dev1"], 129, "password", "root@pam") is None
    msg = pa.passthrough_refusal(["dev2", "dev10"], 129, "token", "root@pam")
    assert msg.startswith("Cannot change dev10, dev2 of CT 129. This task logs in with an API token")


# ---- the login ------------------------------------------------------------------------------------

LOGIN = dict(api_host="pve1", api_port=None, api_user="root@pam", api_password=None, api_token_id=None,
             api_token_secret=None, validate_certs=True, ca_path=None, api_timeout=10)


def test_login_settings_password_and_token():
    host, kwargs, auth = pa.login_settings({**LOGIN, "api_password": "pw", "ca_path": "/etc/ca.pem"})
    assert host == "pve1" and auth == {"method": "password", "user": "root@pam", "url": "https://pve1:8006"}
    assert kwargs == {"port": 8006, "verify_ssl": "/etc/ca.pem", "timeout": 10, "service": "PVE",
                      "user": "root@pam", "password": "pw"}
    host, kwargs, auth = pa.login_settings({**LOGIN, "api_user": None, "api_token_id": "ops@pve!ci",
                                            "api_token_secret": "uuid", "api_port": 443, "validate_certs": False,
                                            "ca_path": "/etc/ca.pem"})
    assert auth == {"method": "token", "user": "ops@pve", "url": "https://pve1:443"}
    assert kwargs["token_name"] == "ci" and kwargs["token_value"] == "uuid" and kwargs["verify_ssl"] is False


def test_login_settings_local_pvesh():
    host, kwargs, auth = pa.login_settings({**LOGIN, "api_host": None})
    assert host is None and kwargs == {"backend": "local", "service": "PVE"} and auth["method"] == "local"


@pytest.mark.parametrize(
    "params,match",
    [
        ({"api_host": None, "api_password": "pw"}, "api_host is not"),
        ({"api_token_id": "ci"}, "without api_token_secret"),
        ({"api_token_id": "ops@pve!ci", "api_token_secret": "uuid"}, "belongs to ops@pve"),
        ({"api_user": None, "api_password": "pw"}, "without api_user"),
        ({}, "no credentials"),
    ],
)
def test_login_settings_errors(params, match):
    with pytest.raises(ConfigError, match=match):
        pa.login_settings({**LOGIN, **params})


def test_exception_text_and_classify_exception():
    class ConnectionError(Exception):  # noqa: A001 (named as requests names it)
        pass

    caught = None
    try:
        try:
            raise OSError("[Errno 111] Connection refused")
        except OSError as inner:
            raise ConnectionError("Max retries exceeded") from inner
    except ConnectionError as exc:
        caught = exc
    assert caught is not None
    assert pa.exception_names(caught)[:2] == ["ConnectionError", "Exception"]
    assert pa.exception_text(caught) == "Max retries exceeded ([Errno 111] Connection refused)"
    err = pa.classify_exception(caught, {"method": "password", "user": "root@pam", "url": "https://pve1:8006"})
    assert err.kind == "connection_refused" and "https://pve1:8006" in err.message
    err = pa.classify_exception(caught, {"method": "local"})
    assert "the PVE API" in err.message
