# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""pve_lxc against an in-memory fake of the proxmoxer API (PVE's behaviour per proxmox-lxc.md §1.1, §3)."""
from __future__ import annotations

import hashlib
import json

import pytest

from ansible.module_utils.testing import patch_module_args

from ansible_collections.inferops.gpu_inference.plugins.module_utils.pve import pve_client
from ansible_collections.inferops.gpu_inference.plugins.modules import pve_lxc

proxmoxer = pytest.importorskip("proxmoxer")
from proxmoxer.core import ResourceException  # noqa: E402

NODE = "pve"


class FakeResource:
    def __init__(self, pve, path):
        self._pve = pve
        self._path = path

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        return FakeResource(self._pve, self._path + [name])

    def __call__(self, resource_id=None):
        if resource_id in (None, ""):
            return self
        return FakeResource(self._pve, self._path + [str(resource_id)])

    def get(self, **params):
        return self._pve.handle("GET", self._path, params)

    def post(self, **params):
        return self._pve.handle("POST", self._path, params)

    def put(self, **params):
        return self._pve.handle("PUT", self._path, params)

    def delete(self, **params):
        return self._pve.handle("DELETE", self._path, params)


class FakePVE(FakeResource):
    """Just enough of PVE: containers, config with digest, root@pam-only devN, tasks."""

    def __init__(self, user="root@pam"):
        super().__init__(self, [])
        self.user = user
        self.cts = {}
        self.tasks = {}
        self.calls = []
        self.task_exit = {}  # task type -> exitstatus override
        self.concurrent_change = False
        self.templates = ["local:vztmpl/debian-13-standard_13.1-1_amd64.tar.zst"]
        self.elsewhere = {}  # vmid -> another node of the cluster that has it

    @staticmethod
    def digest(config):
        return hashlib.sha1(json.dumps(config, sort_keys=True).encode()).hexdigest()

    def task(self, kind, vmid):
        upid = f"UPID:{NODE}:00001234:00ABCDEF:6650F00D:{kind}:{vmid}:{self.user}:"
        exitstatus = self.task_exit.get(kind, "OK")
        self.tasks[upid] = {"status": "stopped", "exitstatus": exitstatus, "upid": upid}
        return upid, exitstatus == "OK"

    def check_perm(self, keys):
        if self.user != "root@pam" and any(k.startswith("dev") for k in keys):
            raise ResourceException(
                403,
                "Forbidden",
                "Permission check failed (configuring device passthrough is only allowed for root@pam)",
            )

    def handle(self, method, path, params):
        self.calls.append((method, "/".join(path), dict(params)))
        if path == ["cluster", "resources"]:
            assert params == {"type": "vm"}
            return ([{"vmid": v, "node": NODE, "type": "lxc"} for v in self.cts]
                    + [{"vmid": v, "node": n, "type": "lxc"} for v, n in self.elsewhere.items()])
        if path[:2] != ["nodes", NODE]:
            raise ResourceException(500, "Internal Server Error", f"hostname lookup '{path[1]}' failed")
        rest = path[2:]
        if rest == ["status"]:
            return {"uptime": 1}
        if rest[:1] == ["storage"] and rest[2:] == ["content"]:
            return [{"volid": v} for v in self.templates if v.startswith(rest[1] + ":")]
        if rest[0] == "tasks":
            upid = rest[1]
            if rest[2] == "status":
                return self.tasks[upid]
            if rest[2] == "log":
                return [{"n": 1, "t": "starting"}, {"n": 2, "t": f"TASK ERROR: {self.tasks[upid]['exitstatus']}"}]
        if rest == ["lxc"]:
            if method == "GET":
                return [{"vmid": vmid, "status": ct["status"]} for vmid, ct in self.cts.items()]
            vmid = int(params.pop("vmid"))
            params.pop("ostemplate")
            for key in ("password", "ssh-public-keys", "pool"):
                params.pop(key, None)
            self.check_perm(params)
            config = dict(params)
            if "rootfs" in config and config["rootfs"].count(":") == 1 and config["rootfs"].split(":")[1].isdigit():
                storage, gib = config["rootfs"].split(":")
                config["rootfs"] = f"{storage}:vm-{vmid}-disk-0,size={gib}G"
            for key in [k for k in config if k.startswith("net")]:
                config[key] += ",hwaddr=BC:24:11:00:00:01,type=veth"
            for key in ("memory", "swap", "cores", "unprivileged"):
                if key in config:
                    config[key] = int(config[key])
            upid, ok = self.task("vzcreate", vmid)
            if ok:
                self.cts[vmid] = {"config": config, "status": "stopped"}
            return upid
        vmid = int(rest[1])
        if vmid not in self.cts:
            raise ResourceException(500, "Internal Server Error", f"Configuration file 'nodes/{NODE}/lxc/{vmid}.conf' does not exist")
        ct = self.cts[vmid]
        sub = rest[2:]
        if sub == [] and method == "DELETE":
            upid, ok = self.task("vzdestroy", vmid)
            if ok:
                del self.cts[vmid]
            return upid
        if sub == ["config"] and method == "GET":
            return {**ct["config"], "digest": self.digest(ct["config"])}
        if sub == ["config"] and method == "PUT":
            if self.concurrent_change:
                ct["config"]["description"] = "changed by someone else"
            digest = params.pop("digest", None)
            if digest and digest != self.digest(ct["config"]):
                raise ResourceException(
                    500, "Internal Server Error", "detected modified configuration - file changed by other user? Try again."
                )
            delete = [k for k in params.pop("delete", "").split(",") if k]
            self.check_perm(list(params) + delete)
            for key in delete:
                ct["config"].pop(key, None)
            ct["config"].update(params)
            return None
        if sub == ["pending"]:
            return []
        if sub == ["status"] and rest == ["status"]:
            return {}
        if sub == ["status", "current"]:
            return {"status": ct["status"], "vmid": vmid}
        if sub[0] == "status" and method == "POST":
            action = sub[1]
            upid, ok = self.task({"start": "vzstart", "shutdown": "vzshutdown", "stop": "vzstop"}[action], vmid)
            if ok:
                ct["status"] = "running" if action == "start" else "stopped"
            return upid
        raise AssertionError(f"unexpected call {method} {path}")

    def writes(self):
        return [c for c in self.calls if c[0] != "GET"]


BASE = dict(vmid=198, node=NODE, api_host="127.0.0.1", api_user="root@pam", api_password="secret")
DECLARED = dict(
    ostemplate="local:vztmpl/debian-13-standard_13.1-1_amd64.tar.zst",
    hostname="gpu-198",
    cores=2,
    memory_mib=2048,
    swap_mib=0,
    rootfs="local-lvm:8",
    net={"net0": "name=eth0,bridge=vmbr0,ip=dhcp"},
    features={"nesting": True},
    gpu_passthrough=2,
)


@pytest.fixture(autouse=True)
def no_sleep(monkeypatch):
    monkeypatch.setattr(pve_client.time, "sleep", lambda _s: None)


def run(monkeypatch, capsys, fake, args, method="password"):
    monkeypatch.setattr(
        pve_lxc,
        "connect",
        lambda module: (fake, dict(method=method, user=module.params["api_user"], url="https://127.0.0.1:8006")),
    )
    with patch_module_args(args):
        with pytest.raises(SystemExit):
            pve_lxc.main()
    out = capsys.readouterr().out
    return json.loads(out)


def test_create_then_idempotent(monkeypatch, capsys):
    fake = FakePVE()
    res = run(monkeypatch, capsys, fake, {**BASE, **DECLARED, "state": "started"})
    assert res["changed"] is True and res["created"] is True, res
    assert res["status"] == "running"
    config = fake.cts[198]["config"]
    assert config["dev0"] == "/dev/nvidia0" and config["dev4"] == "/dev/nvidia-uvm-tools"
    assert config["rootfs"] == "local-lvm:vm-198-disk-0,size=8G"
    assert "password" not in json.dumps(fake.calls)
    assert "dev2: /dev/nvidiactl" in res["diff"]["after"]

    fake.calls.clear()
    res = run(monkeypatch, capsys, fake, {**BASE, **DECLARED, "state": "started"})
    assert res["changed"] is False, res["changes"]
    assert fake.writes() == []
    assert res["diff"]["before"] == res["diff"]["after"]


def test_check_mode_create_sends_nothing(monkeypatch, capsys):
    fake = FakePVE()
    res = run(monkeypatch, capsys, fake, {**BASE, **DECLARED, "_ansible_check_mode": True, "_ansible_diff": True})
    assert res["changed"] is True and res["created"] is True
    assert fake.writes() == []
    assert res["diff"]["before"] == ""
    assert "memory: 2048" in res["diff"]["after"]


def test_update_uses_digest_and_delete(monkeypatch, capsys):
    fake = FakePVE()
    run(monkeypatch, capsys, fake, {**BASE, **DECLARED})
    fake.cts[198]["config"]["description"] = "old"
    fake.calls.clear()
    res = run(monkeypatch, capsys, fake, {**BASE, **DECLARED, "memory_mib": 4096, "gpu_passthrough": 1,
                                          "extra_config": {"description": None}})
    assert res["changed"] is True
    puts = [c for c in fake.calls if c[0] == "PUT"]
    assert len(puts) == 1
    params = puts[0][2]
    assert params["memory"] == "4096"
    assert params["digest"]
    assert set(params["delete"].split(",")) == {"description", "dev1"}
    assert "-memory: 2048" not in res["diff"]["before"]  # conf text, not a unified diff
    assert "memory: 2048" in res["diff"]["before"] and "memory: 4096" in res["diff"]["after"]


def test_a_passthrough_change_on_a_running_container_asks_for_a_restart(monkeypatch, capsys):
    fake = FakePVE()
    res = run(monkeypatch, capsys, fake, {**BASE, **DECLARED, "state": "started"})
    assert res["status_before"] == "absent" and res["restart_needed"] is False
    res = run(monkeypatch, capsys, fake, {**BASE, **DECLARED, "state": "started", "cores": 4})
    assert res["status_before"] == "running" and res["restart_needed"] is False  # not a device key
    res = run(monkeypatch, capsys, fake, {**BASE, **DECLARED, "state": "started", "cores": 4, "gpu_passthrough": 1})
    assert res["changes"]["delete"] == ["dev1"] and res["restart_needed"] is True
    assert fake.cts[198]["status"] == "running"  # left to the caller
    res = run(monkeypatch, capsys, fake, {**BASE, **DECLARED, "state": "started", "cores": 4, "gpu_passthrough": 1})
    assert res["changed"] is False and res["restart_needed"] is False
    fake.cts[198]["status"] = "stopped"
    res = run(monkeypatch, capsys, fake, {**BASE, **DECLARED, "state": "started", "cores": 4})
    assert res["status_before"] == "stopped" and res["restart_needed"] is False and res["status"] == "running"


def test_check_mode_update_sends_nothing(monkeypatch, capsys):
    fake = FakePVE()
    run(monkeypatch, capsys, fake, {**BASE, **DECLARED})
    fake.calls.clear()
    res = run(monkeypatch, capsys, fake, {**BASE, **DECLARED, "cores": 4, "_ansible_check_mode": True})
    assert res["changed"] is True and res["changes"]["set"] == {"cores": "4"}
    assert fake.writes() == []
    assert fake.cts[198]["config"]["cores"] == 2


def test_concurrent_change_is_refused(monkeypatch, capsys):
    fake = FakePVE()
    run(monkeypatch, capsys, fake, {**BASE, **DECLARED})
    fake.concurrent_change = True
    res = run(monkeypatch, capsys, fake, {**BASE, **DECLARED, "cores": 4})
    assert res["failed"] is True
    assert res["error_kind"] == "digest_mismatch"
    assert "Re-run" in res["msg"]


def test_token_with_devn_fails_before_any_write(monkeypatch, capsys):
    fake = FakePVE(user="root@pam!ansible")
    args = {k: v for k, v in BASE.items() if k != "api_password"}
    args.update(DECLARED, api_token_id="ansible", api_token_secret="uuid")
    res = run(monkeypatch, capsys, fake, args, method="token")
    assert res["failed"] is True
    assert res["error_kind"] == "passthrough_root_only"
    assert "api_password" in res["msg"] and "root@pam" in res["msg"]
    assert fake.writes() == []


def test_token_refusal_from_api_is_explained(monkeypatch, capsys):
    # A login the pre-check believes in (e.g. a server that says otherwise): the 403 is explained.
    fake = FakePVE(user="someone@pve")
    res = run(monkeypatch, capsys, fake, {**BASE, **DECLARED})
    assert res["failed"] is True
    assert res["error_kind"] == "passthrough_root_only"
    assert "configuring device passthrough is only allowed for root@pam" in res["msg"]
    assert "api_user: root@pam" in res["msg"]


def test_token_without_devn_change_is_fine(monkeypatch, capsys):
    fake = FakePVE()
    run(monkeypatch, capsys, fake, {**BASE, **DECLARED})
    fake.user = "root@pam!ansible"
    args = {k: v for k, v in BASE.items() if k != "api_password"}
    args.update(DECLARED, memory_mib=3072, api_token_id="ansible", api_token_secret="uuid")
    res = run(monkeypatch, capsys, fake, args, method="token")
    assert res["changed"] is True and res["changes"]["set"] == {"memory": "3072"}


def test_stopped_and_absent(monkeypatch, capsys):
    fake = FakePVE()
    run(monkeypatch, capsys, fake, {**BASE, **DECLARED, "state": "started"})
    res = run(monkeypatch, capsys, fake, {**BASE, "state": "stopped"})
    assert res["changed"] is True and res["stop_method"] == "shutdown" and res["status"] == "stopped"
    res = run(monkeypatch, capsys, fake, {**BASE, "state": "absent"})
    assert res["changed"] is True and 198 not in fake.cts
    assert "hostname: gpu-198" in res["diff"]["before"] and res["diff"]["after"] == ""
    res = run(monkeypatch, capsys, fake, {**BASE, "state": "absent"})
    assert res["changed"] is False and res["status"] == "absent"


def test_shutdown_failure_falls_back_to_stop(monkeypatch, capsys):
    fake = FakePVE()
    run(monkeypatch, capsys, fake, {**BASE, **DECLARED, "state": "started"})
    fake.task_exit["vzshutdown"] = "container did not stop"
    res = run(monkeypatch, capsys, fake, {**BASE, "state": "stopped", "shutdown_timeout": 5})
    assert res["stop_method"] == "stop" and fake.cts[198]["status"] == "stopped"
    shutdown = [c for c in fake.calls if c[1].endswith("status/shutdown")]
    assert shutdown[-1][2] == {"timeout": 5}


def test_failed_task_reports_exitstatus(monkeypatch, capsys):
    fake = FakePVE()
    run(monkeypatch, capsys, fake, {**BASE, **DECLARED})
    fake.task_exit["vzstart"] = "startup for container '198' failed"
    res = run(monkeypatch, capsys, fake, {**BASE, "state": "started"})
    assert res["failed"] is True
    assert res["task_exitstatus"] == "startup for container '198' failed"
    assert "TASK ERROR" in res["msg"]


def test_missing_ostemplate_and_bad_input(monkeypatch, capsys):
    fake = FakePVE()
    res = run(monkeypatch, capsys, fake, {**BASE, "hostname": "x"})
    assert res["failed"] is True and "ostemplate is not set" in res["msg"]
    res = run(monkeypatch, capsys, fake, {**BASE, **DECLARED, "gpu_passthrough": ["nvidia0"]})
    assert res["failed"] is True and "must start with /dev/" in res["msg"]
    assert fake.writes() == []


def test_connect_errors_are_classified(monkeypatch, capsys):
    class Refused(Exception):
        pass

    Refused.__name__ = "ConnectionError"

    def boom(*_a, **_k):
        raise Refused("HTTPSConnectionPool(host='127.0.0.1', port=8006): [Errno 111] Connection refused")

    monkeypatch.setattr(pve_lxc, "ProxmoxAPI", boom)
    with patch_module_args({**BASE}):
        with pytest.raises(SystemExit):
            pve_lxc.main()
    res = json.loads(capsys.readouterr().out)
    assert res["failed"] is True and res["error_kind"] == "connection_refused"
    assert "api_port" in res["msg"]


def test_connect_passes_ca_path(monkeypatch, capsys, tmp_path):
    seen = {}

    class API:
        def __init__(self, host, **kwargs):
            seen.update(kwargs, host=host)
            self.version = self

        def get(self):
            return {"version": "8.4"}

    monkeypatch.setattr(pve_lxc, "ProxmoxAPI", API)
    monkeypatch.setattr(pve_lxc.PveLxc, "run", lambda self: dict(changed=False))
    ca = tmp_path / "ca.pem"
    ca.write_text("x")
    with patch_module_args({**BASE, "ca_path": str(ca)}):
        with pytest.raises(SystemExit):
            pve_lxc.main()
    capsys.readouterr()
    assert seen["verify_ssl"] == str(ca)
    assert seen["user"] == "root@pam" and seen["password"] == "secret"


# ---------------------------------------------------------------- ownership (owner_tag) and state=query


OWNED = dict(owner_tag="inferops-gpu")


def test_create_tags_the_container_and_a_rerun_keeps_it_unchanged(monkeypatch, capsys):
    fake = FakePVE()
    res = run(monkeypatch, capsys, fake, {**BASE, **DECLARED, **OWNED, "state": "started"})
    assert res["created"] and fake.cts[198]["config"]["tags"] == "inferops-gpu"
    fake.calls.clear()
    res = run(monkeypatch, capsys, fake, {**BASE, **DECLARED, **OWNED, "state": "started"})
    assert res["changed"] is False and fake.writes() == []


def test_an_existing_container_without_the_tag_is_refused_before_any_change(monkeypatch, capsys):
    fake = FakePVE()
    run(monkeypatch, capsys, fake, {**BASE, **DECLARED, "state": "started"})  # someone else's CT 198
    before = json.dumps(fake.cts, sort_keys=True)
    fake.calls.clear()
    res = run(monkeypatch, capsys, fake, {**BASE, **DECLARED, **OWNED, "memory_mib": 4096, "state": "started"})
    assert res["failed"] and res["error_kind"] == "not_owned" and "adopt" in res["msg"]
    assert fake.writes() == [] and json.dumps(fake.cts, sort_keys=True) == before
    res = run(monkeypatch, capsys, fake, {**BASE, "vmid": 198, "state": "query", **OWNED})
    assert res["failed"] and res["error_kind"] == "not_owned"


def test_adopt_takes_the_container_over_and_keeps_its_tags(monkeypatch, capsys):
    fake = FakePVE()
    run(monkeypatch, capsys, fake, {**BASE, **DECLARED, "extra_config": {"tags": "team-a"}, "state": "started"})
    res = run(monkeypatch, capsys, fake, {**BASE, **DECLARED, **OWNED, "extra_config": {"tags": "team-a"}, "adopt": True,
                                          "state": "started"})
    assert res["changed"] and fake.cts[198]["config"]["tags"] == "inferops-gpu;team-a"


def test_query_reads_only_and_refuses_a_missing_template(monkeypatch, capsys):
    fake = FakePVE()
    res = run(monkeypatch, capsys, fake, {**BASE, "vmid": 198, "state": "query", **OWNED,
                                          "ostemplate": DECLARED["ostemplate"]})
    assert res["exists"] is False and res["template_present"] is True and res["status"] == "absent"
    res = run(monkeypatch, capsys, fake, {**BASE, "vmid": 198, "state": "query", "ostemplate": "local:vztmpl/nope.tar.zst"})
    assert res["failed"] and res["error_kind"] == "template_missing" and "pveam download local nope.tar.zst" in res["msg"]
    run(monkeypatch, capsys, fake, {**BASE, **DECLARED, **OWNED, "state": "started"})
    fake.calls.clear()
    res = run(monkeypatch, capsys, fake, {**BASE, "vmid": 198, "state": "query", **OWNED})
    assert res["exists"] and res["status"] == "running" and res["tags"] == ["inferops-gpu"]
    assert fake.writes() == []


def test_a_vmid_another_node_has_is_refused_before_any_change(monkeypatch, capsys):
    # PVE keeps one VMID list for the cluster: creating CT 198 here when pve2 has it would fail only at the create.
    fake = FakePVE()
    fake.elsewhere = {198: "pve2"}
    res = run(monkeypatch, capsys, fake, {**BASE, "vmid": 198, "state": "query", **OWNED, "ostemplate": DECLARED["ostemplate"]})
    assert res["failed"] and res["error_kind"] == "vmid_on_other_node"
    assert res["msg"].startswith("CT 198 does not exist on node %s but on node pve2 of the cluster" % NODE)
    res = run(monkeypatch, capsys, fake, {**BASE, **DECLARED, **OWNED, "state": "started"})
    assert res["failed"] and res["error_kind"] == "vmid_on_other_node" and "Nothing has been changed" in res["msg"]
    assert fake.writes() == [] and 198 not in fake.cts
    fake.elsewhere = {}
    res = run(monkeypatch, capsys, fake, {**BASE, **DECLARED, **OWNED, "state": "started"})
    assert res["created"] and 198 in fake.cts
