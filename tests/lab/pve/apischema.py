"""PVE's own API schema for the lab's endpoints, checked as pve-common's JSONSchema.pm checks it.

The schema is apidata-slice.json: the lab's methods cut from pve-docs `api-viewer/apidata.js` at the commit
it names (make_apislice.py), the release the lab reports (9.1). PROFILES holds the other releases the lab checks
requests against without serving them (8.4: apidata-slice-8.4.json; api.py records each request's verdict).
The checks are a port of pve-common `src/PVE/JSONSchema.pm` at f665029:
`check_prop`, `check_object`, `check_type`, `check_format`, `parse_property_string`, `is_number`,
`is_integer`, `parse_boolean`, `parse_size`, with PVE's error texts (a named format's `die` text keeps its
newline, as PVE's "invalid format - $@" does). The named formats are the registered verifiers of
pve-common, pve-container, pve-storage and pve-access-control (each names its source below); a format the
slice uses that has no verifier here fails at import (FORMATS_MISSING), never passes silently.
Stdlib only (runs with the node's python3).
"""
from __future__ import annotations

import json
import os
import re

HERE = os.path.dirname(os.path.abspath(__file__))
SLICE_FILE = os.path.join(HERE, "apidata-slice.json")

with open(SLICE_FILE) as _f:
    SLICE = json.load(_f)
# Other releases' slices: checked, never served (docs/lab.md "PVE's schema").
PROFILE_FILES = {"8.4": os.path.join(HERE, "apidata-slice-8.4.json")}

# pve-container src/PVE/LXC/Config.pm: $MAX_MOUNT_POINTS = 256, $MAX_UNUSED_DISKS = $MAX_MOUNT_POINTS,
# $MAX_DEVICES = 256, $MAX_LXC_NETWORKS = 32 (apidata.js shows each family once, as `net[n]`).
INDEXED_MAX = {"mp": 256, "unused": 256, "dev": 256, "net": 32}

SCHEMA_ERROR = "property is not defined in schema and the schema does not allow additional properties"


class SchemaError(Exception):
    """PVE::Exception raised by validate: 400 `Parameter verification failed.` with per-parameter errors."""

    def __init__(self, errors: dict, msg: str = "Parameter verification failed."):
        super().__init__(msg)
        self.msg = msg
        self.errors = errors


class _Die(Exception):
    """A Perl `die` inside a format verifier; str() is the text PVE's "invalid format - $@" appends."""


# ---- pve-common src/PVE/ParseUtils.pm, src/PVE/JSONSchema.pm: regexes and helpers -------------------------

_IPV4OCTET = r"(?:25[0-5]|(?:2[0-4]|1[0-9]|[1-9])?[0-9])"
IPV4RE = rf"(?:(?:{_IPV4OCTET}\.){{3}}{_IPV4OCTET})"
_H16 = r"(?:[0-9a-fA-F]{1,4})"
_LS32 = rf"(?:(?:{IPV4RE}|{_H16}:{_H16}))"
IPV6RE = ("(?:"
          rf"(?:(?:(?:{_H16}:){{6}}){_LS32})|"
          rf"(?:(?:::(?:{_H16}:){{5}}){_LS32})|"
          rf"(?:(?:(?:{_H16})?::(?:{_H16}:){{4}}){_LS32})|"
          rf"(?:(?:(?:(?:{_H16}:){{0,1}}{_H16})?::(?:{_H16}:){{3}}){_LS32})|"
          rf"(?:(?:(?:(?:{_H16}:){{0,2}}{_H16})?::(?:{_H16}:){{2}}){_LS32})|"
          rf"(?:(?:(?:(?:{_H16}:){{0,3}}{_H16})?::(?:{_H16}:){{1}}){_LS32})|"
          rf"(?:(?:(?:(?:{_H16}:){{0,4}}{_H16})?::){_LS32})|"
          rf"(?:(?:(?:(?:{_H16}:){{0,5}}{_H16})?::){_H16})|"
          rf"(?:(?:(?:(?:{_H16}:){{0,6}}{_H16})?::)))")
CONFIGID_RE = r"(?i:[a-z][a-z0-9_-]+)"


def _m(pattern: str, value: str) -> bool:
    """Perl's `$value =~ m/^...$/`: `$` also matches before a final newline (as Python's `$` does)."""
    return re.search(pattern, value) is not None


def split_list(text) -> list[str]:
    """pve-common ParseUtils::split_list."""
    text = "" if text is None else str(text)
    if "\0" in text:
        return text.split("\0")
    text = re.sub(r"[,;]", " ", text).lstrip()
    return [p for p in re.split(r"\s+", text)] if text else []


def is_number(value: str) -> bool:
    return _m(r"^[+-]?(\d+\.\d+|\d+\.|\.\d+|\d+)([eE][+-]?\d+)?$", value)


def is_integer(value: str) -> bool:
    return _m(r"^[+-]?\d+$", value)


def parse_boolean(value: str):
    if _m(r"(?i)^(1|on|yes|true)$", value):
        return "1"
    if _m(r"(?i)^(0|off|no|false)$", value):
        return "0"
    return None


def parse_size(value: str):
    m = re.search(r"^(\d+(\.\d+)?)([KMGT](?:iB)?)?$", value)
    if not m:
        return None
    mult = {"K": 1, "M": 2, "G": 3, "T": 4}.get((m.group(3) or " ")[0], 0)
    return int(float(m.group(1)) * 1024 ** mult)


def perl_pattern(pattern: str) -> str:
    """A Perl regex of the schema in Python syntax: `(?^:` (default flags) becomes `(?:`, `(?^i:` `(?i:`."""
    return re.sub(r"\(\?\^([a-z]*):", lambda m: f"(?{m.group(1)}:" if m.group(1) else "(?:", pattern)


# ---- named formats: (verifier, source) -------------------------------------------------------------------
# Each verifier returns normally or raises _Die with PVE's text (newline included).

def _die(text: str):
    raise _Die(text + "\n")


def _regex_format(pattern: str, text):
    def check(v):
        if not _m(pattern, v):
            _die(text(v) if callable(text) else text)
    return check


def _parse_id(kind: str):
    def check(v):
        if len(v) < 2:
            _die(f"{kind} ID '{v}' cannot be shorter than 2 characters")
        if not _m(r"(?i)^[a-z][a-z0-9\-_.]*[a-z0-9]$", v):
            _die(f"{kind} ID '{v}' contains illegal characters")
    return check


def _verify_ip(v, noerr=False):
    ok = _m(rf"^(?:(?:{IPV4RE})|(?:{IPV6RE}))$", v)
    if not ok and not noerr:
        _die("value does not look like a valid IP address")
    return ok


def _verify_iface(v, noerr=False):
    ok = _m(r"(?i)^[a-z][a-z0-9_]{1,20}([:.]\d+)?$", v)
    if not ok and not noerr:
        _die(f"invalid network interface name '{v}'")
    return ok


def _cidr(v: str, ipre: str, maxbits: int) -> bool:
    m = re.search(rf"^(?:{ipre})(?:/(\d+))$", v)
    return bool(m) and 7 < int(m.group(1)) <= maxbits


def _ip_with_ll_iface(v):
    m = re.search(r"^(fe80:[^%]+)%(.*)$", v)
    if m and _verify_ip(m.group(1), True) and _verify_iface(m.group(2), True):
        return
    _verify_ip(v)


def _timezone(v):
    # pve-common pve_verify_timezone: 'UTC' or a zone of /usr/share/zoneinfo/zone.tab (column 3)
    if v == "UTC":
        return
    try:
        with open("/usr/share/zoneinfo/zone.tab") as f:
            for line in f:
                if re.match(r"^\s*#", line):
                    continue
                cols = line.rstrip("\n").split("\t")
                if len(cols) > 2 and cols[2] == v:
                    return
    except OSError:
        pass
    _die(f"invalid time zone '{v}'")


def _ct_timezone(v):
    if v == "host":
        return
    _timezone(v)


def _startup_order(v):
    ok = bool(v)
    for part in v.split(","):
        if _m(r"^\s*$", part):
            continue
        if not (_m(r"^(order=)?(\d+)$", part) or _m(r"^up=(\d+)$", part) or _m(r"^down=(\d+)$", part)):
            ok = False
    if not ok:
        _die("unable to parse startup options")


def _mp_string(v):
    if _m(r"/\.\.?/", v) or _m(r"/\.\.?$", v) or _m(r"^\.\./", v):
        _die(f"{v} contains illegal character sequences")


def _dev_string(v):
    if _m(r"/\.\.?(?:/|$)", v) or not _m(r"^/dev/", v):
        _die(f"{v} is not a valid device path")


def _poolid(v):
    if len(v.split("/")) > 3:  # Perl's split drops trailing empty fields; the regex below refuses those anyway
        _die(f"pool name '{v}' nested too deeply (max levels = 3)")
    if not _m(r"^[A-Za-z0-9.\-_]+(?:/[A-Za-z0-9.\-_]+){0,2}$", v):
        _die(f"pool name '{v}' contains invalid characters")


# pve-access-control src/PVE/AccessControl.pm at 25dd375 (the last commit before 2025-04-10, the 8.4 line):
# $privgroups and 'Permissions.Modify'.
VALID_PRIVS = {
    "VM.Config.Disk", "VM.Config.CPU", "VM.Config.Memory", "VM.Config.Network", "VM.Config.HWType",
    "VM.Config.Options", "VM.Allocate", "VM.Clone", "VM.Migrate", "VM.Monitor", "VM.Snapshot",
    "VM.Snapshot.Rollback", "VM.Config.CDROM", "VM.Config.Cloudinit", "VM.Console", "VM.Backup", "VM.PowerMgmt",
    "VM.Audit", "Sys.PowerMgmt", "Sys.Modify", "Sys.Incoming", "Sys.AccessNetwork", "Sys.Console", "Sys.Syslog",
    "Sys.Audit", "Datastore.Allocate", "Datastore.AllocateTemplate", "Datastore.AllocateSpace", "Datastore.Audit",
    "SDN.Allocate", "SDN.Audit", "SDN.Use", "Realm.Allocate", "User.Modify", "Group.Allocate", "Realm.AllocateUser",
    "Pool.Allocate", "Pool.Audit", "Mapping.Modify", "Mapping.Use", "Mapping.Audit", "Permissions.Modify",
}
# pve-storage src/PVE/Storage/DirPlugin.pm plugindata (dir includes all other types) and Plugin.pm verify_content
DIR_CONTENT = {"images", "rootdir", "vztmpl", "iso", "backup", "snippets", "none", "import"}


def _priv(v):
    if v not in VALID_PRIVS:
        _die(f"invalid privilege '{v}'")


def _content(v):
    if v != "import" and v not in DIR_CONTENT:
        _die(f"invalid content type '{v}'")


def _disk_size(v):
    if parse_size(v) is None:
        _die(f"value does not look like a valid disk size: {v}")


FORMATS = {
    "pve-configid": (_regex_format(rf"^{CONFIGID_RE}$", lambda v: f"invalid configuration ID '{v}'"),
                     "pve-common JSONSchema.pm pve_verify_configid"),
    "pve-storage-id": (_parse_id("storage"), "pve-common JSONSchema.pm parse_storage_id/parse_id"),
    "pve-vmid": (_regex_format(r"^[1-9][0-9]{2,8}$", "value does not look like a valid VM ID"),
                 "pve-common JSONSchema.pm pve_verify_vmid"),
    "pve-node": (_regex_format(r"^([a-zA-Z0-9]([a-zA-Z0-9\-]*[a-zA-Z0-9])?)$",
                               "value does not look like a valid node name"),
                 "pve-common JSONSchema.pm pve_verify_node_name"),
    "mac-addr": (_regex_format(r"(?i)^[a-f0-9][02468ace](?::[a-f0-9]{2}){5}$",
                               "value does not look like a valid unicast MAC address"),
                 "pve-common JSONSchema.pm pve_verify_mac_addr"),
    "ipv4": (_regex_format(rf"^(?:{IPV4RE})$", "value does not look like a valid IPv4 address"),
             "pve-common JSONSchema.pm pve_verify_ipv4"),
    "ipv6": (_regex_format(rf"^(?:{IPV6RE})$", "value does not look like a valid IPv6 address"),
             "pve-common JSONSchema.pm pve_verify_ipv6"),
    "pve-ipv4-config": (lambda v: None if (_m(r"^(?:dhcp|manual)$", v) or _cidr(v, IPV4RE, 32))
                        else _die("value does not look like a valid ipv4 network configuration"),
                        "pve-common JSONSchema.pm pve_verify_ipv4_config, pve_verify_cidrv4"),
    "pve-ipv6-config": (lambda v: None if (_m(r"^(?:auto|dhcp|manual)$", v) or _cidr(v, IPV6RE, 128))
                        else _die("value does not look like a valid ipv6 network configuration"),
                        "pve-common JSONSchema.pm pve_verify_ipv6_config, pve_verify_cidrv6"),
    "dns-name": (_regex_format(r"^(([a-zA-Z0-9]([a-zA-Z0-9\-]*[a-zA-Z0-9])?)\.)*([a-zA-Z0-9]([a-zA-Z0-9\-]*[a-zA-Z0-9])?)$",
                               "value does not look like a valid DNS name"),
                 "pve-common JSONSchema.pm pve_verify_dns_name"),
    "disk-size": (_disk_size, "pve-common JSONSchema.pm pve_verify_disk_size, parse_size"),
    "pve-startup-order": (_startup_order, "pve-common JSONSchema.pm pve_verify_startup_order, pve_parse_startup_order"),
    "pve-tag": (_regex_format(r"(?i)^[a-z0-9_][a-z0-9_\-+.]*$", "invalid characters in tag"),
                "pve-common JSONSchema.pm pve_verify_tag ($PVE_TAG_RE)"),
    "pve-task-status-type": (_regex_format(r"(?i)^(ok|error|warning|unknown)$", lambda v: f"invalid status '{v}'"),
                             "pve-common JSONSchema.pm verify_task_status_type"),
    "lxc-ip-with-ll-iface": (_ip_with_ll_iface, "pve-container src/PVE/LXC/Config.pm verify_ip_with_ll_iface"),
    "pve-ct-timezone": (_ct_timezone, "pve-container src/PVE/LXC/Config.pm verify_ct_timezone, "
                                      "pve-common pve_verify_timezone"),
    "pve-lxc-mp-string": (_mp_string, "pve-container src/PVE/LXC/Config.pm verify_lxc_mp_string"),
    "pve-lxc-dev-string": (_dev_string, "pve-container src/PVE/LXC/Config.pm verify_lxc_dev_string"),
    "pve-volume-id": (_regex_format(r"(?i)^([a-z][a-z0-9\-_.]*[a-z0-9]):(.+)$",
                                    lambda v: f"unable to parse volume ID '{v}'"),
                      "pve-storage src/PVE/Storage/Plugin.pm parse_volume_id"),
    "pve-storage-content": (_content, "pve-storage src/PVE/Storage/Plugin.pm verify_content"),
    "pve-poolid": (_poolid, "pve-access-control src/PVE/AccessControl.pm verify_poolname"),
    "pve-priv": (_priv, "pve-access-control src/PVE/AccessControl.pm verify_privname"),
    "pve-realm": (_regex_format(r"^[A-Za-z][A-Za-z0-9.\-_]+$", "value does not look like a valid realm"),
                  "pve-access-control src/PVE/Auth/Plugin.pm pve_verify_realm"),
}


def check_format(fmt, value: str, path: str):
    """JSONSchema.pm check_format: a hash is a property string; `<name>-list` splits (empty allowed),
    `<name>-opt` checks a non-empty value."""
    if isinstance(fmt, dict):
        return parse_property_string(fmt, value, path)
    if fmt == "regex":
        return None
    m = re.match(r"^(.*?)(?:-(list|opt))?$", fmt)
    name, kind = m.group(1), m.group(2) or "none"
    verifier = FORMATS.get(name)
    if verifier is None:
        raise _Die(f"undefined format '{fmt}'\n")
    check = verifier[0]
    if kind == "list":
        for v in split_list(value):
            check(v)
    elif kind == "opt":
        if value:
            check(value)
    else:
        check(value)
    return None


def parse_property_string(fmt: dict, data: str, path: str) -> dict:
    """JSONSchema.pm parse_property_string (additional properties not allowed)."""
    res: dict = {}
    default_key = None
    for part in str(data).split(","):
        if _m(r"^\s*$", part):
            continue
        m = re.search(r"^([^=]+)=(.+)$", part)  # Perl's `.` does not match "\n": neither does Python's
        if m:
            k, v = m.group(1), m.group(2)
            if k in res:
                raise _Die(f"duplicate key in comma-separated list property: {k}\n")
            schema = fmt.get(k)
            if not schema:
                raise _Die(f"invalid key in comma-separated list property: {k}\n")
            if schema.get("type") == "boolean":
                v = parse_boolean(v) or v
            res[k] = v
        elif "=" not in part:
            if default_key:
                raise _Die(f"duplicate key in comma-separated list property: {default_key}\n")
            for key, sub in fmt.items():
                if sub.get("default_key"):
                    default_key = key
                    if not res.get(key):
                        if sub.get("type") == "boolean":
                            part = parse_boolean(part) or part
                        res[key] = part
                        break
                    raise _Die(f"duplicate key in comma-separated list property: {default_key}\n")
            if not default_key:
                raise _Die("value without key, but schema does not define a default key\n")
        else:
            raise _Die("missing key in comma-separated list property\n")
    errors: dict = {}
    check_object(path, fmt, res, 0, errors)
    if errors:
        # PVE::Exception "format error\n" with errors, stringified as the message plus "<key>: <error>\n" each
        raise _Die("format error\n" + "".join(f"{k}: {v}\n" for k, v in errors.items()))
    return res


def add_error(errors: dict, path: str, msg: str) -> None:
    path = path or "_root"
    errors[path] = f"{errors[path]}\\n{msg}" if path in errors else msg


def _perl_ref(value) -> str | None:
    """What Perl's ref() gives for a decoded JSON value (None for a plain scalar)."""
    if isinstance(value, bool):
        return "JSON::PP::Boolean"
    if isinstance(value, dict):
        return "HASH"
    if isinstance(value, list):
        return "ARRAY"
    return None


def _scalar(value) -> str:
    """A decoded JSON number or string as Perl would stringify it."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return str(value)


def check_type(path: str, typ, value, errors: dict) -> bool:
    if not typ or typ == "any":
        return True
    if value is None:
        return typ == "null"
    if typ == "null":
        add_error(errors, path, f"type check ('{typ}') failed - value is not null")
        return False
    vt = _perl_ref(value)
    if typ in ("array", "object"):
        if vt != ("ARRAY" if typ == "array" else "HASH"):
            add_error(errors, path, f"type check ('{typ}') failed")
            return False
        return True
    if vt:
        if typ == "boolean" and vt == "JSON::PP::Boolean":
            return True
        add_error(errors, path, f"type check ('{typ}') failed - got {vt}")
        return False
    s = _scalar(value)
    if typ == "boolean":
        if s in ("1", "0"):
            return True
        add_error(errors, path, f"type check ('{typ}') failed - got '{s}'")
        return False
    if typ == "integer" and not is_integer(s) or typ == "number" and not is_number(s):
        add_error(errors, path, f"type check ('{typ}') failed - got '{s}'")
        return False
    return True


UNSUPPORTED = ("alias", "oneOf", "allOf", "type-property", "instance-types")


def check_prop(value, schema: dict, path: str, errors: dict) -> None:
    for key in UNSUPPORTED:
        if key in schema:  # none in the slice (a test checks); never pass such a schema silently
            raise NotImplementedError(f"lab: schema keyword '{key}' at {path}")
    if value is None:
        if schema.get("type") == "null":
            return
        if not schema.get("optional") and not schema.get("group"):
            add_error(errors, path, "property is missing and it is not optional")
        return
    if not check_type(path, schema.get("type"), value, errors):
        return
    vt = _perl_ref(value)
    if vt in ("ARRAY", "HASH"):
        if vt == "ARRAY":
            if isinstance(schema.get("items"), dict):
                for i, el in enumerate(value):
                    check_prop(el, schema["items"], f"{path}[{i}]", errors)
            return
        if schema.get("properties") or schema.get("additionalProperties"):
            check_object(path, schema.get("properties") or {}, value, schema.get("additionalProperties"), errors)
        return
    s = "1" if value is True else "0" if value is False else _scalar(value)
    fmt = schema.get("format")
    if fmt:
        try:
            check_format(fmt, s, path)
        except _Die as e:
            add_error(errors, path, f"invalid format - {e}")
            return
    pattern = schema.get("pattern")
    if pattern and not re.search(f"^{perl_pattern(pattern)}$", s):
        add_error(errors, path, "value does not match the regex pattern")
        return
    if schema.get("maxLength") is not None and len(s) > int(schema["maxLength"]):
        add_error(errors, path, f"value may only be {schema['maxLength']} characters long")
        return
    if schema.get("minLength") is not None and len(s) < int(schema["minLength"]):
        add_error(errors, path, f"value must be at least {schema['minLength']} characters long")
        return
    if is_number(s):
        if schema.get("maximum") is not None and float(s) > float(schema["maximum"]):
            add_error(errors, path, f"value must have a maximum value of {schema['maximum']}")
            return
        if schema.get("minimum") is not None and float(s) < float(schema["minimum"]):
            add_error(errors, path, f"value must have a minimum value of {schema['minimum']}")
            return
    if schema.get("enum") and s not in [str(e) for e in schema["enum"]]:
        add_error(errors, path, f"value '{s}' does not have a value in the enumeration '{', '.join(map(str, schema['enum']))}'")


def check_object(path: str, schema: dict, value: dict, additional, errors: dict) -> None:
    for k, sub in schema.items():
        check_prop(value.get(k), sub, f"{path}.{k}" if path else k, errors)
    for k in value:
        newpath = f"{path}.{k}" if path else k
        sub = schema.get(k)
        if sub:
            req = sub.get("requires")
            if isinstance(req, dict):
                check_prop(value, req, path, errors)
            elif req and value.get(req) is None:
                add_error(errors, f"{path}.{req}" if path else req, f"missing property required by '{newpath}'")
            continue
        if additional is not None and not additional:
            add_error(errors, newpath, SCHEMA_ERROR)
            continue
        if isinstance(additional, dict):
            check_prop(value[k], additional, newpath, errors)


# ---- the lab's methods -----------------------------------------------------------------------------------

def expand_indexed(properties: dict) -> dict:
    """apidata.js's `net[n]` as the schema really has it: net0 .. net31 (INDEXED_MAX)."""
    out = {}
    for key, sub in properties.items():
        m = re.fullmatch(r"([a-z]+)\[n\]", key)
        if m:
            if m.group(1) not in INDEXED_MAX:
                raise NotImplementedError(f"lab: no count known for '{key}'")
            for i in range(INDEXED_MAX[m.group(1)]):
                out[f"{m.group(1)}{i}"] = sub
        else:
            out[key] = sub
    return out


class Method:
    def __init__(self, key: str, info: dict):
        self.key = key
        self.http, self.path = key.split(" ", 1)
        self.info = info
        params = info.get("parameters") or {}
        self.properties = expand_indexed(params.get("properties") or {})
        self.additional = params.get("additionalProperties")
        # RESTHandler: a `{name}` path component matches [^/]+ and is a parameter of the call
        self.regex = re.compile("^" + re.sub(r"\\\{([a-z\-]+)\\\}", r"(?P<\1>[^/]+)", re.escape(self.path)) + "$")

    def defaults(self) -> dict:
        return {k: v.get("default") for k, v in self.properties.items() if "default" in v}


METHODS = {key: Method(key, info) for key, info in SLICE["methods"].items()}


def _load_profile(path: str) -> dict:
    with open(path) as f:
        data = json.load(f)
    return {"commit": data["commit"], "methods": {k: Method(k, i) for k, i in data["methods"].items()}}


PROFILES = {name: _load_profile(path) for name, path in PROFILE_FILES.items()}


def profile_errors(profile: str, key: str, params: dict) -> dict | None:
    """What release `profile`'s schema says of a request the lab's own schema took: None when that release has
    the method and takes the parameters, else {parameter: error} as its JSONSchema.pm validate gives them
    ({"": "no such method"} when the release lacks the method)."""
    method = PROFILES[profile]["methods"].get(key)
    if method is None:
        return {"": f"no method {key} in the {profile} schema"}
    errors: dict = {}
    check_object("", method.properties, params, method.additional, errors)
    return errors or None


def find(http: str, rel: str):
    """(Method, uri parameters) for a request path below /api2/json, or (None, {}) when the lab has no such
    method (pve-http-server: 501 `Method '<M> <path>' not implemented`)."""
    for m in METHODS.values():
        if m.http != http:
            continue
        match = m.regex.match(rel)
        if match:
            return m, {k: urllib_unquote(v) for k, v in match.groupdict().items()}
    return None, {}


def urllib_unquote(v: str) -> str:
    from urllib.parse import unquote
    return unquote(v)


def plain(value) -> str:
    """A validated parameter value as the handlers read it (PVE's untainted scalar): JSON booleans as 1/0."""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, (dict, list)):
        return json.dumps(value)
    return _scalar(value)


def is_default(schema: dict, value) -> bool:
    """Whether a (validated) value is the parameter's schema default; a boolean without one defaults to 0."""
    typ = schema.get("type")
    if "default" in schema:
        default = schema["default"]
    elif typ == "boolean":
        default = 0
    else:
        return False
    v, d = plain(value), plain(default)
    if typ in ("integer", "number", "boolean") and is_number(v) and is_number(d):
        return float(v) == float(d)
    return v == d


def check_keys(properties: dict, params: dict, errors: dict) -> None:
    """check_object on the given keys only (no missing-property errors): what `pct set`/`pct create` pass
    to the backend without the path parameters."""
    check_object("", {k: v for k, v in properties.items() if k in params}, params, 0, errors)


def validate(method: Method, params: dict) -> None:
    """JSONSchema.pm validate($param, $info->{parameters}): raises SchemaError (400) with the errors."""
    errors: dict = {}
    check_object("", method.properties, params, method.additional, errors)
    if errors:
        raise SchemaError(errors)


def method_info(key: str) -> Method:
    return METHODS[key]


def formats_used() -> set:
    used = set()

    def scan(schema):
        fmt = schema.get("format")
        if isinstance(fmt, str):
            used.add(re.match(r"^(.*?)(?:-(list|opt))?$", fmt).group(1))
        elif isinstance(fmt, dict):
            for sub in fmt.values():
                scan(sub)

    for methods in [METHODS] + [p["methods"] for p in PROFILES.values()]:
        for m in methods.values():
            for sub in m.properties.values():
                scan(sub)
    return used


FORMATS_MISSING = sorted(formats_used() - set(FORMATS) - {"regex"})
if FORMATS_MISSING:
    raise ImportError(f"lab: formats of the schema slice without a verifier: {FORMATS_MISSING}")
