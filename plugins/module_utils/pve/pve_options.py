# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""PVE container options as PVE prints them: property strings, their normalised form, and the comparison of a
declared value with the container's current one (pct.conf(5)).

No Ansible and no proxmoxer imports. ConfigError, raised here for values that cannot be parsed or states that
cannot be reached, is the error every pve_* module_utils raises.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping, Optional
from ansible_collections.inferops.gpu_inference.plugins.module_utils.common.errors import InferopsError


class ConfigError(InferopsError):
    """Bad input or an unreachable declared state; the message says what was wrong and what to do."""


# --------------------------------------------------------------------------------------------
# Property strings ("local-lvm:vm-198-disk-0,size=8G", "name=eth0,bridge=vmbr0,ip=dhcp")
# --------------------------------------------------------------------------------------------

_INDEXED = re.compile(r"^(?P<base>[a-z]+)(?P<index>\d+)$")

# Options whose value is a property string, and the key a bare first item stands for.
_DEFAULT_KEY: dict[str, Optional[str]] = {
    "rootfs": "volume",
    "mp": "volume",
    "unused": "volume",
    "dev": "path",
    "net": None,
    "features": None,
    "startup": None,
}
# Boolean keys inside property strings (PVE accepts 1/0/yes/no/on/off/true/false, stores 1/0).
_BOOL_KEYS: dict[str, frozenset[str]] = {
    "rootfs": frozenset({"acl", "backup", "quota", "replicate", "ro", "shared"}),
    "mp": frozenset({"acl", "backup", "quota", "replicate", "ro", "shared", "keepattrs"}),
    "dev": frozenset({"deny-write"}),
    "net": frozenset({"firewall", "link_down", "host-managed"}),
    "features": frozenset({"fuse", "keyctl", "mknod", "nesting", "force_rw_sys"}),
}
# Keys equal to their default are the same as absent.
_DEFAULT_VALUES: dict[str, dict[str, str]] = {
    "rootfs": {"ro": "0", "quota": "0", "replicate": "1", "shared": "0"},
    "mp": {"ro": "0", "quota": "0", "replicate": "1", "shared": "0", "backup": "0", "keepattrs": "0"},
    "dev": {"deny-write": "0"},
    "net": {"firewall": "0", "link_down": "0", "type": "veth", "host-managed": "0"},
    "features": {"fuse": "0", "keyctl": "0", "mknod": "0", "nesting": "0", "force_rw_sys": "0"},
}
# Keys PVE fills in itself: when the desired value leaves them out, the current value is kept.
_FILLED_BY_PVE: dict[str, frozenset[str]] = {
    "rootfs": frozenset({"size"}),
    "mp": frozenset({"size"}),
    "net": frozenset({"hwaddr", "type"}),
}
# Keys of PVE 9 that a declaration written without them leaves as the operator set them: net[n] host-managed
# (the host, not the container, configures the address), mp[n] keepattrs (pve-container 6.0) and idmap (6.1.6,
# PVE 9.2). Declared, they are compared and sent like any other key.
_KEPT_UNLESS_DECLARED: dict[str, frozenset[str]] = {
    "mp": frozenset({"keepattrs", "idmap"}),
    "net": frozenset({"host-managed"}),
}
# Top-level boolean options.
_TOP_BOOL_KEYS = frozenset({"onboot", "unprivileged", "protection", "template", "console", "debug"})

_TRUE = frozenset({"1", "yes", "on", "true"})
_FALSE = frozenset({"0", "no", "off", "false"})


def option_base(key: str) -> str:
    """'net0' -> 'net', 'dev12' -> 'dev', 'rootfs' -> 'rootfs'."""
    match = _INDEXED.match(key)
    return match.group("base") if match else key


def option_index(key: str) -> Optional[int]:
    """'dev12' -> 12, 'net0' -> 0, 'rootfs' -> None."""
    match = _INDEXED.match(key)
    return int(match.group("index")) if match else None


def is_property_option(key: str) -> bool:
    return option_base(key) in _DEFAULT_KEY


def parse_property_string(value: str, default_key: Optional[str] = None) -> dict[str, str]:
    """Parse a PVE property string into an ordered dict.

    A first item without ``=`` is the value of ``default_key`` ("volume" for rootfs,
    "path" for devN).
    """
    result: dict[str, str] = {}
    text = str(value).strip()
    if not text:
        return result
    for position, item in enumerate(text.split(",")):
        item = item.strip()
        if not item:
            continue
        if "=" in item:
            key, _sep, val = item.partition("=")
            key = key.strip()
        elif position == 0 and default_key:
            key, val = default_key, item
        else:
            raise ConfigError(f"cannot parse {value!r}: item {item!r} is not key=value")
        if key in result:
            raise ConfigError(f"cannot parse {value!r}: key {key!r} appears twice")
        result[key] = val.strip()
    return result


def format_property_string(props: Mapping[str, str], default_key: Optional[str] = None) -> str:
    """Inverse of parse_property_string: the default key's value first, without its name."""
    items: list[str] = []
    if default_key and default_key in props:
        items.append(str(props[default_key]))
    for key, val in props.items():
        if key == default_key:
            continue
        items.append(f"{key}={val}")
    return ",".join(items)


def norm_bool(value: Any) -> str:
    """A boolean as PVE stores it ('1'/'0'); any other value stripped of spaces."""
    text = str(value).strip().lower()
    if isinstance(value, bool):
        return "1" if value else "0"
    if text in _TRUE:
        return "1"
    if text in _FALSE:
        return "0"
    return str(value).strip()


_SIZE_RE = re.compile(r"^(\d+(?:\.\d+)?)([KMGT])?$", re.IGNORECASE)
_SIZE_FACTOR = {None: 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}


def parse_size_bytes(text: str) -> int:
    """PVE disk size ("8G", "512M", "8589934592") in bytes; no unit means bytes."""
    match = _SIZE_RE.match(str(text).strip())
    if not match:
        raise ConfigError(f"cannot parse disk size {text!r}: expected a number with an optional K/M/G/T unit")
    unit = match.group(2).upper() if match.group(2) else None
    return int(float(match.group(1)) * _SIZE_FACTOR[unit])


_ALLOC_RE = re.compile(r"^(?P<storage>[A-Za-z][A-Za-z0-9\-_.]*):(?P<gib>\d+(?:\.\d+)?)$")


def parse_allocation(volume: str) -> Optional[tuple[str, int]]:
    """'local-lvm:8' (allocate 8 GiB on local-lvm) -> ('local-lvm', 8 GiB in bytes); None for a volume ID."""
    match = _ALLOC_RE.match(volume.strip())
    if not match:
        return None
    return match.group("storage"), int(float(match.group("gib")) * 1024**3)


def _storage_of(volume: str) -> Optional[str]:
    return volume.split(":", 1)[0] if ":" in volume else None


def normalize_props(key: str, props: Mapping[str, str]) -> dict[str, str]:
    """Booleans as 1/0, defaults dropped, MAC addresses upper case, sizes in bytes."""
    base = option_base(key)
    bools = _BOOL_KEYS.get(base, frozenset())
    defaults = _DEFAULT_VALUES.get(base, {})
    result: dict[str, str] = {}
    for name, val in props.items():
        norm = norm_bool(val) if name in bools else str(val).strip()
        if name == "hwaddr":
            norm = norm.upper()
        if name == "size":
            norm = str(parse_size_bytes(norm))
        if defaults.get(name) == norm:
            continue
        result[name] = norm
    return result


def normalize_scalar(key: str, value: Any) -> str:
    """Top-level option value as PVE prints it: booleans 1/0, integral numbers without '.0'."""
    if key in _TOP_BOOL_KEYS or isinstance(value, bool):
        return norm_bool(value)
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value).strip()


@dataclass
class OptionComparison:
    equal: bool
    put_value: str  # what to send to make current match desired (meaningful when not equal)


def compare_option(key: str, current: Any, desired: Any) -> OptionComparison:
    """Compare one option's current (from GET config) and desired value, PVE formatting aside.

    For rootfs/mpN the desired volume may use the allocation syntax (``local-lvm:8``) while the
    current one names the allocated volume (``local-lvm:vm-198-disk-0,size=8G``); they are equal
    when storage and size agree. Resizing or moving a volume is refused with a ConfigError.
    """
    if not is_property_option(key):
        cur = normalize_scalar(key, current)
        des = normalize_scalar(key, desired)
        return OptionComparison(cur == des, des)

    base = option_base(key)
    default_key = _DEFAULT_KEY[base]
    cur_props = parse_property_string(str(current), default_key)
    des_props = parse_property_string(str(desired), default_key)

    put_props = dict(des_props)
    filled = _FILLED_BY_PVE.get(base, frozenset()) | _KEPT_UNLESS_DECLARED.get(base, frozenset())
    for name in filled:
        if name not in des_props and name in cur_props:
            put_props[name] = cur_props[name]

    if base in ("rootfs", "mp") and "volume" in des_props and "volume" in cur_props:
        alloc = parse_allocation(des_props["volume"])
        cur_volume = cur_props["volume"]
        if alloc is not None and parse_allocation(cur_volume) is None:
            storage, size_bytes = alloc
            cur_size = parse_size_bytes(cur_props["size"]) if "size" in cur_props else None
            if _storage_of(cur_volume) != storage:
                raise ConfigError(
                    f"{key}: the container's volume {cur_volume} is on storage {_storage_of(cur_volume)}, "
                    f"not {storage} as declared ({des_props['volume']}); this module does not move volumes. "
                    "Move it with `pct move-volume` or declare the current storage."
                )
            if cur_size is not None and cur_size != size_bytes:
                raise ConfigError(
                    f"{key}: the container's volume {cur_volume} is {cur_props['size']}, not "
                    f"{des_props['volume'].split(':', 1)[1]}G as declared; this module does not resize volumes. "
                    "Grow it with `pct resize` (PUT /nodes/{node}/lxc/{vmid}/resize) or declare the current size."
                )
            # Same volume: compare the options, keep the real volume ID and size when sending.
            des_props = {**des_props, "volume": cur_volume}
            put_props["volume"] = cur_volume
            if cur_size is not None:
                des_props.setdefault("size", cur_props["size"])
                put_props["size"] = cur_props["size"]
        elif alloc is None and cur_volume != des_props["volume"]:
            raise ConfigError(
                f"{key}: the container uses volume {cur_volume}, the declared value names {des_props['volume']}; "
                "this module does not swap or move volumes. Declare the current volume, or use the "
                "allocation form STORAGE:SIZE_GIB (e.g. local-lvm:8) which matches the existing volume."
            )

    cur_norm = normalize_props(key, cur_props)
    des_norm = normalize_props(key, des_props)
    for name in filled:
        if name not in des_props:  # declared at its default (dropped from des_norm) is still declared
            cur_norm.pop(name, None)
    # Order inside the string does not matter to PVE.
    return OptionComparison(cur_norm == des_norm, format_property_string(put_props, default_key))


def split_tags(value: Any) -> list[str]:
    """PVE's tags property: a list of tags separated by ';', ',' or spaces (pve-guest-common 'pve-tag-list')."""
    if not value:
        return []
    return [t for t in re.split(r"[;, ]+", str(value)) if t]
