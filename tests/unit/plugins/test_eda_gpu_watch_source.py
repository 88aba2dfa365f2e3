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
