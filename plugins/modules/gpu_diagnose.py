#!/usr/bin/python
# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpu_diagnose
short_description: Diagnose the GPU and memory state of one Proxmox VE container from the node (read-only)
version_added: 0.1.0
author:
  - inferops team (@inferops)
description:
  - Runs on the Proxmox VE node, as root, and gathers the evidence of rung 0 of the recovery ladder for one
    container (see C(docs/recover.md)), without changing anything.
  - GPUs and compute processes from C(nvidia-smi) (wrapped in C(timeout); a hang is itself a finding).
    Compute-app PIDs are host PIDs; each is mapped to its container through C(/proc/PID/cgroup)
    (C(/lxc/<vmid>/...) on PVE, C(lxc.payload.<vmid>) on plain LXC, cgroup v2 or the v1 hierarchies).
  - Every host process is scanned once; the container's processes are classified (running, zombie, zombie
    with live threads, D state on FUSE, NFS, in the NVIDIA driver, or unknown, from C(wchan) and
    C(/proc/PID/stack)), and those holding C(/dev/nvidia*) (fd table, matched by device number) are listed.
  - Nothing it reads can make it wait on a filesystem a tenant serves. A holder's fd is stat'ed only when its mount
    (from C(/proc/self/fdinfo) of an C(O_PATH) copy, and the holder's C(/proc/PID/mountinfo)) is a devtmpfs or tmpfs;
    a C(/dev/nvidia*) path on any other filesystem (a FUSE mount at C(/dev/nvidia-x)) is an unverified holder, named
    in C(evidence.unverified_holders), a holder of its own container (never Clean), a note for any other. The
    container's C(/dev/shm) is listed only through directories on local filesystems. Every command runs under a
    supervisor that kills it at O(command_timeout), whatever it starts.
  - Host memory (MemAvailable, Shmem, Mlocked) through the parser of M(inferops.gpu_inference.gpu_host_facts),
    the container's cgroup memory and OOM-kill count, leaked C(/dev/shm) segments in the container, the
    state of the service inside it (C(pct exec <vmid> -- systemctl show)), recent kernel Xid/OOM/hung-task
    lines (best effort) and the deploy baseline C(<baseline_dir>/<vmid>.json).
  - Scope first (C(docs/recover.md), "Scope"), before anything is read from the container. O(vmid) must be a
    container the inventory declares on O(node) (an entry of O(declared)), unless O(allow_undeclared) names it
    explicitly. The container's GPUs are its C(devN) (or C(lxc.mount.entry)) entries for C(/dev/nvidiaN) in
    C(pct config) now. A failing C(pct config) (GPUs unknown) or a baseline recorded for other GPUs (stale)
    fails the module with what to do; nothing is judged or changed then.
  - Without a baseline the verdict is never C(Clean) (the GPUs' idle figures are unknown); it is C(Not clean) with
    that reason and recommended rung 0, since no rung can change it; M(inferops.gpu_inference.gpu_baseline)
    records one at idle.
  - The driver's C(gpu_recovery_action) of each of the container's GPUs must be C(None). C(Reset) or a drain asks
    for the ladder's GPU reset (after the container is stopped), C(Reboot) is a reboot signal, and an unreadable
    value is not clean. A driver that does not know the field is noted, not judged.
  - Takes O(samples) samples O(sample_interval) seconds apart (fewer with O(stop_when_decided)); the verdict is
    C(Clean) only when every sample passes, and a process counts as stuck only when it is in D state in every sample.
  - Returns the verdict and the first rung of the ladder the evidence says is needed (it jumps rungs, for
    example straight to the scoped kill when no service runs but escaped processes hold the GPUs). The module only
    reads; the verdict, its reasons, the rung and RV(settled) are decided in one place, C(recover_gate.judge).
options:
  vmid:
    description: The container to diagnose.
    type: int
    required: true
  service:
    description: The systemd unit of the inference server inside the container.
    type: str
    default: sglang.service
  baseline_dir:
    description: Directory on the node holding C(<vmid>.json), the baseline deploy records before it starts the server.
    type: path
    default: /var/lib/inferops/baseline
  samples:
    description: Number of samples; all must be clean.
    type: int
    default: 2
  sample_interval:
    description: Seconds between samples.
    type: float
    default: 5
  gpu_memory_tolerance_mib:
    description: MiB above the baseline a GPU may use and still count as clean (GCM uses 15 MiB).
    type: int
    default: 16
  mem_available_tolerance_bytes:
    description:
      - How far host MemAvailable may be below the baseline's. Default max(2% of MemTotal, 8 GiB).
    type: int
  shmem_tolerance_bytes:
    description: How far host Shmem may be above the baseline's.
    type: int
    default: 2147483648
  mlocked_tolerance_bytes:
    description: How far host Mlocked may be above the baseline's.
    type: int
    default: 1073741824
  min_available_pct:
    description: Without a baseline, the host is clean when MemAvailable is at least this percentage of MemTotal.
    type: float
    default: 10
  host_memory_attribution_bytes:
    description:
      - The node is shared. A host-memory shortfall makes this container Not clean only when its own cgroup uses
        more than this; otherwise it is reported as a note (no rung of this container's ladder could change it).
    type: int
    default: 2147483648
  after_rung:
    description:
      - The last rung already tried; the recommended rung is always higher (0 at the start).
    type: int
    default: 0
  command_timeout:
    description: Seconds each C(nvidia-smi) and C(pct) call may take (then it and every process of its session are killed).
    type: int
    default: 30
  kernel_log:
    description:
      - Read the kernel log (O(kmsg_path)) and judge the C(NVRM Xid) lines logged since the run started.
      - A new Xid on one of the container's GPUs makes the verdict Not clean (Xid 48, 79, 119, 120, 154 are reboot
        signals); Xids logged before the run are evidence only. An unreadable log is Not clean.
    type: bool
    default: true
  kmsg_path:
    description: The kernel's record device; every record carries a sequence number.
    type: path
    default: /dev/kmsg
  kernel_since_seq:
    description:
      - The kernel log cursor of the run's first diagnosis (its RV(kernel_cursor)); records after it are new.
      - Unset, the cursor is taken when this diagnosis starts.
    type: int
  nvidia_smi_path:
    description: Path to C(nvidia-smi); looked up in E(PATH) by default.
    type: path
  pct_path:
    description: Path to C(pct); looked up in E(PATH) by default.
    type: path
  node:
    description: The inventory name of the node this runs on (what O(declared) entries name as C(node_host)).
    type: str
    required: true
  declared:
    description:
      - The GPU containers the inventory declares, each C({host, vmid, node_host, adopt}) (playbooks/recover.yml
        reads them from the group sglang_containers with the variables deploy.yml uses; C(adopt) is that host's
        C(pve_gpu_container_adopt)).
    type: list
    elements: dict
    default: []
  allow_undeclared:
    description: Diagnose (and let the ladder act on) O(vmid) although no entry of O(declared) names it on O(node).
    type: bool
    default: false
  owner_tag:
    description:
      - The PVE tag that marks the containers this collection manages (deploy.yml's C(pve_lxc) puts it on them).
        A container whose C(pct config) lacks it is refused, nothing read further, unless its O(declared) entry
        says C(adopt=true) (the opt-in deploy.yml takes, C(pve_gpu_container_adopt)), because a VMID destroyed and made
        again by someone else is not this collection's to stop, kill in or reset.
    type: str
    default: inferops-gpu
  rung_started_at:
    description:
      - When the rung being verified started, in seconds since the epoch on the node's clock (the RV(node_time) of
        the diagnosis before it). With it the result says whether the verification may stop polling (RV(settled)).
    type: float
  stuck_grace:
    description: Seconds processes may stay stuck after the rung started before the next rung is taken.
    type: float
    default: 30
  release_grace:
    description: Seconds GPU memory may stay held (with no process, holders, or the container down) after the rung started.
    type: float
    default: 60
  stop_timed_out:
    description:
      - The rung verified is rung 1 and its C(systemctl stop) ran out of the stop timeout. With holders still alive,
        the verification settles at once instead of waiting O(release_grace) (they had SIGTERM for the whole timeout).
    type: bool
    default: false
  stop_when_decided:
    description:
      - Take no more samples once one is not clean and no process of the container is in D state or a zombie with
        live threads in it (recover_gate.sampling_decided). The verdict is then Not clean whatever later samples
        show, and no process can be stuck in every sample; the rung is chosen from that sample. recover.yml's
        diagnoses set it (rung 0 and each poll of a verification); a clean sample, or one with such a process, still
        needs the next.
    type: bool
    default: false
  poll_budget:
    description:
      - With O(rung_started_at) (a verification), diagnose again O(poll_delay) seconds after each diagnosis that does
        not settle (RV(settled)), until one settles or this many seconds have passed since the first began; the
        result is the last diagnosis's. 0 (the default), or without O(rung_started_at), one diagnosis.
    type: float
    default: 0
  poll_delay:
    description: Seconds between two diagnoses of a verification (O(poll_budget)).
    type: float
    default: 1
  ignore_baseline:
    description:
      - Judge without the baseline on disk (even a stale one), as recover_record_baseline does before it records a
        new one at idle.
    type: bool
    default: false
extends_documentation_fragment:
  - inferops.gpu_inference.attributes
attributes:
  check_mode:
    support: full
    details: The module never changes anything.
  diff_mode:
    support: none
notes:
  - Run it on the Proxmox VE node as root. Inside a container the driver reports no process, so the evidence is empty.
seealso:
  - module: inferops.gpu_inference.gpu_host_facts
  - module: inferops.gpu_inference.gpu_recover_action
"""

EXAMPLES = r"""
- name: Is CT 129 clean?
  inferops.gpu_inference.gpu_diagnose:
    vmid: 129
    node: pve1
    declared: [{host: ct129, vmid: 129, node_host: pve1}]
  register: diag

- name: Print the verdict
  ansible.builtin.debug:
    msg: "{{ diag.verdict }}: {{ diag.reasons | join('; ') }} (next rung {{ diag.recommended_rung }})"
"""

RETURN = r"""
verdict:
  description: C(Clean) or C(Not clean).
  returned: always
  type: str
  sample: Not clean
clean:
  description: Whether every sample passed the gate.
  returned: always
  type: bool
kernel_cursor:
  description:
    - The kernel log's sequence number when the run started (O(kernel_since_seq) if given); pass it to the next
      diagnosis of the same run. None when the kernel log was not read.
  returned: always
  type: int
reasons:
  description: Why the last failing sample is not clean (empty when clean).
  returned: always
  type: list
  elements: str
notes:
  description: Facts worth knowing that do not decide the verdict (no baseline, GPUs shared with other holders).
  returned: always
  type: list
  elements: str
recommended_rung:
  description: The rung to climb to next (0 when clean; 6 is the reboot report).
  returned: always
  type: int
recommended_rung_name:
  description: Its name (stop_service, kill_holders, unblock_stuck, stop_container, reset_gpus, reboot_report).
  returned: always
  type: str
node_time:
  description: The node's clock when the diagnosis ended (seconds since the epoch); the next rung's start.
  returned: always
  type: float
settled:
  description:
    - Whether the verification of the rung that started at O(rung_started_at) may stop polling (recover_gate.settled)
      - the gate passes, a reboot signal, a GPU reset the driver asks for, stuck past O(stuck_grace), or memory not
      released past O(release_grace). Without O(rung_started_at), whether the gate passes.
  returned: always
  type: bool
settled_reason:
  description: Why it may stop, or what it waits for.
  returned: always
  type: str
polls:
  description: How many diagnoses this call made (more than one only with O(poll_budget)); the result is the last one's.
  returned: always
  type: int
rung_names:
  description: The name of every rung, by number (0 diagnose ... 6 reboot_report), defined once in recover_gate.RUNG_NAMES.
  returned: always
  type: list
  elements: str
rung_reason:
  description: Why that rung.
  returned: always
  type: str
findings:
  description: The facts the rung was chosen from (container_status, service_active, holders, stuck,
    gpu_excess_without_process, host_memory_only, reboot_signals, recovery_reset).
  returned: always
  type: dict
evidence:
  description:
    - The evidence of the last sample and the one-off reads; keys container, service, gpus, ct_processes,
      ct_holders, ct_stuck, other_gpu_holders, unverified_holders (processes, of the container or not, with a
      C(/dev/nvidia*) path on a filesystem the scan never stats, such as FUSE; each as PID/comm, owner, each fd's path and
      filesystem), host_memory, host_judgement, baseline, kernel_log (its lines,
      oom_kills_in_container and oom_kill_last_seq, the /dev/kmsg sequence number of the container's newest OOM kill
      record, each kill attributed by the task_memcg field of the kernel's C(oom-kill:) record only, never by the
      task's name; oom_kills_ambiguous, records that read more than one way and are attributed to no container),
      shm_leftovers, nvlink_peers, recovery_actions (the driver's gpu_recovery_action per GPU), samples.
  returned: always
  type: dict
"""

import sys
import time

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.inferops.gpu_inference.plugins.module_utils.host import bounded_command
from ansible_collections.inferops.gpu_inference.plugins.module_utils.host import gpu_facts
from ansible_collections.inferops.gpu_inference.plugins.module_utils.recover import recover_baseline
from ansible_collections.inferops.gpu_inference.plugins.module_utils.recover import recover_gate as gate
from ansible_collections.inferops.gpu_inference.plugins.module_utils.recover import recover_kernel as rk
from ansible_collections.inferops.gpu_inference.plugins.module_utils.recover import recover_procs as procs
from ansible_collections.inferops.gpu_inference.plugins.module_utils.recover import recover_pve as pve
from ansible_collections.inferops.gpu_inference.plugins.module_utils.recover import recover_scope
from ansible_collections.inferops.gpu_inference.plugins.module_utils.recover import recover_smi
from ansible_collections.inferops.gpu_inference.plugins.module_utils.common.safe_text import unit_name_message


class Runner:
    """Runs commands under the bounded supervisor (bounded_command: nothing the command starts, a container's own
    binary behind pct exec included, can hold the module past the timeout) and says which ones ran out."""

    def __init__(self, module, timeout):
        self.module = module
        self.timeout = timeout

    def run(self, args, timeout=None):
        t = int(timeout or self.timeout)
        rc, out, err = self.module.run_command(bounded_command.argv(sys.executable, t, args),
                                               environ_update={"LC_ALL": "C"})
        return rc, out, err, bounded_command.timed_out(rc)


# --------------------------------------------------------------------------- readings (nothing here judges)


def read_gpus(runner, smi, hung_before=False):
    """(gpu rows, compute apps, error, hung) from nvidia-smi (not run again when it hung already in this diagnosis)."""
    if not smi:
        return [], [], "nvidia-smi not found", False
    if hung_before:
        return [], [], "nvidia-smi timed out reading the GPUs' numbering", True
    rc, out, err, hung = runner.run(gpu_facts.gpu_query_args(smi))
    if hung:
        return [], [], "nvidia-smi --query-gpu timed out", True
    if rc != 0:
        return [], [], "nvidia-smi exited %d: %s" % (rc, (err or out).strip()), False
    try:
        gpus = gpu_facts.parse_gpu_csv(out)
    except gpu_facts.ParseError as exc:
        return [], [], "unexpected nvidia-smi output: %s" % exc, False
    rc, out, err, hung = runner.run(gpu_facts.compute_apps_query_args(smi))
    if hung:
        return gpus, [], "nvidia-smi --query-compute-apps timed out", True
    if rc != 0:
        return gpus, [], "nvidia-smi --query-compute-apps exited %d: %s" % (rc, (err or out).strip()), False
    try:
        apps = gpu_facts.parse_compute_apps_csv(out)
    except gpu_facts.ParseError as exc:
        return gpus, [], "unexpected nvidia-smi --query-compute-apps output: %s" % exc, False
    return gpus, apps, None, False


def _slim(proc):
    keys = ("pid", "comm", "state", "class", "pgid", "nspid", "gpu_fds", "nvidia_fd_kinds", "unverified_nvidia_fds",
            "wchan", "stack", "threads", "task_states", "vmid")
    return {k: proc.get(k) for k in keys}


def read_recovery_actions(runner, smi, failed):
    """The driver's gpu_recovery_action per GPU (recover_smi.parse_recovery_actions); skipped when nvidia-smi failed."""
    if not smi or failed:
        return {"supported": False, "actions": {}, "error": None}
    rc, out, err, hung = runner.run(recover_smi.recovery_action_query_args(smi))
    if hung:
        return {"supported": True, "actions": {}, "error": "nvidia-smi --query-gpu=gpu_recovery_action timed out"}
    return recover_smi.parse_recovery_actions(rc, out, err)


def read_numbering(runner, smi):
    """The driver's GPU numbering, device minor <-> nvidia-smi index <-> PCI bus id (recover_smi.gpu_numbering):
    {"numbering": dict or None, "error": str or None, "hung": bool}."""
    if not smi:
        return {"numbering": None, "error": "nvidia-smi not found", "hung": False}
    gpus, _apps, error, hung = read_gpus(runner, smi)
    if error:
        return {"numbering": None, "error": error, "hung": hung}
    rc, out, err, hung = runner.run(recover_smi.minor_query_args(smi))
    if hung or rc != 0:
        return {"numbering": None, "hung": hung,
                "error": "nvidia-smi -q %s" % ("timed out" if hung else "exited %d: %s" % (rc, (err or out).strip()[:300]))}
    return {"numbering": recover_smi.gpu_numbering(gpus, recover_smi.parse_q_minors(out)), "error": None, "hung": False}


def take_sample(runner, smi, vmid, container, uvm_majors, init_pid=None):
    container_gpus = container["gpus"]
    gpus, apps, smi_error, hung = read_gpus(runner, smi, container.get("numbering_hung", False))
    recovery = read_recovery_actions(runner, smi, smi_error or hung)
    scan = procs.scan_processes(vmid, "/", uvm_majors)
    owner_of = {app["pid"]: procs.container_of_pid(app["pid"]) for app in apps if app.get("pid") is not None}
    uuid_to_index = {g["uuid"]: g["index"] for g in gpus}
    for g in gpus:
        g["apps"] = []
    by_index = {g["index"]: g for g in gpus}
    for app in apps:
        idx = uuid_to_index.get(app.get("gpu_uuid"))
        entry = dict(app, owner=owner_of.get(app.get("pid"), "gone"), gpu_index=idx)
        if idx in by_index:
            by_index[idx]["apps"].append(entry)
    ct_procs = scan["container"]
    try:
        host_memory = gpu_facts.read_host_memory("/")
    except gpu_facts.ParseError:
        host_memory = {}
    return {
        "time": time.time(),
        "vmid": vmid,
        "container_gpus": container_gpus,
        "container_gpus_unmapped": container.get("gpus_unmapped") or [],
        "gpu_numbering_error": container.get("gpu_numbering_error"),
        "gpus": gpus,
        "nvidia_smi_error": smi_error,
        "nvidia_smi_hung": hung,
        "recovery_actions": recovery,
        "ct_processes": ct_procs,
        # A process of the container with a /dev/nvidia* path on a filesystem that is not stat'ed (recover_procs
        # nvidia_fds) is one of its holders: unverified, so never taken as idle.
        "ct_holders": [x for x in ct_procs if x["holds_nvidia"] or x["holds_unverified"]],
        "ct_stuck": [x for x in ct_procs if x["class"] not in ("running", "zombie")],
        "other_gpu_holders": [x for x in scan["nvidia_holders"]
                              if x["vmid"] != vmid and set(x["gpu_fds"]) & set(container["gpu_minors"])],
        "other_unverified_holders": [x for x in scan["unverified_holders"] if x["vmid"] != vmid],
        "host_memory": host_memory,
        "ct_memory_usage_bytes": pve.container_memory(vmid, init_pid, "/")["memory_usage_bytes"],
    }


def read_container(module, runner, pct, smi, notes):
    """The container (scope, owner tag, pct status, its GPUs from pct config as nvidia-smi indexes through the
    driver's numbering) and its baseline; fails the module, changing nothing, when the scope refuses it
    (recover_scope)."""
    p = module.params
    vmid = p["vmid"]
    container = {"vmid": vmid, "status": None, "init_pid": None, "gpus": [], "gpu_minors": [], "gpus_unmapped": [],
                 "gpus_from": None}
    try:
        container["scope"] = recover_scope.check_target(vmid, p["node"], p["declared"] or [], p["allow_undeclared"])
    except recover_scope.ScopeError as exc:
        module.fail_json(msg=str(exc), refused="scope")
    if not pct:
        module.fail_json(msg="pct not found: gpu_diagnose runs on a Proxmox VE node")
    rc, out, err, hung = runner.run([pct, "status", str(vmid), "--verbose"])
    if rc != 0:
        module.fail_json(msg="pct status %d failed (%s): %s" % (vmid, "timed out" if hung else "rc %d" % rc,
                                                                (err or out).strip()))
    st = pve.parse_pct_status(out)
    container["status"], container["init_pid"] = st["status"], st["pid"]
    rc, out, err, hung = runner.run([pct, "config", str(vmid)])
    if rc == 0:
        try:
            container["owner"] = recover_scope.check_owner(vmid, p["node"], pve.parse_pct_config_tags(out),
                                                           p["owner_tag"], container["scope"].get("adopt", False))
        except recover_scope.ScopeError as exc:
            module.fail_json(msg=str(exc), refused="owner")
    minors = pve.parse_pct_config_gpus(out) if rc == 0 else []
    numbering = read_numbering(runner, smi) if minors else {"numbering": None, "error": None, "hung": False}
    indexes, unmapped = recover_smi.indexes_of_minors(minors, numbering["numbering"])
    container["gpu_minors"], container["gpus_unmapped"] = minors, unmapped
    container["numbering_hung"] = numbering["hung"]
    if unmapped:
        container["gpu_numbering_error"] = recover_smi.describe_unmapped(unmapped, numbering["numbering"], numbering["error"])
        notes.append(container["gpu_numbering_error"])
    elif numbering["numbering"] and numbering["numbering"]["problems"]:
        notes.append("GPU numbering: %s" % "; ".join(numbering["numbering"]["problems"]))
    if numbering["numbering"]:
        container["gpu_numbering"] = {"/dev/nvidia%d" % m: {"index": i, "pci_bus_id": numbering["numbering"]["bus_of_index"].get(i)}
                                      for m, i in sorted(numbering["numbering"]["index_of_minor"].items()) if m in minors}
    baseline_path, baseline, baseline_error = recover_baseline.load(p["baseline_dir"], vmid)
    if baseline_error:
        notes.append(baseline_error)
    if p["ignore_baseline"] and baseline is not None:
        # recover_record_baseline: the baseline on disk (stale, or from another layout) is judged without, and
        # recorded again at idle once everything else is clean.
        notes.append("baseline %s set aside (record_baseline): judged without it" % baseline_path)
        baseline = None
    try:
        # Unmapped minors leave the GPUs unknown (a reason of the gate): the baseline is not compared with a part.
        gpus = recover_scope.container_gpus(vmid, rc, indexes, "timed out" if hung else (err or out),
                                            None if unmapped else recover_baseline.gpus_of(baseline), baseline_path)
    except recover_scope.ScopeError as exc:
        module.fail_json(msg=str(exc), refused="gpus")
    container["gpus"], container["gpus_from"] = gpus["gpus"], gpus["from"]
    if baseline is None:
        notes.append("no baseline at %s: GPU baseline 0 MiB and no compute apps; host memory judged without a baseline"
                     % baseline_path)
    return container, baseline_path, baseline


def read_service(runner, pct, vmid, name, running):
    """``systemctl show`` of the service inside the container (not read when the container is stopped)."""
    service = {"name": name, "checked": False}
    if not running:
        return service
    # "--": the unit name is never read as an option of systemctl (main() also refuses a name starting with "-").
    rc, out, err, hung = runner.run([pct, "exec", str(vmid), "--", "systemctl", "show", "-p", "ActiveState",
                                     "-p", "SubState", "-p", "UnitFileState", "-p", "MainPID", "-p", "NRestarts",
                                     "-p", "LoadState", "--", name])
    if rc != 0:
        service["error"] = ("timed out" if hung else "rc %d: %s" % (rc, (err or out).strip()))
        return service
    fields = pve.parse_systemctl_show(out)
    service.update(checked=True, active_state=fields.get("ActiveState"), sub_state=fields.get("SubState"),
                   unit_file_state=fields.get("UnitFileState"), load_state=fields.get("LoadState"),
                   main_pid=int(fields["MainPID"]) if fields.get("MainPID", "").isdigit() else None,
                   n_restarts=fields.get("NRestarts"))
    return service


def read_kernel(p, kmsg_start):
    """The kernel records to judge (the gate's ``kernel`` reading) and the kernel log's evidence, or (None, ...) when
    the log is not read. Records after the run's cursor (kernel_since_seq, else the one taken before the first
    sample) are new (recover_kernel)."""
    evidence = {"lines": [], "oom_kills_in_container": 0, "oom_kill_last_seq": None, "source": None, "cursor": None}
    if not p["kernel_log"]:
        return None, evidence
    k1 = rk.read_kmsg(p["kmsg_path"])
    since = p["kernel_since_seq"] if p["kernel_since_seq"] is not None else kmsg_start["cursor"]
    error = k1["error"] or kmsg_start["error"]
    if not error:
        evidence.update(rk.parse_kernel_log("\n".join(r["message"] for r in k1["records"]), p["vmid"]))
        evidence["oom_kill_last_seq"] = rk.last_oom_kill_seq(k1["records"], p["vmid"])
        evidence["source"], evidence["cursor"] = p["kmsg_path"], since
    return {"records": k1["records"], "since": since, "error": error}, evidence


def read_nvlink(runner, smi, gpus, notes):
    if not smi or not gpus:
        return {}
    rc, out, err, hung = runner.run([smi, "topo", "-m"], 20)
    if rc != 0:
        notes.append("nvidia-smi topo -m unavailable: NVLink peers unknown (GPUs reset individually)")
        return {}
    return recover_smi.parse_topo_nvlink(out)


# --------------------------------------------------------------------------- rung 0: read, then ask the gate


def diagnose(module):
    """One diagnosis; with rung_started_at and poll_budget, again after each one that does not settle, until one settles
    or the budget has passed since the first began (recover_gate.poll_again): the last one's result, with ``polls``."""
    p = module.params
    if p["command_timeout"] < 1:
        module.fail_json(msg="command_timeout must be at least 1 (seconds each command may take), got %d"
                         % p["command_timeout"])
    if p["poll_budget"] < 0 or p["poll_delay"] < 0:
        module.fail_json(msg="poll_budget and poll_delay are seconds, 0 or more; got %s and %s"
                         % (p["poll_budget"], p["poll_delay"]))
    runner = Runner(module, p["command_timeout"])
    smi = p["nvidia_smi_path"] or module.get_bin_path("nvidia-smi", opt_dirs=["/usr/bin", "/usr/local/bin"])
    pct = p["pct_path"] or module.get_bin_path("pct", opt_dirs=["/usr/sbin", "/sbin"])
    began = time.time()
    polls = 0
    while True:
        result = diagnose_once(module, runner, smi, pct)
        polls += 1
        budget = p["poll_budget"] if p["rung_started_at"] is not None else 0
        if not gate.poll_again(result["settled"], time.time() - began, budget):
            result["polls"] = polls
            return result
        time.sleep(p["poll_delay"])


def diagnose_once(module, runner, smi, pct):
    p = module.params
    vmid = p["vmid"]
    notes = []
    container, baseline_path, baseline = read_container(module, runner, pct, smi, notes)
    service = read_service(runner, pct, vmid, p["service"], container["status"] == "running")
    uvm_majors = procs.uvm_majors()
    tolerances = {
        "gpu_memory_mib": p["gpu_memory_tolerance_mib"],
        "mem_available_bytes": p["mem_available_tolerance_bytes"],
        "shmem_bytes": p["shmem_tolerance_bytes"],
        "mlocked_bytes": p["mlocked_tolerance_bytes"],
        "min_available_pct": p["min_available_pct"],
        "ct_attribution_bytes": p["host_memory_attribution_bytes"],
    }
    # The kernel log's cursor before the first sample.
    kmsg_start = rk.read_kmsg(p["kmsg_path"]) if p["kernel_log"] else {"cursor": None, "error": None}
    samples = []
    for i in range(max(1, p["samples"])):
        if i:
            time.sleep(p["sample_interval"])
        samples.append(take_sample(runner, smi, vmid, container, uvm_majors, container["init_pid"]))
        if samples[-1]["nvidia_smi_hung"]:
            break
        if p["stop_when_decided"] and gate.sampling_decided(gate.evaluate_sample(samples[-1], baseline, tolerances),
                                                            samples[-1]):
            break
    kernel, kernel_evidence = read_kernel(p, kmsg_start)
    ct_memory = pve.container_memory(vmid, container["init_pid"], "/")
    shm_names, shm_why = procs.shm_listing(container["init_pid"], "/")
    shm = [n for n in shm_names if procs.SHM_LEFTOVER_RE.match(n)]
    if shm_why:
        notes.append(shm_why)
    if shm:
        notes.append("leftover /dev/shm segments in CT %d: %s" % (vmid, ", ".join(shm[:10])))
    nvlink = read_nvlink(runner, smi, container["gpus"], notes)

    judged = gate.judge(samples, baseline, tolerances, baseline_path=baseline_path,
                        container_status=container["status"], service_state=service.get("active_state"),
                        kernel=kernel, after_rung=p["after_rung"],
                        elapsed_s=None if p["rung_started_at"] is None else time.time() - p["rung_started_at"],
                        stuck_grace_s=p["stuck_grace"], release_grace_s=p["release_grace"],
                        stop_timed_out=p["stop_timed_out"])

    for note in judged.notes:
        if note not in notes:
            notes.append(note)
    if kernel is not None and not kernel["error"]:
        kernel_evidence["new_xids"], kernel_evidence["old_xids"] = judged.kernel["new_xids"], judged.kernel["old_xids"]
    last, last_eval = samples[-1], judged.evaluations[-1]
    fuse = {s["pid"]: procs.fuse_connections_of(s["pid"], "/") for s in judged.stuck if s["class"] == "stuck_fuse"}
    evidence = {
        "container": dict(container, memory=ct_memory),
        "service": service,
        "gpus": last_eval["gpus"],
        "ct_processes": ["%d/%s/%s" % (x["pid"], x["comm"], x["class"]) for x in last["ct_processes"]],
        "ct_holders": [_slim(x) for x in last["ct_holders"]],
        "ct_stuck": [_slim(x) for x in judged.stuck],
        "fuse_connections": {str(k): v for k, v in fuse.items()},
        "other_gpu_holders": [_slim(x) for x in last["other_gpu_holders"]],
        "unverified_holders": [procs.describe_unverified(x) for x in last["ct_holders"] + last["other_unverified_holders"]
                               if x["holds_unverified"]],
        "host_memory": last["host_memory"],
        "host_judgement": last_eval["host"],
        "baseline": {"path": baseline_path, "present": baseline is not None,
                     "recorded_at": (baseline or {}).get("recorded_at")},
        "kernel_log": kernel_evidence,
        "shm_leftovers": shm,
        "nvlink_peers": {str(k): v for k, v in nvlink.items()},
        "nvidia_smi_error": last["nvidia_smi_error"],
        "recovery_actions": {str(k): v for k, v in last["recovery_actions"]["actions"].items()},
        "samples": [{"time": s["time"], "clean": e["clean"], "reasons": e["reasons"]}
                    for s, e in zip(samples, judged.evaluations)],
    }
    return {
        "changed": False,
        "verdict": judged.verdict,
        "clean": judged.clean,
        "kernel_cursor": kernel_evidence["cursor"],
        "reasons": judged.reasons,
        "notes": notes,
        "recommended_rung": judged.rung,
        "recommended_rung_name": gate.RUNG_NAMES[judged.rung],
        "rung_names": [gate.RUNG_NAMES[r] for r in sorted(gate.RUNG_NAMES)],
        "rung_reason": judged.why,
        "summary": judged.summary,
        "node_time": round(time.time(), 3),
        "settled": judged.settled,
        "settled_reason": judged.settled_reason,
        "findings": judged.findings,
        "evidence": evidence,
    }


def main():
    module = AnsibleModule(
        argument_spec=dict(
            vmid=dict(type="int", required=True),
            service=dict(type="str", default="sglang.service"),
            baseline_dir=dict(type="path", default="/var/lib/inferops/baseline"),
            samples=dict(type="int", default=2),
            sample_interval=dict(type="float", default=5),
            gpu_memory_tolerance_mib=dict(type="int", default=16),
            mem_available_tolerance_bytes=dict(type="int"),
            shmem_tolerance_bytes=dict(type="int", default=2 * 1024**3),
            mlocked_tolerance_bytes=dict(type="int", default=1024**3),
            min_available_pct=dict(type="float", default=10),
            host_memory_attribution_bytes=dict(type="int", default=2 * 1024**3),
            after_rung=dict(type="int", default=0),
            command_timeout=dict(type="int", default=30),
            kernel_log=dict(type="bool", default=True),
            kmsg_path=dict(type="path", default="/dev/kmsg"),
            kernel_since_seq=dict(type="int"),
            nvidia_smi_path=dict(type="path"),
            pct_path=dict(type="path"),
            node=dict(type="str", required=True),
            declared=dict(type="list", elements="dict", default=[]),
            allow_undeclared=dict(type="bool", default=False),
            owner_tag=dict(type="str", default="inferops-gpu"),
            ignore_baseline=dict(type="bool", default=False),
            rung_started_at=dict(type="float"),
            stuck_grace=dict(type="float", default=30),
            release_grace=dict(type="float", default=60),
            stop_timed_out=dict(type="bool", default=False),
            stop_when_decided=dict(type="bool", default=False),
            poll_budget=dict(type="float", default=0),
            poll_delay=dict(type="float", default=1),
        ),
        supports_check_mode=True,
    )
    if recover_scope.vmid_problem(module.params["vmid"]):
        module.fail_json(msg="vmid %s" % recover_scope.vmid_problem(module.params["vmid"]))
    if unit_name_message("service", module.params["service"]):
        module.fail_json(msg=unit_name_message("service", module.params["service"]))
    module.exit_json(**diagnose(module))


if __name__ == "__main__":
    main()
