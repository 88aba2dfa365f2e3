#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: inferops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
module: gpu_recover_lock
short_description: Take or release the node's lock on one container's recovery ladder
version_added: "0.1.0"
author:
  - inferops team (@inferops)
description:
  - One ladder per container at a time on a node. O(state=acquired) takes an flock(2) on
    C(/run/inferops/locks/recover-ct-<vmid>.lock) and leaves a small holder process keeping it, because the ladder
    spans many module calls; O(state=released) ends that holder. The holder also ends when its lease
    (O(lease_s), the ladder's whole budget) runs out or when the connection it was taken through ends, so a
    controller killed mid-ladder does not keep the container locked.
  - A lock that is held makes the call wait up to O(wait_s), then fail, saying who holds it (the holder's record,
    pid, start time, playbook, controller, for the message only; that the lock is held is the kernel's answer).
  - Used by the action plugin P(inferops.gpu_inference.gpu_recover_ladder#module); it also writes the run's metrics
    file (O(metrics_path)) in the same call, so the metrics cost no connection of their own.
  - The node's GPU reset lock (one reset per node) is taken by M(inferops.gpu_inference.gpu_recover_action) itself.
options:
  vmid:
    description: The container whose ladder the lock covers.
    type: int
    required: true
  state:
    description: V(acquired) takes the lock (and writes O(metrics_text)); V(released) ends the holder (after
      writing O(metrics_text)).
    type: str
    required: true
    choices: [acquired, released]
  wait_s:
    description: Seconds to wait for a lock another run holds before failing.
    type: int
    default: 0
  lease_s:
    description: Seconds the holder keeps the lock at most (O(state=acquired)).
    type: int
    default: 3600
  playbook:
    description: The run's playbook, for the record a second run prints.
    type: str
    default: ""
  controller:
    description: The controller host and user of the run, for the record a second run prints.
    type: str
    default: ""
  run_pid:
    description: The controller's ansible-playbook process of the run (recorded, with O(run_start_ticks), so that a
      later run on the same controller can tell this run is gone).
    type: int
  run_start_ticks:
    description: Its start time on the controller, clock ticks since boot.
    type: int
  break_pid:
    description:
      - (O(state=acquired)) The holder a run on the same controller judged stale (its run is gone there). It is
        ended only when the kernel says it holds this lock (C(/proc/locks)) and it is still the process that started
        at O(break_start_ticks); then the lock is taken as usual.
    type: int
  break_start_ticks:
    description: The stale holder's start time, with O(break_pid).
    type: int
  holder_pid:
    description: (O(state=released)) The holder's pid, as O(state=acquired) returned it.
    type: int
  holder_start_ticks:
    description: (O(state=released)) The holder's start time, as O(state=acquired) returned it; with O(holder_pid)
      it names the process (a pid alone may have been reused).
    type: int
  metrics_path:
    description: node_exporter textfile to write (whole, through a rename) with O(metrics_text); none by default.
    type: path
  metrics_text:
    description: The content of O(metrics_path).
    type: str
  lock_dir:
    description: Directory of the lock files (root's, mode 0700).
    type: path
    default: /run/inferops/locks
extends_documentation_fragment:
  - inferops.gpu_inference.attributes
attributes:
  check_mode:
    support: none
  diff_mode:
    support: none
seealso:
  - module: inferops.gpu_inference.gpu_recover_ladder
"""

EXAMPLES = r"""
- name: Take CT 129's ladder lock, waiting up to 5 minutes for another run
  inferops.gpu_inference.gpu_recover_lock:
    vmid: 129
    state: acquired
    wait_s: 300
    lease_s: 1800
  register: _lock

- name: Release it
  inferops.gpu_inference.gpu_recover_lock:
    vmid: 129
    state: released
    holder_pid: "{{ _lock.holder_pid }}"
    holder_start_ticks: "{{ _lock.holder_start_ticks }}"
"""

RETURN = r"""
path:
  description: The lock file.
  type: str
  returned: always
holder_pid:
  description: The holder process (O(state=acquired)).
  type: int
  returned: when acquired
holder_start_ticks:
  description: Its start time, clock ticks since boot (proc(5)).
  type: int
  returned: when acquired
waited_s:
  description: How long the call waited for another run's lock.
  type: float
  returned: when acquired
waited_for:
  description: Who held the lock while it waited (the last message), or null.
  type: str
  returned: when acquired
broken:
  description: What was done with O(break_pid) (ended, or nothing because the kernel does not name it the holder).
  type: str
  returned: when acquired
released:
  description: Whether a holder was ended (O(state=released)).
  type: bool
  returned: when released
holder:
  description: The record of the run that holds the lock (when refused).
  type: dict
  returned: on failure to acquire
"""

import json
import os
import select
import signal
import time

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.inferops.gpu_inference.plugins.module_utils.recover import recover_lock as rl


def write_metrics(path, text):
    """The metrics file, whole: a temporary file beside it renamed into place."""
    directory = os.path.dirname(path)
    os.makedirs(directory, mode=0o755, exist_ok=True)
    tmp = os.path.join(directory, ".%s.%d.tmp" % (os.path.basename(path), os.getpid()))
    with open(tmp, "w", encoding="utf-8") as handle:
        handle.write(text)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def hold(fd, deadline, connection):
    """The holder process: keeps the flock on ``fd`` until SIGTERM, its lease or the connection's end."""
    stop = []
    signal.signal(signal.SIGTERM, lambda *args: stop.append(1))
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    while not stop and time.time() < deadline:
        if connection and not rl.same_process(connection[0], connection[1]):
            break
        time.sleep(0.5)
    try:
        os.ftruncate(fd, 0)
    except OSError:
        pass


def holder_main(path, p, ready_w, connection):
    """In the holder (its own session, outliving the module call): take the lock, waiting up to O(wait_s), so that
    the kernel names this process its holder (/proc/locks); say how it went on ``ready_w``; keep it."""
    fd, info = rl.acquire(path, p["wait_s"])
    if fd is None:
        os.write(ready_w, (json.dumps(dict(info, acquired=False)) + "\n").encode())
        os.close(ready_w)
        return
    me = os.getpid()
    record = rl.holder_record(me, rl.start_ticks(me), "recover ladder", p["vmid"], p["playbook"], p["controller"],
                              lease_until=time.time() + p["lease_s"],
                              run={"pid": p["run_pid"], "start_ticks": p["run_start_ticks"]})
    rl.write_record(fd, record)
    os.write(ready_w, (json.dumps(dict(info, acquired=True, pid=me, start_ticks=record["start_ticks"])) + "\n").encode())
    os.close(ready_w)
    hold(fd, time.time() + p["lease_s"], connection)


def spawn_holder(p, path):
    """Fork the holder (twice, in a session of its own) and wait for its word: the lock taken, or refused."""
    connection = rl.connection_process()
    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(ready_r)
            os.setsid()
            if os.fork():
                os._exit(0)
            os.chdir("/")
            null = os.open(os.devnull, os.O_RDWR)
            for std in (0, 1, 2):
                os.dup2(null, std)
            os.closerange(3, ready_w)
            os.closerange(ready_w + 1, 1024)
            holder_main(path, p, ready_w, connection)
        finally:
            os._exit(0)
    os.close(ready_w)
    os.waitpid(pid, 0)
    data = b""
    deadline = time.monotonic() + p["wait_s"] + 30
    while time.monotonic() < deadline:
        ready = select.select([ready_r], [], [], max(deadline - time.monotonic(), 0))[0]
        if not ready:
            break
        chunk = os.read(ready_r, 65536)
        if not chunk:
            break
        data += chunk
    os.close(ready_r)
    try:
        return json.loads(data.decode() or "null")
    except ValueError:
        return None


def end_stale_holder(path, pid, ticks):
    """End the holder of a run that is gone (the controller's judgement), when the kernel says it holds the lock and
    it is still that process; a message saying what was done."""
    try:
        with open("/proc/locks", "r", encoding="ascii", errors="replace") as handle:
            holders = rl.flock_holders(path, handle.read())
    except OSError:
        holders = set()
    if pid not in holders or not rl.same_process(pid, ticks):
        return "pid %d does not hold %s (or is another process now): nothing ended" % (pid, path)
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 5
    while rl.same_process(pid, ticks) and time.monotonic() < deadline:
        time.sleep(0.05)
    if rl.same_process(pid, ticks):
        os.kill(pid, signal.SIGKILL)
    return "ended pid %d, which held %s for a run that is gone" % (pid, path)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            vmid=dict(type="int", required=True),
            state=dict(type="str", required=True, choices=["acquired", "released"]),
            wait_s=dict(type="int", default=0),
            lease_s=dict(type="int", default=3600),
            playbook=dict(type="str", default=""),
            controller=dict(type="str", default=""),
            run_pid=dict(type="int"),
            run_start_ticks=dict(type="int"),
            break_pid=dict(type="int"),
            break_start_ticks=dict(type="int"),
            holder_pid=dict(type="int"),
            holder_start_ticks=dict(type="int"),
            metrics_path=dict(type="path"),
            metrics_text=dict(type="str"),
            lock_dir=dict(type="path", default=rl.LOCK_DIR),
        ),
        required_together=[("metrics_path", "metrics_text"), ("holder_pid", "holder_start_ticks"),
                           ("break_pid", "break_start_ticks"), ("run_pid", "run_start_ticks")],
        supports_check_mode=False,
    )
    p = module.params
    try:
        path = rl.ladder_path(p["vmid"], p["lock_dir"])
        if p["wait_s"] < 0 or p["lease_s"] < 1:
            raise rl.LockError("wait_s must be 0 or more and lease_s 1 or more seconds, got %d and %d"
                               % (p["wait_s"], p["lease_s"]))
        os.makedirs(p["lock_dir"], mode=0o700, exist_ok=True)
    except (rl.LockError, OSError) as exc:
        module.fail_json(msg=str(exc))
    if p["state"] == "released":
        if p["metrics_path"]:
            write_metrics(p["metrics_path"], p["metrics_text"])
        released = False
        if p["holder_pid"] is not None and rl.same_process(p["holder_pid"], p["holder_start_ticks"]):
            os.kill(p["holder_pid"], signal.SIGTERM)
            released = True
            deadline = time.monotonic() + 10
            while rl.same_process(p["holder_pid"], p["holder_start_ticks"]) and time.monotonic() < deadline:
                time.sleep(0.05)
        module.exit_json(changed=False, path=path, released=released)
    broken = None
    if p["break_pid"] is not None:
        broken = end_stale_holder(path, p["break_pid"], p["break_start_ticks"])
    info = spawn_holder(p, path)
    if not info:
        module.fail_json(msg="the holder of %s did not start" % path, path=path)
    if not info["acquired"]:
        module.fail_json(msg="Another recover run holds the ladder of CT %d on this node: %s. Waited %.0f s "
                             "(gpu_recover_lock_wait_s %d); run again once it has ended." % (
                                 p["vmid"], info["msg"], info["waited_s"], p["wait_s"]),
                         path=path, holder=info.get("holder"), waited_s=info["waited_s"], refused=True, broken=broken)
    if p["metrics_path"]:
        write_metrics(p["metrics_path"], p["metrics_text"])
    module.exit_json(changed=False, path=path, holder_pid=info["pid"], holder_start_ticks=info["start_ticks"],
                     waited_s=info["waited_s"], waited_for=info.get("waited_for"), broken=broken)


if __name__ == "__main__":
    main()
