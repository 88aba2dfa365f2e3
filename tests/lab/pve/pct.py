"""`pct` of the simulated PVE node (installed as /usr/sbin/pct by labctl). Same backend as the API.

The CLI environment acts as root@pam (pve-common RESTEnvironment setup_default_cli_env). Task commands
run the task in the foreground and exit 0 on success, 255 on task error (proxmox-lxc.md §2, "Exit codes").
"""
from __future__ import annotations

import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))
import pvelab as pve  # noqa: E402
from pvelab import PVEError  # noqa: E402

USER = "root@pam"
CMDS = ("exec", "enter", "start", "stop", "shutdown", "reboot", "status", "config", "set", "unlock", "list",
        "create", "destroy", "help")


def die(msg: str, code: int = 255) -> "None":
    sys.stderr.write(msg.rstrip("\n") + "\n")
    sys.exit(code)


def parse_args(args: list[str]) -> tuple[list[str], dict]:
    """Getopt::Long style as PVE's CLIHandler: -opt val, --opt val, --opt=val; repeated -delete joins."""
    pos, opts = [], {}
    i = 0
    while i < len(args):
        a = args[i]
        if a.startswith("-") and len(a) > 1 and not re.fullmatch(r"-\d+", a):
            key = a.lstrip("-")
            if "=" in key:
                key, val = key.split("=", 1)
            elif i + 1 < len(args):
                val = args[i + 1]
                i += 1
            else:
                val = "1"
            opts[key] = val if key not in opts else f"{opts[key]},{val}"
        else:
            pos.append(a)
        i += 1
    return pos, opts


def need_vmid(pos: list[str], cmd: str) -> int:
    if not pos:
        die(f"400 not enough arguments\npct {cmd} <vmid>", 255)
    if not re.fullmatch(r"\d+", pos[0]):
        die(f"400 Parameter verification failed.\nvmid: type check ('integer') failed - got '{pos[0]}'", 255)
    return int(pos[0])


def run_fg(ttype: str, vmid: int, func, *args) -> int:
    task = pve.Task(ttype, vmid, USER, echo=True)
    return 0 if pve.run_task(task, func, *args) else 255


def bool_opt(opts: dict, key: str) -> bool:
    return str(opts.get(key, "0")).lower() in ("1", "true", "yes")


def cmd_exec(argv: list[str]) -> int:
    # pct exec <vmid> [--keep-env 0|1] -- cmd args...
    if "--" in argv:
        idx = argv.index("--")
        head, command = argv[:idx], argv[idx + 1:]
    else:
        head, command = argv[:1], argv[1:]
    pos, opts = parse_args(head)
    vmid = need_vmid(pos, "exec")
    pve.load_config(vmid)
    if not pve.is_running(vmid):
        die(f"container '{vmid}' not running!")
    if not command:
        die("missing command")
    keep = str(opts.get("keep-env", "1")) not in ("0", "false")
    env = dict(os.environ)
    env.pop("SSL_CERT_FILE", None)
    env.pop("SSL_CERT_DIR", None)
    env["PATH"] = pve.CLI_PATH  # pve-common run_cli_handler; keep-env carries it into the CT
    lxc = ["lxc-attach", "-n", str(vmid), "--keep-env" if keep else "--clear-env", "--"]
    os.execvpe("lxc-attach", lxc + command, env)
    return 1


def cmd_status(pos, opts) -> int:
    vmid = need_vmid(pos, "status")
    st = pve.vm_status(vmid)
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
    conf = pve.load_config(vmid)
    conf.pop("digest", None)
    conf.pop("_rest", None)
    text = pve.format_conf(conf)
    sys.stdout.write(text)
    return 0


def cmd_list(pos, opts) -> int:
    rows = [pve.vm_status(v) for v in pve.list_cts()]
    if rows:
        print("%-10s %-10s %-12s %-20s" % ("VMID", "Status", "Lock", "Name"))
    for r in rows:
        print("%-10s %-10s %-12s %-20s" % (r["vmid"], r["status"], r.get("lock", ""), r["name"]))
    return 0


def main(argv: list[str]) -> int:
    os.environ["PATH"] = pve.CLI_PATH
    if not argv or argv[0] in ("help", "-h", "--help"):
        print("USAGE: pct <COMMAND> [ARGS] [OPTIONS]\n  commands: " + " ".join(CMDS))
        return 0 if argv else 255
    cmd, rest = argv[0], argv[1:]
    if cmd not in CMDS:
        die(f"unknown command 'pct {cmd}'")
    if os.geteuid() != 0:
        die("only root can run pct")
    try:
        if cmd == "exec":
            return cmd_exec(rest)
        pos, opts = parse_args(rest)
        if cmd == "list":
            return cmd_list(pos, opts)
        vmid = need_vmid(pos, cmd)
        if cmd == "enter":
            pve.load_config(vmid)
            if not pve.is_running(vmid):
                die(f"container '{vmid}' not running!")
            os.execvp("lxc-attach", ["lxc-attach", "-n", str(vmid), "--keep-env"])
        if cmd == "status":
            return cmd_status(pos, opts)
        if cmd == "config":
            return cmd_config(pos, opts)
        if cmd == "unlock":
            pve.unlock(vmid)
            return 0
        if cmd == "set":
            pve.update_config(vmid, opts, USER)
            return 0
        if cmd == "create":
            if len(pos) < 2:
                die("400 not enough arguments\npct create <vmid> <ostemplate> [OPTIONS]")
            opts["ostemplate"] = pos[1]
            ttype, tid, func, args = pve.create_ct(vmid, opts, USER)
            return run_fg(ttype, tid, pve.TASK_FUNCS[func], *args)
        pve.load_config(vmid)
        if cmd == "start":
            return run_fg("vzstart", vmid, pve.do_start, vmid, bool_opt(opts, "skiplock"))
        if cmd == "stop":
            return run_fg("vzstop", vmid, pve.do_stop, vmid, bool_opt(opts, "skiplock"))
        if cmd == "shutdown":
            return run_fg("vzshutdown", vmid, pve.do_shutdown, vmid, int(opts.get("timeout", 60)),
                          bool_opt(opts, "forceStop"))
        if cmd == "reboot":
            return run_fg("vzreboot", vmid, pve.do_reboot, vmid, opts.get("timeout"))
        if cmd == "destroy":
            return run_fg("vzdestroy", vmid, pve.do_destroy, vmid, bool_opt(opts, "purge"),
                          bool_opt(opts, "force"))
    except PVEError as e:
        if e.errors:
            die(f"{e.code} {e.msg}\n" + "\n".join(f"{k}: {v}" for k, v in sorted(e.errors.items())))
        die(e.msg)
    return 255


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
