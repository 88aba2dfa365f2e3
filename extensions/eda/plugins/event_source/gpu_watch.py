# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""
gpu_watch: an Event-Driven Ansible event source that watches the GPU containers of an inventory and emits one event
per container whose state needs the recovery ladder (docs/recover.md, "Unattended recovery").

It only reads. Every poll runs the collection's own read-only module inferops.gpu_inference.gpu_diagnose on the
container's Proxmox VE node (ansible ad-hoc, through the same inventory, connection and vault as recover.yml), so the
verdict, its reasons and the findings come from recover_gate.judge and nowhere else. Which of them are a fault, the
debounce, the cool-down and the budget are decided by plugins/module_utils/recover/eda_watch.py.

Arguments (all optional but inventory):
  inventory: the inventory recover.yml runs with (path); only its sglang_containers are watched.
  interval: seconds between polls (default 15).
  debounce: seconds a fault must persist (seen twice at least this far apart) before an event (default 30).
  cooldown: seconds after a recover event before another for the same container while it stays faulty (1800).
  budget: recover events per container per budget_window seconds (3), then one alert and no more for it.
  budget_window: the budget's window in seconds (3600).
  unreachable_polls: polls in a row in which no container of a node is read before the node is an event (3).
  read_timeout: seconds one read of a container (ansible running gpu_diagnose on its node) may take (300); past it
    the read is killed, with every process it started, and counts as the node not answering.
  metrics_file: a node_exporter textfile (*.prom) on the machine the source runs on, written whole after each poll:
    inferops_watch_node_up, inferops_watch_budget_exhausted and the poll's time, which the shipped Prometheus rules
    (extensions/eda/prometheus/inferops-gpu-rules.yml) alert on; empty (default): none.
  samples, sample_interval: gpu_diagnose's (1 sample; the debounce is the second look).
  service: the unit inside the container (sglang.service).
  ansible: the ansible command (default "ansible" on PATH); ansible_inventory likewise.
  once: stop after this many polls (tests); 0 (default) runs until stopped.

Each poll reads the nodes at the same time, and the containers of one node one after the other; a node that did not
answer one read (unreachable, or killed at read_timeout) is not asked again for its other containers in that poll, so
a poll takes at most read_timeout times the containers of the largest node, whatever a node or a tenant does.

Each container event: {"inferops_gpu_watch": true, "action": "recover" | "alert_budget_exhausted", "host", "vmid",
"node", "kinds", "reasons", "verdict", "recommended_rung", "relaunch", "message", "first_seen", "detected_at",
"recoveries_in_window"}. Each node event: {"inferops_gpu_watch": true, "action": "node_unreachable" |
"node_reachable", "node", "vmids", "failed_polls", "reasons" (unreachable), "unreachable_s" (reachable), "message",
"detected_at"}: node_unreachable once per outage, after unreachable_polls polls in a row in which no container of the
node was read (a single failed poll is only logged), node_reachable at the first read after it
(plugins/module_utils/recover/eda_watch.py, Policy.observe_node).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import sys
import tempfile
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
    from ansible_collections.inferops.gpu_inference.plugins.module_utils.recover import eda_watch, metrics_textfile
except ImportError:
    sys.path.insert(0, _collections_root())
    from ansible_collections.inferops.gpu_inference.plugins.module_utils.recover import eda_watch, metrics_textfile


INVENTORY_TIMEOUT_S = 60.0
_REAP_TIMEOUT_S = 10.0


def _kill_group(proc: asyncio.subprocess.Process) -> None:
    """SIGKILL the process group the read started (ansible, its workers, ssh): start_new_session made it its own.
    Only while its leader is not reaped, so the group's number cannot have been given to another process."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


async def _run(argv: list[str], env: dict[str, str], timeout_s: float) -> tuple[int, str, str, bool]:
    """(rc, stdout, stderr, timed_out) of a command, killed with every process it started past ``timeout_s``."""
    proc = await asyncio.create_subprocess_exec(*argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.PIPE, env=env, start_new_session=True)
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout_s)
    except asyncio.TimeoutError:
        _kill_group(proc)
        try:
            await asyncio.wait_for(proc.wait(), _REAP_TIMEOUT_S)
        except asyncio.TimeoutError:
            logger.error("gpu_watch: %s did not end %.0f s after SIGKILL", argv[0], _REAP_TIMEOUT_S)
        return -1, "", "", True
    except asyncio.CancelledError:
        _kill_group(proc)
        raise
    return proc.returncode, out.decode(errors="replace"), err.decode(errors="replace"), False


def _positive(args: dict[str, Any], name: str, default: float) -> float:
    value = args.get(name, default)
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = -1.0
    if not number > 0:
        raise ValueError("gpu_watch: %s must be a number of seconds > 0, got %r" % (name, value))
    return number


async def read_inventory(args: dict[str, Any], env: dict[str, str]) -> list[eda_watch.Watched]:
    argv = [args.get("ansible_inventory", "ansible-inventory"), "-i", args["inventory"], "--list"]
    rc, out, err, timed_out = await _run(argv, env, INVENTORY_TIMEOUT_S)
    if timed_out:
        raise RuntimeError("ansible-inventory -i %s --list did not end within %.0f s" % (args["inventory"], INVENTORY_TIMEOUT_S))
    if rc != 0:
        raise RuntimeError("ansible-inventory -i %s --list failed (rc %d): %s" % (args["inventory"], rc, err.strip()[-2000:]))
    return eda_watch.watched_containers(json.loads(out))


async def diagnose(args: dict[str, Any], env: dict[str, str], watched: eda_watch.Watched,
                   all_watched: list[eda_watch.Watched], kernel_since: Any) -> tuple[str, dict[str, Any]]:
    """gpu_diagnose on the container's node, bounded by read_timeout: (outcome, the module's result or
    {"msg": why}), outcome one of eda_watch.READ_OUTCOMES."""
    options = {"vmid": watched.vmid, "node": watched.node_host, "declared": eda_watch.declared(all_watched),
               "service": args.get("service", "sglang.service"), "samples": int(args.get("samples", 1)),
               "sample_interval": float(args.get("sample_interval", 2))}
    if kernel_since is not None:
        options["kernel_since_seq"] = kernel_since
    argv = [args.get("ansible", "ansible"), watched.node_host, "-i", args["inventory"],
            "-m", "inferops.gpu_inference.gpu_diagnose", "-a", json.dumps(options)]
    timeout_s = _positive(args, "read_timeout", 300)
    rc, out, err, timed_out = await _run(
        argv, dict(env, ANSIBLE_LOAD_CALLBACK_PLUGINS="1", ANSIBLE_STDOUT_CALLBACK="ansible.posix.json"), timeout_s)
    if timed_out:
        return eda_watch.READ_TIMED_OUT, {"msg": "no answer within read_timeout (%.0f s): killed" % timeout_s}
    try:
        doc = json.loads(out)
        result = doc["plays"][0]["tasks"][0]["hosts"][watched.node_host]
    except (ValueError, KeyError, IndexError, TypeError):
        return eda_watch.READ_UNREACHABLE, {"msg": "ansible rc %d: %s" % (rc, (err or out).strip()[-2000:])}
    if not isinstance(result, dict):
        return eda_watch.READ_UNREACHABLE, {"msg": "ansible rc %d: no result for %s" % (rc, watched.node_host)}
    if result.get("unreachable"):
        return eda_watch.READ_UNREACHABLE, result
    if result.get("failed"):
        return eda_watch.READ_FAILED, result
    return eda_watch.READ_OK, result


def write_metrics(path: str, text: str) -> None:
    """The metrics file written whole (a temporary file renamed into place), as the textfile collector expects."""
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".gpu_watch.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


async def main(queue: asyncio.Queue, args: dict[str, Any]) -> None:
    if not args.get("inventory"):
        raise ValueError("gpu_watch: the argument inventory (the inventory recover.yml runs with) is required")
    settings = eda_watch.PolicySettings(debounce_s=float(args.get("debounce", 30)),
                                        cooldown_s=float(args.get("cooldown", 1800)),
                                        budget=int(args.get("budget", 3)),
                                        budget_window_s=float(args.get("budget_window", 3600)),
                                        unreachable_polls=int(args.get("unreachable_polls", 3)))
    interval = float(args.get("interval", 15))
    _positive(args, "read_timeout", 300)
    metrics_file = str(args.get("metrics_file") or "")
    once = int(args.get("once", 0))
    env = dict(os.environ)
    policy = eda_watch.Policy(settings)
    watched = await read_inventory(args, env)
    logger.info("gpu_watch: watching %s", ", ".join("CT %d (%s on %s)" % (w.vmid, w.host, w.node_host) for w in watched))
    by_node: dict[str, list[eda_watch.Watched]] = {}
    for w in watched:
        by_node.setdefault(w.node_host, []).append(w)
    cursors: dict[int, Any] = {}

    async def poll_node(node: str, members: list[eda_watch.Watched]) -> None:
        reads: dict[int, tuple[str, str]] = {}
        for w in members:
            if any(outcome in (eda_watch.READ_UNREACHABLE, eda_watch.READ_TIMED_OUT) for outcome, _w in reads.values()):
                reads[w.vmid] = (eda_watch.READ_UNREACHABLE, "not asked: the node did not answer this poll")
                continue
            outcome, diag = await diagnose(args, env, w, watched, cursors.get(w.vmid))
            reads[w.vmid] = (outcome, str(diag.get("msg") or "")[-500:])
            if outcome != eda_watch.READ_OK:
                logger.warning("gpu_watch: CT %d on %s not read (%s): %s", w.vmid, node, outcome, diag.get("msg"))
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
        event = policy.observe_node(node, reads, time.time())
        if event is not None:
            logger.warning("gpu_watch: %s: %s", event["action"], event["message"])
            await queue.put(event)

    polls = 0
    metrics_error = None
    while True:
        started = time.time()
        await asyncio.gather(*(poll_node(node, members) for node, members in by_node.items()))
        polls += 1
        if metrics_file:
            exhausted = set(policy.exhausted())
            text = metrics_textfile.watch_metrics(
                policy.node_states(), [{"vmid": w.vmid, "node": w.node_host, "exhausted": w.vmid in exhausted}
                                       for w in watched], time.time())
            try:
                write_metrics(metrics_file, text)
                metrics_error = None
            except OSError as exc:
                if str(exc) != metrics_error:
                    logger.error("gpu_watch: metrics file %s not written: %s", metrics_file, exc)
                metrics_error = str(exc)
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
