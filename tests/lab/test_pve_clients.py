"""Clients no one here wrote, against the lab's PVE node: plain proxmoxer calls, and community.proxmox's own
modules (tests/lab/clients/community_proxmox.yml). Each checks what the node then holds, not only the replies.

The API schema they meet is PVE's (tests/lab/pve/apidata-slice.json, docs/lab.md "PVE's schema").
"""
from __future__ import annotations

import os
import subprocess
import time

import pytest
import requests
from proxmoxer.core import ResourceException

from conftest import CA, NODE, REPO, TEMPLATE, destroy, pct, secret, wait_task

VMID = 197            # the proxmoxer lifecycle; never 129, 130, 132, 196, 198 or 199
COMMUNITY_VMID = 196  # tests/lab/clients/community_proxmox.yml
API = "https://127.0.0.1:8006/api2/json"


def test_proxmoxer_minimal_create_start_stop_remove(api_token):
    """What a generic client sends: vmid and ostemplate only (PVE's defaults: rootfs local:4, hostname CT<vmid>,
    memory/swap 512), plus the defaults proxmoxer users often pass (force=0)."""
    destroy(VMID)
    node = api_token.nodes(NODE)
    since = int(time.time()) - 1
    try:
        st = wait_task(api_token, node.lxc.post(vmid=VMID, ostemplate=TEMPLATE, force=0, unprivileged=1))
        assert st["exitstatus"] == "OK", st
        conf = node.lxc(VMID).config.get()
        assert conf["rootfs"] == f"local:{VMID}/vm-{VMID}-disk-0.raw,size=4G"
        assert conf["hostname"] == f"CT{VMID}" and conf["memory"] == 512 and conf["swap"] == 512
        with open(f"/etc/pve/lxc/{VMID}.conf") as f:
            assert f"hostname: CT{VMID}\n" in f.read()

        st = wait_task(api_token, node.lxc(VMID).status.start.post(debug=0))
        assert st["exitstatus"] == "OK", st
        assert node.lxc(VMID).status.current.get()["status"] == "running"
        assert pct("status", str(VMID)).stdout.strip() == "status: running"
        names = [i["name"] for i in node.lxc(VMID).interfaces.get()]
        assert "lo" in names
        snaps = node.lxc(VMID).snapshot.get()
        assert snaps == [{"name": "current", "description": "You are here!", "running": 1,
                          "digest": node.lxc(VMID).config.get()["digest"]}]

        res = api_token.cluster.resources.get()
        ct = next(r for r in res if r.get("id") == f"lxc/{VMID}")
        assert ct["node"] == NODE and ct["status"] == "running" and ct["type"] == "lxc"
        assert {r["id"] for r in res if r["type"] == "storage"} == {f"storage/{NODE}/local", f"storage/{NODE}/local-lvm"}
        assert [r["node"] for r in res if r["type"] == "node"] == [NODE]
        assert api_token.cluster.status.get()[0]["name"] == NODE

        tasks = node.tasks.get(vmid=VMID, since=since)
        assert [t["type"] for t in tasks] == ["vzstart", "vzcreate"]
        assert all(t["status"] == "OK" and "endtime" in t for t in tasks)
        assert node.tasks.get(source="active", vmid=VMID) == []

        st = wait_task(api_token, node.lxc(VMID).status.stop.post(**{"overrule-shutdown": 0}))
        assert st["exitstatus"] == "OK", st
        assert pct("status", str(VMID)).stdout.strip() == "status: stopped"
        st = wait_task(api_token, node.lxc(VMID).delete(**{"destroy-unreferenced-disks": 0}))
        assert st["exitstatus"] == "OK", st
        assert not os.path.exists(f"/etc/pve/lxc/{VMID}.conf")
        assert all(r.get("vmid") != VMID for r in api_token.cluster.resources.get(type="vm"))
    finally:
        destroy(VMID)


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
    destroy(COMMUNITY_VMID)
    env = dict(os.environ, LAB_API_TOKEN_SECRET=secret("token-secret"), ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg"))
    try:
        r = subprocess.run([os.path.join(REPO, ".venv", "bin", "ansible-playbook"),
                            os.path.join(REPO, "tests", "lab", "clients", "community_proxmox.yml")],
                           capture_output=True, text=True, env=env, timeout=900, cwd=REPO)
        assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-3000:]
        assert "failed=0" in r.stdout
        assert not os.path.exists(f"/etc/pve/lxc/{COMMUNITY_VMID}.conf")
    finally:
        destroy(COMMUNITY_VMID)
