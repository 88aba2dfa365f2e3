"""The simulated PVE node's REST API: https://127.0.0.1:8006/api2/json/... (stdlib only, Python >= 3.11).

Started by `labctl up` as a daemon: python3 tests/lab/pve/api.py --daemon. Secrets and TLS material live
under /var/lib/inferops-lab (see docs/lab.md, "PVE node").
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import http.client
import json
import os
import re
import ssl
import sys
import time
import traceback
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from pve import access, apischema, ctapi, ctconfig, ctstate, nodeapi, pvecluster, pvenode, pvetasks
from pve.pvenode import PVEError

LAB = pvenode.LAB
PKI = f"{LAB}/pki"
SECRETS = f"{LAB}/secrets"
AUTHKEY = f"{SECRETS}/authkey"
TOKEN_CFG = f"{pvenode.PVE_ETC}/priv/token.cfg"
PIDFILE = pvecluster.api_pidfile(pvenode.NODE)  # main() sets these for --node
LOGFILE = f"{LAB}/log/pve-api.log"
API_PORT = 8006
TICKET_LIFETIME = 7200  # PVE: tickets are valid for 2 hours
# Every request the lab's own schema (9.1) took, with what each other release's schema says of it
# (apischema.PROFILES): one JSON line each, read by the client tests (docs/lab.md "PVE's schema"). Only the
# daemon writes it (main() sets it), not an in-process import.
PROFILE_LOG_FILE = f"{pvenode.RUN}/api-profiles.jsonl"
PROFILE_LOG: str | None = None


def record_profiles(info: "apischema.Method", params: dict, user: str | None) -> None:
    """Appends the request's verdict under every other profile to PROFILE_LOG (the names of the parameters,
    never their values: passwords and tickets pass here). A failure to write never fails the request."""
    if PROFILE_LOG is None:
        return
    entry = {"t": time.time(), "node": pvenode.NODE, "user": user, "method": info.key, "params": sorted(params),
             "profiles": {name: apischema.profile_errors(name, info.key, params) for name in apischema.PROFILES}}
    try:
        fd = os.open(PROFILE_LOG, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            os.write(fd, (json.dumps(entry, sort_keys=True) + "\n").encode())
        finally:
            os.close(fd)
    except OSError:
        pass


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


# Parameters PVE's schema has that the lab does not simulate, per method (item 2 of issue 23): accepted at their
# schema default (a boolean without one: 0, as the handlers read an absent flag), else 501 naming them.
NOT_SIMULATED = {
    "POST /access/ticket": ("new-format", "otp", "tfa-challenge", "path", "privs"),
    "POST /nodes/{node}/lxc": ("force", "restore", "unique", "pool", "ignore-unpack-errors", "bwlimit", "ha-managed"),
    "DELETE /nodes/{node}/lxc/{vmid}": ("destroy-unreferenced-disks",),
    "GET /nodes/{node}/lxc/{vmid}/config": ("snapshot",),
    "POST /nodes/{node}/lxc/{vmid}/status/start": ("debug",),
    "POST /nodes/{node}/lxc/{vmid}/status/stop": ("overrule-shutdown",),
    "GET /nodes/{node}/storage": ("format",),  # `target`: nodeapi.node_storage_list (this node = no target)
    "GET /nodes/{node}/tasks/{upid}/log": ("download",),
    "GET /nodes/{node}/qemu": ("full",),
}


def refuse_not_simulated(method: "apischema.Method", params: dict) -> None:
    """501 with the parameter's name for a value the lab does not simulate; the default is dropped."""
    for name in NOT_SIMULATED.get(method.key, ()):
        if name in params:
            if apischema.is_default(method.properties[name], params[name]):
                del params[name]
            else:
                raise PVEError(f"lab: parameter '{name}' is not simulated by the lab (only its default "
                               f"{method.properties[name].get('default', 0)!r} is accepted)", 501)


def check_api2_permissions(info: "apischema.Method", user: str, uri: dict, cfg: dict | None = None) -> None:
    """pve-access-control PVE::RPCEnvironment::check_api2_permissions on the method's `permissions` from the
    schema slice: `user => 'all'`/`'world'`, or `check => ['perm', '<path with {uri params}>', [privs], any => 1]`."""
    perms = info.info.get("permissions") or {}
    check = perms.get("check")
    if check is None:
        if perms.get("user") in ("all", "world"):
            return
        raise NotImplementedError(f"lab: permissions {perms} of {info.key}")
    if check[0] != "perm" or len(check) not in (3, 5):
        raise NotImplementedError(f"lab: permission check {check} of {info.key}")
    path = re.sub(r"\{([a-z\-]+)\}", lambda m: str(uri.get(m.group(1), "")), check[1])
    access.check_perm(user, path, check[2], cfg, any_=len(check) == 5 and check[3] == "any" and bool(check[4]))


class ProxyTo(Exception):
    """The method is another node's (`proxyto`): the request goes there as it came (pve-manager
    PVE/HTTPServer.pm rest_handler, after the permission check and before the schema, which the other node
    checks)."""

    def __init__(self, node: str):
        super().__init__(node)
        self.node = node


def cert_paths(node: str) -> tuple[str, str]:
    """A node's TLS certificate and key (PVE: /etc/pve/nodes/<node>/pve-ssl.pem, signed by the cluster's CA)."""
    if node == "pve1":
        return f"{PKI}/pve-ssl.pem", f"{PKI}/pve-ssl.key"
    return f"{PKI}/{node}/pve-ssl.pem", f"{PKI}/{node}/pve-ssl.key"


def remote_node_ip(node: str) -> str:
    """pve-cluster PVE::Cluster::remote_node_ip: the member's address from the nodelist; a name that is no
    member falls back to a hostname lookup, which fails for the lab's names."""
    for n in pvecluster.cluster_nodes():
        if n["name"] == node and n["ip"]:
            return n["ip"]
    raise PVEError(f"hostname lookup '{node}' failed - failed to get address info for: {node}: "
                   "Name or service not known", 500)


def prepare(method: str, rel: str, params: dict, user: str | None, cfg: dict | None = None) -> tuple:
    """What happens to a request before its handler runs: the method lookup (501 `Method '<M> <path>' not
    implemented`), then as pve-manager PVE/HTTPServer.pm rest_handler: a body or query parameter may repeat a
    path parameter only with the same value, a token only where the method allows tokens (`allowtoken`),
    the lab's gate (root@pam and its tokens), the method's `permissions` (check_api2_permissions), then PVE's schema
    (RESTHandler::handle -> JSONSchema::validate, 400), then the lab's rule for parameters it does not simulate
    (501). Returns (method, the parameters as plain strings, path parameters included)."""
    info, uri = apischema.find(method, rel)
    if info is None:
        raise PVEError(f"Method '{method} {rel}' not implemented", 501)
    for k, v in params.items():
        if k in uri and apischema.plain(v) != uri[k]:
            raise pvenode.param_error({k: "duplicate parameter (already defined in URI) with conflicting values!"})
    params = dict(params, **uri)
    if user and "!" in user and not info.info.get("allowtoken"):
        raise PVEError(f"URI '{rel}' not available with API token, need proper ticket.", 403)
    if user and not (user == "root@pam" or user.startswith("root@pam!")):
        raise PVEError("Permission check failed", 403)
    if user:
        check_api2_permissions(info, user, uri, cfg)
    target = uri.get(info.info.get("proxyto") or "")
    if target and target not in ("localhost", pvenode.NODE):
        raise ProxyTo(target)
    try:
        apischema.validate(info, params)
    except apischema.SchemaError as e:
        raise pvenode.param_error(e.errors) from None
    record_profiles(info, params, user)
    refuse_not_simulated(info, params)
    return info, {k: apischema.plain(v) for k, v in params.items()}


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
        """Query and body parameters. A JSON body keeps its JSON types (JSONSchema.pm checks a JSON boolean
        as a boolean, a JSON number as a number); form and query values are strings."""
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
                if not isinstance(body, dict):
                    raise PVEError("malformed JSON body: an object is required", 400)
                params.update(body)
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
            is_ticket = rel == "/access/ticket"
            user = None if is_ticket else self.authenticate(method)
            try:
                info, p = prepare(method, rel, params, user)
            except ProxyTo as e:
                return self.proxy(e.node, method, params)
            if is_ticket:
                return self.login(p) if method == "POST" else self.reply(200, None)
            data = self.route(method, rel, p, user)
            self.reply(200, data)
        except PVEError as e:
            self.reply(e.code, None, e.msg, e.errors)
        except Exception as e:  # a lab bug: 500 with the text, traceback in the log
            traceback.print_exc()
            self.reply(500, None, f"lab internal error: {e}")

    def proxy(self, node: str, method: str, params: dict):
        """pve-http-server src/PVE/APIServer/AnyEvent.pm proxy_request: to https://<node ip>:8006 with the
        caller's ticket cookie or token header and CSRF token, `PVEDisableProxy: true` (a proxied request that
        would be proxied again: 500 `proxy loop detected`), the parameters as a form (or JSON, as they came);
        the other node's answer goes back as it is. The other node's certificate is checked (PVE pins its
        fingerprint; the lab checks it against the cluster's CA). Not reachable: 595 with the reason, as
        AnyEvent::HTTP reports a failed connection."""
        if self.headers.get("PVEDisableProxy"):
            raise PVEError("proxy loop detected", 500)
        ip = remote_node_ip(node)
        headers = {"PVEDisableProxy": "true", "PVEClientIP": self.client_address[0]}
        for name in ("Cookie", "Authorization", "CSRFPreventionToken", "Host"):
            if self.headers.get(name):
                headers[name] = self.headers[name]
        body = None
        if method in ("POST", "PUT"):
            if (self.headers.get("Content-Type") or "").startswith("application/json"):
                headers["Content-Type"] = "application/json"
                body = json.dumps(params).encode()
            else:
                headers["Content-Type"] = "application/x-www-form-urlencoded"
                body = urllib.parse.urlencode(params).encode()
            headers["Content-Length"] = str(len(body))
        ctx = ssl.create_default_context(cafile=f"{PKI}/ca.pem")
        ctx.check_hostname = False  # PVE pins the node's certificate; the CA check stands in for it
        conn = http.client.HTTPSConnection(ip, API_PORT, context=ctx, timeout=30)
        try:
            conn.request(method, self.path, body=body, headers=headers)
            r = conn.getresponse()
            raw = r.read()
            code, reason, ctype = r.status, r.reason, r.getheader("Content-Type")
        except OSError as e:
            reason = getattr(e, "strerror", None) or str(e)
            return self.reply(595, None, reason)
        finally:
            conn.close()
        self.send_response(code, reason)
        self.send_header("Content-Type", ctype or "application/json;charset=UTF-8")
        self.send_header("Content-Length", str(len(raw)))
        self.send_header("Cache-Control", "max-age=0")
        self.send_header("Pragma", "no-cache")
        self.end_headers()
        self.wfile.write(raw)
        return None

    def login(self, params: dict):
        """POST /access/ticket: a password, or as the password a valid ticket of the same user (how clients renew
        their ticket before it expires): pve-access-control src/PVE/API2/AccessControl.pm create_ticket_data
        (verify_ticket, `$ticketuser eq $username`)."""
        username = params.get("username", "")
        realm = params.get("realm")
        if realm and "@" not in username:
            username = f"{username}@{realm}"
        try:
            password = read_secret(f"{SECRETS}/root-password")
        except OSError:
            password = None
        given = params.get("password", "")
        renewed = given.startswith("PVE:") and verify_ticket(given) == username
        if username != "root@pam" or not (renewed or (password is not None and hmac.compare_digest(given, password))):
            time.sleep(1)  # PVE delays failed logins
            raise PVEError("authentication failure", 401)
        ticket = make_ticket(username)
        data = {"username": username, "ticket": ticket, "CSRFPreventionToken": make_csrf(username),
                "cap": {}, "clustername": None}
        cookie = f"PVEAuthCookie={urllib.parse.quote(ticket)}; path=/; secure; SameSite=Lax"
        self.reply(200, data, cookie=cookie)

    def route(self, method: str, rel: str, p: dict, user: str):
        """The handler of a method of the schema slice (dispatch has checked the parameters)."""
        parts = rel.strip("/").split("/")
        if rel == "/version":
            return dict(pvenode.PVE_VERSION)
        if rel == "/nodes":  # pve-manager PVE/API2/Nodes.pm index: extract_node_stats + ssl_fingerprint per member
            return [dict(nodeapi.node_entry(n), ssl_fingerprint=cert_fingerprint(cert_paths(n)[0]))
                    for n in nodeapi.node_names()]
        if rel == "/cluster/resources":
            return nodeapi.cluster_resources(p.get("type"))
        if rel == "/cluster/status":
            return nodeapi.cluster_status()
        if rel == "/cluster/nextid":
            used = set(pvecluster.vmlist())
            if p.get("vmid"):
                if int(p["vmid"]) in used:
                    raise PVEError(f"VM {p['vmid']} already exists", 400)
                return p["vmid"]
            return str(next(i for i in range(100, 1000000) if i not in used))
        if rel == "/storage":
            return [nodeapi.storage_config(k) for k in pvenode.STORAGES
                    if not p.get("type") or p["type"] == pvenode.STORAGES[k]["type"]]
        if parts[0] == "storage":
            return nodeapi.storage_config(parts[1])
        node = parts[1]
        if node != pvenode.NODE and node not in nodeapi.node_names():
            raise PVEError(f"hostname lookup '{node}' failed - failed to get address info for: {node}: "
                           "Name or service not known", 500)
        sub = parts[2:]
        if sub == ["status"]:
            return nodeapi.node_status()
        if sub == ["version"]:
            return dict(pvenode.PVE_VERSION)
        if sub == ["network"]:
            return nodeapi.node_network(p.get("type"))
        if sub == ["storage"]:
            return nodeapi.node_storage_list(p)
        if len(sub) == 3 and sub[0] == "storage" and sub[2] == "content":
            return nodeapi.storage_content(sub[1], p.get("content"), p.get("vmid"))
        if sub == ["qemu"]:
            return []  # the lab node runs no VMs (GET /nodes/{node}/qemu lists them; docs/lab.md)
        if sub[0] == "tasks":
            if len(sub) == 1:
                return pvetasks.list_tasks(p)
            upid = p["upid"]
            if len(sub) == 2 and method == "GET":
                pvetasks.task_file_checked(upid)
                return [{"name": "log"}, {"name": "status"}]
            if len(sub) == 3 and sub[2] == "status":
                return pvetasks.task_status(upid)
            if len(sub) == 3 and sub[2] == "log":
                return pvetasks.task_log(upid, int(p.get("start", 0)), int(p.get("limit", 50)))
            if len(sub) == 2 and method == "DELETE":
                info = pvetasks.task_file_checked(upid)
                if pvetasks.proc_starttime(info["pid"]) == info["pstart"]:
                    os.kill(info["pid"], 15)
                return None
        if sub[0] == "lxc":
            return self.route_lxc(method, sub[1:], p, user)
        raise PVEError(f"Method '{method} {rel}' not implemented", 501)  # unreachable: the slice has no other

    def route_lxc(self, method: str, sub: list, p: dict, user: str):
        if not sub:
            if method == "GET":
                return [self.short_status(v) for v in ctstate.list_cts()]
            ttype, tid, func, args = ctapi.create_ct(p.pop("vmid", None), p, user)
            return pvetasks.spawn_task(ttype, tid, user, func, args)
        vmid = int(sub[0])
        rest = sub[1:]
        if not rest and method == "DELETE":
            access.check_vm_perm(user, vmid, ["VM.Allocate"])
            ctconfig.load_config(vmid)
            purge = p.get("purge") == "1"
            force = p.get("force") == "1"
            return pvetasks.spawn_task("vzdestroy", vmid, user, "destroy", [vmid, purge, force])
        if not rest:
            ctconfig.load_config(vmid)
            return [{"subdir": s} for s in ("config", "pending", "status", "vncproxy", "termproxy", "vncwebsocket",
                                            "spiceproxy", "migrate", "clone", "rrd", "rrddata", "firewall",
                                            "snapshot", "resize", "interfaces", "mtunnel", "mtunnelwebsocket",
                                            "remote_migrate")]
        if rest == ["config"]:
            if method == "GET":  # current=1 is the same without a pending section
                access.check_vm_perm(user, vmid, ["VM.Audit"])
                return ctapi.get_config(vmid, user)
            ctapi.update_config(vmid, p, user)
            return None
        if rest == ["pending"]:
            access.check_vm_perm(user, vmid, ["VM.Audit"])
            return ctapi.get_pending(vmid, user)
        if rest == ["snapshot"]:
            access.check_vm_perm(user, vmid, ["VM.Audit"])
            return nodeapi.snapshot_list(vmid)
        if rest == ["interfaces"]:
            access.check_vm_perm(user, vmid, ["VM.Audit"])
            return nodeapi.ct_interfaces(vmid)
        if rest == ["status"]:
            ctconfig.load_config(vmid)
            return [{"subdir": s} for s in ("current", "start", "stop", "shutdown", "reboot", "suspend", "resume")]
        if rest == ["status", "current"]:
            access.check_vm_perm(user, vmid, ["VM.Audit"])
            return ctstate.vm_status(vmid)
        return self.status_action(rest[1], vmid, p, user)

    @staticmethod
    def status_action(action: str, vmid: int, p: dict, user: str) -> str:
        """POST status/{start,stop,shutdown,reboot} (pve-container API2/LXC/Status.pm): VM.PowerMgmt,
        skiplock for root@pam only (400), the running state checked before the task is forked."""
        access.check_vm_perm(user, vmid, ["VM.PowerMgmt"])
        skiplock = p.get("skiplock") == "1"
        if skiplock and user != "root@pam":
            raise pvenode.param_error({"skiplock": "Only root may use this option."})
        ctconfig.load_config(vmid)
        running = ctstate.is_running(vmid)
        if action == "start":
            if running:
                raise PVEError(f"CT {vmid} already running")
            pvecluster.check_cfs_quorum()  # vm_start
            return pvetasks.spawn_task("vzstart", vmid, user, "start", [vmid, skiplock])
        if not running:
            raise PVEError(f"CT {vmid} not running")
        if action == "stop":
            return pvetasks.spawn_task("vzstop", vmid, user, "stop", [vmid, skiplock])
        if action == "shutdown":
            force = p.get("forceStop") == "1"
            return pvetasks.spawn_task("vzshutdown", vmid, user, "shutdown", [vmid, int(p.get("timeout") or 60), force])
        return pvetasks.spawn_task("vzreboot", vmid, user, "reboot", [vmid, p.get("timeout")])

    @staticmethod
    def short_status(vmid: int) -> dict:
        st = ctstate.vm_status(vmid)
        return {k: st[k] for k in ("vmid", "name", "status", "type", "maxmem", "maxswap", "mem", "cpus", "uptime",
                                   "pid", "lock", "tags", "maxdisk", "disk", "cpu", "netin", "netout", "diskread",
                                   "diskwrite", "template") + tuple(f"pressure{t}{k}" for t, k in ctstate.PRESSURE_KEYS)
                if k in st}


def cert_fingerprint(path: str) -> str | None:
    try:
        with open(path) as f:
            der = ssl.PEM_cert_to_DER_cert(f.read())
    except OSError:
        return None
    fp = hashlib.sha256(der).hexdigest().upper()
    return ":".join(fp[i:i + 2] for i in range(0, len(fp), 2))


def serve(host: str, port: int) -> None:
    httpd = ThreadingHTTPServer((host, port), Handler)
    httpd.daemon_threads = True
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(*cert_paths(pvenode.NODE))
    httpd.fingerprint = cert_fingerprint(cert_paths(pvenode.NODE)[0])
    httpd.socket = ctx.wrap_socket(httpd.socket, server_side=True)
    httpd.serve_forever()


def main(argv: list[str] | None = None) -> int:
    """`labctl api [--node N] [--host H] [--port P] [--daemon]`"""
    import argparse
    global PIDFILE, LOGFILE, PROFILE_LOG
    ap = argparse.ArgumentParser(prog="labctl api")
    ap.add_argument("--node", default="pve1", choices=sorted(pvenode.NODE_ADDRESSES))
    ap.add_argument("--host", default=None, help="default: the node's address")
    ap.add_argument("--port", type=int, default=API_PORT)
    ap.add_argument("--daemon", action="store_true")
    args = ap.parse_args(argv)
    os.environ["PATH"] = "/usr/sbin:/usr/bin:/sbin:/bin"
    pvenode.set_node(args.node)
    PIDFILE = pvecluster.api_pidfile(args.node)
    if args.node != "pve1":
        LOGFILE = f"{LAB}/log/pve-api-{args.node}.log"
    args.host = args.host or pvenode.NODE_ADDRESSES[args.node]
    if args.node != "pve1":  # another node's daemon and task workers live in its mount namespace (its GPUs)
        from pve import nodens
        nodens.enter(args.node)
    if args.daemon:
        os.makedirs(os.path.dirname(LOGFILE), exist_ok=True)
        os.makedirs(pvenode.RUN, exist_ok=True)
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
    PROFILE_LOG = PROFILE_LOG_FILE
    serve(args.host, args.port)
    return 0


if __name__ == "__main__":
    sys.exit(main())
