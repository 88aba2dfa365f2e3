# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""
gpu_watch: an Event-Driven Ansible event source that watches the GPU containers of an inventory and emits one event
per container whose state needs the recovery ladder (docs/recover.md, "Unattended recovery").

It only reads. Every poll runs the collection's own read-only module inferops.gpu_inference.gpu_diagnose on the
container's Proxmox VE node (ansible ad-hoc, through the same inventory, connection and vault as recover.yml), so the
verdict, its reasons and the findings come from recover_gate.judge and nowhere else. Which of them are a fault, the
debounce, the cool-down and the budget are decided by plugins/module_utils/eda_watch.py.

Arguments (all optional but inventory):
  inventory: the inventory recover.yml runs with (path); only its sglang_containers are watched.
  interval: seconds between polls (default 15).
  debounce: seconds a fault must persist (seen twice at least this far apart) before an event (default 30).
  cooldown: seconds after a recover event before another for the same container while it stays faulty (1800).
  budget: recover events per container per budget_window seconds (3), then one alert and no more for it.
  budget_window: the budget's window in seconds (3600).
  samples, sample_interval: gpu_diagnose's (1 sample; the debounce is the second look).
  service: the unit inside the container (sglang.service).
  ansible: the ansible command (default "ansible" on PATH); ansible_inventory likewise.
  once: stop after this many polls (tests); 0 (default) runs until stopped.

Each event: {"inferops_gpu_watch": true, "action": "recover" | "alert_budget_exhausted", "host", "vmid", "node",
"kinds", "reasons", "verdict", "recommended_rung", "relaunch", "message", "first_seen", "detected_at",
"recoveries_in_window"}. A poll that cannot read a node is logged, never an event.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
import time
from typing import Any

logger = logging.getLogger(__name__)


def _collections_root() -> str:
    """The directory holding ansible_collections/ (this file is .../ansible_collections/inferops/gpu_inference/
    extensions/eda/plugins/event_source/gpu_watch.py), so that the collection's module_utils import without Ansible."""
    path = os.path.abspath(__file__)
    while path != os.path.dirname(path):
        path = os.path.dirname(path)
        if os.path.basename(path) == "ansible_collections":
            return os.path.dirname(path)
    raise RuntimeError("gpu_watch.py must run from an installed collection (.../ansible_collections/inferops/...)")


try:
    from ansible_collections.inferops.gpu_inference.plugins.module_utils import eda_watch
except ImportError:
    sys.path.insert(0, _collections_root())
    from ansible_collections.inferops.gpu_inference.plugins.module_utils import eda_watch


async def _run(argv: list[str], env: dict[str, str]) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
                                                env=env)
    out, err = await proc.communicate()
    return proc.returncode, out.decode(errors="replace"), err.decode(errors="replace")


async def read_inventory(args: dict[str, Any], env: dict[str, str]) -> list[eda_watch.Watched]:
    rc, out, err = await _run([args.get("ansible_inventory", "ansible-inventory"), "-i", args["inventory"], "--list"], env)
    if rc != 0:
        raise RuntimeError("ansible-inventory -i %s --list failed (rc %d): %s" % (args["inventory"], rc, err.strip()[-2000:]))
    return eda_watch.watched_containers(json.loads(out))


async def diagnose(args: dict[str, Any], env: dict[str, str], watched: eda_watch.Watched,
                   all_watched: list[eda_watch.Watched], kernel_since: Any) -> dict[str, Any]:
    """gpu_diagnose on the container's node; the module's result, or {"failed": True, "msg": ...}."""
    options = {"vmid": watched.vmid, "node": watched.node_host, "declared": eda_watch.declared(all_watched),
               "service": args.get("service", "sglang.service"), "samples": int(args.get("samples", 1)),
               "sample_interval": float(args.get("sample_interval", 2))}
    if kernel_since is not None:
        options["kernel_since_seq"] = kernel_since
    argv = [args.get("ansible", "ansible"), watched.node_host, "-i", args["inventory"],
            "-m", "inferops.gpu_inference.gpu_diagnose", "-a", json.dumps(options)]
    rc, out, err = await _run(argv, dict(env, ANSIBLE_LOAD_CALLBACK_PLUGINS="1", ANSIBLE_STDOUT_CALLBACK="ansible.posix.json"))
    try:
        doc = json.loads(out)
        result = doc["plays"][0]["tasks"][0]["hosts"][watched.node_host]
    except (ValueError, KeyError, IndexError, TypeError):
        return {"failed": True, "msg": "ansible rc %d: %s" % (rc, (err or out).strip()[-2000:])}
    return result


async def main(queue: asyncio.Queue, args: dict[str, Any]) -> None:
    if not args.get("inventory"):
        raise ValueError("gpu_watch: the argument inventory (the inventory recover.yml runs with) is required")
    settings = eda_watch.PolicySettings(debounce_s=float(args.get("debounce", 30)),
                                        cooldown_s=float(args.get("cooldown", 1800)),
                                        budget=int(args.get("budget", 3)),
                                        budget_window_s=float(args.get("budget_window", 3600)))
    interval = float(args.get("interval", 15))
    once = int(args.get("once", 0))
    env = dict(os.environ)
    policy = eda_watch.Policy(settings)
    watched = await read_inventory(args, env)
    logger.info("gpu_watch: watching %s", ", ".join("CT %d (%s on %s)" % (w.vmid, w.host, w.node_host) for w in watched))
    cursors: dict[int, Any] = {}
    polls = 0
    while True:
        started = time.time()
        for w in watched:
            diag = await diagnose(args, env, w, watched, cursors.get(w.vmid))
            if diag.get("failed") or diag.get("unreachable"):
                logger.warning("gpu_watch: CT %d on %s not read: %s", w.vmid, w.node_host, diag.get("msg"))
                continue
            if cursors.get(w.vmid) is None:
                cursors[w.vmid] = diag.get("kernel_cursor")
            event = policy.observe(w, diag, time.time())
            if event is None:
                continue
            # Xids before this event are the recovery's evidence, not a new fault: the next poll takes a new cursor.
            cursors.pop(w.vmid, None)
            event["poll_interval"] = interval
            logger.info("gpu_watch: event at %.3f: %s", event["detected_at"], event["message"])
            await queue.put(event)
        polls += 1
        logger.info("gpu_watch: poll %d of %d container(s) took %.1f s", polls, len(watched), time.time() - started)
        if once and polls >= once:
            return
        await asyncio.sleep(max(0.0, interval - (time.time() - started)))


if __name__ == "__main__":

    class _MockQueue(asyncio.Queue):
        async def put(self, item):  # noqa: D401 - print what would be emitted
            print(json.dumps(item))

    logging.basicConfig(level=logging.INFO)
    asyncio.run(main(_MockQueue(), {"inventory": sys.argv[1], "once": int(sys.argv[2]) if len(sys.argv) > 2 else 1,
                                    "debounce": 0, "interval": 1}))
