# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""NVIDIA GPU passthrough as native devN entries (pct.conf(5) dev[n]; pve-container 5.0.7, PVE 8.1): the device
paths ``gpu_passthrough`` stands for, the options of every entry, and which devN keys hold them.

No Ansible and no proxmoxer imports.
"""

from __future__ import annotations

import re
from typing import Any, Iterable, Mapping, Optional, Sequence, Union

from ansible_collections.inferops.gpu_inference.plugins.module_utils.pve.pve_options import (
    ConfigError,
    format_property_string,
    norm_bool,
    option_base,
    option_index,
    parse_property_string,
)

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
            result["deny-write"] = norm_bool(value)
        else:
            raise ConfigError(f"gpu_device_options has an unknown key {name!r}; use uid, gid, mode or deny_write")
    return result


def device_entry(path: str, options: Mapping[str, str]) -> str:
    """The devN value, e.g. '/dev/nvidia0,gid=44'."""
    return format_property_string({"path": path, **options}, "path")


def _is_nvidia_path(path: Optional[str]) -> bool:
    return bool(path) and str(path).startswith("/dev/nvidia")


def dev_index(key: str) -> Optional[int]:
    """'dev3' -> 3; None for any other key."""
    return option_index(key) if option_base(key) == "dev" else None


_MOUNT_GPU_RE = re.compile(r"(?:^|\s)/dev/nvidia(\d+)(?:\s|$)")


def config_gpus(config: Mapping[str, Any]) -> list[int]:
    """The GPU device minors (N of ``/dev/nvidiaN``, not nvidia-smi indexes) a container's config passes through: ``devN`` entries, and raw
    ``lxc.mount.entry`` lines (the pre-devN way; the API returns raw lines as ``lxc: [[key, value], ...]``).
    The one reading of "which GPUs a container holds", for deploy's node plan and recover's scope."""
    gpus: set[int] = set()
    for key, value in config.items():
        if dev_index(str(key)) is None:
            continue
        try:
            path = parse_property_string(str(value), "path").get("path")
        except ConfigError:
            continue
        match = _GPU_NODE_RE.match(str(path or ""))
        if match:
            gpus.add(int(match.group(1)))
    for entry in config.get("lxc") or []:
        if isinstance(entry, (list, tuple)) and len(entry) == 2 and str(entry[0]).strip() == "lxc.mount.entry":
            match = _MOUNT_GPU_RE.search(str(entry[1]).strip())
            if match:
                gpus.add(int(match.group(1)))
    return sorted(gpus)


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
        index = dev_index(key)
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
        index = dev_index(key)
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
    return desired, sorted(delete, key=lambda k: dev_index(k) or 0)
