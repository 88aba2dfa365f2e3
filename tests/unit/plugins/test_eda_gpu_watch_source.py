# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The event source gpu_watch run in-process with stand-ins for the ansible-inventory and ansible commands (canned
output in the formats they print): the inventory's containers only are read, each with gpu_diagnose on its node with
the declared list, the kernel cursor carried from poll to poll, and the events the policy decides are put on the queue.
The real commands against the lab: tests/eda/run_unattended.py."""
from __future__ import annotations

import asyncio
import json
import os
import runpy
import stat

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
SOURCE = os.path.join(ROOT, "extensions", "eda", "plugins", "event_source", "gpu_watch.py")

INVENTORY = {
    "_meta": {"hostvars": {"ct129": {"proxmox_vmid": 129}, "ct132": {"proxmox_vmid": 132, "gpu_recover_eda_relaunch": True}}},
    "proxmox_nodes": {"hosts": ["pve1"]},
    "sglang_containers": {"hosts": ["ct129", "ct132"]},
    "other": {"hosts": ["ct130"]},
}


def script(path, body):
    with open(path, "w") as f:
        f.write("#!/usr/bin/env python3\nimport json, sys\n" + body)
    os.chmod(path, os.stat(path).st_mode | stat.S_IEXEC)
    return str(path)


def test_source_reads_the_inventory_and_emits_the_policy_events(tmp_path):
    calls = tmp_path / "calls.jsonl"
    inv = script(tmp_path / "ansible-inventory", "print(json.dumps(%r))\n" % (INVENTORY,))
    ansible = script(tmp_path / "ansible", """
args = json.loads(sys.argv[sys.argv.index("-a") + 1])
open(%r, "a").write(json.dumps({"argv": sys.argv[1:], "args": args}) + "\\n")
stuck = 1 if args["vmid"] == 132 else 0
diag = {"verdict": "Not clean" if stuck else "Clean", "reasons": ["stuck"] if stuck else [], "kernel_cursor": 41,
        "findings": {"stuck": stuck, "holders": 0, "service_active": True}, "evidence": {},
        "recommended_rung": 3 if stuck else 0, "recommended_rung_name": "x"}
print(json.dumps({"plays": [{"tasks": [{"hosts": {sys.argv[1]: diag}}]}]}))
""" % str(calls))
    mod = runpy.run_path(SOURCE)
    events = []

    class Queue:
        async def put(self, item):
            events.append(item)

    asyncio.run(mod["main"](Queue(), {"inventory": "inv", "ansible": ansible, "ansible_inventory": inv, "interval": 0,
                                      "debounce": 0, "cooldown": 1000, "budget": 1, "once": 3}))
    seen = [json.loads(line) for line in calls.read_text().splitlines()]
    assert [c["args"]["vmid"] for c in seen] == [129, 132] * 3          # CT 130 is in no watched group
    assert all(c["argv"][0] == "pve1" and "inferops.gpu_inference.gpu_diagnose" in c["argv"] for c in seen)
    assert seen[0]["args"]["declared"] == [{"host": "ct129", "vmid": 129, "node_host": "pve1", "adopt": False},
                                           {"host": "ct132", "vmid": 132, "node_host": "pve1", "adopt": False}]
    # The first poll takes the kernel cursor; the next ones pass it (Xids since then are new) until an event.
    assert "kernel_since_seq" not in seen[0]["args"] and seen[2]["args"]["kernel_since_seq"] == 41
    assert "kernel_since_seq" not in seen[3]["args"] and seen[5]["args"]["kernel_since_seq"] == 41
    assert len(events) == 1 and events[0]["vmid"] == 132 and events[0]["action"] == "recover"
    assert events[0]["relaunch"] is True and events[0]["kinds"] == ["stuck_processes"]


def test_an_unreadable_node_is_no_event(tmp_path):
    inv = script(tmp_path / "ansible-inventory", "print(json.dumps(%r))\n" % (INVENTORY,))
    ansible = script(tmp_path / "ansible", "print('not json'); sys.exit(4)\n")
    mod = runpy.run_path(SOURCE)
    events = []

    class Queue:
        async def put(self, item):
            events.append(item)

    asyncio.run(mod["main"](Queue(), {"inventory": "inv", "ansible": ansible, "ansible_inventory": inv, "interval": 0,
                                      "debounce": 0, "once": 2}))
    assert events == []


INVENTORY2 = {
    "_meta": {"hostvars": {"ct129": {"proxmox_vmid": 129}, "ct132": {"proxmox_vmid": 132},
                           "ct140": {"proxmox_vmid": 140, "pve_gpu_container_node_host": "pve2"}}},
    "proxmox_nodes": {"hosts": ["pve1", "pve2"]},
    "sglang_containers": {"hosts": ["ct129", "ct132", "ct140"]},
}

CLEAN = ('{"verdict": "Clean", "reasons": [], "kernel_cursor": 1, "findings": {"stuck": 0, "holders": 0, '
         '"service_active": True}, "evidence": {}, "recommended_rung": 0, "recommended_rung_name": "x"}')


def run_source(tmp_path, ansible_body, **args):
    inv = script(tmp_path / "ansible-inventory", "print(json.dumps(%r))\n" % (INVENTORY2,))
    ansible = script(tmp_path / "ansible", ansible_body)
    mod = runpy.run_path(SOURCE)
    events = []

    class Queue:
        async def put(self, item):
            events.append(item)

    asyncio.run(mod["main"](Queue(), dict({"inventory": "inv", "ansible": ansible, "ansible_inventory": inv,
                                           "interval": 0, "debounce": 0}, **args)))
    return events


def alive(pid):
    """Whether the process runs (a zombie waiting for its parent has ended)."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_a_node_that_never_answers_is_killed_at_the_bound_and_becomes_one_event(tmp_path):
    """pve1's reads hang (an ssh that never connects, a tenant's FUSE mount): each is killed at read_timeout with the
    processes it started, its second container is not asked in that poll, pve2 is read meanwhile, and after
    unreachable_polls polls pve1 is one node_unreachable event; the metrics file says so."""
    pids = tmp_path / "pids"
    body = """
import os, subprocess, time
host = sys.argv[1]
if host == "pve1":
    child = subprocess.Popen(["sleep", "3600"])      # what ansible starts (ssh): killed with it
    open(%r, "a").write("%%d %%d\\n" %% (os.getpid(), child.pid))
    time.sleep(3600)
print(json.dumps({"plays": [{"tasks": [{"hosts": {host: %s}}]}]}))
""" % (str(pids), CLEAN)
    metrics = tmp_path / "watch.prom"
    events = run_source(tmp_path, body, read_timeout=1, unreachable_polls=3, once=4, metrics_file=str(metrics))
    assert [(e["action"], e["node"]) for e in events] == [("node_unreachable", "pve1")]
    e = events[0]
    assert e["vmids"] == [129, 132] and e["failed_polls"] == 3 and e["last_read_at"] is None
    assert "CT 129: timed_out: no answer within read_timeout (1 s): killed" in e["reasons"]
    assert "CT 132: unreachable: not asked: the node did not answer this poll" in e["reasons"]
    started = [tuple(map(int, line.split())) for line in pids.read_text().splitlines()]
    assert len(started) == 4                           # one read of pve1 per poll: CT 132 was not asked
    assert not any(alive(pid) for pair in started for pid in pair)
    text = metrics.read_text()
    assert 'inferops_watch_node_up{node="pve1"} 0\n' in text and 'inferops_watch_node_up{node="pve2"} 1\n' in text
    assert 'inferops_watch_node_failed_polls{node="pve1"} 4\n' in text
    assert 'inferops_watch_budget_exhausted{node="pve1",vmid="129"} 0\n' in text


def test_an_unreachable_node_then_back(tmp_path):
    """ansible's own verdict (unreachable: true, rc 4) for pve1 in polls 2-4, then pve1 answers again."""
    count = tmp_path / "count"
    body = """
import os
host = sys.argv[1]
args = json.loads(sys.argv[sys.argv.index("-a") + 1])
n = len(open(%r).read()) if os.path.exists(%r) else 0
if args["vmid"] == 129:
    open(%r, "a").write("x")
if host == "pve1" and n in (1, 2, 3):
    print(json.dumps({"plays": [{"tasks": [{"hosts": {host: {"unreachable": True, "changed": False,
          "msg": "Failed to connect to the host via ssh: ssh: connect to host 10.0.0.1 port 22: Connection refused"}}}]}]}))
    sys.exit(4)
print(json.dumps({"plays": [{"tasks": [{"hosts": {host: %s}}]}]}))
""" % (str(count), str(count), str(count), CLEAN)
    events = run_source(tmp_path, body, unreachable_polls=2, once=6)
    assert [(e["action"], e["node"]) for e in events] == [("node_unreachable", "pve1"), ("node_reachable", "pve1")]
    assert "Connection refused" in events[0]["reasons"][0] and events[0]["failed_polls"] == 2
    assert events[1]["failed_polls"] == 3


def test_bad_read_timeout_refused(tmp_path):
    mod = runpy.run_path(SOURCE)
    try:
        asyncio.run(mod["main"](None, {"inventory": "inv", "read_timeout": "soon"}))
    except ValueError as exc:
        assert "read_timeout must be a number of seconds > 0" in str(exc)
    else:
        raise AssertionError("read_timeout 'soon' accepted")
