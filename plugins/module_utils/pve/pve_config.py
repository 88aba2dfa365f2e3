# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The config pve_lxc declares and what it takes to get there: the declared PVE keys from the module's
parameters, the minimal PUT (or the POST that creates the container), the owner tag, the keys PVE holds as
pending, and PVE's conf text form for --diff.

No Ansible and no proxmoxer imports: plain, typed Python that the unit tests call directly.
Memory options carry their unit in their name (``memory_mib``, ``swap_mib``); PVE's own
``memory`` and ``swap`` keys are MiB (pct.conf(5): "Amount of RAM for the container in MB"; pve-container
multiplies them by 1024 * 1024).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Optional, Union

from ansible_collections.inferops.gpu_inference.plugins.module_utils.pve.pve_gpu_devices import (
    device_options_suffix,
    gpu_device_paths,
    plan_gpu_devices,
    validate_device_path,
)
from ansible_collections.inferops.gpu_inference.plugins.module_utils.pve.pve_options import (
    ConfigError,
    compare_option,
    normalize_scalar,
    option_base,
    parse_property_string,
)

# --------------------------------------------------------------------------------------------
# Desired config and the plan
# --------------------------------------------------------------------------------------------

_NET_KEY_RE = re.compile(r"^net\d+$")
_MANAGED_ELSEWHERE = {
    "hostname": "hostname",
    "cores": "cores",
    "memory": "memory_mib",
    "swap": "swap_mib",
    "rootfs": "rootfs",
    "features": "features",
}
_NOT_CONFIG_KEYS = frozenset({"digest", "lxc", "vmid", "node", "delete", "revert"})


def env_value(variables: Iterable[Any]) -> str:
    """PVE 9's ``env`` option from a list of NAME=value strings: NUL-separated, as the API takes it (pct.conf(5);
    pve-container stores each as a ``lxc.environment.runtime`` line)."""
    out = []
    for item in variables:
        text = str(item)
        if not re.match(r"^\w+=", text) or "\0" in text or "\n" in text:
            raise ConfigError(
                f"extra_config env: each item must be NAME=value (letters, digits, '_' before '=', no newline), "
                f"got {text!r}"
            )
        out.append(text)
    return "\0".join(out)


def _props_value(value: Any, what: str) -> str:
    """A property-string option given as a string or as a dict of key: value."""
    if isinstance(value, Mapping):
        parts = []
        for key, val in value.items():
            if val is None:
                continue
            if isinstance(val, bool):
                val = 1 if val else 0
            parts.append(f"{key}={val}")
        return ",".join(parts)
    if isinstance(value, str):
        return value.strip()
    raise ConfigError(f"{what} must be a string like 'nesting=1,keyctl=1' or a dict, got {value!r}")


def build_desired_config(
    hostname: Optional[str] = None,
    cores: Optional[int] = None,
    memory_mib: Optional[int] = None,
    swap_mib: Optional[int] = None,
    rootfs: Optional[str] = None,
    net: Optional[Mapping[str, Any]] = None,
    features: Optional[Union[str, Mapping[str, Any]]] = None,
    extra_config: Optional[Mapping[str, Any]] = None,
) -> tuple[dict[str, str], list[str]]:
    """The declared PVE config keys (excluding devN GPU entries) and the keys to delete.

    Returns (key -> value as sent to the API, keys whose extra_config value is null).
    """
    desired: dict[str, str] = {}
    if hostname is not None:
        if not re.match(r"^[A-Za-z0-9]([A-Za-z0-9\-.]*[A-Za-z0-9])?$", hostname):
            raise ConfigError(f"hostname {hostname!r} is not a valid DNS name (letters, digits, '-', '.')")
        desired["hostname"] = hostname
    if cores is not None:
        if cores < 1 or cores > 8192:
            raise ConfigError(f"cores must be between 1 and 8192, got {cores}")
        desired["cores"] = str(cores)
    if memory_mib is not None:
        if memory_mib < 16:
            raise ConfigError(f"memory_mib is in MiB and PVE's minimum is 16, got {memory_mib}")
        desired["memory"] = str(memory_mib)
    if swap_mib is not None:
        if swap_mib < 0:
            raise ConfigError(f"swap_mib must be >= 0 (MiB), got {swap_mib}")
        desired["swap"] = str(swap_mib)
    if rootfs is not None:
        parse_property_string(rootfs, "volume")  # validates
        desired["rootfs"] = rootfs.strip()
    if net:
        for key, value in net.items():
            if not _NET_KEY_RE.match(str(key)):
                raise ConfigError(f"net keys must be net0, net1, ..., got {key!r}")
            text = _props_value(value, f"net.{key}")
            parse_property_string(text)
            desired[str(key)] = text
    if features is not None:
        text = _props_value(features, "features")
        parse_property_string(text)
        desired["features"] = text
    delete: list[str] = []
    for key, value in (extra_config or {}).items():
        key = str(key)
        if key.startswith("lxc."):
            raise ConfigError(
                f"extra_config key {key!r}: raw lxc.* keys are not PVE API parameters; they live only in "
                "/etc/pve/lxc/<vmid>.conf. Edit that file on the node (e.g. ansible.builtin.blockinfile), "
                "or use gpu_passthrough (devN) for NVIDIA devices."
            )
        if key in _NOT_CONFIG_KEYS:
            raise ConfigError(f"extra_config key {key!r} is not a container option")
        if key in _MANAGED_ELSEWHERE and key in desired:
            raise ConfigError(
                f"extra_config key {key!r} is also set by the option {_MANAGED_ELSEWHERE[key]}; give it once"
            )
        if key in desired:
            raise ConfigError(f"extra_config key {key!r} is also set by the option net; give it once")
        if value is None:
            delete.append(key)
            continue
        if isinstance(value, Mapping):
            text = _props_value(value, f"extra_config.{key}")
        elif key == "env" and isinstance(value, (list, tuple)):
            text = env_value(value)
        else:
            text = normalize_scalar(key, value)
        if option_base(key) == "dev":
            validate_device_path(parse_property_string(text, "path").get("path", ""))
        desired[key] = text
    return desired, delete


@dataclass
class ConfigPlan:
    """What a PUT must send: values to set and keys to delete."""

    set: dict[str, str] = field(default_factory=dict)
    delete: list[str] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return bool(self.set or self.delete)

    def device_keys(self) -> list[str]:
        """The devN keys the plan sets or deletes, sorted."""
        return sorted(k for k in list(self.set) + self.delete if option_base(k) == "dev")

    def touches_devices(self) -> bool:
        return bool(self.device_keys())

    def changes(self) -> dict[str, Any]:
        """The module's ``changes`` return value."""
        return dict(set=dict(self.set), delete=list(self.delete))

    def put_params(self, digest: Optional[str]) -> dict[str, str]:
        """PUT /nodes/{node}/lxc/{vmid}/config: the values, ``delete=`` and the digest read with the config."""
        params = dict(self.set)
        if self.delete:
            params["delete"] = ",".join(self.delete)
        if digest:
            params["digest"] = digest
        return params


def plan_config(current: Mapping[str, Any], desired: Mapping[str, str], delete: Iterable[str] = ()) -> ConfigPlan:
    """The minimal PUT that makes ``current`` (GET .../config) match ``desired``.

    Keys not in ``desired`` are left alone unless listed in ``delete`` (and present).
    """
    plan = ConfigPlan()
    for key, value in desired.items():
        if key not in current or current[key] is None:
            plan.set[key] = value
            continue
        comparison = compare_option(key, current[key], value)
        if not comparison.equal:
            plan.set[key] = comparison.put_value
    for key in delete:
        if key in current and key not in plan.set and key not in plan.delete:
            plan.delete.append(key)
    return plan


def apply_plan(current: Mapping[str, Any], plan: ConfigPlan) -> dict[str, Any]:
    """The config after the plan is applied (for the diff's 'after')."""
    after = {k: v for k, v in current.items() if k != "digest"}
    for key in plan.delete:
        after.pop(key, None)
    after.update(plan.set)
    return after


# --------------------------------------------------------------------------------------------
# From pve_lxc's parameters to the PUT or the POST
# --------------------------------------------------------------------------------------------


@dataclass
class Declared:
    """What the module's parameters declare: PVE keys (without GPU devN), keys to delete, GPU device paths
    (None: leave devN alone) and the options of every GPU devN entry."""

    config: dict[str, str]
    delete: list[str]
    gpu_paths: Optional[list[str]]
    dev_options: dict[str, str]


def declared_state(params: Mapping[str, Any]) -> Declared:
    """The declared state from pve_lxc's parameters; raises ConfigError for a value PVE would not take."""
    config, delete = build_desired_config(
        hostname=params["hostname"],
        cores=params["cores"],
        memory_mib=params["memory_mib"],
        swap_mib=params["swap_mib"],
        rootfs=params["rootfs"],
        net=params["net"],
        features=params["features"],
        extra_config=params["extra_config"],
    )
    gpu = params["gpu_passthrough"]
    gpu_paths = gpu_device_paths(gpu) if gpu is not None else None
    dev_options = device_options_suffix(params["gpu_device_options"])
    return Declared(config, list(delete) + list(params["delete"] or []), gpu_paths, dev_options)


def plan_update(current: Mapping[str, Any], declared: Declared) -> ConfigPlan:
    """The PUT for an existing container: the declared keys, and the GPU devN entries where they already are."""
    desired = dict(declared.config)
    delete = list(declared.delete)
    if declared.gpu_paths is not None:
        devices, stale = plan_gpu_devices(current, declared.gpu_paths, declared.dev_options, reserved_keys=declared.config)
        desired.update(devices)
        delete.extend(stale)
    return plan_config(current, desired, delete)


def create_config(declared: Declared) -> dict[str, str]:
    """The config a new container gets: the declared keys and the GPU devN entries from dev0 up."""
    config = dict(declared.config)
    if declared.gpu_paths:
        devices, _unused = plan_gpu_devices(
            dict(declared.config), declared.gpu_paths, declared.dev_options, reserved_keys=declared.config
        )
        config.update(devices)
    return config


def create_params(config: Mapping[str, str], vmid: int, params: Mapping[str, Any]) -> dict[str, Any]:
    """POST /nodes/{node}/lxc: the config and the keys PVE only takes at creation."""
    post: dict[str, Any] = dict(config)
    post.update(vmid=vmid, ostemplate=params["ostemplate"], unprivileged=1 if params["unprivileged"] else 0)
    if params["password"]:
        post["password"] = params["password"]
    if params["ssh_public_keys"]:
        post["ssh-public-keys"] = params["ssh_public_keys"]
    if params["pool"]:
        post["pool"] = params["pool"]
    return post


def pending_keys(pending: Iterable[Mapping[str, Any]]) -> list[str]:
    """The keys GET .../pending lists as not applied yet (a new value or a deletion), sorted."""
    keys = [item.get("key") for item in pending if "pending" in item or item.get("delete")]
    return sorted(k for k in keys if k)


# --------------------------------------------------------------------------------------------
# Ownership (owner_tag) and creation
# --------------------------------------------------------------------------------------------


def owner_refusal(vmid: int, node: str, owner: Optional[str], tags: Iterable[str], adopt: bool) -> Optional[str]:
    """Why an existing container that lacks the tag ``owner`` must not be changed; None when it may."""
    tags = list(tags)
    if not owner or owner in tags or adopt:
        return None
    return (
        f"CT {vmid} exists on node {node} but does not carry the PVE tag {owner!r} that marks the "
        f"containers this collection manages (its tags: {';'.join(tags) or 'none'}): changing it could break "
        "another workload. Check the VMID (proxmox_vmid); to take this container over on purpose, set "
        "pve_gpu_container_adopt=true for it (adopt=true)."
    )


def tags_with_owner(tags: Iterable[str], owner: str) -> str:
    """The tags property with ``owner`` added: the tags sorted, joined by ';'."""
    return ";".join(sorted(set(tags) | {owner}))


def missing_ostemplate(vmid: int, node: str) -> str:
    return (
        f"CT {vmid} does not exist on node {node} and ostemplate is not set: give ostemplate "
        "(e.g. local:vztmpl/debian-13-standard_13.1-1_amd64.tar.zst) to create it, or check vmid and node."
    )


def missing_template(vmid: int, node: str, template: str) -> str:
    storage = template.partition(":")[0]
    return (
        f"CT {vmid} does not exist on node {node} and its template {template} is not in storage "
        f"{storage}: download it on the node first (pveam update; pveam download "
        f"{storage} {template.rpartition('/')[2]}), or fix ostemplate."
    )


def vmid_on_other_node(vmid: int, node: str, other: str) -> str:
    return (
        f"CT {vmid} does not exist on node {node} but on node {other} of the cluster, and VMIDs are unique in a "
        f"Proxmox VE cluster, so it cannot be made on {node}: place the container on {other} in the inventory "
        f"(pve_gpu_container_node_host, and proxmox_node of that node host), or give it a VMID no node uses. "
        f"Nothing has been changed."
    )


# --------------------------------------------------------------------------------------------
# Conf text (as in /etc/pve/lxc/<vmid>.conf) for --diff
# --------------------------------------------------------------------------------------------


def _conf_value(value: Any) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def render_conf(config: Optional[Mapping[str, Any]]) -> str:
    """PVE's conf text form: description as '#' comments, keys sorted, ``env`` and raw lxc.* keys last."""
    if not config:
        return ""
    lines: list[str] = []
    description = config.get("description")
    if description:
        for line in str(description).splitlines():
            lines.append("#" + line)
    for key in sorted(config):
        if key in ("digest", "description", "lxc", "env") or config[key] is None:
            continue
        lines.append(f"{key}: {_conf_value(config[key])}")
    # PVE 9 writes ``env`` as one lxc.environment.runtime line per variable, before the other raw keys
    # (pve-container LXC/Config.pm write_pct_config).
    for variable in str(config.get("env") or "").split("\0"):
        if variable:
            lines.append(f"lxc.environment.runtime: {variable}")
    raw = config.get("lxc") or []
    for item in raw:
        if isinstance(item, (list, tuple)) and len(item) == 2:
            lines.append(f"{item[0]}: {item[1]}")
    return "\n".join(lines) + "\n"
