# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Taking over a running, hand-made GPU container (pve_gpu_container_adopt): what deploy reads before it changes
anything, and what it decides from that.

- :func:`parse_server_argv`: a running SGLang launcher's own arguments (``--hicache-size``, ``--tp-size``, the port);
- :func:`find_servers`: the SGLang launchers among the container's processes (read on the node from /proc);
- :func:`judge_running`: the running server's own size judged by the sizing model (the one ``hicache.plan``);
- :func:`classify_passthrough`: how the container's GPUs are passed (devN, raw ``lxc.mount.entry`` /
  ``lxc.cgroup2.devices.allow`` lines, or both), which nvidia-smi GPU each device node is, what is mapped twice;
- :func:`config_rows`: the container's config beside what the roles would set, key by key, and what is kept;
- :func:`take_over`: the steps, which of them interrupt the server, and whether the run may take them;
- :func:`report_lines`: all of it in words.

Nothing read from the container is executed or trusted as identity: an argv is text to parse, a number in it that
does not parse is reported as such, and every value is clipped before it reaches a message.
No Ansible imports.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence

from ansible_collections.inferops.gpu_inference.plugins.module_utils.sizing import hicache
from ansible_collections.inferops.gpu_inference.plugins.module_utils.pve.pve_options import ConfigError, compare_option, option_base
from ansible_collections.inferops.gpu_inference.plugins.module_utils.pve.pve_options import parse_property_string
from ansible_collections.inferops.gpu_inference.plugins.module_utils.sizing.sizing_values import GB_BYTES, clip, fmt_gb
from ansible_collections.inferops.gpu_inference.plugins.module_utils.common.errors import InferopsError

SHOWN = 80
SGLANG_DEFAULT_PORT = 30000
NVIDIA_MAJOR = 195
NVIDIACTL_MINOR = 255
# The consent the interrupting steps need, by name (the messages say what to set).
CONSENT_VAR = "pve_gpu_container_adopt_interrupt"
# What an adoption keeps of the operator's container unless the inventory sets it (PVE key -> role variable).
KEPT_KEYS = {"hostname": "pve_gpu_container_hostname", "cores": "pve_gpu_container_cores",
             "swap": "pve_gpu_container_swap_mib", "features": "pve_gpu_container_features",
             "rootfs": "pve_gpu_container_rootfs"}
# SGLang's server_args.py spells some options two ways (python/sglang/srt/server_args.py add_cli_args).
_ALIASES = {
    "--tp-size": "tp", "--tensor-parallel-size": "tp", "--tp": "tp",
    "--pp-size": "pp", "--pipeline-parallel-size": "pp", "--pp": "pp",
    "--dp-size": "dp", "--data-parallel-size": "dp", "--dp": "dp",
    "--hicache-size": "hicache_size", "--port": "port", "--host": "host",
    "--model-path": "model_path", "--model": "model_path",
}
_FLAGS = {"--enable-hierarchical-cache": "hierarchical", "--enable-dp-attention": "dp_attention"}
_GPU_NODE_RE = re.compile(r"^/dev/nvidia(\d+)$")
_ALLOW_RE = re.compile(r"^([abc])\s+(\d+|\*):(\d+|\*)\s+([rwm]+)$")


class AdoptError(InferopsError):
    """A read value the take-over cannot go on from; the message says what to do."""


# --------------------------------------------------------------------------- the running server


@dataclass
class RunningServer:
    """One SGLang launcher found in the container (host PIDs, as /proc on the node gives them)."""

    pid: int
    pgid: int
    argv: List[str]
    tp_size: int = 1
    pp_size: int = 1
    dp_size: int = 1
    dp_attention: bool = False
    hicache_size_gb: Optional[int] = None
    hierarchical: bool = False
    port: int = SGLANG_DEFAULT_PORT
    host: str = "127.0.0.1"
    model_path: str = ""
    problems: List[str] = field(default_factory=list)
    children: List[int] = field(default_factory=list)
    unit: str = ""
    starttime: Optional[int] = None
    ct_pids: List[int] = field(default_factory=list)

    def as_dict(self) -> Dict[str, Any]:
        return {"pid": self.pid, "pgid": self.pgid, "argv": [clip(a, SHOWN) for a in self.argv[:64]],
                "tp_size": self.tp_size, "pp_size": self.pp_size, "dp_size": self.dp_size,
                "dp_attention": self.dp_attention, "hicache_size_gb": self.hicache_size_gb,
                "hierarchical": self.hierarchical, "port": self.port, "host": self.host,
                "model_path": clip(self.model_path, SHOWN), "problems": list(self.problems),
                "children": list(self.children), "unit": self.unit, "starttime": self.starttime,
                "ct_pids": list(self.ct_pids)}


# The unit's ExecStart (roles/sglang_server/files/sglang_launch.py): it runs sglang.launch_server in its own process
# (runpy), with SGLang's arguments after "--".
UNIT_LAUNCHER = "sglang-launch"


def is_sglang_launcher(argv: Sequence[str]) -> bool:
    """``python -m sglang.launch_server ...``, ``.../sglang/launch_server.py ...``, ``sglang serve ...``, or the unit's
    own launcher (``python .../sglang-launch ... -- <SGLang arguments>``)."""
    args = [str(a) for a in argv]
    for i, arg in enumerate(args[:4]):
        if os.path.basename(arg) == UNIT_LAUNCHER and "--" in args[i:]:
            return True
        if arg == "-m" and i + 1 < len(args) and args[i + 1] == "sglang.launch_server":
            return True
        if arg.endswith("sglang/launch_server.py"):
            return True
        if os.path.basename(arg) == "sglang" and i + 1 < len(args) and args[i + 1] == "serve":
            return True
    return False


def parse_server_argv(argv: Sequence[str], pid: int = 0, pgid: int = 0) -> Optional[RunningServer]:
    """The launcher's settings from its argv; None when the argv is not an SGLang launcher. A value that does not
    parse is a problem of the server, not an error of the run (it is the operator's process, as found)."""
    args = [str(a) for a in argv]
    if not is_sglang_launcher(args):
        return None
    server = RunningServer(pid=pid, pgid=pgid, argv=args)
    i = 0
    while i < len(args):
        arg = args[i]
        name, eq, inline = arg.partition("=")
        if name in _FLAGS and not eq:
            setattr(server, _FLAGS[name], True)
        elif name in _ALIASES:
            if eq:
                value = inline
            elif i + 1 < len(args):
                i += 1
                value = args[i]
            else:
                server.problems.append("%s has no value" % name)
                break
            _set_option(server, name, _ALIASES[name], value)
        i += 1
    return server


def _set_option(server: RunningServer, name: str, key: str, value: str) -> None:
    if key in ("host", "model_path"):
        setattr(server, key, value)
        return
    text = value.strip()
    if key == "hicache_size":
        # SGLang takes an int (GB per rank); 0 means "use --hicache-ratio" (server_args.py hicache_size: int = 0).
        if not text.isdigit():
            server.problems.append("%s %s is not a whole number of GB" % (name, clip(value, SHOWN)))
            return
        server.hicache_size_gb = int(text) or None
        return
    limits = {"port": (1, 65535), "tp": (1, 1024), "pp": (1, 1024), "dp": (1, 1024)}[key]
    if not text.isdigit() or not limits[0] <= int(text) <= limits[1]:
        server.problems.append("%s %s is not a number from %d to %d" % (name, clip(value, SHOWN), limits[0], limits[1]))
        return
    attr = {"port": "port", "tp": "tp_size", "pp": "pp_size", "dp": "dp_size"}[key]
    setattr(server, attr, int(text))


def find_servers(procs: Sequence[Mapping[str, Any]]) -> List[RunningServer]:
    """The SGLang launchers among ``procs`` (each ``{pid, ppid, pgid, argv, unit}`` read on the node), with the PIDs
    of their descendants (the ranks rename themselves, sglang::scheduler_TP0, so they are found by parentage). A
    launcher started by another launcher is its child, not another server."""
    by_pid = {int(p["pid"]): p for p in procs}
    launchers = {pid for pid, p in by_pid.items() if is_sglang_launcher(p.get("argv") or [])}
    servers: List[RunningServer] = []
    for pid in sorted(launchers):
        if int(by_pid[pid].get("ppid") or 0) in launchers:
            continue
        proc = by_pid[pid]
        server = parse_server_argv(proc.get("argv") or [], pid, int(proc.get("pgid") or 0))
        if server is None:
            continue
        server.unit = str(proc.get("unit") or "")
        server.children = sorted(_descendants(pid, by_pid))
        server.starttime = proc.get("starttime")
        server.ct_pids = sorted(int(by_pid[p]["ct_pid"]) for p in [pid] + server.children if by_pid[p].get("ct_pid"))
        servers.append(server)
    return servers


def _descendants(pid: int, by_pid: Mapping[int, Mapping[str, Any]]) -> List[int]:
    found: List[int] = []
    todo = [pid]
    while todo:
        parent = todo.pop()
        for child, p in by_pid.items():
            if int(p.get("ppid") or 0) == parent and child not in found and child != pid:
                found.append(child)
                todo.append(child)
    return found


# --------------------------------------------------------------------------- the running size, judged


def running_plan_data(plan_base: Mapping[str, Any], server: RunningServer, facts: Mapping[str, Any]) -> Dict[str, Any]:
    """What the sizing model is given to judge the running server: the inventory's model and policy, the running
    layout and size (from its argv), and the node's facts with the container's limit as it is now."""
    data = {k: v for k, v in plan_base.items() if k != "requested_gb"}
    data.update(tp_size=server.tp_size, pp_size=server.pp_size, dp_size=server.dp_size,
                enable_dp_attention=server.dp_attention)
    data.update(facts)
    if server.hicache_size_gb:
        data["requested_gb"] = server.hicache_size_gb
    return data


def judge_running(plan_base: Mapping[str, Any], server: RunningServer, facts: Mapping[str, Any]) -> Dict[str, Any]:
    """The running server's own ``--hicache-size`` judged by the sizing model: ``fits`` (None when it runs without
    a host cache), the words of the verdict, and the plan's largest size for the same layout."""
    if server.problems:
        return {"fits": None, "verdict": "your running server's arguments could not all be read (%s): its size is "
                "not judged" % "; ".join(server.problems), "plan": None}
    if not server.hierarchical or not server.hicache_size_gb:
        verdict = ("your running server has no host cache (--enable-hierarchical-cache %s, --hicache-size %s): "
                   "nothing of it is pinned in host RAM by HiCache" % (
                       "given" if server.hierarchical else "not given", server.hicache_size_gb or "not given"))
        return {"fits": None, "verdict": verdict, "plan": None}
    try:
        plan = hicache.plan(running_plan_data(plan_base, server, facts))
    except hicache.PlanError as exc:
        return {"fits": None, "verdict": "your running server's size cannot be judged: %s" % exc, "plan": None}
    ranks = int(plan["engine_ranks_per_host"])
    asked = "your running --hicache-size %d x %d ranks" % (server.hicache_size_gb, ranks)
    if plan["fits"]:
        verdict = "%s fits: %s pinned of a %s budget" % (
            asked, fmt_gb(int(plan["total_pinned_bytes"])), fmt_gb(int(plan["budget_bytes"])))
    else:
        verdict = ("%s does not fit: %s vs %s (OVERCOMMIT: the ranks would pin more host RAM than the node and the "
                   "container's limit leave; the plan's largest size for this layout is %d GB per rank)" % (
                       asked, _whole_gb(int(plan["total_pinned_bytes"])), _whole_gb(int(plan["budget_bytes"])),
                       int(plan["max_per_rank_gb"])))
    return {"fits": bool(plan["fits"]), "verdict": verdict, "plan": {
        k: plan[k] for k in ("total_pinned_bytes", "budget_bytes", "max_per_rank_gb", "engine_ranks_per_host",
                             "requested_gb", "fits")}, "explain": list(plan["explain"])}


def _whole_gb(value_bytes: int) -> str:
    return "%d GB" % ((value_bytes + GB_BYTES // 2) // GB_BYTES)


def _argv_text(argv: Sequence[str]) -> str:
    text = re.sub(r"[\x00-\x1f\x7f]", "?", " ".join(str(a) for a in argv))
    return text if len(text) <= 400 else text[:397] + "..."


def _text(value: Any) -> str:
    """A value read from the container's config, as a report shows it: one line, clipped."""
    text = re.sub(r"[\x00-\x1f\x7f]", "?", str(value))
    return text if len(text) <= SHOWN else text[:SHOWN - 3] + "..."


# --------------------------------------------------------------------------- GPU passthrough


def _raw_lines(config: Mapping[str, Any]) -> List[tuple]:
    lines = []
    for entry in config.get("lxc") or []:
        if isinstance(entry, (list, tuple)) and len(entry) == 2:
            lines.append((str(entry[0]).strip(), str(entry[1]).strip()))
    return lines


def _allows(allow: Sequence[tuple], major: int, minor: int) -> bool:
    return any(kind in ("a", "c") and maj in ("*", str(major)) and mi in ("*", str(minor)) and "r" in perm
               and "w" in perm for kind, maj, mi, perm in allow)


def classify_passthrough(config: Mapping[str, Any], node_gpus: Sequence[Mapping[str, Any]]) -> Dict[str, Any]:
    """How the container's NVIDIA device nodes are passed: ``method`` (devN, raw, both, none), each device path with
    the keys that map it, the GPUs by minor with the nvidia-smi GPU each is, what is mapped twice, and problems (a
    raw mount of a GPU node without a cgroup rule that lets the container open it; a minor the node has no GPU
    for)."""
    paths: Dict[str, List[str]] = {}
    dev_paths: Dict[str, str] = {}
    for key in sorted(config, key=lambda k: (option_base(str(k)), str(k))):
        if option_base(str(key)) != "dev" or not re.match(r"^dev\d+$", str(key)):
            continue
        try:
            path = parse_property_string(str(config[key]), "path").get("path", "")
        except ConfigError:
            continue
        if str(path).startswith("/dev/nvidia"):
            paths.setdefault(str(path), []).append(str(key))
            dev_paths[str(path)] = str(key)
    allow: List[tuple] = []
    raw: List[str] = []
    for key, value in _raw_lines(config):
        if key == "lxc.mount.entry":
            source = value.split()[0] if value.split() else ""
            if source.startswith("/dev/nvidia"):
                paths.setdefault(source, []).append("lxc.mount.entry")
                raw.append("%s: %s" % (key, _text(value)))
        elif key in ("lxc.cgroup2.devices.allow", "lxc.cgroup.devices.allow"):
            match = _ALLOW_RE.match(value)
            if match:
                allow.append(match.groups())
                if match.group(2) in ("*", str(NVIDIA_MAJOR)):
                    raw.append("%s: %s" % (key, _text(value)))
    by_minor = {int(g["minor_number"]): g for g in node_gpus if g.get("minor_number") is not None}
    gpus: List[Dict[str, Any]] = []
    problems: List[str] = []
    for path in sorted(paths):
        match = _GPU_NODE_RE.match(path)
        if not match:
            continue
        minor = int(match.group(1))
        gpu = by_minor.get(minor)
        via = paths[path]
        if "lxc.mount.entry" in via and not any(k.startswith("dev") for k in via) and not _allows(allow, NVIDIA_MAJOR, minor):
            problems.append("%s is bind-mounted by a raw lxc.mount.entry line but no lxc.cgroup2.devices.allow line lets "
                            "the container open it (c %d:%d rw)" % (path, NVIDIA_MAJOR, minor))
        if gpu is None:
            problems.append("%s is passed through but the node's driver lists no GPU with minor number %d" % (path, minor))
        gpus.append({"minor": minor, "path": path, "via": via,
                     "index": None if gpu is None else gpu.get("index"),
                     "uuid": None if gpu is None else gpu.get("uuid"),
                     "pci_bus_id": None if gpu is None else gpu.get("pci_bus_id"),
                     "name": None if gpu is None else gpu.get("name")})
    twice = sorted(p for p, via in paths.items() if len(via) > 1)
    has_dev = any(k.startswith("dev") for via in paths.values() for k in via)
    has_raw = bool(raw)
    method = "both" if has_dev and has_raw else "devN" if has_dev else "raw" if has_raw else "none"
    return {"method": method, "paths": {p: list(v) for p, v in sorted(paths.items())}, "gpus": gpus,
            "minors": [g["minor"] for g in gpus], "mapped_twice": twice, "raw_lines": raw, "problems": problems,
            "dev_keys": dict(sorted(dev_paths.items()))}


def passthrough_decision(passthrough: Mapping[str, Any], wanted_minors: Sequence[int]) -> Dict[str, Any]:
    """What deploy does with the passthrough on adoption. Raw lines that pass exactly the wanted GPUs stay and are
    the passthrough (no devN beside them: ``manage_devn`` False); devN only: managed as on any container; raw lines
    that pass other GPUs than the inventory's, or a device mapped twice: refused (``refusal``), nothing changed."""
    have = sorted(passthrough.get("minors") or [])
    wanted = sorted(int(m) for m in wanted_minors)
    method = passthrough.get("method")
    if passthrough.get("mapped_twice"):
        return {"manage_devn": False, "restart": False, "refusal": (
            "the container maps %s twice (%s): deploy will not add to that. Remove one of the two (the devN entry "
            "with `pct set <vmid> --delete devN`, or the raw lines in /etc/pve/lxc/<vmid>.conf), then run again" % (
                ", ".join(passthrough["mapped_twice"]),
                "; ".join("%s by %s" % (p, " and ".join(passthrough["paths"][p])) for p in passthrough["mapped_twice"])))}
    if method == "raw":
        if have != wanted:
            return {"manage_devn": False, "restart": False, "refusal": (
                "the container's raw lxc lines pass GPUs %s (device minors) but the inventory asks for %s "
                "(pve_gpu_container_gpus): deploy does not add devN entries beside raw lines. Set pve_gpu_container_gpus "
                "to %s to keep them as they are, or replace the raw lines by devN yourself (docs/deploy.md, \"Taking "
                "over an existing container\")" % (have or "none", wanted, have))}
        return {"manage_devn": False, "restart": False, "refusal": None}
    if method == "both" and have != wanted:
        return {"manage_devn": False, "restart": False, "refusal": (
            "the container passes GPUs %s by both devN entries and raw lxc lines, not the inventory's GPUs %s "
            "(pve_gpu_container_gpus): mend the config by hand first" % (have, wanted))}
    if method == "both":
        return {"manage_devn": False, "restart": False, "refusal": None}
    restart = have != wanted
    return {"manage_devn": True, "restart": restart, "refusal": None}


# --------------------------------------------------------------------------- config, key by key


def config_rows(current: Mapping[str, Any], declared: Mapping[str, Any], inventory_sets: Sequence[str],
                consent: bool) -> Dict[str, Any]:
    """The container's config beside what the roles would set. ``declared``: PVE key -> the roles' value.
    ``inventory_sets``: the role variables the inventory gives. A KEPT_KEYS key the inventory does not set is kept
    (left out of the update); one it sets to another value is applied only with consent. Returns the rows and
    ``omit``, the PVE keys the update leaves alone."""
    rows: List[Dict[str, Any]] = []
    omit: List[str] = []
    for key in sorted(declared):
        want = declared[key]
        have = current.get(key)
        try:
            same = have is not None and compare_option(key, have, str(want)).equal
            refused = ""
        except ConfigError as exc:  # a volume the update would have to resize or move
            same, refused = False, str(exc)
        if same:
            action = "same"
        elif key in KEPT_KEYS and KEPT_KEYS[key] not in inventory_sets:
            action = "kept (the operator's; %s is not set in the inventory)" % KEPT_KEYS[key]
            omit.append(key)
        elif key in KEPT_KEYS and have is not None and not consent:
            action = "differs: kept until %s=true (the inventory's %s)" % (CONSENT_VAR, KEPT_KEYS[key])
            omit.append(key)
        elif refused:
            action = "refused: %s" % refused
        else:
            action = "set"
        rows.append({"key": key, "current": None if have is None else _text(have), "roles": _text(want),
                     "action": action})
    others = sorted(k for k in current if k not in declared and k not in ("digest", "lxc") and option_base(str(k)) != "dev")
    for key in others:
        rows.append({"key": key, "current": _text(current[key]), "roles": None, "action": "kept (not managed)"})
    return {"rows": rows, "omit": omit}


# --------------------------------------------------------------------------- the take-over


def take_over(vmid: int, servers: Sequence[RunningServer], decision: Mapping[str, Any], config: Mapping[str, Any],
              planned_gb: Optional[int], unit: str, consent: bool, baseline_present: bool,
              gpus_busy: bool, stop_timeout_s: int = 120) -> Dict[str, Any]:
    """The steps in order, which interrupt the server, and whether the run may go on (``refusal`` names what is
    missing: a passthrough it will not touch, or the consent the interrupting steps need)."""
    hand_run = [s for s in servers if s.unit != unit]
    steps: List[Dict[str, Any]] = []
    # The order of the take-over (roles/pve_gpu_container/tasks/configure_container.yml): the hand-run server stops
    # first, the baseline is taken right after it (nothing the run does until the unit starts uses a GPU), then the
    # config, the passthrough restart, the install and the unit.
    for s in hand_run:
        steps.append({"step": "stop your hand-run SGLang (pid %d on the node, process group %d, port %d): SIGTERM to its "
                              "process group, up to %d s for it to drain and exit, then SIGKILL; a process still there "
                              "(stuck in the driver or on FUSE): the recovery ladder's rungs for this container, in "
                              "this window, which goes on only once recover's verdict is Clean"
                              % (s.pid, s.pgid, s.port, stop_timeout_s), "interrupts": True})
    if hand_run:
        steps.append({"step": "take the baseline with the GPUs idle, right after the stop", "interrupts": True})
    steps.append({"step": "tag the container inferops-gpu (recover then knows it as ours)", "interrupts": bool(hand_run)})
    changes = [r["key"] for r in config["rows"] if r["action"] == "set"]
    if changes:
        steps.append({"step": "set %s on the container" % ", ".join(changes), "interrupts": bool(hand_run)})
    if decision.get("restart"):
        steps.append({"step": "restart the container for its GPU passthrough (devN)", "interrupts": True})
    steps.append({"step": "install the driver userspace and SGLang in the container if they differ",
                  "interrupts": bool(hand_run)})
    steps.append({"step": "start %s with --hicache-size %s (the plan's size), recording the baseline again at idle "
                          "just before, and verify it" % (unit, planned_gb if planned_gb is not None else "as planned"),
                  "interrupts": bool(hand_run)})
    interrupts = any(s["interrupts"] for s in steps)
    refusal = decision.get("refusal")
    if not refusal and interrupts and not consent:
        refusal = ("taking over CT %s interrupts the server it runs (the steps marked INTERRUPTS above), and that needs "
                   "your consent: set %s=true for it, in a window when the model may stop. Nothing has been changed."
                   % (vmid, CONSENT_VAR))
    if baseline_present:
        recover = "a baseline exists: recover judges Clean against it from the first minute"
    elif gpus_busy:
        recover = ("no baseline yet, and the GPUs are busy (your server), so none can be taken now: until the take-over "
                   "records one (right after it stops your server), recover.yml says Not clean with "
                   "'no baseline' (host memory judged only by its MemAvailable floor), never Clean; its ladder still "
                   "stops and cleans the container's processes")
    else:
        recover = ("no baseline yet and the GPUs are idle: deploy records it in this step, before any change (in check "
                   "mode it would), so recover can judge Clean from the first minute")
    return {"steps": steps, "interrupts": interrupts, "refusal": refusal, "hand_run": [s.pid for s in hand_run],
            "recover": recover, "record_baseline_now": not baseline_present and not gpus_busy and not servers}


def stop_targets(servers: Sequence[Mapping[str, Any]], procs: Sequence[Mapping[str, Any]],
                 vmid: int) -> Dict[str, Any]:
    """Which of the container's processes (read now: pid, ppid, starttime, vmid) the consented stop signals: each
    launcher the report found, if it is still the same process (same start time), and its descendants now. A
    launcher gone or replaced since the report is not signalled and is named."""
    by_pid = {int(p["pid"]): p for p in procs}
    targets: List[Mapping[str, Any]] = []
    skipped: List[str] = []
    for server in servers:
        pid = int(server["pid"])
        now = by_pid.get(pid)
        if now is None:
            skipped.append("pid %d has exited since the report" % pid)
            continue
        if server.get("starttime") is None or now.get("starttime") != server.get("starttime") or now.get("vmid") != vmid:
            skipped.append("pid %d is another process now (its start time or container differs): not signalled" % pid)
            continue
        targets.append(now)
        targets.extend(by_pid[c] for c in _descendants(pid, by_pid) if by_pid[c].get("vmid") == vmid)
    return {"targets": targets, "skipped": skipped}


def whole_groups(targets: Sequence[Mapping[str, Any]], all_procs: Sequence[Mapping[str, Any]]) -> bool:
    """Whether the targets' process groups hold nothing but the targets: only then is a group signalled as a whole
    (a server started with nohup from the operator's shell may share the shell's group; the shell is not ours to
    stop)."""
    pids = {int(t["pid"]) for t in targets}
    groups = {int(t["pgid"]) for t in targets}
    return all(int(p["pid"]) in pids for p in all_procs if int(p["pgid"]) in groups)


def port_owner(port: int, servers: Sequence[RunningServer], unit: str) -> Optional[str]:
    """'your server' when the port the inventory asks for is the hand-run SGLang's own (the take-over frees it)."""
    for s in servers:
        if s.port == port and s.unit != unit:
            return ("port %d is held by your server (SGLang, pid %d, started by hand): the take-over stops it and starts "
                    "the unit on the same port" % (port, s.pid))
    return None


def report_lines(vmid: int, host: str, config: Mapping[str, Any], passthrough: Mapping[str, Any],
                 servers: Sequence[RunningServer], judged: Sequence[Mapping[str, Any]], plan_line: str,
                 steps: Mapping[str, Any], port_note: Optional[str]) -> List[str]:
    """The adoption report in words."""
    lines = ["Adoption report for CT %d (%s): read from the node and the container, nothing changed." % (vmid, host), "",
             "Config, key by key (current | the roles' | what happens):"]
    for row in config["rows"]:
        lines.append("  %-10s %s | %s | %s" % (row["key"], row["current"] if row["current"] is not None else "-",
                                               row["roles"] if row["roles"] is not None else "-", row["action"]))
    lines += ["", "GPU passthrough: %s" % {"devN": "devN entries", "raw": "raw lxc lines (no devN added beside them)",
                                           "both": "devN entries AND raw lxc lines", "none": "none"}[passthrough["method"]]]
    for g in passthrough["gpus"]:
        lines.append("  %s (minor %d) by %s = nvidia-smi GPU %s %s %s" % (
            g["path"], g["minor"], " and ".join(g["via"]), g["index"] if g["index"] is not None else "?",
            g["pci_bus_id"] or "", g["uuid"] or ""))
    for line in passthrough["raw_lines"]:
        lines.append("  raw: %s" % line)
    for path in passthrough["mapped_twice"]:
        lines.append("  MAPPED TWICE: %s" % path)
    for problem in passthrough["problems"]:
        lines.append("  problem: %s" % problem)
    lines += ["", "SGLang running in the container:" if servers else "SGLang running in the container: none found"]
    for s, j in zip(servers, judged):
        lines.append("  pid %d (process group %d, %d child process(es)%s): %s" % (
            s.pid, s.pgid, len(s.children), ", under %s" % s.unit if s.unit else ", started by hand",
            _argv_text(s.argv)))
        lines.append("  --tp-size %d, --pp-size %d, --dp-size %d, --hicache-size %s, port %d" % (
            s.tp_size, s.pp_size, s.dp_size, s.hicache_size_gb if s.hicache_size_gb else "not given", s.port))
        lines.append("  " + str(j["verdict"]))
    if port_note:
        lines.append("  " + port_note)
    lines += ["", plan_line, "", "The take-over, step by step:"]
    for n, step in enumerate(steps["steps"], 1):
        lines.append("  %d. %s%s" % (n, step["step"], "  [INTERRUPTS the server]" if step["interrupts"] else ""))
    lines += ["", "Recover meanwhile: %s" % steps["recover"]]
    if steps["refusal"]:
        lines += ["", "STOP: %s" % steps["refusal"]]
    return lines


# Memory a GPU with no work shows (GCM's idle threshold, as gpu_baseline's idle_max_mib).
IDLE_MAX_MIB = 16


def gpus_busy(gpus: Sequence[Mapping[str, Any]]) -> bool:
    """Whether any of the container's GPUs (gpu_host_facts rows) uses more than an idle GPU does."""
    return any(int(g.get("memory_used_mib") or 0) > IDLE_MAX_MIB for g in gpus)


def facts_for_running(node_mem_total_bytes: int, node_mem_available_bytes: int, container_held_bytes: int,
                      container_memory_mib: int, gpus: Sequence[Mapping[str, Any]]) -> Dict[str, Any]:
    """The sizing model's facts for judging the running server: MemAvailable with what the container holds now added
    back (its server holds it), against the container's limit as it is now."""
    if not gpus:
        raise AdoptError("the container passes no GPU the node's driver lists: its server cannot be judged")
    return {"mem_total_bytes": int(node_mem_total_bytes),
            "mem_available_bytes": min(int(node_mem_available_bytes) + int(container_held_bytes),
                                       int(node_mem_total_bytes)),
            "mem_limit_bytes": int(container_memory_mib) * 2**20,
            "gpu_count": len(gpus),
            "gpu_memory_mib": min(int(g.get("memory_total_mib") or 0) for g in gpus) or 1024}


__all__ = ["AdoptError", "RunningServer", "parse_server_argv", "find_servers", "judge_running", "classify_passthrough",
           "passthrough_decision", "config_rows", "gpus_busy", "stop_targets", "whole_groups", "take_over", "port_owner", "report_lines", "facts_for_running",
           "GB_BYTES"]
