"""Clients no one here wrote, against the lab's PVE node: plain proxmoxer calls, and community.proxmox's own
modules (tests/lab/clients/community_proxmox.yml). Each checks what the node then holds, not only the replies.

The API schema they meet is PVE 9.1's (tests/lab/pve/apidata-slice.json, docs/lab.md "PVE's schema"). Every request
of every test here is also checked against PVE 8.4's schema (apidata-slice-8.4.json): the API daemon records each
request its own schema took, with 8.4's verdict, in /run/inferops-lab/api-profiles.jsonl, and the fixture below
fails a test whose client sent something 8.4 refuses; the methods and parameters seen go to
$INFEROPS_REPORT_DIR/pve-profiles.json when that is set.
"""
from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time

import pytest
import requests
from proxmoxer.core import ResourceException

from conftest import CA, NODE, NODE2, NODE_ADDRESSES, REPO, TEMPLATE, destroy, node_ssh, secret, wait_task

VMID = 197            # the proxmoxer lifecycle on pve1; never 129, 130, 132, 194, 196, 198 or 199
VMID2 = 195           # the same on pve2
COMMUNITY_VMID = 196  # tests/lab/clients/community_proxmox.yml, on pve1
COMMUNITY_VMID2 = 194  # the same on pve2
API = "https://127.0.0.1:8006/api2/json"
API2 = f"https://{NODE_ADDRESSES[NODE2]}:8006/api2/json"


PROFILE_LOG = "/run/inferops-lab/api-profiles.jsonl"
SEEN: dict = {}  # "METHOD /path" -> the parameter names sent, over the module's tests


def profile_log_size() -> int:
    try:
        return os.path.getsize(PROFILE_LOG)
    except FileNotFoundError:
        return 0


@pytest.fixture(autouse=True)
def valid_on_every_profile(lab):
    """The requests a test's clients sent, as the lab's API daemons recorded them: each taken by 9.1's schema (else
    it is not recorded) must also be valid under 8.4's."""
    start = profile_log_size()
    yield
    with open(PROFILE_LOG) as f:
        f.seek(start)
        entries = [json.loads(line) for line in f if line.strip()]
    refused = [e for e in entries if e["profiles"].get("8.4")]
    for e in entries:
        SEEN.setdefault(e["method"], set()).update(p for p in e["params"] if p not in ("node", "vmid", "upid"))
    assert not refused, f"requests PVE 8.4's schema refuses: {refused}"


@pytest.fixture(scope="module", autouse=True)
def profile_report():
    yield
    out = os.environ.get("INFEROPS_REPORT_DIR")
    if out:
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, "pve-profiles.json"), "w") as f:
            json.dump({m: sorted(p) for m, p in sorted(SEEN.items())}, f, indent=1)


def node_pct(node: str, *args: str) -> subprocess.CompletedProcess:
    """pct as the node's SSH endpoint runs it (pct on this machine is pve1's)."""
    return node_ssh(node, "pct", *args)


@pytest.mark.parametrize("node_name,vmid", [(NODE, VMID), (NODE2, VMID2)], ids=["pve1", "pve2-proxied-by-pve1"])
def test_proxmoxer_minimal_create_start_stop_remove(api_token, api_token_pve2, node_name, vmid):
    """What a generic client sends: vmid and ostemplate only (PVE's defaults: rootfs local:4, hostname CT<vmid>,
    memory/swap 512), plus the defaults proxmoxer users often pass (force=0). On pve2 through pve1's address:
    pve1 proxies /nodes/pve2/... to pve2 (pve-manager rest_handler, proxyto), which does the work."""
    destroy(vmid)
    api = api_token
    node = api.nodes(node_name)
    other = NODE2 if node_name == NODE else NODE
    conf_file = f"/etc/pve/nodes/{node_name}/lxc/{vmid}.conf"
    since = int(time.time()) - 1
    try:
        upid = node.lxc.post(vmid=vmid, ostemplate=TEMPLATE, force=0, unprivileged=1)
        assert upid.startswith(f"UPID:{node_name}:"), upid
        st = wait_task(api, upid)
        assert st["exitstatus"] == "OK", st
        conf = node.lxc(vmid).config.get()
        assert conf["rootfs"] == f"local:{vmid}/vm-{vmid}-disk-0.raw,size=4G"
        assert conf["hostname"] == f"CT{vmid}" and conf["memory"] == 512 and conf["swap"] == 512
        with open(conf_file) as f:
            assert f"hostname: CT{vmid}\n" in f.read()
        assert not os.path.exists(f"/etc/pve/nodes/{other}/lxc/{vmid}.conf")
        with open("/etc/pve/.vmlist") as f:
            assert json.load(f)["ids"][str(vmid)] == {"node": node_name, "type": "lxc", "version": 1}

        st = wait_task(api, node.lxc(vmid).status.start.post(debug=0))
        assert st["exitstatus"] == "OK", st
        assert node.lxc(vmid).status.current.get()["status"] == "running"
        assert node_pct(node_name, "status", str(vmid)).stdout.strip() == "status: running"
        elsewhere = node_pct(other, "status", str(vmid))
        assert elsewhere.returncode != 0
        assert f"Configuration file 'nodes/{other}/lxc/{vmid}.conf' does not exist" in elsewhere.stderr
        names = [i["name"] for i in node.lxc(vmid).interfaces.get()]
        assert "lo" in names
        snaps = node.lxc(vmid).snapshot.get()
        assert snaps == [{"name": "current", "description": "You are here!", "running": 1,
                          "digest": node.lxc(vmid).config.get()["digest"]}]

        for client in (api_token, api_token_pve2):  # the same cluster view from either node
            res = client.cluster.resources.get()
            ct = next(r for r in res if r.get("id") == f"lxc/{vmid}")
            assert ct["node"] == node_name and ct["status"] == "running" and ct["type"] == "lxc"
            assert {r["id"] for r in res if r["type"] == "storage"} == {
                f"storage/{n}/{s}" for n in (NODE, NODE2) for s in ("local", "local-lvm")}
            assert [(r["node"], r["status"]) for r in res if r["type"] == "node"] == [(NODE, "online"),
                                                                                      (NODE2, "online")]
            status = client.cluster.status.get()
            assert status[0]["type"] == "cluster" and status[0]["quorate"] == 1 and status[0]["nodes"] == 2
            assert [(n["name"], n["online"]) for n in status[1:]] == [(NODE, 1), (NODE2, 1)]

        tasks = node.tasks.get(vmid=vmid, since=since)
        assert [t["type"] for t in tasks] == ["vzstart", "vzcreate"]
        assert all(t["status"] == "OK" and "endtime" in t and t["node"] == node_name for t in tasks)
        assert node.tasks.get(source="active", vmid=vmid) == []
        assert api.nodes(other).tasks.get(vmid=vmid, since=since) == []  # each node lists its own tasks

        st = wait_task(api, node.lxc(vmid).status.stop.post(**{"overrule-shutdown": 0}))
        assert st["exitstatus"] == "OK", st
        assert node_pct(node_name, "status", str(vmid)).stdout.strip() == "status: stopped"
        st = wait_task(api, node.lxc(vmid).delete(**{"destroy-unreferenced-disks": 0}))
        assert st["exitstatus"] == "OK", st
        assert not os.path.exists(conf_file)
        assert all(r.get("vmid") != vmid for r in api_token_pve2.cluster.resources.get(type="vm"))
    finally:
        destroy(vmid)


def test_cluster_vmid_list_and_proxying(api_token, api_token_pve2):
    """One VMID list for the cluster: pve2 refuses a VMID pve1 has (pve-cluster check_vmid_unused) and
    /cluster/nextid skips it; pve1 proxies /nodes/pve2/... there (schema checked by pve2), refuses a request that
    was already proxied (proxy loop), and a node that is no member is a hostname-lookup error."""
    headers = {"Authorization": f"PVEAPIToken=root@pam!lab={secret('token-secret')}"}
    r = requests.post(f"{API2}/nodes/{NODE2}/lxc", data={"vmid": 130, "ostemplate": TEMPLATE}, headers=headers,
                      verify=CA, timeout=30)
    assert r.status_code == 500 and r.json()["message"] == "CT 130 already exists on node 'pve1'\n", r.text
    assert not os.path.exists("/etc/pve/nodes/pve2/lxc/130.conf")
    with open("/etc/pve/lxc/130.conf") as f:
        assert "bystander" in f.read()
    r = requests.get(f"{API2}/cluster/nextid", params={"vmid": 130}, headers=headers, verify=CA, timeout=30)
    assert r.status_code == 400 and "VM 130 already exists" in r.json()["message"]
    assert int(api_token_pve2.cluster.nextid.get()) not in {129, 130, 132}

    # through pve1, answered by pve2: pve2 has no CT 130 (and no config file of it), pve2's schema check
    r = requests.get(f"{API}/nodes/{NODE2}/lxc/130/config", headers=headers, verify=CA, timeout=30)
    assert r.status_code == 500 and "Configuration file 'nodes/pve2/lxc/130.conf' does not exist" in r.text
    r = requests.get(f"{API}/nodes/{NODE2}/lxc", params={"full": 1}, headers=headers, verify=CA, timeout=30)
    assert r.status_code == 400 and list(r.json()["errors"]) == ["full"]
    assert [c["vmid"] for c in api_token.nodes(NODE2).lxc.get()] == [
        int(n[:-5]) for n in sorted(os.listdir("/etc/pve/nodes/pve2/lxc")) if n.endswith(".conf")]
    assert 130 in [c["vmid"] for c in api_token_pve2.nodes(NODE).lxc.get()]  # and the other way round
    r = requests.get(f"{API}/nodes/{NODE2}/status", headers=dict(headers, PVEDisableProxy="true"), verify=CA,
                     timeout=30)
    assert r.status_code == 500 and r.json()["message"] == "proxy loop detected\n"
    r = requests.get(f"{API}/nodes/pve3/status", headers=headers, verify=CA, timeout=30)
    assert r.status_code == 500 and r.json()["message"].startswith("hostname lookup 'pve3' failed")
    # a ticket from pve1 is valid on pve2 (one cluster, one authkey)
    t = requests.post(f"{API}/access/ticket", data={"username": "root@pam", "password": secret("root-password")},
                      verify=CA, timeout=30).json()["data"]
    r = requests.get(f"{API2}/nodes/{NODE2}/status", cookies={"PVEAuthCookie": t["ticket"]}, verify=CA, timeout=30)
    assert r.status_code == 200


def test_proxmoxer_refusals_as_pve_gives_them(api_token):
    node = api_token.nodes(NODE)
    with pytest.raises(ResourceException) as e:
        node.lxc.get(full=1)  # additionalProperties 0 on GETs too
    assert e.value.status_code == 400 and list(e.value.errors) == ["full"]
    with pytest.raises(ResourceException) as e:
        node.tasks("not-a-upid").status.get()
    assert e.value.status_code == 400 and e.value.errors == {"upid": "unable to parse worker upid"}
    with pytest.raises(ResourceException) as e:
        node.tasks.get(limit="ten")
    assert e.value.status_code == 400 and e.value.errors == {"limit": "type check ('integer') failed - got 'ten'"}
    with pytest.raises(ResourceException) as e:
        node.lxc.post(vmid=VMID, ostemplate=TEMPLATE, force=1)
    assert e.value.status_code == 501 and "'force'" in e.value.content
    assert not os.path.exists(f"/etc/pve/lxc/{VMID}.conf")
    with pytest.raises(ResourceException) as e:
        api_token.nodes(NODE).lxc(130).config.post(memory=256)  # PVE has PUT only
    assert e.value.status_code == 501
    storage = api_token.storage("local").get()
    assert storage["storage"] == "local" and storage["type"] == "dir" and len(storage["digest"]) == 40
    net = node.network.get(type="any_bridge")
    assert [i["iface"] for i in net] == ["vmbr0"] and net[0]["cidr"] == "10.77.0.1/24"


def test_ticket_renewal_with_the_ticket_as_password(lab):
    """proxmoxer renews its ticket by posting it as the password (pve-access-control create_ticket_data)."""
    r = requests.post(f"{API}/access/ticket", data={"username": "root@pam", "password": secret("root-password")},
                      verify=CA, timeout=30)
    assert r.status_code == 200, r.text
    ticket = r.json()["data"]["ticket"]
    r2 = requests.post(f"{API}/access/ticket", data={"username": "root@pam", "password": ticket}, verify=CA,
                       timeout=30)
    assert r2.status_code == 200, r2.text
    renewed = r2.json()["data"]["ticket"]
    r3 = requests.get(f"{API}/nodes/{NODE}/status", cookies={"PVEAuthCookie": renewed}, verify=CA, timeout=30)
    assert r3.status_code == 200
    bad = ticket[:-4] + ("AAAA" if not ticket.endswith("AAAA") else "BBBB")
    r4 = requests.post(f"{API}/access/ticket", data={"username": "root@pam", "password": bad}, verify=CA, timeout=30)
    assert r4.status_code == 401


def test_community_proxmox_modules(lab):
    """community.proxmox's modules, each node through its own API address (the playbook runs both)."""
    destroy(COMMUNITY_VMID)
    destroy(COMMUNITY_VMID2)
    env = dict(os.environ, LAB_API_TOKEN_SECRET=secret("token-secret"), ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg"))
    try:
        r = subprocess.run([os.path.join(REPO, ".venv", "bin", "ansible-playbook"),
                            os.path.join(REPO, "tests", "lab", "clients", "community_proxmox.yml")],
                           capture_output=True, text=True, env=env, timeout=900, cwd=REPO)
        assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-3000:]
        assert "failed=0" in r.stdout
        assert r.stdout.count("Create the container on") == 2, r.stdout[-3000:]
        assert not os.path.exists(f"/etc/pve/nodes/pve1/lxc/{COMMUNITY_VMID}.conf")
        assert not os.path.exists(f"/etc/pve/nodes/pve2/lxc/{COMMUNITY_VMID2}.conf")
    finally:
        destroy(COMMUNITY_VMID)
        destroy(COMMUNITY_VMID2)


def test_without_pve2_pve1_has_no_quorum(api_token):
    """Two members, one vote each: with pve2's daemon stopped pve1 is not quorate, so create and start fail before
    any change (pve-cluster check_cfs_quorum), and a request for pve2 gets the proxy's connection error."""
    pidfile = "/run/inferops-lab/pve-api-pve2.pid"
    with open(pidfile) as f:
        pid = int(f.read().split()[0])
    os.kill(pid, signal.SIGTERM)
    try:
        for _ in range(50):
            if not os.path.exists(f"/proc/{pid}"):
                break
            time.sleep(0.1)
        status = api_token.cluster.status.get()
        assert status[0]["quorate"] == 0 and [(n["name"], n["online"]) for n in status[1:]] == [(NODE, 1), (NODE2, 0)]
        with pytest.raises(ResourceException) as e:
            api_token.nodes(NODE).lxc.post(vmid=VMID, ostemplate=TEMPLATE)
        assert e.value.status_code == 500 and "cluster not ready - no quorum?" in str(e.value)
        assert not os.path.exists(f"/etc/pve/nodes/pve1/lxc/{VMID}.conf")
        with pytest.raises(ResourceException) as e:
            api_token.nodes(NODE).lxc(130).status.start.post()  # running: refused as such before quorum
        assert "CT 130 already running" in str(e.value)
        with pytest.raises(ResourceException) as e:
            api_token.nodes(NODE2).status.get()
        assert e.value.status_code == 595
        nodes = {n["node"]: n["status"] for n in api_token.nodes.get()}
        assert nodes == {NODE: "online", NODE2: "offline"}
    finally:
        subprocess.run(["/usr/bin/python3", os.path.join(REPO, "tests", "lab", "labctl"), "api", "--daemon", "--node",
                        NODE2], check=True)  # as labctl up starts it
        for _ in range(100):
            with contextlib.suppress(requests.RequestException):
                if requests.get(f"{API2}/version", verify=CA, timeout=2).status_code == 401:
                    break
            time.sleep(0.1)
    assert api_token.cluster.status.get()[0]["quorate"] == 1
