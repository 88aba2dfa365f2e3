"""`pct` of the simulated PVE node (installed as /usr/sbin/pct by labctl). Same backend as the API.

The CLI environment acts as root@pam (pve-common RESTEnvironment setup_default_cli_env). Task commands
run the task in the foreground and exit 0 on success, 255 on task error (proxmox-lxc.md §2, "Exit codes").
"""
from __future__ import annotations

import os
import re
import sys

from pve import apischema, ctapi, ctconfig, ctoptions, ctstate, pvenode, pvetasks, taskops
from pve.pvenode import PVEError

USER = "root@pam"
CMDS = ("exec", "enter", "start", "stop", "shutdown", "reboot", "status", "config", "set", "unlock", "list",
        "create", "destroy", "pending", "help")
# positional arguments of each command (pct.pm $cmddef arg_param)
POSITIONAL = {"list": 0, "create": 2}


def die(msg: str, code: int = 255) -> "None":
    sys.stderr.write(msg.rstrip("\n") + "\n")
    sys.exit(code)


# The options of each `pct` command: the parameters of the API method it maps to in pve-container
# src/PVE/CLI/pct.pm ($cmddef), minus the fixed `node` and the positional arguments (vmid, ostemplate).
# "bool": Getopt `:s` (value optional); "value": `=s`; "list": `=s@` (repeatable, joined with commas);
# NOT_SIMULATED: PVE has the option but the lab does not simulate it, so it is refused, never ignored.
NOT_SIMULATED = "not simulated"
_CONFIG = "config"  # every config option of pct.conf(5) the lab knows (ctoptions.option_checker)
CREATE_EXTRA = {"password": "value", "ssh-public-keys": "value", "start": "bool", "storage": "value",
                "force": NOT_SIMULATED, "restore": NOT_SIMULATED, "unique": NOT_SIMULATED,
                "pool": NOT_SIMULATED, "ignore-unpack-errors": NOT_SIMULATED, "bwlimit": NOT_SIMULATED,
                "ha-managed": NOT_SIMULATED}  # PVE 9's create_vm; the lab has no HA
SCHEMAS = {
    "exec": {"keep-env": "bool"},                                   # pct.pm exec
    "enter": {"keep-env": "bool"},                                  # pct.pm enter
    "status": {"verbose": "bool"},                                  # pct.pm status
    "config": {"current": "bool", "snapshot": NOT_SIMULATED},       # API2/LXC/Config.pm vm_config
    "list": {},                                                     # API2/LXC.pm vmlist
    "unlock": {},                                                   # pct.pm unlock
    "start": {"skiplock": "bool", "debug": NOT_SIMULATED},          # API2/LXC/Status.pm vm_start
    "stop": {"skiplock": "bool", "overrule-shutdown": NOT_SIMULATED},  # Status.pm vm_stop
    "shutdown": {"timeout": "value", "forceStop": "bool"},          # Status.pm vm_shutdown
    "reboot": {"timeout": "value"},                                 # Status.pm vm_reboot
    "destroy": {"force": "bool", "purge": "bool", "destroy-unreferenced-disks": NOT_SIMULATED},  # destroy_vm
    "set": {_CONFIG: "value", "delete": "list", "revert": "list", "digest": "value"},  # Config.pm update_vm
    "create": {_CONFIG: "value", **CREATE_EXTRA},                   # API2/LXC.pm create_vm
    "pending": {},                                                  # API2/LXC.pm vm_pending
}


# The API method of each command with options in PVE's schema (apidata-slice.json): a not-simulated option is
# accepted at its schema default (then dropped), and boolean options are read as JSONSchema::get_options does.
CMD_METHOD = {
    "config": "GET /nodes/{node}/lxc/{vmid}/config",
    "start": "POST /nodes/{node}/lxc/{vmid}/status/start",
    "stop": "POST /nodes/{node}/lxc/{vmid}/status/stop",
    "destroy": "DELETE /nodes/{node}/lxc/{vmid}",
    "set": "PUT /nodes/{node}/lxc/{vmid}/config",
    "create": "POST /nodes/{node}/lxc",
}


class OptionError(Exception):
    """An option Getopt::Long does not know: it warns `Unknown option: <name>` and PVE's
    JSONSchema::get_options raises `400 unable to parse option`."""

    def __init__(self, warnings: list[str], msg: str = "unable to parse option"):
        super().__init__(msg)
        self.warnings = warnings
        self.msg = msg


def option_kind(schema: dict, name: str):
    if name in schema:
        return schema[name]
    if _CONFIG in schema and name not in ("lxc",) and ctoptions.option_checker(name) is not None:
        return schema[_CONFIG]
    return None


def parse_args(args: list[str], schema: dict | None = None) -> tuple[list[str], dict]:
    """Getopt::Long as PVE's JSONSchema::get_options configures it (prefix `-` or `--`, `--opt=v`);
    an option not in the command's schema is `Unknown option: <name>`, and the call fails with
    `400 unable to parse option` (exit 255). Options PVE has but the lab does not simulate are refused
    with the lab's own message. Without a schema every option is taken (internal use only)."""
    pos, opts, unknown, refused = [], {}, [], []
    method = apischema.METHODS.get(CMD_METHOD.get(cmd_of(schema), ""))
    i = 0
    while i < len(args):
        a = args[i]
        if a == "--":
            pos.extend(args[i + 1:])
            break
        if a.startswith("-") and len(a) > 1 and not re.fullmatch(r"-\d+", a):
            key = a[2:] if a.startswith("--") else a[1:]
            val = None
            if "=" in key:
                key, val = key.split("=", 1)
            kind = "value" if schema is None else option_kind(schema, key)
            if kind is None:
                unknown.append(f"Unknown option: {key}")
                i += 1
                continue
            if kind == NOT_SIMULATED:
                refused.append(key)
                kind = "bool" if (method and method.properties[key].get("type") == "boolean") else "value"
            if val is None:
                nxt = args[i + 1] if i + 1 < len(args) else None
                # `=s` takes the next argument; `:s` (booleans) only when it does not look like an option
                takes_next = nxt is not None and (kind != "bool" or not (nxt.startswith("-") and len(nxt) > 1))
                if takes_next:
                    val = nxt
                    i += 1
                elif kind == "bool":
                    val = "1"
                else:
                    unknown.append(f"Option {key} requires an argument")
                    i += 1
                    continue
            if kind == "list" and key in opts:
                opts[key] = f"{opts[key]},{val}"
            else:
                opts[key] = val
        else:
            pos.append(a)
        i += 1
    if unknown:
        raise OptionError(unknown)
    for key in refused:
        if method is not None and apischema.is_default(method.properties[key], opts[key]):
            del opts[key]
        else:
            raise OptionError([], "lab: option(s) not simulated by the lab: " + ", ".join(f"--{k}" for k in refused))
    if method is not None:
        for key, val in opts.items():
            # pve-common JSONSchema.pm get_options: a boolean option's value goes through parse_boolean,
            # else `400 unable to parse boolean option`
            if (method.properties.get(key) or {}).get("type") == "boolean":
                b = apischema.parse_boolean(str(val))
                if b is None:
                    raise OptionError([], "unable to parse boolean option")
                opts[key] = b
    return pos, opts


def cmd_of(schema) -> str | None:
    return next((c for c, sch in SCHEMAS.items() if sch is schema), None)


def need_vmid(pos: list[str], cmd: str) -> int:
    if not pos:
        die(f"400 not enough arguments\npct {cmd} <vmid>", 255)
    if not re.fullmatch(r"\d+", pos[0]):
        die(f"400 Parameter verification failed.\nvmid: type check ('integer') failed - got '{pos[0]}'", 255)
    return int(pos[0])


def run_fg(ttype: str, vmid: int, func, *args) -> int:
    task = pvetasks.Task(ttype, vmid, USER, echo=True)
    return 0 if pvetasks.run_task(task, func, *args) else 255


def bool_opt(opts: dict, key: str) -> bool:
    return str(opts.get(key, "0")).lower() in ("1", "true", "yes")


def cmd_exec(argv: list[str]) -> int:
    # pct exec <vmid> [--keep-env 0|1] -- cmd args...
    if "--" in argv:
        idx = argv.index("--")
        head, command = argv[:idx], argv[idx + 1:]
    else:
        head, command = argv[:1], argv[1:]
    pos, opts = parse_args(head, SCHEMAS["exec"])
    vmid = need_vmid(pos, "exec")
    ctconfig.load_config(vmid)
    if not ctstate.is_running(vmid):
        die(f"container '{vmid}' not running!")
    if not command:
        die("missing command")
    keep = str(opts.get("keep-env", "1")) not in ("0", "false")
    env = dict(os.environ)
    env.pop("SSL_CERT_FILE", None)
    env.pop("SSL_CERT_DIR", None)
    env["PATH"] = pvenode.CLI_PATH  # pve-common run_cli_handler; keep-env carries it into the CT
    lxc = ["lxc-attach", "-n", str(vmid), "--keep-env" if keep else "--clear-env", "--"]
    os.execvpe("lxc-attach", lxc + command, env)
    return 1


def cmd_status(pos, opts) -> int:
    vmid = need_vmid(pos, "status")
    st = ctstate.vm_status(vmid)
    if bool_opt(opts, "verbose"):
        for k in sorted(st):
            v = st[k]
            if isinstance(v, dict):
                v = ",".join(f"{a}={b}" for a, b in v.items())
            print(f"{k}: {v}")
    else:
        print(f"status: {st['status']}")
    return 0


def cmd_config(pos, opts) -> int:
    vmid = need_vmid(pos, "config")
    conf = ctconfig.load_config(vmid)
    conf.pop("digest", None)
    conf.pop("_rest", None)
    env = conf.pop("env", None)
    text = ctconfig.format_conf(conf)
    if env is not None:
        # pct.pm `config` prints vm_config's keys sorted as "key: value", so PVE 9's env is one line with its
        # NUL separators (the file holds lxc.environment.runtime lines instead)
        lines = text.splitlines(keepends=True)
        at = next((i for i, ln in enumerate(lines) if not ln.startswith("#") and ln.split(":")[0] > "env"),
                  len(lines))
        lines.insert(at, f"env: {env}\n")
        text = "".join(lines)
    sys.stdout.write(text)
    return 0


def cmd_list(pos, opts) -> int:
    rows = [ctstate.vm_status(v) for v in ctstate.list_cts()]
    if rows:
        print("%-10s %-10s %-12s %-20s" % ("VMID", "Status", "Lock", "Name"))
    for r in rows:
        print("%-10s %-10s %-12s %-20s" % (r["vmid"], r["status"], r.get("lock", ""), r["name"]))
    return 0


def usage_error(cmd: str, msg: str, warnings=()) -> "None":
    """A parameter error as PVE's CLI prints it: Getopt's warnings, `400 <msg>`, the short usage; exit 255."""
    for w in warnings:
        sys.stderr.write(w + "\n")
    die(f"400 {msg}\npct {cmd} <vmid> [OPTIONS]" if cmd not in ("list",) else f"400 {msg}\npct {cmd}")


def check_positional(cmd: str, pos: list[str]) -> None:
    if len(pos) > POSITIONAL.get(cmd, 1):
        usage_error(cmd, "too many arguments")


def cmd_pending(pos, opts) -> int:
    """PVE::GuestHelpers::format_pending over the /pending array."""
    vmid = need_vmid(pos, "pending")
    for item in sorted(ctapi.get_pending(vmid), key=lambda i: i["key"]):
        k, v, pnd = item["key"], item.get("value"), item.get("pending")
        if k == "digest":
            continue
        if v is not None:
            if item.get("delete"):
                print(f"del {k}: {v}")
            elif pnd is not None:
                print(f"cur {k}: {v}\nnew {k}: {pnd}")
            else:
                print(f"cur {k}: {v}")
        elif pnd is not None:
            print(f"new {k}: {pnd}")
    return 0


def main(argv: list[str]) -> int:
    os.environ["PATH"] = pvenode.CLI_PATH
    if not argv or argv[0] in ("help", "-h", "--help"):
        print("USAGE: pct <COMMAND> [ARGS] [OPTIONS]\n  commands: " + " ".join(CMDS))
        return 0 if argv else 255
    cmd, rest = argv[0], argv[1:]
    if cmd not in CMDS:
        # PVE::CLIHandler $abort: print_usage_short to stderr, exit(-1)
        die(f"ERROR: unknown command 'pct {cmd}'\nUSAGE: pct <COMMAND> [ARGS] [OPTIONS]")
    if os.geteuid() != 0:
        die("only root can run pct")
    if pvenode.NODE != "pve1":  # pve2's pct acts in pve2's mount namespace (its /dev/nvidia*), as its sessions do
        from pve import nodens
        nodens.enter(pvenode.NODE)
    try:
        if cmd == "exec":
            return cmd_exec(rest)
        pos, opts = parse_args(rest, SCHEMAS[cmd])
        check_positional(cmd, pos)
        if cmd == "list":
            return cmd_list(pos, opts)
        vmid = need_vmid(pos, cmd)
        if cmd == "enter":
            ctconfig.load_config(vmid)
            if not ctstate.is_running(vmid):
                die(f"container '{vmid}' not running!")
            keep = str(opts.get("keep-env", "1")) not in ("0", "false")
            os.execvp("lxc-attach", ["lxc-attach", "-n", str(vmid), "--keep-env" if keep else "--clear-env"])
        if cmd == "status":
            return cmd_status(pos, opts)
        if cmd == "config":
            return cmd_config(pos, opts)
        if cmd == "pending":
            return cmd_pending(pos, opts)
        if cmd == "unlock":
            ctapi.unlock(vmid)
            return 0
        if cmd == "set":
            for warning in ctapi.update_config(vmid, opts, USER):
                sys.stderr.write(warning + "\n")
            return 0
        if cmd == "create":
            if len(pos) < 2:
                usage_error(cmd, "not enough arguments")
            opts["ostemplate"] = pos[1]
            ttype, tid, func, args = ctapi.create_ct(vmid, opts, USER)
            return run_fg(ttype, tid, taskops.TASK_FUNCS[func], *args)
        ctconfig.load_config(vmid)
        if cmd == "start":
            if ctstate.is_running(vmid):
                die(f"CT {vmid} already running")
            return run_fg("vzstart", vmid, taskops.do_start, vmid, bool_opt(opts, "skiplock"))
        if cmd in ("stop", "shutdown", "reboot") and not ctstate.is_running(vmid):
            die(f"CT {vmid} not running")  # vm_stop/vm_shutdown/vm_reboot check before forking the task
        if cmd == "stop":
            return run_fg("vzstop", vmid, taskops.do_stop, vmid, bool_opt(opts, "skiplock"))
        if cmd == "shutdown":
            timeout = opts.get("timeout", "60")
            if not re.fullmatch(r"\d+", str(timeout)):
                die(f"400 Parameter verification failed.\ntimeout: type check ('integer') failed - got '{timeout}'")
            return run_fg("vzshutdown", vmid, taskops.do_shutdown, vmid, int(timeout), bool_opt(opts, "forceStop"))
        if cmd == "reboot":
            timeout = opts.get("timeout")
            if timeout is not None and not re.fullmatch(r"\d+", str(timeout)):
                die(f"400 Parameter verification failed.\ntimeout: type check ('integer') failed - got '{timeout}'")
            return run_fg("vzreboot", vmid, taskops.do_reboot, vmid, timeout)
        if cmd == "destroy":
            return run_fg("vzdestroy", vmid, taskops.do_destroy, vmid, bool_opt(opts, "purge"),
                          bool_opt(opts, "force"))
    except OptionError as e:
        usage_error(cmd, e.msg, e.warnings)
    except PVEError as e:
        if e.errors:
            die(f"{e.code} {e.msg}\n" + "\n".join(f"{k}: {v}" for k, v in sorted(e.errors.items())))
        die(e.msg)
    return 255


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
