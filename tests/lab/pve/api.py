"""The simulated PVE node's REST API: https://127.0.0.1:8006/api2/json/... (stdlib only, Python >= 3.11).

Started by `labctl up` as a daemon: python3 tests/lab/pve/api.py --daemon. Secrets and TLS material live
under /var/lib/inferops-lab (see docs/lab.md, "PVE node").
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import re
import ssl
import sys
import time
import traceback
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pvelab as pve  # noqa: E402
from pvelab import PVEError  # noqa: E402

LAB = pve.LAB
PKI = f"{LAB}/pki"
SECRETS = f"{LAB}/secrets"
AUTHKEY = f"{SECRETS}/authkey"
TOKEN_CFG = f"{pve.PVE_ETC}/priv/token.cfg"
PIDFILE = f"{pve.RUN}/pve-api.pid"
LOGFILE = f"{LAB}/log/pve-api.log"
TICKET_LIFETIME = 7200  # PVE: tickets are valid for 2 hours


def read_secret(path: str) -> str:
    with open(path) as f:
        return f.read().strip()


def sign(data: str) -> str:
    key = read_secret(AUTHKEY).encode()
    return base64.b64encode(hmac.new(key, data.encode(), hashlib.sha256).digest()).decode()


def make_ticket(user: str) -> str:
    data = f"PVE:{user}:{int(time.time()):08X}"
    return f"{data}::{sign(data)}"


def verify_ticket(ticket: str) -> str | None:
    m = re.fullmatch(r"(PVE:([^:]+):([0-9A-F]{8}))::(.+)", ticket or "")
    if not m or not hmac.compare_digest(sign(m.group(1)), m.group(4)):
        return None
    if time.time() - int(m.group(3), 16) > TICKET_LIFETIME:
        return None
    return m.group(2)


def make_csrf(user: str) -> str:
    ts = f"{int(time.time()):08X}"
    return f"{ts}:{sign(f'{ts}:{user}')}"


def verify_csrf(token: str, user: str) -> bool:
    m = re.fullmatch(r"([0-9A-F]{8}):(.+)", token or "")
    return bool(m) and hmac.compare_digest(sign(f"{m.group(1)}:{user}"), m.group(2))


def token_secrets() -> dict:
    """/etc/pve/priv/token.cfg: '<user>@<realm>!<tokenid> <secret>' per line, as on PVE."""
    res = {}
    try:
        with open(TOKEN_CFG) as f:
            for line in f:
                parts = line.split()
                if len(parts) == 2:
                    res[parts[0]] = parts[1]
    except FileNotFoundError:
        pass
    return res


# Parameters of the status and destroy endpoints (pve-container src/PVE/API2/LXC/Status.pm, API2/LXC.pm);
# all have additionalProperties 0. The lab refuses the ones it does not simulate instead of ignoring them.
STATUS_PARAMS = {
    "start": {"skiplock": True, "debug": False},
    "stop": {"skiplock": True, "overrule-shutdown": False},
    "shutdown": {"timeout": True, "forceStop": True},
    "reboot": {"timeout": True},
}
DESTROY_PARAMS = {"force": True, "purge": True, "destroy-unreferenced-disks": False}
SCHEMA_ERROR = "property is not defined in schema and the schema does not allow additional properties"


def check_params(params: dict, schema: dict) -> None:
    """400 per unknown parameter, as PVE's JSON schema check; parameters PVE has but the lab does not
    simulate are refused too (lab wording), never ignored."""
    errors = {}
    for key in params:
        if key in ("node", "vmid"):
            continue
        if key not in schema:
            errors[key] = SCHEMA_ERROR
        elif not schema[key]:
            errors[key] = "not simulated by the lab"
    if errors:
        raise pve.param_error(errors)


class Handler(BaseHTTPRequestHandler):
    server_version = "pve-api-daemon/3.0"
    sys_version = ""
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):
        sys.stderr.write("%s [%s] %s\n" % (self.address_string(), self.log_date_time_string(), fmt % args))

    # -- response helpers ------------------------------------------------------------------
    def reply(self, code: int, data=None, message: str | None = None, errors: dict | None = None,
              cookie: str | None = None):
        body = {"data": data}
        if message is not None:
            body["message"] = message if message.endswith("\n") else message + "\n"
        if errors:
            body["errors"] = errors
        raw = json.dumps(body).encode()
        # PVE puts the error message into the HTTP status line (proxmoxer shows it as the reason).
        reason = None
        if message:
            reason = message.strip().replace("\n", " ").replace("\r", " ")
            if errors:
                reason += " (" + ", ".join(f"{k}: {v}" for k, v in sorted(errors.items())) + ")"
        self.send_response(code, reason)
        self.send_header("Content-Type", "application/json;charset=UTF-8")
        self.send_header("Content-Length", str(len(raw)))
        self.send_header("Cache-Control", "max-age=0")
        self.send_header("Pragma", "no-cache")
        if cookie:
            self.send_header("Set-Cookie", cookie)
        self.end_headers()
        self.wfile.write(raw)

    # -- request parsing -------------------------------------------------------------------
    def params(self) -> dict:
        url = urllib.parse.urlsplit(self.path)
        params = {}
        for k, v in urllib.parse.parse_qsl(url.query, keep_blank_values=True):
            params[k] = v
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            raw = self.rfile.read(length).decode()
            ctype = (self.headers.get("Content-Type") or "").split(";")[0].strip()
            if ctype == "application/json":
                body = json.loads(raw or "{}")
                params.update({k: (v if isinstance(v, str) else json.dumps(v) if isinstance(v, (dict, list))
                                   else str(int(v)) if isinstance(v, bool) else str(v)) for k, v in body.items()})
            else:
                for k, v in urllib.parse.parse_qsl(raw, keep_blank_values=True):
                    params[k] = v
        return params

    def authenticate(self, method: str) -> str:
        """Returns the authenticated user id (token id for tokens) or raises 401."""
        auth = self.headers.get("Authorization") or ""
        m = re.fullmatch(r"PVEAPIToken=?\s*([^!\s]+@[^!\s]+)!([A-Za-z][A-Za-z0-9.\-_]*)[=:](\S+)", auth.strip())
        if m:
            tokenid = f"{m.group(1)}!{m.group(2)}"
            secret = token_secrets().get(tokenid)
            if secret is None or not hmac.compare_digest(secret, m.group(3)):
                raise PVEError("authentication failure", 401)
            return tokenid  # the token id is the user (pve-manager HTTPServer.pm, proxmox-lxc.md §1.1)
        cookies = {}
        for part in (self.headers.get("Cookie") or "").split(";"):
            if "=" in part:
                k, v = part.strip().split("=", 1)
                cookies[k] = urllib.parse.unquote(v)
        user = verify_ticket(cookies.get("PVEAuthCookie", ""))
        if user is None:
            raise PVEError("No ticket", 401)
        if method != "GET" and not verify_csrf(self.headers.get("CSRFPreventionToken", ""), user):
            raise PVEError("Permission denied - invalid csrf token", 401)
        return user

    # -- dispatch --------------------------------------------------------------------------
    def do_GET(self):
        self.dispatch("GET")

    def do_POST(self):
        self.dispatch("POST")

    def do_PUT(self):
        self.dispatch("PUT")

    def do_DELETE(self):
        self.dispatch("DELETE")

    def dispatch(self, method: str):
        path = urllib.parse.urlsplit(self.path).path
        try:
            params = self.params()
            if not path.startswith("/api2/json/"):
                raise PVEError("Not Implemented", 501)
            rel = "/" + path[len("/api2/json/"):].strip("/")
            if rel == "/access/ticket" and method == "POST":
                return self.login(params)
            if rel == "/access/ticket" and method == "GET":
                return self.reply(200, None)
            user = self.authenticate(method)
            if not (user == "root@pam" or user.startswith("root@pam!")):
                raise PVEError("Permission check failed", 403)
            data = self.route(method, rel, params, user)
            self.reply(200, data)
        except PVEError as e:
            self.reply(e.code, None, e.msg, e.errors)
        except Exception as e:  # a lab bug: 500 with the text, traceback in the log
            traceback.print_exc()
            self.reply(500, None, f"lab internal error: {e}")

    def login(self, params: dict):
        username = params.get("username", "")
        realm = params.get("realm")
        if realm and "@" not in username:
            username = f"{username}@{realm}"
        try:
            password = read_secret(f"{SECRETS}/root-password")
        except OSError:
            password = None
        if username != "root@pam" or password is None or not hmac.compare_digest(params.get("password", ""), password):
            time.sleep(1)  # PVE delays failed logins
            raise PVEError("authentication failure", 401)
        ticket = make_ticket(username)
        data = {"username": username, "ticket": ticket, "CSRFPreventionToken": make_csrf(username),
                "cap": {}, "clustername": None}
        cookie = f"PVEAuthCookie={urllib.parse.quote(ticket)}; path=/; secure; SameSite=Lax"
        self.reply(200, data, cookie=cookie)

    def route(self, method: str, rel: str, p: dict, user: str):
        parts = rel.strip("/").split("/")
        if rel == "/version" and method == "GET":
            return dict(pve.PVE_VERSION)
        if rel == "/nodes" and method == "GET":
            st = pve.node_status()
            return [{"node": pve.NODE, "status": "online", "type": "node", "id": f"node/{pve.NODE}",
                     "maxmem": st["memory"]["total"], "mem": st["memory"]["used"], "maxcpu": os.cpu_count(),
                     "cpu": 0, "uptime": st["uptime"], "level": "", "ssl_fingerprint": self.server.fingerprint}]
        if rel == "/cluster/resources" and method == "GET":
            res = []
            if p.get("type") in (None, "", "vm"):
                for vmid in pve.list_cts():
                    with_st = pve.vm_status(vmid)
                    with_st.update(id=f"lxc/{vmid}", node=pve.NODE)
                    res.append(with_st)
            if p.get("type") in (None, "", "node"):
                res.append({"id": f"node/{pve.NODE}", "node": pve.NODE, "type": "node", "status": "online"})
            return res
        if rel == "/cluster/nextid" and method == "GET":
            used = set(pve.list_cts())
            if p.get("vmid"):
                if int(p["vmid"]) in used:
                    raise PVEError(f"VM {p['vmid']} already exists", 400)
                return p["vmid"]
            return str(next(i for i in range(100, 1000000) if i not in used))
        if rel == "/storage" and method == "GET":
            return [{"storage": k, "type": v["type"], "content": v["content"], "path": v["path"]}
                    for k, v in pve.STORAGES.items() if not p.get("type") or p["type"] == v["type"]]
        if parts[0] != "nodes" or len(parts) < 2:
            raise PVEError("Method '%s /%s' not implemented" % (method, rel.strip("/")), 501)
        node = parts[1]
        if node != pve.NODE:
            raise PVEError(f"hostname lookup '{node}' failed - failed to get address info for: {node}: "
                           "Name or service not known", 500)
        sub = parts[2:]
        if sub == ["status"] and method == "GET":
            return pve.node_status()
        if sub == ["version"] and method == "GET":
            return dict(pve.PVE_VERSION)
        if sub == ["storage"] and method == "GET":
            return [{"storage": k, "type": v["type"], "content": v["content"], "active": 1, "enabled": 1}
                    for k, v in pve.STORAGES.items()]
        if len(sub) == 3 and sub[0] == "storage" and sub[2] == "content" and method == "GET":
            if sub[1] not in pve.STORAGES:
                raise PVEError(f"storage '{sub[1]}' does not exist")
            if sub[1] != "local" or p.get("content") not in (None, "", "vztmpl"):
                return []
            return pve.template_list()
        if sub and sub[0] == "tasks":
            if len(sub) == 1 and method == "GET":
                return pve.list_tasks(int(p.get("limit", 50)))
            upid = urllib.parse.unquote(sub[1]) if len(sub) > 1 else ""
            if len(sub) == 3 and sub[2] == "status" and method == "GET":
                return pve.task_status(upid)
            if len(sub) == 3 and sub[2] == "log" and method == "GET":
                return pve.task_log(upid, int(p.get("start", 0)), int(p.get("limit", 50)))
            if len(sub) == 2 and method == "DELETE":
                info = pve.parse_upid(upid)
                if pve.proc_starttime(info["pid"]) == info["pstart"]:
                    os.kill(info["pid"], 15)
                return None
        if sub and sub[0] == "lxc":
            return self.route_lxc(method, sub[1:], p, user)
        if sub == ["qemu"] and method == "GET":
            return []  # the lab node runs no VMs (GET /nodes/{node}/qemu lists them; docs/lab.md)
        raise PVEError("Method '%s /%s' not implemented" % (method, rel.strip("/")), 501)

    def route_lxc(self, method: str, sub: list, p: dict, user: str):
        if not sub:
            if method == "GET":
                return [self.short_status(v) for v in pve.list_cts()]
            if method == "POST":
                ttype, tid, func, args = pve.create_ct(p.pop("vmid", None), p, user)
                return pve.spawn_task(ttype, tid, user, func, args)
            raise PVEError(f"Method '{method} /nodes/{pve.NODE}/lxc' not implemented", 501)
        vmid = sub[0]
        if not re.fullmatch(r"\d+", vmid):
            raise pve.param_error({"vmid": "type check ('integer') failed"})
        vmid = int(vmid)
        rest = sub[1:]
        if not rest and method == "DELETE":
            check_params(p, DESTROY_PARAMS)
            pve.check_vm_perm(user, vmid, ["VM.Allocate"])
            pve.load_config(vmid)
            purge = p.get("purge") in ("1", "true")
            force = p.get("force") in ("1", "true")
            return pve.spawn_task("vzdestroy", vmid, user, "destroy", [vmid, purge, force])
        if not rest and method == "GET":
            pve.load_config(vmid)
            return [{"subdir": s} for s in ("config", "status", "pending", "snapshot", "firewall", "rrd")]
        if rest == ["config"]:
            if method == "GET":
                check_params(p, {"current": True, "snapshot": False})  # no pending section: current = pending
                pve.check_vm_perm(user, vmid, ["VM.Audit"])
                return pve.get_config(vmid)
            if method in ("PUT", "POST"):
                pve.update_config(vmid, p, user)
                return None
        if rest == ["pending"] and method == "GET":
            pve.check_vm_perm(user, vmid, ["VM.Audit"])
            return pve.get_pending(vmid)
        if rest and rest[0] == "status":
            if rest == ["status", "current"] and method == "GET":
                pve.check_vm_perm(user, vmid, ["VM.Audit"])
                return pve.vm_status(vmid)
            if len(rest) == 2 and method == "POST" and rest[1] in STATUS_PARAMS:
                return self.status_action(rest[1], vmid, p, user)
        raise PVEError(f"Method '{method} /nodes/{pve.NODE}/lxc/{vmid}/{'/'.join(rest)}' not implemented", 501)

    @staticmethod
    def status_action(action: str, vmid: int, p: dict, user: str) -> str:
        """POST status/{start,stop,shutdown,reboot} (pve-container API2/LXC/Status.pm): schema, VM.PowerMgmt,
        skiplock for root@pam only (400), the running state checked before the task is forked."""
        check_params(p, STATUS_PARAMS[action])
        pve.check_vm_perm(user, vmid, ["VM.PowerMgmt"])
        skiplock = p.get("skiplock") in ("1", "true")
        if skiplock and user != "root@pam":
            raise pve.param_error({"skiplock": "Only root may use this option."})
        pve.load_config(vmid)
        running = pve.is_running(vmid)
        if action == "start":
            if running:
                raise PVEError(f"CT {vmid} already running")
            return pve.spawn_task("vzstart", vmid, user, "start", [vmid, skiplock])
        if not running:
            raise PVEError(f"CT {vmid} not running")
        if action == "stop":
            return pve.spawn_task("vzstop", vmid, user, "stop", [vmid, skiplock])
        if action == "shutdown":
            force = p.get("forceStop") in ("1", "true")
            return pve.spawn_task("vzshutdown", vmid, user, "shutdown", [vmid, int(p.get("timeout") or 60), force])
        return pve.spawn_task("vzreboot", vmid, user, "reboot", [vmid, p.get("timeout")])

    @staticmethod
    def short_status(vmid: int) -> dict:
        st = pve.vm_status(vmid)
        return {k: st[k] for k in ("vmid", "name", "status", "type", "maxmem", "maxswap", "mem", "cpus", "uptime",
                                   "pid", "lock", "tags", "maxdisk", "disk") if k in st}


def serve(host: str, port: int) -> None:
    httpd = ThreadingHTTPServer((host, port), Handler)
    httpd.daemon_threads = True
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(f"{PKI}/pve-ssl.pem", f"{PKI}/pve-ssl.key")
    with open(f"{PKI}/pve-ssl.pem") as f:
        der = ssl.PEM_cert_to_DER_cert(f.read())
    fp = hashlib.sha256(der).hexdigest().upper()
    httpd.fingerprint = ":".join(fp[i:i + 2] for i in range(0, len(fp), 2))
    httpd.socket = ctx.wrap_socket(httpd.socket, server_side=True)
    httpd.serve_forever()


def main() -> int:
    import argparse
    ap = argparse.ArgumentParser()
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8006)
    ap.add_argument("--daemon", action="store_true")
    args = ap.parse_args()
    os.environ["PATH"] = "/usr/sbin:/usr/bin:/sbin:/bin"
    if args.daemon:
        os.makedirs(os.path.dirname(LOGFILE), exist_ok=True)
        os.makedirs(pve.RUN, exist_ok=True)
        if os.fork():
            return 0
        os.setsid()
        if os.fork():
            os._exit(0)
        log = os.open(LOGFILE, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.chdir("/")
        with open(PIDFILE, "w") as f:
            f.write(f"{os.getpid()}\n")
    serve(args.host, args.port)
    return 0


if __name__ == "__main__":
    sys.exit(main())
