# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Talking to the PVE API: the login pve_lxc uses (password, API token or local pvesh), PVE tasks (UPIDs), and
an API or connection error turned into a message that says what went wrong and what to do.

No Ansible and no proxmoxer imports: exceptions are read by their class names and text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence

from ansible_collections.inferops.gpu_inference.plugins.module_utils.pve.pve_options import ConfigError

# --------------------------------------------------------------------------------------------
# Tasks
# --------------------------------------------------------------------------------------------


def upid_node(upid: str) -> str:
    """The node a UPID ran on (field 2 of 'UPID:<node>:<pid>:<pstart>:<starttime>:<type>:<id>:<user>:')."""
    parts = str(upid).split(":")
    if len(parts) < 3 or parts[0] != "UPID" or not parts[1]:
        raise ConfigError(f"unexpected task ID from the PVE API: {upid!r} (expected UPID:<node>:...)")
    return parts[1]


def task_succeeded(status: Mapping[str, Any]) -> bool:
    """A stopped task whose exitstatus is OK or 'WARNINGS: n'."""
    exitstatus = str(status.get("exitstatus") or "")
    return status.get("status") == "stopped" and (exitstatus == "OK" or exitstatus.startswith("WARNINGS"))


def task_log_tail(log: Sequence[Mapping[str, Any]], lines: int = 15) -> str:
    """The last lines of GET /nodes/{node}/tasks/{upid}/log."""
    ordered = sorted(log, key=lambda entry: int(entry.get("n", 0)))
    return "\n".join(str(entry.get("t", "")) for entry in ordered[-lines:])


# --------------------------------------------------------------------------------------------
# Authentication and errors
# --------------------------------------------------------------------------------------------

ROOT_PAM = "root@pam"


def normalize_token(api_user: Optional[str], api_token_id: str) -> tuple[str, str]:
    """(user, token name) from api_user and api_token_id; api_token_id may be 'user@realm!name'."""
    token = api_token_id.strip()
    if "!" in token:
        user, _sep, name = token.partition("!")
        if api_user and api_user != user:
            raise ConfigError(
                f"api_token_id {token!r} belongs to {user}, but api_user is {api_user}; "
                f"give api_token_id as the token name only ({name!r}) with api_user {user}"
            )
        if not name:
            raise ConfigError(f"api_token_id {token!r} has no token name after '!'")
        return user, name
    if not api_user:
        raise ConfigError(
            "api_user is required with api_token_id (the token's owner, e.g. root@pam), "
            "or give api_token_id as user@realm!tokenname"
        )
    return api_user, token


def login_settings(params: Mapping[str, Any]) -> tuple[Optional[str], dict[str, Any], dict[str, str]]:
    """How pve_lxc logs in, from its parameters: (api_host, or None for pvesh on this node; proxmoxer's keyword
    arguments; the login as ``dict(method=password|token|local, user=..., url=...)``).

    Raises ConfigError when the credentials given do not make one login.
    """
    if not params["api_host"]:
        if params["api_password"] or params["api_token_id"]:
            raise ConfigError(
                "api_password/api_token_id are given but api_host is not; set api_host (or PROXMOX_HOST) "
                "to use the REST API, or drop the credentials to run pvesh on the node as root."
            )
        return None, dict(backend="local", service="PVE"), dict(method="local", user=ROOT_PAM, url="pvesh on this node")

    port = params["api_port"] or 8006
    url = f"https://{params['api_host']}:{port}"
    verify = params["ca_path"] if (params["validate_certs"] and params["ca_path"]) else params["validate_certs"]
    kwargs: dict[str, Any] = dict(port=port, verify_ssl=verify, timeout=params["api_timeout"], service="PVE")
    if params["api_token_id"]:
        if not params["api_token_secret"]:
            raise ConfigError("api_token_id is given without api_token_secret; give both (or api_password instead)")
        user, name = normalize_token(params["api_user"], params["api_token_id"])
        kwargs.update(user=user, token_name=name, token_value=params["api_token_secret"])
        return params["api_host"], kwargs, dict(method="token", user=user, url=url)
    if params["api_password"]:
        if not params["api_user"]:
            raise ConfigError("api_password is given without api_user; give api_user, e.g. root@pam")
        kwargs.update(user=params["api_user"], password=params["api_password"])
        return params["api_host"], kwargs, dict(method="password", user=params["api_user"], url=url)
    raise ConfigError(
        "no credentials: give api_user with api_password (a root@pam password is needed for GPU devN entries) "
        "or api_user with api_token_id and api_token_secret"
    )


def passthrough_guidance() -> str:
    return (
        "Only root@pam may set or remove devN (device passthrough) entries; PVE refuses them for every API "
        "token, even root@pam!<token>, and for every other user. Log in with a root@pam password ticket: "
        "api_user: root@pam and api_password from Vault (e.g. api_password: \"{{ vault_pve_root_password }}\"), "
        "and leave api_token_id/api_token_secret unset for this task; or run the module on the PVE node as "
        "root without api_host (it then uses pvesh, which acts as root@pam)."
    )


def passthrough_auth_problem(auth_method: str, api_user: Optional[str]) -> Optional[str]:
    """Why this login cannot set devN, or None when it can (root@pam password, or local pvesh)."""
    if auth_method == "local":
        return None
    if auth_method == "token":
        return f"This task logs in with an API token ({api_user}!...). " + passthrough_guidance()
    if api_user != ROOT_PAM:
        return f"This task logs in as {api_user}. " + passthrough_guidance()
    return None


def passthrough_refusal(device_keys: Sequence[str], vmid: Any, auth_method: str, api_user: Optional[str]) -> Optional[str]:
    """Why this login cannot change the devN keys ``device_keys`` of CT ``vmid``; None when it can (or none change)."""
    if not device_keys:
        return None
    problem = passthrough_auth_problem(auth_method, api_user)
    if not problem:
        return None
    return f"Cannot change {', '.join(sorted(device_keys))} of CT {vmid}. {problem}"


@dataclass
class ApiError:
    kind: str
    message: str


_ROOT_ONLY_PATTERNS = (
    "only allowed for root@pam",
    "only root can pass arbitrary filesystem paths",
    "only root can set 'hookscript'",
)


def classify_api_error(
    exc_names: Sequence[str],
    text: str,
    status_code: Optional[int] = None,
    *,
    url: str = "the PVE API",
    auth_method: str = "password",
    api_user: Optional[str] = None,
    ca_path: Optional[str] = None,
    validate_certs: bool = True,
    api_timeout_s: Optional[int] = None,
) -> ApiError:
    """Turn a proxmoxer/requests exception into a message that says what went wrong and what to do.

    ``exc_names`` are the class names along the exception's MRO (e.g. ["SSLError",
    "ConnectionError", ...]), ``text`` its str(), ``status_code`` the HTTP status when there is one.
    """
    names = {n.lower() for n in exc_names}
    low = text.lower()

    if "device passthrough" in low or ("root@pam" in low and re.search(r"\bdev\d+\b", low)):
        return ApiError("passthrough_root_only", f"PVE refused the change: {text.strip()}. " + passthrough_guidance())
    if any(p in low for p in _ROOT_ONLY_PATTERNS):
        return ApiError(
            "root_only",
            f"PVE refused the change: {text.strip()}. PVE lets only root@pam change this option, and an API token "
            "is never root@pam (not even root@pam!<token>). Log in with api_user: root@pam and api_password from "
            "Vault, without api_token_id/api_token_secret; or run the module on the PVE node as root without "
            "api_host (pvesh acts as root@pam).",
        )

    # The CA file itself, before any certificate is checked: OpenSSL reads an empty or non-PEM file as "no
    # certificate or crl found", which requests reports as an SSLError like a failed verification.
    ca_name = ca_path or "given as ca_path"
    if "no_certificate_or_crl_found" in low or "no certificate or crl found" in low:
        return ApiError(
            "ca_file_empty",
            f"The CA file {ca_name} holds no certificate: it is empty or has no PEM block (-----BEGIN "
            "CERTIFICATE-----), so nothing could be verified. Copy the PVE node's /etc/pve/pve-root-ca.pem (or the "
            "CA that signed the node's certificate) into it; the roles take it from proxmox_api_ca_path. "
            f"({text.strip()})",
        )
    if "could not find a suitable tls ca certificate bundle" in low:
        return ApiError(
            "ca_file_missing",
            f"The CA file {ca_name} does not exist on the machine that calls the API (the controller, or the host "
            "the task is delegated to). Copy the PVE node's /etc/pve/pve-root-ca.pem there, or correct the path "
            f"(proxmox_api_ca_path for the roles). ({text.strip()})",
        )
    if "sslerror" in names or "certificate verify failed" in low or "certificate_verify_failed" in low:
        if "hostname mismatch" in low or "doesn't match" in low or "not valid for" in low:
            why = "the certificate does not name this host; use the host name the certificate was issued for as api_host"
        else:
            why = "the server certificate is not signed by a CA this machine trusts"
        hint = (
            f" ca_path is {ca_path}: check that this PEM file is the CA that signed the PVE certificate."
            if ca_path
            else " Set ca_path to the PEM CA that signed the PVE certificate (on a PVE node: /etc/pve/pve-root-ca.pem)."
        )
        return ApiError(
            "tls_verify",
            f"TLS verification failed for {url}: {why}.{hint} Do not turn validate_certs off. ({text.strip()})",
        )

    if "connection refused" in low or "errno 111" in low:
        return ApiError(
            "connection_refused",
            f"Connection refused by {url}: nothing listens there. Check api_host/api_port (PVE's API is on "
            f"port 8006) and that pveproxy runs on the node. TLS was not reached, so ca_path is not the cause. "
            f"({text.strip()})",
        )
    if "name or service not known" in low or "temporary failure in name resolution" in low or "nodename nor servname" in low:
        return ApiError("name_resolution", f"Cannot resolve the host name in {url}: check api_host. ({text.strip()})")
    waited = f" ({api_timeout_s} s per request)" if api_timeout_s is not None else ""
    if "timeout" in names or "connecttimeout" in names or "readtimeout" in names or "timed out" in low:
        return ApiError(
            "timeout",
            f"{url} did not answer in time{waited}: check the network path to the node, or give it longer: "
            "proxmox_api_timeout in the inventory (the role pve_gpu_container's pve_gpu_container_api_timeout_s; "
            f"the module's api_timeout), in seconds per request. ({text.strip()})",
        )
    if "connectionerror" in names and status_code is None:
        return ApiError(
            "unreachable",
            f"Cannot reach {url}: check api_host/api_port and the network; if the error mentions TLS, set ca_path. "
            f"({text.strip()})",
        )

    if "authenticationerror" in names or status_code == 401 or "authentication failure" in low or "no ticket" in low:
        if auth_method == "token":
            hint = (
                "Check api_user (the token's owner, e.g. root@pam), api_token_id (the token name only, e.g. "
                "ansible) and api_token_secret (the UUID PVE showed when the token was made)."
            )
        else:
            hint = (
                f"Check api_user ({api_user}; the realm suffix matters: root@pam, admin@pve) and api_password; "
                "accounts with two-factor authentication cannot log in this way."
            )
        return ApiError("auth_failed", f"PVE rejected the credentials (401). {hint} ({text.strip()})")

    if "detected modified configuration" in low or ("digest" in low and "mismatch" in low):
        return ApiError(
            "digest_mismatch",
            "The container's config changed after this task read it (digest mismatch), so PVE refused the update "
            f"rather than overwrite the other change. Re-run the task. ({text.strip()})",
        )

    if status_code == 403 or "permission check failed" in low:
        return ApiError(
            "permission",
            f"Permission denied: {text.strip()}. Grant {api_user or 'the user'} the needed privileges on /vms/<vmid> "
            "and the storage (VM.Allocate, VM.Config.*, VM.PowerMgmt, Datastore.AllocateSpace); an API token with "
            "privilege separation needs its own ACL entries.",
        )

    if status_code == 404 or "does not exist" in low or "no such" in low:
        return ApiError("not_found", f"Not found: {text.strip()}")

    return ApiError("api_error", f"PVE API error: {text.strip()}")


def exception_names(exc: BaseException) -> list[str]:
    """The class names along the exception's MRO, e.g. ["SSLError", "ConnectionError", ..., "object"]."""
    return [cls.__name__ for cls in type(exc).__mro__]


def exception_text(exc: BaseException) -> str:
    """str(exc) with the text of its causes: requests wraps urllib3 errors, and the root cause names
    "Connection refused" or the TLS failure."""
    text = str(exc)
    cause = exc.__cause__ or exc.__context__
    depth = 0
    while cause is not None and depth < 5:
        more = str(cause)
        if more and more not in text:
            text = f"{text} ({more})"
        cause = cause.__cause__ or cause.__context__
        depth += 1
    return text


def classify_exception(
    exc: BaseException,
    auth: Mapping[str, Any],
    ca_path: Optional[str] = None,
    validate_certs: bool = True,
    api_timeout_s: Optional[int] = None,
) -> ApiError:
    """classify_api_error for an exception proxmoxer or requests raised, under the login ``auth`` (login_settings)."""
    return classify_api_error(
        exception_names(exc),
        exception_text(exc),
        getattr(exc, "status_code", None),
        url=auth.get("url", "the PVE API"),
        auth_method=auth["method"],
        api_user=auth.get("user"),
        ca_path=ca_path,
        validate_certs=validate_certs,
        api_timeout_s=api_timeout_s,
    )
