# -*- coding: utf-8 -*-
# Copyright: inferops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the container installs, checked against what the inventory says it is, before it runs as root.

- The NVIDIA installer (``NVIDIA-Linux-x86_64-<ver>.run``, run as root in the container) must match a sha256 the
  inventory gives for that driver version (``sglang_server_nvidia_installer_sha256``); without one the deploy is
  refused before any change, and a file that differs is refused before it runs.
- pip: a plain-HTTP index or find-links URL is refused unless the inventory allows it by name
  (``sglang_server_pip_allow_http``); with ``sglang_server_pip_hashes`` every package is installed from a requirements
  file the collection writes, under ``pip --require-hashes``.

No Ansible imports: the action sglang_launch calls :func:`plan`, sglang_installer_check :func:`check_installer` and
:func:`check_driver_installed`.
"""
from __future__ import annotations

import re
from typing import Any, Dict, List, Mapping, Optional
from ansible_collections.inferops.gpu_inference.plugins.module_utils.common.errors import InferopsError

_SHA256 = re.compile(r"[0-9a-f]{64}")
_DRIVER = re.compile(r"[0-9]+(\.[0-9]+){1,3}")
_PIN = re.compile(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([A-Za-z0-9][A-Za-z0-9.+!_-]*)")


class SupplyError(InferopsError):
    """An artefact the inventory does not vouch for, or a source it does not allow."""


def installer_file(driver_version: str) -> str:
    if not _DRIVER.fullmatch(str(driver_version)):
        raise SupplyError("the node's NVIDIA driver version %r is not a version (digits and dots): the installer's file "
                          "name is not built from it" % (driver_version,))
    return "NVIDIA-Linux-x86_64-%s.run" % driver_version


def installer_sha256(sha256s: Any, driver_version: str) -> str:
    """The sha256 the inventory gives for the installer of ``driver_version``; refused when missing or malformed."""
    name = installer_file(driver_version)
    if sha256s in (None, ""):
        sha256s = {}
    if not isinstance(sha256s, Mapping):
        raise SupplyError("sglang_server_nvidia_installer_sha256 must map a driver version to the sha256 of its installer, "
                          "e.g. {'%s': '<64 hex digits>'}, got %s" % (driver_version, type(sha256s).__name__))
    value = sha256s.get(str(driver_version))
    if value in (None, ""):
        raise SupplyError(
            "the container needs the NVIDIA userspace driver %s, installed by running %s as root, and the inventory gives no "
            "sha256 for it: set sglang_server_nvidia_installer_sha256: {'%s': '<sha256>'} from a source you trust "
            "(NVIDIA's published checksum for that release, or `sha256sum %s` of the file you verified). Nothing was "
            "changed." % (driver_version, name, driver_version, name))
    value = str(value).strip().lower()
    if value.startswith("sha256:"):
        value = value[len("sha256:"):]
    if not _SHA256.fullmatch(value):
        raise SupplyError("sglang_server_nvidia_installer_sha256['%s'] must be 64 hex digits (sha256sum's first field), got %r"
                          % (driver_version, sha256s.get(str(driver_version))))
    return value


def check_installer(expected: str, actual: Optional[str], path: str) -> None:
    """Refuse an installer whose sha256 is not the inventory's, before it runs."""
    if not actual or str(actual).lower() != str(expected).lower():
        raise SupplyError("%s has sha256 %s, but the inventory says %s (sglang_server_nvidia_installer_sha256): refused, "
                          "it was not run. Fetch it again from the source you trust, or correct the inventory if the "
                          "checksum there is wrong." % (path, actual or "(unreadable)", expected))


def check_urls(index_url: str, find_links: str, allow_http: bool) -> None:
    """A plain-HTTP index or find-links URL lets anyone on the path hand pip code it then runs as root: refused unless
    the inventory allows it by name."""
    for name, url in (("sglang_server_pip_index_url", index_url), ("sglang_server_pip_find_links", find_links)):
        url = str(url or "").strip()
        if url.lower().startswith("http://") and not allow_http:
            raise SupplyError(
                "%s=%s is plain HTTP: anything on the network path can replace the packages pip installs and runs as "
                "root in the container. Use https://, or a wheelhouse (sglang_server_wheelhouse_src), or pin every "
                "package with sglang_server_pip_hashes, or allow it by name with sglang_server_pip_allow_http=true."
                % (name, url))


def requirements(version: str, extra_packages: List[str], hashes: Any) -> str:
    """The requirements file pip installs with --require-hashes: sglang==version and every other pinned entry of
    ``hashes`` ('name==version' -> sha256 list), each with its hashes. Empty when the inventory gives none."""
    if hashes in (None, "", {}):
        return ""
    if not isinstance(hashes, Mapping):
        raise SupplyError("sglang_server_pip_hashes must map 'name==version' to a list of sha256 digests, got %s"
                          % type(hashes).__name__)
    pins: Dict[str, List[str]] = {}
    for req, digests in hashes.items():
        m = _PIN.fullmatch(str(req).strip())
        if not m:
            raise SupplyError("sglang_server_pip_hashes key %r must be 'name==version' (an exact pin): --require-hashes "
                              "installs only exact pins" % (req,))
        if isinstance(digests, str):
            digests = [digests]
        if not isinstance(digests, (list, tuple)) or not digests:
            raise SupplyError("sglang_server_pip_hashes[%r] must list the sha256 of each of its files" % (req,))
        clean = []
        for d in digests:
            d = str(d).strip().lower()
            d = d[len("sha256:"):] if d.startswith("sha256:") else d
            if not _SHA256.fullmatch(d):
                raise SupplyError("sglang_server_pip_hashes[%r]: %r is not a sha256 (64 hex digits)" % (req, d))
            clean.append(d)
        pins[str(req).strip()] = clean
    want = "sglang==%s" % version
    if want not in pins:
        raise SupplyError("sglang_server_pip_hashes has no entry %r: with hashes every package is pinned, sglang "
                          "%s included" % (want, version))
    for pkg in extra_packages or []:
        if str(pkg).strip() not in pins:
            raise SupplyError("sglang_server_pip_extra_packages lists %r, which sglang_server_pip_hashes does not pin: "
                              "with hashes each extra package is given as 'name==version' and pinned there" % (pkg,))
    lines = []
    for req in sorted(pins):
        if req.lower().startswith("sglang==") and req != want:
            continue  # other sglang releases of the same mapping (a wheelhouse holding several)
        lines.append("%s %s" % (req, " ".join("--hash=sha256:%s" % d for d in pins[req])))
    return "\n".join(lines) + "\n"


def plan(supply: Mapping[str, Any], version: str, node_driver: str, container_driver: str,
         extra_packages: List[str]) -> Dict[str, Any]:
    """What install.yml does about the installer and pip, decided before any change."""
    check_urls(supply.get("pip_index_url", ""), supply.get("pip_find_links", ""), bool(supply.get("pip_allow_http")))
    out: Dict[str, Any] = {"installer": {"needed": False, "file": "", "sha256": "", "source": ""},
                           "pip": {"requirements": requirements(version, extra_packages, supply.get("pip_hashes"))}}
    # The container's NVIDIA userspace must be exactly the node's kernel module: installed when it differs (none read
    # before the first install). From sglang_server_nvidia_installer_url when given (downloaded inside the container),
    # otherwise from the node's sglang_server_nvidia_installer_node_dir through the controller.
    if str(container_driver or "") != str(node_driver):
        out["installer"] = {"needed": True, "file": installer_file(node_driver),
                            "sha256": installer_sha256(supply.get("installer_sha256"), node_driver),
                            "source": "url" if str(supply.get("installer_url") or "").strip() else "node"}
    return out


def check_driver_installed(node_driver: str, smi_stdout: Any) -> str:
    """After the installer ran: the container's userspace as nvidia-smi reports it (its first line) must be the node's
    driver; returns it, refused otherwise."""
    lines = [line.strip() for line in str(smi_stdout or "").splitlines() if line.strip()]
    seen = lines[0] if lines else ""
    if seen != str(node_driver):
        raise SupplyError("after the installer ran, nvidia-smi in the container reports the NVIDIA driver %s, not the node's "
                          "%s: the container's userspace must equal the node's kernel module exactly. Read the installer's "
                          "log in the container (/var/log/nvidia-installer.log)." % (seen or "(nothing)", node_driver))
    return seen
