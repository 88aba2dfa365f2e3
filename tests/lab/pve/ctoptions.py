"""Option parsing and validation (the subset of pct.conf(5) the collection uses), checked against PVE's schema.

Part of the simulated PVE node (tests/lab/pve/__init__.py).
"""
from __future__ import annotations

import os
import random
import re
import stat

from pve import apischema, pvenode


def parse_prop_string(value: str, default_key: str | None = None) -> dict:
    res: dict = {}
    for part in str(value).split(","):
        if not part:
            continue
        if "=" in part:
            k, v = part.split("=", 1)
            res[k.strip()] = v.strip()
        elif default_key and default_key not in res:
            res[default_key] = part.strip()
        else:
            raise ValueError(f"invalid format - missing key in comma-separated list property: '{part}'")
    return res


def parse_dev(value: str) -> dict:
    # pct.conf: dev[n]: [[path=]<Path>] [,deny-write=<1|0>] [,gid=<integer>] [,mode=<Octal access mode>] [,uid=<integer>]
    d = parse_prop_string(value, "path")
    for k in d:
        if k not in ("path", "deny-write", "gid", "mode", "uid"):
            raise ValueError(f"invalid format - property '{k}' is not defined in schema")
    path = d.get("path", "")
    if not path.startswith("/dev/") or "/./" in path or "/../" in path:
        raise ValueError("invalid format - value does not look like a valid device path")
    if "mode" in d and not re.fullmatch(r"0[0-7]{3}", d["mode"]):
        raise ValueError("invalid format - value does not look like a valid file access mode")
    for k in ("uid", "gid"):
        if k in d and not re.fullmatch(r"\d+", d[k]):
            raise ValueError(f"invalid format - {k}: type check ('integer') failed")
    return d


def device_mode_and_rdev(path: str) -> os.stat_result:
    # PVE::LXC::Tools::get_device_mode_and_rdev
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise pvenode.PVEError(f"Device {path} does not exist") from None
    if not (stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode)):
        raise pvenode.PVEError(f"{path} is not a device")
    return st


def parse_net(value: str) -> dict:
    d = parse_prop_string(value)
    if "name" not in d:
        raise ValueError("invalid format - missing property 'name'")
    return d


def _bool_opt(v):
    """A config boolean as PVE stores it: 1 or 0 (the schema check before it takes only 1, 0 or a JSON
    boolean; a property string's booleans pass through parse_boolean)."""
    s = str(v).lower()
    if s in ("1", "true", "yes", "on"):
        return "1"
    if s in ("0", "false", "no", "off"):
        return "0"
    raise ValueError(f"type check ('boolean') failed - got '{v}'")


# pve-container src/PVE/LXC/Config.pm $features_desc: the keys of the `features` property string.
FEATURE_KEYS = ("mount", "nesting", "keyctl", "fuse", "mknod", "force_rw_sys")
BOOL_FEATURES = ("nesting", "keyctl", "fuse", "mknod", "force_rw_sys")


def parse_features(value) -> dict:
    """PVE::LXC::Config::parse_features: {} for an empty value, else the property string checked."""
    if not value:
        return {}
    d = parse_prop_string(value)
    for k, v in d.items():
        if k not in FEATURE_KEYS:
            raise ValueError(f"invalid format - property '{k}' is not defined in schema")
        if k in BOOL_FEATURES:
            d[k] = _bool_opt(v)
    return d


# The config options are the properties of update_vm (PUT /nodes/{node}/lxc/{vmid}/config) in PVE's schema
# (apidata-slice.json) besides the method's own parameters; the schema checks them (apischema.py).
UPDATE_METHOD = "PUT /nodes/{node}/lxc/{vmid}/config"
CREATE_METHOD = "POST /nodes/{node}/lxc"
UPDATE_VM_EXTRA = ("node", "vmid", "delete", "revert", "digest")


def option_checker(key: str):
    """The schema of config option `key`, or None when pct.conf(5) has no such option."""
    if key in UPDATE_VM_EXTRA:
        return None
    return apischema.METHODS[UPDATE_METHOD].properties.get(key)


def validate_options(params: dict, allowed_extra=(), method: str = UPDATE_METHOD) -> dict:
    """Checks the given parameters against the method's schema (JSONSchema.pm check_object on the keys
    given: types, formats, property strings, enums, ranges, additionalProperties 0) and returns the config
    options among them as PVE stores them (booleans 1/0, a MAC generated for a netN without one)."""
    props = apischema.METHODS[method].properties
    errors: dict = {}
    apischema.check_keys(props, params, errors)
    if errors:
        raise pvenode.param_error(errors)
    out = {}
    for key, value in params.items():
        if key in allowed_extra or key in UPDATE_VM_EXTRA or option_checker(key) is None:
            continue
        value = "1" if value is True else "0" if value is False else str(value)
        if option_checker(key).get("type") == "boolean":
            value = _bool_opt(value)
        if re.fullmatch(r"net\d+", key) and "hwaddr" not in parse_prop_string(value, "name"):
            # PVE generates a MAC when none is given (pve-container LXC/Config.pm parse_lxc_network)
            value = f"{value},hwaddr=" + "BC:24:11:%02X:%02X:%02X" % tuple(random.randrange(256) for _ in range(3))
        out[key] = value
    return out
