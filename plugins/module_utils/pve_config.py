# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Pure logic for the pve_lxc module: PVE LXC config strings, the desired config, the
difference to the current config, devN GPU passthrough entries, PVE's conf text form, task
status and API error classification.

No Ansible and no proxmoxer imports: plain, typed Python that the unit tests call directly.
Memory options carry their unit in their name (``memory_mib``, ``swap_mib``); PVE's own
``memory`` and ``swap`` keys are MiB (pct.conf(5): "Amount of RAM for the container in MB"; pve-container
multiplies them by 1024 * 1024).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Optional, Sequence, Union


class ConfigError(ValueError):
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
    "mp": frozenset({"acl", "backup", "quota", "replicate", "ro", "shared"}),
    "dev": frozenset({"deny-write"}),
    "net": frozenset({"firewall", "link_down"}),
    "features": frozenset({"fuse", "keyctl", "mknod", "nesting", "force_rw_sys"}),
}
# Keys equal to their default are the same as absent.
_DEFAULT_VALUES: dict[str, dict[str, str]] = {
    "rootfs": {"ro": "0", "quota": "0", "replicate": "1", "shared": "0"},
    "mp": {"ro": "0", "quota": "0", "replicate": "1", "shared": "0", "backup": "0"},
    "dev": {"deny-write": "0"},
    "net": {"firewall": "0", "link_down": "0", "type": "veth"},
    "features": {"fuse": "0", "keyctl": "0", "mknod": "0", "nesting": "0", "force_rw_sys": "0"},
}
# Keys PVE fills in itself: when the desired value leaves them out, the current value is kept.
_FILLED_BY_PVE: dict[str, frozenset[str]] = {
    "rootfs": frozenset({"size"}),
    "mp": frozenset({"size"}),
    "net": frozenset({"hwaddr", "type"}),
}
# Top-level boolean options.
_TOP_BOOL_KEYS = frozenset({"onboot", "unprivileged", "protection", "template", "console", "debug"})

_TRUE = frozenset({"1", "yes", "on", "true"})
_FALSE = frozenset({"0", "no", "off", "false"})


def option_base(key: str) -> str:
    """'net0' -> 'net', 'dev12' -> 'dev', 'rootfs' -> 'rootfs'."""
    match = _INDEXED.match(key)
    return match.group("base") if match else key


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


def _norm_bool(value: Any) -> str:
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
        norm = _norm_bool(val) if name in bools else str(val).strip()
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
        return _norm_bool(value)
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
    filled = _FILLED_BY_PVE.get(base, frozenset())
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
        if name not in des_norm:
            cur_norm.pop(name, None)
    # Order inside the string does not matter to PVE.
    return OptionComparison(cur_norm == des_norm, format_property_string(put_props, default_key))


# --------------------------------------------------------------------------------------------
# devN GPU passthrough entries (pct.conf(5) dev[n]; pve-container 5.0.7, PVE 8.1)
# --------------------------------------------------------------------------------------------

MAX_DEVICES = 256
NVIDIA_CONTROL_NODES: tuple[str, ...] = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")
_GPU_NODE_RE = re.compile(r"^/dev/nvidia(\d+)$")
_MODE_RE = re.compile(r"^0[0-7]{3}$")


def validate_device_path(path: str) -> str:
    text = str(path).strip()
    if not text.startswith("/dev/"):
        raise ConfigError(f"device path {path!r} must start with /dev/ (PVE's devN takes device nodes only)")
    if "/./" in text or "/../" in text or text.endswith("/.") or text.endswith("/.."):
        raise ConfigError(f"device path {path!r} must not contain /./ or /../")
    if "," in text or "=" in text:
        raise ConfigError(f"device path {path!r} must not contain ',' or '='")
    if text.rstrip("/") == "/dev/nvidia-caps":
        raise ConfigError(
            "/dev/nvidia-caps is a directory and cannot be one devN entry; list its nodes "
            "(/dev/nvidia-caps/nvidia-cap1, ...) instead"
        )
    return text


def gpu_device_paths(spec: Union[int, str, Sequence[Any], None]) -> list[str]:
    """Device paths for ``gpu_passthrough``.

    An integer N gives /dev/nvidia0 .. /dev/nvidia{N-1}; a list gives those paths (an integer
    item i means /dev/nvidia{i}). The control nodes nvidiactl, nvidia-uvm and nvidia-uvm-tools
    are appended whenever at least one GPU node is passed; 0 or [] means no NVIDIA devices.
    """
    if spec is None:
        return []
    if isinstance(spec, bool):
        raise ConfigError("gpu_passthrough must be a GPU count or a list of device paths, not a boolean")
    if isinstance(spec, str) and spec.strip().isdigit():
        spec = int(spec.strip())
    if isinstance(spec, int):
        if spec < 0:
            raise ConfigError(f"gpu_passthrough count must be >= 0, got {spec}")
        items: list[Any] = list(range(spec))
    elif isinstance(spec, (list, tuple)):
        items = list(spec)
    else:
        raise ConfigError(
            f"gpu_passthrough must be a GPU count (e.g. 8) or a list of device paths "
            f"(e.g. [/dev/nvidia0, /dev/nvidia1]), got {spec!r}"
        )
    paths: list[str] = []
    for item in items:
        if isinstance(item, bool):
            raise ConfigError(f"gpu_passthrough item {item!r} is a boolean; give a path or a GPU index")
        if isinstance(item, int) or (isinstance(item, str) and item.strip().isdigit()):
            index = int(item)
            if index < 0:
                raise ConfigError(f"gpu_passthrough GPU index must be >= 0, got {index}")
            path = f"/dev/nvidia{index}"
        else:
            path = validate_device_path(str(item))
        if path not in paths:
            paths.append(path)
    if any(_GPU_NODE_RE.match(p) for p in paths):
        for control in NVIDIA_CONTROL_NODES:
            if control not in paths:
                paths.append(control)
    if len(paths) > MAX_DEVICES:
        raise ConfigError(f"gpu_passthrough gives {len(paths)} devices; PVE allows at most {MAX_DEVICES} (dev0..dev255)")
    return paths


def device_options_suffix(options: Optional[Mapping[str, Any]]) -> dict[str, str]:
    """Validated devN options (uid, gid, mode, deny_write) as PVE property keys."""
    result: dict[str, str] = {}
    if not options:
        return result
    for name, value in options.items():
        if value is None:
            continue
        if name in ("uid", "gid"):
            if isinstance(value, bool) or not str(value).isdigit():
                raise ConfigError(f"gpu_device_options.{name} must be an integer >= 0 (an ID inside the container), got {value!r}")
            result[name] = str(int(value))
        elif name == "mode":
            text = str(value)
            if isinstance(value, int) and not isinstance(value, bool):
                raise ConfigError(
                    f"gpu_device_options.mode must be a quoted octal string like '0666', got the number {value!r} "
                    "(YAML reads 0666 unquoted as a number)"
                )
            if not _MODE_RE.match(text):
                raise ConfigError(f"gpu_device_options.mode must match 0[0-7]{{3}} (e.g. '0666'), got {value!r}")
            result["mode"] = text
        elif name in ("deny_write", "deny-write"):
            result["deny-write"] = _norm_bool(value)
        else:
            raise ConfigError(f"gpu_device_options has an unknown key {name!r}; use uid, gid, mode or deny_write")
    return result


def device_entry(path: str, options: Mapping[str, str]) -> str:
    """The devN value, e.g. '/dev/nvidia0,gid=44'."""
    return format_property_string({"path": path, **options}, "path")


def _is_nvidia_path(path: Optional[str]) -> bool:
    return bool(path) and str(path).startswith("/dev/nvidia")


def _dev_index(key: str) -> Optional[int]:
    match = _INDEXED.match(key)
    if match and match.group("base") == "dev":
        return int(match.group("index"))
    return None


def plan_gpu_devices(
    current: Mapping[str, Any],
    paths: Sequence[str],
    options: Mapping[str, str],
    reserved_keys: Iterable[str] = (),
) -> tuple[dict[str, str], list[str]]:
    """Which devN keys should hold the NVIDIA devices, keeping existing indices.

    Returns (desired devN -> value for every NVIDIA entry, devN keys to delete). A device that
    is already passed through keeps its devN key (so re-ordering is not a change, and PVE's
    hotplug of newly added devices applies); new devices take the lowest free index. Existing
    devN entries for other /dev/nvidia* paths are removed; non-NVIDIA devN entries and
    ``reserved_keys`` (declared in extra_config) are left alone.
    """
    reserved = set(reserved_keys)
    used: set[int] = set()
    by_path: dict[str, str] = {}
    for key, value in current.items():
        index = _dev_index(key)
        if index is None:
            continue
        used.add(index)
        if key in reserved:
            continue
        try:
            props = parse_property_string(str(value), "path")
        except ConfigError:
            continue
        path = props.get("path")
        if _is_nvidia_path(path) and path not in by_path:
            by_path[str(path)] = key
    for key in reserved:
        index = _dev_index(key)
        if index is not None:
            used.add(index)

    desired: dict[str, str] = {}
    kept: set[str] = set()
    new_paths: list[str] = []
    for path in paths:
        if path in by_path:
            desired[by_path[path]] = device_entry(path, options)
            kept.add(by_path[path])
        else:
            new_paths.append(path)
    stale = [key for path, key in by_path.items() if key not in kept]
    free = (i for i in range(MAX_DEVICES) if i not in used or f"dev{i}" in stale)
    for path in new_paths:
        try:
            index = next(free)
        except StopIteration:
            raise ConfigError(f"no free devN index left for {path}: PVE allows dev0..dev{MAX_DEVICES - 1}") from None
        key = f"dev{index}"
        desired[key] = device_entry(path, options)
    delete = [key for key in stale if key not in desired]
    return desired, sorted(delete, key=lambda k: _dev_index(k) or 0)


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

    def touches_devices(self) -> bool:
        return any(option_base(k) == "dev" for k in list(self.set) + self.delete)


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


def create_params(desired: Mapping[str, str]) -> dict[str, str]:
    """The POST /nodes/{node}/lxc parameters for the declared config (create-only keys added by the caller)."""
    return dict(desired)


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
    """PVE's conf text form: description as '#' comments, keys sorted, raw lxc.* keys last."""
    if not config:
        return ""
    lines: list[str] = []
    description = config.get("description")
    if description:
        for line in str(description).splitlines():
            lines.append("#" + line)
    for key in sorted(config):
        if key in ("digest", "description", "lxc") or config[key] is None:
            continue
        lines.append(f"{key}: {_conf_value(config[key])}")
    raw = config.get("lxc") or []
    for item in raw:
        if isinstance(item, (list, tuple)) and len(item) == 2:
            lines.append(f"{item[0]}: {item[1]}")
    return "\n".join(lines) + "\n"


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
    if "timeout" in names or "connecttimeout" in names or "readtimeout" in names or "timed out" in low:
        return ApiError(
            "timeout",
            f"{url} did not answer in time: check the network path to the node, or raise api_timeout. ({text.strip()})",
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


def split_tags(value):
    """PVE's tags property: a list of tags separated by ';', ',' or spaces (pve-guest-common 'pve-tag-list')."""
    if not value:
        return []
    return [t for t in re.split(r"[;, ]+", str(value)) if t]
