#!/usr/bin/python
# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpu_recover_action
short_description: Host-side recovery actions for one Proxmox VE container's GPUs (scoped kill, FUSE abort, GPU reset)
version_added: 0.1.0
author:
  - inferops team (@inferops)
description:
  - The acting rungs of the recovery ladder that need the node's view of processes (see C(docs/recover.md)).
    Runs on the Proxmox VE node as root; every target is re-discovered and re-checked at call time.
  - O(action) is the rung's name (C(recover_gate.RUNG_NAMES), defined once); the role passes the rung the
    diagnosis asks for.
  - O(action=stop_service) (rung 1) runs C(systemctl disable --now) on O(service) inside the container
    (C(pct exec)), bounded by O(service_stop_timeout); systemd SIGTERMs, then SIGKILLs, the unit's cgroup.
  - O(action=kill_holders) (rung 2) disables O(service) (so nothing respawns), then sends SIGTERM, waits O(term_grace)
    seconds, then SIGKILL, to every process of the container that holds C(/dev/nvidia*) or is listed by
    C(nvidia-smi) as a compute app, by process group when every member of the group is in the container, else by PID. A process is in the container when its
    C(/proc/PID/cgroup) names C(/lxc/<vmid>) (or C(lxc.payload.<vmid>)). The container's init is never signalled;
    C(fuser -k) is never used.
  - Every signal reaches only what was judged, checked at the moment it is sent. A PID goes through a pidfd, only
    while its start time is the planned one and it is still in the cgroup it was judged in (or wholly in the
    container); a process without a planned start time is never signalled. A process group is judged again member by
    member; when any process in it now is outside the container's cgroup (root moved it out, or it joined from
    elsewhere), the group is not signalled, its planned members are, one by one, and the group is reported under
    RV(refused).
  - O(action=unblock_stuck) (rung 3) finds, for each process of the container in D state on FUSE, the FUSE connection
    of the files it has open (each fd held with C(O_PATH), its mount id from C(/proc/self/fdinfo) -> C(/proc/PID/mountinfo)
    device C(major:minor), connection C((major << 20) | minor) as C(fs/fuse/control.c) names it), writes C(1) to
    C(/sys/fs/fuse/connections/<N>/abort), then SIGKILLs those processes (scoped as above) and waits up to
    O(stuck_timeout) seconds; a connection that is also mounted in the host's mount namespace (lxcfs is one) is never
    aborted. Then it SIGKILLs the container's remaining GPU holders (they may have waited behind the stuck ones).
  - O(action=stop_container) (rung 4), when the container runs, disables O(service) (so the container comes back
    without it), runs C(pct shutdown --timeout O(container_shutdown_timeout) --forceStop 1), and C(pct stop)
    (bounded by O(container_stop_timeout)) if it still runs.
  - O(action=reset_gpus) (rung 5) first ends the container's GPU processes when the container runs (NVIDIA,
    "Error Recovery and Response Flags" - terminate all GPU processes, then C(nvidia-smi -r)), C(systemctl disable --now)
    O(service) as rung 1, then SIGTERM, O(term_grace), SIGKILL to its remaining holders as rung 2; the container keeps
    running. Then it resets the container's GPUs with C(nvidia-smi -r) from the host, each GPU only when
    no process at all holds it (its NVLink peers from C(nvidia-smi topo -m) are added and must be free too);
    persistence mode is switched off first and restored afterwards. A GPU with a client is refused and reported.
    A process on the host or in the container with a C(/dev/nvidia*) path on a filesystem the scan never stats
    (an unverified holder, see M(inferops.gpu_inference.gpu_diagnose)) refuses every reset; one in another container
    is named in RV(unverified_holders) only.
  - With O(stop_host_daemons), a host C(nvidia-persistenced) that holds the GPUs' device files (it blocks any reset)
    is stopped first and started again afterwards, whatever the reset's outcome, only through its systemd unit
    (C(systemctl stop)/C(systemctl start nvidia-persistenced.service)), and only when systemd vouches for it; it is the
    unit's C(MainPID) (same start time), the unit is active, its unit file lies under C(/etc/systemd/system),
    C(/lib/systemd/system) or C(/usr/lib/systemd/system), the unit file, its drop-ins and its C(ExecStart) binary
    are root's alone (owned by root, writable by no group or other, up to C(/)), the process's real uid is root's
    or the user the unit names (C(User=), C(--user)), and the kernel puts it in the unit's control group. Nothing
    read from the process (its name, command line or cgroup as it tells them) is trusted or run. The module fails
    if the daemon does not come back. Any other host process holding a GPU (DCGM, exporters, another tenant, a
    process that only calls itself nvidia-persistenced) is a client, so that GPU's reset is refused and the
    holder named with why.
  - In check mode nothing is signalled, aborted or reset; the module reports what it would do.
options:
  vmid:
    description: The container.
    type: int
    required: true
  action:
    description: What to do.
    type: str
    required: true
    choices: [stop_service, kill_holders, unblock_stuck, stop_container, reset_gpus]
  service:
    description:
      - The inference server's systemd unit inside the container.
      - Required for O(action=stop_service); with O(action=kill_holders) and O(action=stop_container) it is disabled
        first, when given.
    type: str
  service_stop_timeout:
    description: Seconds C(systemctl disable --now) may take (O(action=stop_service)).
    type: int
    default: 90
  stuck_timeout:
    description: Seconds to wait for the stuck processes to be gone after the abort (O(action=unblock_stuck)).
    type: int
    default: 60
  container_shutdown_timeout:
    description: C(pct shutdown --timeout) (O(action=stop_container)).
    type: int
    default: 60
  container_stop_timeout:
    description: Seconds C(pct stop) may take (O(action=stop_container)).
    type: int
    default: 90
  term_grace:
    description: Seconds between SIGTERM and SIGKILL (O(action=kill_holders)); V(0) sends only SIGKILL.
    type: int
    default: 10
  unit_stop_timed_out:
    description:
      - O(action=kill_holders) right after rung 1's C(systemctl stop) of O(service) ran out of its timeout (the ladder
        says so). systemd sent SIGTERM to every process of the unit when that stop began (systemd.kill(5),
        C(KillMode=control-group)), so when every process to signal is in the unit's cgroup they get SIGKILL at once,
        without a second SIGTERM and O(term_grace); when any is not (an escaped worker), all get SIGTERM and O(term_grace) first.
    type: bool
    default: false
  wait:
    description: Seconds to wait, after the last SIGKILL to GPU holders, for them to be gone (they may stay in D state).
    type: int
    default: 30
  gpus:
    description:
      - nvidia-smi indexes of the GPUs to reset (O(action=reset_gpus)), the container's GPUs as gpu_diagnose numbers
        them. The reset reads the driver's numbering again (C(nvidia-smi -q), Minor Number) and refuses unless the
        container's C(devN) still are these GPUs.
    type: list
    elements: int
  command_timeout:
    description:
      - Seconds each C(nvidia-smi), C(pct status), C(pct list), C(pct config) and C(systemctl) call may take (C(-r) gets
        three times this); then it and every process of its session are killed, whatever it started.
    type: int
    default: 60
  nvidia_smi_path:
    description: Path to C(nvidia-smi); looked up in E(PATH) by default.
    type: path
  stop_host_daemons:
    description:
      - Stop a host C(nvidia-persistenced) for the reset and start it again afterwards, through its systemd unit
        (O(action=reset_gpus)).
      - V(false) treats it as a client like any other, so the reset of the GPUs it holds is refused.
    type: bool
    default: true
  reset_lock_wait:
    description:
      - Seconds O(action=reset_gpus) waits for another GPU reset on the node before it refuses, naming the holder.
        One reset at a time per node, through the node's reset lock C(/run/inferops/locks/gpu-reset.lock), an flock(2)
        this module holds for its reset. Not taken in check mode.
    type: int
    default: 180
  lock_dir:
    description: Directory of the node's lock files (root's, mode 0700).
    type: path
    default: /run/inferops/locks
extends_documentation_fragment:
  - inferops.gpu_inference.attributes
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
seealso:
  - module: inferops.gpu_inference.gpu_diagnose
"""

EXAMPLES = r"""
- name: Rung 2, kill CT 129's GPU holders from the host
  inferops.gpu_inference.gpu_recover_action:
    vmid: 129
    action: kill_holders
    service: sglang.service
    term_grace: 10
    wait: 60

- name: Rung 5, reset CT 129's GPUs (only those without clients)
  inferops.gpu_inference.gpu_recover_action:
    vmid: 129
    action: reset_gpus
    gpus: [0, 1, 2, 3, 4, 5, 6, 7]
"""

RETURN = r"""
planned:
  description: What was (or, in check mode, would be) done.
  returned: always
  type: dict
started_at:
  description: The node's clock (seconds since the epoch) when the action started; the verification's graces count from it.
  returned: always
  type: float
ended_at:
  description: The node's clock when the action ended.
  returned: always
  type: float
commands:
  description: The C(pct) commands run (argv as text, rc, timed_out, the end of their output).
  returned: always
  type: list
  elements: dict
container_was_running:
  description: Whether O(action=stop_container) found the container running (it was stopped by this action).
  returned: when action is stop_container
  type: bool
signalled:
  description: Process groups and PIDs signalled (those judged still in scope when the signal was sent), with the signals used.
  returned: when action is kill_holders or unblock_stuck
  type: list
  elements: dict
aborted:
  description: FUSE connections aborted.
  returned: when action is unblock_stuck
  type: list
  elements: dict
refused:
  description:
    - What was refused and why (a GPU with clients, a shared FUSE connection, a PID outside the container, a PID
      reused or moved out of the container since the plan, a process group with a member outside the container).
  returned: always
  type: list
  elements: dict
remaining:
  description: Targeted processes still present after the wait (PID, comm, state).
  returned: always
  type: list
  elements: dict
reset:
  description: Per GPU reset result (rc and output).
  returned: when action is reset_gpus
  type: list
  elements: dict
unverified_holders:
  description:
    - Processes (any owner) with a C(/dev/nvidia*) path open on a filesystem the scan never stats (FUSE, an overlay, a
      mount outside the process's mount table), each as PID/comm, owner, path and filesystem. One on the host or in
      the container refuses every reset; one in another container is only named (it cannot hold a GPU being reset).
  returned: when action is reset_gpus
  type: list
  elements: str
daemons:
  description: Host daemons stopped for the reset (name, pid, unit, stopped, restarted, pid_after, error).
  returned: when action is reset_gpus and a reset was attempted
  type: list
  elements: dict
reset_lock:
  description: The node's GPU reset lock (path, waited_s, waited_for), or its holder when it was not given.
  returned: when action is reset_gpus, not in check mode
  type: dict
"""

import os
import signal
import sys
import time

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.inferops.gpu_inference.plugins.module_utils.common.gpu_inventory import vmid_problem
from ansible_collections.inferops.gpu_inference.plugins.module_utils.host import bounded_command
from ansible_collections.inferops.gpu_inference.plugins.module_utils.host import gpu_facts
from ansible_collections.inferops.gpu_inference.plugins.module_utils.recover import recover_daemons as rd
from ansible_collections.inferops.gpu_inference.plugins.module_utils.recover import recover_gate as gate
from ansible_collections.inferops.gpu_inference.plugins.module_utils.recover import recover_lock as rl
from ansible_collections.inferops.gpu_inference.plugins.module_utils.recover import recover_procs as procs
from ansible_collections.inferops.gpu_inference.plugins.module_utils.recover import recover_pve as pve
from ansible_collections.inferops.gpu_inference.plugins.module_utils.recover import recover_scope
from ansible_collections.inferops.gpu_inference.plugins.module_utils.host.procfs import read_text
from ansible_collections.inferops.gpu_inference.plugins.module_utils.recover import recover_signals as rsig
from ansible_collections.inferops.gpu_inference.plugins.module_utils.recover import recover_smi
from ansible_collections.inferops.gpu_inference.plugins.module_utils.common.safe_text import unit_name_message


def run_bounded(module, argv, timeout):
    """``argv`` under the bounded supervisor (bounded_command): killed with every process of its session after
    ``timeout`` seconds, whatever it starts (a container's own binary behind pct exec included)."""
    return module.run_command(bounded_command.argv(sys.executable, timeout, argv), environ_update={"LC_ALL": "C"})


def run_smi(module, smi, args, timeout):
    return run_bounded(module, [smi] + args, timeout)


def compute_app_pids(module, smi, timeout):
    if not smi:
        return []
    rc, out, err = run_smi(module, smi, gpu_facts.compute_apps_query_args("x")[1:], timeout)
    if rc != 0:
        return []
    try:
        return [a["pid"] for a in gpu_facts.parse_compute_apps_csv(out) if a.get("pid")]
    except gpu_facts.ParseError:
        return []


def ct_init_pid(module, vmid):
    pct = module.get_bin_path("pct", opt_dirs=["/usr/sbin"])
    if not pct:
        return None
    rc, out, err = run_bounded(module, [pct, "status", str(vmid), "--verbose"], module.params["command_timeout"])
    return pve.parse_pct_status(out)["pid"] if rc == 0 else None


def container_gpu_minors(module, vmid, timeout):
    """The /dev/nvidiaN minors a container's devN pass (its pct config now), or (None, why) when unreadable."""
    pct = module.get_bin_path("pct", opt_dirs=["/usr/sbin"])
    if not pct:
        return None, "pct not found"
    rc, out, err = run_bounded(module, [pct, "config", str(vmid)], timeout)
    if rc != 0:
        return None, "pct config %d failed (rc %d): %s" % (vmid, rc, (err or out).strip())
    return pve.parse_pct_config_gpus(out), None


def read_numbering(module, smi, rows, timeout):
    """The driver's numbering, device minor <-> nvidia-smi index (recover_smi.gpu_numbering), or (None, why)."""
    rc, out, err = run_smi(module, smi, recover_smi.minor_query_args("x")[1:], timeout)
    if rc != 0:
        return None, "nvidia-smi -q failed (rc %d): %s" % (rc, (err or out).strip()[:300])
    numbering = recover_smi.gpu_numbering(list(rows.values()), recover_smi.parse_q_minors(out))
    if not numbering["complete"]:
        return None, "; ".join(numbering["problems"])
    return numbering, None


def by_index(holders, numbering):
    """The scan's holders with gpu_fds as nvidia-smi indexes (the minors they hold open kept as gpu_fd_minors).
    A minor no GPU of the numbering has is no GPU nvidia-smi lists, so none this reset could take."""
    out = []
    for h in holders:
        indexes, _unknown = recover_smi.indexes_of_minors(h.get("gpu_fds") or [], numbering)
        out.append(dict(h, gpu_fds=indexes, gpu_fd_minors=sorted(h.get("gpu_fds") or [])))
    return out


def other_containers_gpus(module, vmid, timeout):
    """{VMID: [GPU minor]} of the node's other running containers (their devN), or (None, why) when unknown:
    ``pct list`` and one ``pct config`` each, all within recover_gate.other_containers_scan_s (however many
    containers run); past it their GPUs are unknown."""
    pct = module.get_bin_path("pct", opt_dirs=["/usr/sbin"])
    if not pct:
        return None, "pct not found"
    total = gate.other_containers_scan_s(timeout)
    deadline = time.monotonic() + total

    def run(args):
        left = int(deadline - time.monotonic()) - gate.COMMAND_SLACK_S
        if left < 1:
            return None
        return run_bounded(module, [pct] + args, min(timeout, left))
    late = "reading the other containers' configs took more than %d s" % total
    done = run(["list"])
    if done is None:
        return None, late
    rc, out, err = done
    if rc != 0:
        return None, "pct list failed (rc %d): %s" % (rc, (err or out).strip())
    found = {}
    for other, status in sorted(pve.parse_pct_list(out).items()):
        if other == vmid or status != "running":
            continue
        done = run(["config", str(other)])
        if done is None:
            return None, late
        rc, out, err = done
        if rc != 0:
            return None, "pct config %d failed (rc %d): %s" % (other, rc, (err or out).strip())
        found[other] = pve.parse_pct_config_gpus(out)
    return found, None


def alive(refs):
    """Targets (pid, starttime) still present and not zombies."""
    left = []
    for pid, start in refs:
        st = procs.is_alive(pid, start)
        if st:
            left.append({"pid": pid, "comm": st["comm"], "state": st["state"]})
    return left


def members(plan):
    """The planned processes, (pid, starttime): every member of each planned group as judged, and each PID."""
    refs = {(int(pid), st) for g in plan["groups"] for pid, st in plan["members"].get(g, {}).items()}
    refs |= {(int(pid), plan["starttimes"][pid]) for pid in plan["pids"]}
    return sorted(refs)


def send(plan, sig, result):
    """Send through recover_signals.send_signal (each group and PID judged again as it is signalled); what was
    signalled, refused and failed goes to the result."""
    out = rsig.send_signal(plan, sig)
    result["signalled"].append({"signal": signal.Signals(sig).name, "groups": out["groups"], "pids": out["pids"]})
    result["refused"].extend(out["refused"])
    return out["errors"]


def replan(vmid, refs, init_pid):
    """The plan again from a fresh process table, for the targets still alive with the same start time
    (a PID reused since the first plan is not one of them), their groups judged anew."""
    scan = procs.scan_processes(vmid, "/", procs.uvm_majors())
    left = set(refs)
    targets = [x for x in scan["container"] if (int(x["pid"]), x["starttime"]) in left]
    return rsig.pids_to_signal(targets, scan["all"], vmid, init_pid)


def kill_holders(module, vmid, smi, result, term_grace, wait, unit_stop_timed_out=False):
    p = module.params
    scan = procs.scan_processes(vmid, "/", procs.uvm_majors())
    mine = scan["container"]
    app_pids = set(compute_app_pids(module, smi, p["command_timeout"]))
    # A process of the container with a /dev/nvidia* path on a filesystem the scan never stats is one of its holders
    # (unverified: recover_procs.nvidia_fds).
    targets = [x for x in mine if x["holds_nvidia"] or x.get("holds_unverified") or x["pid"] in app_pids]
    # Compute apps outside the container are reported, never touched.
    outside = sorted(app_pids - {x["pid"] for x in mine})
    for pid in outside:
        owner = procs.container_of_pid(pid)
        result["refused"].append({"pid": pid, "why": "compute app not in CT %d (%s)" % (
            vmid, "CT %s" % owner if isinstance(owner, int) else "host or gone")})
    init_pid = ct_init_pid(module, vmid)
    plan = rsig.pids_to_signal(targets, scan["all"], vmid, init_pid)
    result["refused"].extend(plan["skipped"])
    refs = members(plan)
    if unit_stop_timed_out and refs and all(procs.in_unit(read_text("/proc/%d/cgroup" % pid), p["service"]) for pid, _st in refs):
        term_grace = 0
        result["sigkill_only"] = ("every process to signal is in %s, whose stop ran out of its timeout: systemd sent them "
                                  "SIGTERM when it began (systemd.kill(5))" % p["service"])
    result["planned"] = {"action": gate.RUNG_NAMES[gate.RUNG_KILL_HOLDERS], "targets": ["%d/%s" % (x["pid"], x["comm"]) for x in targets],
                         "process_groups": plan["groups"], "pids": plan["pids"],
                         "signals": (["SIGTERM", "SIGKILL"] if term_grace > 0 else ["SIGKILL"])}
    if not refs:
        return
    if module.check_mode:
        result["changed"] = True
        return
    errors = []
    if term_grace > 0:
        errors += send(plan, signal.SIGTERM, result)
        rsig.wait_until(lambda: not alive(refs), term_grace)
    if alive(refs):
        plan = replan(vmid, refs, init_pid)
        result["refused"].extend(s for s in plan["skipped"] if s not in result["refused"])
        errors += send(plan, signal.SIGKILL, result)
    result["changed"] = True
    rsig.wait_until(lambda: not alive(refs), wait)
    result["remaining"] = alive(refs)
    if errors:
        result.setdefault("errors", []).extend(errors)


def abort_fuse(module, vmid, result):
    p = module.params
    scan = procs.scan_processes(vmid, "/", procs.uvm_majors())
    stuck = [x for x in scan["container"] if x["class"] == "stuck_fuse"]
    shared = procs.host_fuse_devices("/")
    conns = {}
    for x in stuck:
        for c in procs.fuse_connections_of(x["pid"], "/"):
            if c["device"] in shared or c["fstype"] == "fuse.lxcfs":
                result["refused"].append({"conn": c["conn"], "why": "FUSE connection %s (%s on %s) is shared with the host "
                                          "mount namespace: not aborted" % (c["device"], c["fstype"], c["mount_point"])})
                continue
            conns.setdefault(c["conn"], dict(c, pids=[]))["pids"].append(x["pid"])
    init_pid = ct_init_pid(module, vmid)
    # Only the stuck PIDs themselves (their group may hold unrelated processes of the container), each with the
    # start time and cgroup it was judged by.
    plan = rsig.pids_to_signal(stuck, scan["all"], vmid, init_pid, by_group=False)
    result["refused"].extend(plan["skipped"])
    refs = members(plan)
    result["planned"] = {"action": "abort_fuse", "stuck": ["%d/%s (%s)" % (x["pid"], x["comm"], x["wchan"]) for x in stuck],
                         "connections": sorted(conns.values(), key=lambda c: c["conn"]), "then_sigkill": plan["pids"]}
    if not stuck:
        return
    if module.check_mode:
        result["changed"] = bool(conns)
        return
    for conn, info in sorted(conns.items()):
        try:
            rsig.abort_fuse_connection(conn)
            result["aborted"].append(info)
            result["changed"] = True
        except OSError as exc:
            result["refused"].append({"conn": conn, "why": "abort failed: %s" % exc})
    errors = send(plan, signal.SIGKILL, result)
    rsig.wait_until(lambda: not alive(refs), p["stuck_timeout"])
    result["remaining"] = alive(refs)
    if errors:
        result.setdefault("errors", []).extend(errors)


def unblock_stuck(module, vmid, smi, result):
    """Rung 3: abort the FUSE connections the stuck processes wait on and SIGKILL them, then SIGKILL the
    container's remaining GPU holders."""
    abort_fuse(module, vmid, result)
    planned, remaining = result["planned"], result["remaining"]
    kill_holders(module, vmid, smi, result, 0, module.params["wait"])
    result["planned"] = {"action": gate.RUNG_NAMES[gate.RUNG_UNBLOCK_STUCK], "abort_fuse": planned, "kill_holders": result["planned"]}
    result["remaining"] = remaining + [r for r in result["remaining"] if r not in remaining]


# --------------------------------------------------------------------------- rungs run through pct

def pct_command(module, args, timeout, result, changed=True):
    """Run ``pct ARGS`` bounded by ``timeout`` (run_bounded); recorded in result["commands"]."""
    pct = module.get_bin_path("pct", opt_dirs=["/usr/sbin"])
    if not pct:
        module.fail_json(msg="pct not found: gpu_recover_action runs on the Proxmox VE node", **result)
    rc, out, err = run_bounded(module, [pct] + [str(a) for a in args], timeout)
    entry = {"command": "pct " + " ".join(str(a) for a in args), "rc": rc, "timed_out": bounded_command.timed_out(rc),
             "output": ((out or "") + (err or ""))[-500:]}
    result["commands"].append(entry)
    if changed:
        result["changed"] = True
    return rc, out or "", err or ""


def container_running(module, vmid, result):
    rc, out, err = pct_command(module, ["status", vmid], gate.PCT_STATUS_TIMEOUT_S, result, changed=False)
    return rc == 0 and pve.parse_pct_status(out)["status"] == "running"


def disable_service(module, vmid, result):
    """systemctl disable inside the container, so nothing starts the server again (failures are recorded only)."""
    service = module.params["service"]
    if not service:
        return
    if module.check_mode:
        return
    rc, out, err = pct_command(module, ["exec", vmid, "--", "systemctl", "disable", "--", service], 30, result, changed=False)
    if "Removed" in err or "Removed" in out:
        result["changed"] = True


def stop_service(module, vmid, result):
    p = module.params
    if not p["service"]:
        module.fail_json(msg="action=stop_service needs service (the systemd unit inside the container)", **result)
    result["planned"] = {"action": gate.RUNG_NAMES[gate.RUNG_STOP_SERVICE], "command": "pct exec %d -- systemctl disable --now -- %s" % (vmid, p["service"])}
    if module.check_mode:
        result["changed"] = True
        return
    # "--": the unit name is never read as an option of systemctl (main() also refuses a name starting with "-").
    pct_command(module, ["exec", vmid, "--", "systemctl", "disable", "--now", "--", p["service"]], p["service_stop_timeout"], result)


def stop_container(module, vmid, result):
    p = module.params
    running = container_running(module, vmid, result)
    result["container_was_running"] = running
    result["planned"] = {"action": gate.RUNG_NAMES[gate.RUNG_STOP_CONTAINER], "running": running,
                         "commands": ["pct shutdown %d --timeout %d --forceStop 1" % (vmid, p["container_shutdown_timeout"]),
                                      "pct stop %d (if it still runs)" % vmid] if running else [],
                         "disable_service_first": p["service"] if running else None}
    if not running:
        return
    disable_service(module, vmid, result)
    if module.check_mode:
        result["changed"] = True
        return
    pct_command(module, ["shutdown", vmid, "--timeout", p["container_shutdown_timeout"], "--forceStop", "1"],
                p["container_shutdown_timeout"] + 30, result)
    if container_running(module, vmid, result):
        pct_command(module, ["stop", vmid], p["container_stop_timeout"], result)


def reset_gpus(module, vmid, smi, result):
    p = module.params
    if not smi:
        module.fail_json(msg="nvidia-smi not found", **result)
    t = p["command_timeout"]
    rc, out, err = run_smi(module, smi, gpu_facts.gpu_query_args("x")[1:], t)
    if rc != 0:
        module.fail_json(msg="nvidia-smi --query-gpu failed (rc %d): %s" % (rc, (err or out).strip()), **result)
    rows = {g["index"]: g for g in gpu_facts.parse_gpu_csv(out)}
    topo_rc, out, err = run_smi(module, smi, ["topo", "-m"], t)
    peers = recover_smi.parse_topo_nvlink(out) if topo_rc == 0 else {}
    wanted = sorted(set(p["gpus"] or []))
    # What the node shows as /dev/nvidiaN (devN entries, open fds) is the driver's minor number; nvidia-smi -r -i
    # takes the index. Only the driver's numbering turns one into the other; without it nothing is reset. The
    # container's GPUs are read again through it: they must still be the ones the diagnosis judged.
    numbering, why = read_numbering(module, smi, rows, t)
    if numbering is not None:
        own, why = container_gpu_minors(module, vmid, t)
        if own is not None:
            own_indexes, unknown = recover_smi.indexes_of_minors(own, numbering)
            if unknown:
                why = recover_smi.describe_unmapped(unknown, numbering)
            elif own_indexes != wanted:
                why = ("CT %d passes /dev/nvidia%s, which the driver numbers as GPU(s) %s, not the GPU(s) %s asked for: "
                       "diagnose again" % (vmid, ",".join(str(m) for m in own), own_indexes, wanted))
    if why:
        result["refused"].append({"gpus": wanted, "why": "GPU numbering unknown, no GPU reset: %s" % why})
        result["planned"] = {"action": gate.RUNG_NAMES[gate.RUNG_RESET_GPUS], "groups": [], "stop_host_daemons": []}
        return
    result["gpu_numbering"] = {str(i): {"minor": m, "pci_bus_id": numbering["bus_of_index"].get(i)}
                               for i, m in sorted(numbering["minor_of_index"].items())}
    # Clients: any process (any owner) with the GPU's node open, any compute app on it. A host daemon that holds
    # the GPUs (nvidia-persistenced) is stopped for the reset and started again only when its systemd unit vouches
    # for it (recover_daemons: what root controls, never what the process says of itself); every other holder is
    # a client that blocks the reset of its GPUs, named with why it is not the daemon.
    scan = procs.scan_processes(vmid, "/", procs.uvm_majors())
    holders = by_index(scan["nvidia_holders"], numbering)
    # A /dev/nvidia* path on a filesystem the scan never stats (a FUSE mount at /dev/nvidia-x) is an unverified
    # holder. On the host or in this container it may be a client of any GPU: every reset is refused while it is
    # there. In another container it cannot hold a GPU being reset: a container opens only the devices its
    # configuration passes (a mount made in its user namespace opens no device node), and a GPU another running
    # container has is never reset (recover_scope.reset_conflicts); it is named, not obeyed, so that a neighbour
    # cannot hold back this container's reset.
    unverified = scan.get("unverified_holders", [])
    blocking = [h for h in unverified if h["vmid"] is None or h["vmid"] == vmid]
    result["unverified_holders"] = [procs.describe_unverified(h) for h in unverified]
    units = read_units(module) if p["stop_host_daemons"] else {}
    split = rd.split_host_holders(holders, sorted(rows), p["stop_host_daemons"], units, rd.read_real_uid)
    daemons = split["daemons"]
    busy = {}
    for h in split["clients"]:
        for g in h["gpu_fds"]:
            busy.setdefault(g, []).append("%d/%s (%s: %s)" % (
                h["pid"], h["comm"], "CT %s" % h["vmid"] if h["vmid"] is not None else "host", h["why"]))
    rc, out, err = run_smi(module, smi, gpu_facts.compute_apps_query_args("x")[1:], t)
    uuid_index = {g["uuid"]: i for i, g in rows.items()}
    if rc == 0:
        for a in gpu_facts.parse_compute_apps_csv(out):
            idx = uuid_index.get(a["gpu_uuid"])
            if idx is not None:
                busy.setdefault(idx, []).append("%s/%s (compute app)" % (a["pid"], a["process_name"]))
    groups = []
    done = set()
    for g in wanted:
        if g in done:
            continue
        group = recover_smi.nvlink_closure([g], peers)
        done |= set(group)
        groups.append(group)
    # Never a GPU another running container has as devN (docs/recover.md, "Scope"): unknown is refused too.
    others, why = other_containers_gpus(module, vmid, t)
    if others is None:
        result["refused"].extend({"gpus": group, "why": "the other containers' GPUs are unknown (%s)" % why}
                                 for group in groups)
        groups = []
    others = {other: recover_smi.indexes_of_minors(minors, numbering)[0] for other, minors in (others or {}).items()}
    conflicts = recover_scope.reset_conflicts(groups, vmid, others)
    for conflict in conflicts:
        result["refused"].append({"gpus": conflict["gpus"], "why": recover_scope.describe_conflict(conflict)})
    groups = [g for g in groups if g not in [c["gpus"] for c in conflicts]]
    if blocking:
        result["refused"].extend({"gpus": group, "why": "unverified holder(s) on the host or in CT %d, which may be "
                                  "clients of any GPU: %s" % (vmid, "; ".join(procs.describe_unverified(h) for h in blocking))}
                                 for group in groups)
        groups = []
    plan = []
    for group in groups:
        missing = [g for g in group if g not in rows]
        clients = {g: busy[g] for g in group if busy.get(g)}
        if missing or clients:
            result["refused"].append({"gpus": group, "why": "GPU(s) %s not found" % missing if missing else
                                      "clients on %s" % "; ".join("GPU %d: %s" % (g, ", ".join(c)) for g, c in clients.items())})
            continue
        pm_on = [g for g in group if (rows[g].get("persistence_mode") or "").lower() == "enabled"]
        plan.append({"gpus": group, "persistence_mode_enabled": pm_on,
                     "extra_nvlink_peers": [g for g in group if g not in wanted]})
    planned_gpus = {g for item in plan for g in item["gpus"]}
    daemons = [d for d in daemons if set(d["gpus"]) & planned_gpus]
    result["planned"] = {"action": gate.RUNG_NAMES[gate.RUNG_RESET_GPUS], "nvlink_peers": {str(k): v for k, v in peers.items()},
                         "nvlink_known": topo_rc == 0, "groups": plan,
                         "stop_host_daemons": [rd.describe(d) for d in daemons]}
    if module.check_mode or not plan:
        result["changed"] = bool(plan) and module.check_mode
        return
    stopped = []
    try:
        for d in daemons:
            stop_daemon(module, d)
            stopped.append(d)
        reset_groups(module, smi, plan, result, t)
    finally:
        for d in stopped:
            start_daemon(module, d)
        keys = ("name", "pid", "unit", "stopped", "restarted", "pid_after", "error")
        result["daemons"] = [{k: d.get(k) for k in keys} for d in daemons]


def systemctl(module, args, timeout=rd.SYSTEMCTL_TIMEOUT_S):
    """``systemctl ARGS``, bounded (run_bounded): (rc, out, err); rc 127 when there is no systemctl."""
    sbin = module.get_bin_path("systemctl")
    if not sbin:
        return 127, "", "systemctl not found"
    return run_bounded(module, [sbin] + list(args), timeout)


def unit_facts(module, unit):
    rc, out, err = systemctl(module, rd.show_args(unit))
    return rd.unit_facts(unit, out if rc == 0 else "")


def read_units(module):
    """What systemd says of the units of the host daemons rung 5 may stop (recover_daemons.unit_facts)."""
    return {unit: unit_facts(module, unit) for unit in rd.STOPPABLE_UNITS}


def _same_process(pid, starttime):
    return procs.is_alive(pid, starttime) is not None


def stop_daemon(module, d):
    """Stop a host daemon through its systemd unit, after systemd confirms it is still that unit's main process."""
    why = rd.still_main(d, unit_facts(module, d["unit"]), _same_process(d["pid"], d["starttime"]))
    if why:
        raise DaemonError(why + "; no GPU was reset")
    rc, out, err = systemctl(module, ["stop", d["unit"]])
    if rc != 0:
        d["error"] = "systemctl stop %s: rc %d %s" % (d["unit"], rc, (err or out).strip())
    gone = rsig.wait_until(lambda: not _same_process(d["pid"], d["starttime"]), rd.STOP_WAIT_S)
    d["stopped"] = bool(gone)
    if not gone:
        raise DaemonError("%s (pid %d) did not stop within %d s of systemctl stop %s; no GPU was reset" % (
            d["name"], d["pid"], rd.STOP_WAIT_S, d["unit"]))


def start_daemon(module, d):
    """Start a stopped daemon again through its unit (nothing else is ever run), and wait until the unit's new main
    process holds the GPUs again."""
    rc, out, err = systemctl(module, ["start", d["unit"]])
    if rc != 0:
        d["error"] = "systemctl start %s: rc %d %s" % (d["unit"], rc, (err or out).strip())
        d["restarted"] = False
        return
    state = {}

    def back():
        facts = unit_facts(module, d["unit"])
        main = facts["main_pid"]
        # The device minors the new main process holds open (the scan's own numbering, as gpu_minors).
        held = (procs.read_process(main, "/", procs.uvm_majors(), deep=False) or {}).get("gpu_fds") if main else None
        state["ok"], state["why"] = rd.restarted(d, facts, held)
        state["pid"] = main
        return state["ok"]
    rsig.wait_until(back, rd.START_WAIT_S)
    d["restarted"] = bool(state.get("ok"))
    d["pid_after"] = state.get("pid") if d["restarted"] else None
    if not d["restarted"]:
        d["error"] = "started, but after %d s: %s" % (rd.START_WAIT_S, state.get("why"))


class DaemonError(Exception):
    pass


def reset_groups(module, smi, plan, result, t):
    for item in plan:
        ids = ",".join(str(g) for g in item["gpus"])
        entry = {"gpus": item["gpus"]}
        if item["persistence_mode_enabled"]:
            pm_ids = ",".join(str(g) for g in item["persistence_mode_enabled"])
            rc, out, err = run_smi(module, smi, ["-pm", "0", "-i", pm_ids], t)
            entry["pm_off"] = {"rc": rc, "out": (out + err).strip()}
        try:
            rc, out, err = run_smi(module, smi, ["-r", "-i", ids], 3 * t)
            entry.update(rc=rc, out=(out + err).strip(), ok=rc == 0)
            result["changed"] = True
        finally:
            if item["persistence_mode_enabled"]:
                rc2, out2, err2 = run_smi(module, smi, ["-pm", "1", "-i", pm_ids], t)
                entry["pm_restore"] = {"rc": rc2, "out": (out2 + err2).strip()}
        result["reset"].append(entry)


def rung_kill_holders(module, vmid, smi, result):
    disable_service(module, vmid, result)
    kill_holders(module, vmid, smi, result, module.params["term_grace"], module.params["wait"],
                 module.params["unit_stop_timed_out"])
    result["planned"]["disable_service_first"] = module.params["service"]


def end_gpu_processes(module, vmid, smi, result):
    """Before a reset: end the container's GPU processes, as NVIDIA's recovery flag says ("Terminate all GPU
    processes, reset the GPU using nvidia-smi -r", Error Recovery and Response Flags): stop and disable the service
    when the container runs (so nothing respawns), then SIGTERM/SIGKILL what still holds its GPUs, scoped as rung 2.
    The container keeps running; a holder outside it stays a client that refuses the reset."""
    p = module.params
    running = container_running(module, vmid, result)
    done = {"container_running": running, "service_stopped": None, "kill_holders": None}
    if running and p["service"]:
        stop_service(module, vmid, result)
        done["service_stopped"] = p["service"]
    if running:
        kill_holders(module, vmid, smi, result, p["term_grace"], p["wait"])
        done["kill_holders"] = result.get("planned")
    return done


def node_reset_lock(module, vmid, result):
    """One GPU reset per node at a time: the node's reset lock (recover_lock), held by this process for the reset
    (the kernel drops it when the process ends, however it ends); another ladder's reset is waited for, at most
    O(reset_lock_wait) seconds, then this one is refused, naming the holder. None in check mode (nothing is reset)."""
    if module.check_mode:
        return None
    p = module.params
    path = rl.reset_path(p["lock_dir"])
    fd, info = rl.acquire(path, p["reset_lock_wait"])
    if fd is None:
        module.fail_json(msg="Another GPU reset runs on this node: %s. Waited %.0f s; no GPU was reset." % (
            info["msg"], info["waited_s"]), reset_lock={"path": path, "holder": info.get("holder")}, **result)
    me = os.getpid()
    rl.write_record(fd, rl.holder_record(me, rl.start_ticks(me), "GPU reset", vmid))
    result["reset_lock"] = {"path": path, "waited_s": info["waited_s"], "waited_for": info.get("waited_for")}
    return fd


def rung_reset_gpus(module, vmid, smi, result):
    ended = end_gpu_processes(module, vmid, smi, result)
    lock = node_reset_lock(module, vmid, result)
    try:
        reset_gpus(module, vmid, smi, result)
        result["planned"]["end_gpu_processes_first"] = ended
    except DaemonError as exc:
        module.fail_json(msg=str(exc), **result)
    finally:
        if lock is not None:
            os.ftruncate(lock, 0)
            os.close(lock)
    unstarted = [d for d in result.get("daemons", []) if d.get("stopped") and not d.get("restarted")]
    if unstarted:
        module.fail_json(msg="%s could not be started again after the reset: %s; start it by hand" % (
            ", ".join(d["name"] for d in unstarted), "; ".join(d.get("error") or "" for d in unstarted)), **result)


# What each acting rung of recover_gate does (its option action is the rung's name, gate.RUNG_NAMES).
RUNG_ACTIONS = {
    gate.RUNG_STOP_SERVICE: lambda module, vmid, smi, result: stop_service(module, vmid, result),
    gate.RUNG_KILL_HOLDERS: rung_kill_holders,
    gate.RUNG_UNBLOCK_STUCK: unblock_stuck,
    gate.RUNG_STOP_CONTAINER: lambda module, vmid, smi, result: stop_container(module, vmid, result),
    gate.RUNG_RESET_GPUS: rung_reset_gpus,
}


def main():
    module = AnsibleModule(
        argument_spec=dict(
            vmid=dict(type="int", required=True),
            action=dict(type="str", required=True, choices=list(gate.ACTION_NAMES)),
            service=dict(type="str"),
            service_stop_timeout=dict(type="int", default=90),
            stuck_timeout=dict(type="int", default=60),
            container_shutdown_timeout=dict(type="int", default=60),
            container_stop_timeout=dict(type="int", default=90),
            term_grace=dict(type="int", default=10),
            unit_stop_timed_out=dict(type="bool", default=False),
            wait=dict(type="int", default=30),
            gpus=dict(type="list", elements="int"),
            command_timeout=dict(type="int", default=60),
            nvidia_smi_path=dict(type="path"),
            stop_host_daemons=dict(type="bool", default=True),
            reset_lock_wait=dict(type="int", default=180),
            lock_dir=dict(type="path", default=rl.LOCK_DIR),
        ),
        required_if=[("action", gate.RUNG_NAMES[gate.RUNG_RESET_GPUS], ("gpus",))],
        supports_check_mode=True,
    )
    vmid = module.params["vmid"]
    if vmid_problem(vmid):
        module.fail_json(msg="vmid %s" % vmid_problem(vmid))
    if module.params["service"] is not None and unit_name_message("service", module.params["service"]):
        module.fail_json(msg=unit_name_message("service", module.params["service"]))
    smi = module.params["nvidia_smi_path"] or module.get_bin_path("nvidia-smi", opt_dirs=["/usr/bin", "/usr/local/bin"])
    result = {"changed": False, "planned": {}, "signalled": [], "aborted": [], "refused": [], "remaining": [],
              "reset": [], "commands": [], "started_at": time.time()}
    start = time.monotonic()
    rung = gate.RUNG_OF_ACTION[module.params["action"]]
    RUNG_ACTIONS[rung](module, vmid, smi, result)
    result["seconds"] = round(time.monotonic() - start, 2)
    result["ended_at"] = time.time()
    if rung == gate.RUNG_RESET_GPUS and any(not r.get("ok") for r in result["reset"]):
        module.fail_json(msg="GPU reset failed: %s" % "; ".join(r.get("out", "") for r in result["reset"] if not r.get("ok")),
                         **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
