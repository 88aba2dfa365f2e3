# -*- coding: utf-8 -*-
# Copyright: inferops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""One Proxmox VE node's plan: every GPU container the inventory places on it, planned together in one call, with
the node's other guests and its own reserve (pure Python, no Ansible imports).

The rules (docs/deploy.md, "The node's budget"):

- **GPUs are owned once.** A GPU another guest of the node already has as ``devN`` (managed or not, running or
  stopped) is refused, naming that guest; two inventory containers asking for one GPU are refused.
- **Each container is planned against what the others leave.** The containers are planned in VMID order; each is
  planned against the node's MemAvailable less what the containers planned before it will still add (their
  committed memory less what they already hold), so two containers never both take the same free memory.
- **The node's committed memory fits its RAM.** A managed container that is new, stopped, or will pin more than it
  holds commits what its plan pins and its processes hold (``ceiling_bytes``: the pools plus the rank and front-end
  overheads; the in-container reserve is page cache and headroom the kernel can reclaim, not committed). A running
  one whose plan pins no more than it holds counts what it holds now, measured on the node from its memory cgroup
  (usage less the file LRU lists: the shared-memory pools stay in; the PVE API's ``mem`` leaves them out). Every
  other guest counts by its memory limit (``others_count='limit'``, the default: a stopped guest can be started at
  any time) or by what it holds now (``'measured'``, where the operator says so). A running guest that carries the
  collection's owner tag but is not in this run (``deploy_containers`` naming fewer containers, recover's relaunch
  of one) counts by what it holds now, as it would in the run. With the node's own reserve the sum must not exceed
  MemTotal.
- **Re-runs plan the same**: a running container's held memory is added back to what is available to it, is not
  counted twice, and is counted the same whether the container is in the run or not, so an unchanged node plans
  the same sizes and refuses nothing, for a re-run of one container or of all.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Sequence

from ansible_collections.inferops.gpu_inference.plugins.module_utils.deploy.sglang_deploy import (
    CALCULATOR_FACT_KEYS,
    GPU_MEMORY_NOT_READ_MIB,
    check_gpus_exist,
    gpus_by_minor,
    container_spec,
    memory_bytes,
    node_gate,
    require_gpu_memory,
)
from ansible_collections.inferops.gpu_inference.plugins.module_utils.deploy.sglang_request import SHOWN, DeployError, setting_int
from ansible_collections.inferops.gpu_inference.plugins.module_utils.sizing.sizing_values import clip, fmt_gb, fmt_gib, is_blank

OTHERS_COUNT = ("limit", "measured")


def _int(value: Any) -> int:
    try:
        return int(value or 0)
    except (TypeError, ValueError):
        return 0


def guest_label(guest: Mapping[str, Any]) -> str:
    kind = "VM" if guest.get("type") == "qemu" else "CT"
    name = str(guest.get("name") or "")
    return "%s %s%s (%s)" % (kind, guest.get("vmid"), " " + name if name else "", guest.get("status") or "unknown")


def held_bytes(guest: Mapping[str, Any], measured: Mapping[str, Any]) -> int:
    """What a running guest holds now: its memory cgroup's usage less reclaimable page cache, read on the node
    (gpu_host_facts ``containers_memory``: shared-memory pools included), else the PVE API's ``mem`` (which leaves
    shared memory out, so it misses SGLang's pinned pools; the only figure for a VM). A stopped guest holds 0."""
    if guest.get("status") != "running":
        return 0
    read = (measured.get(str(_int(guest.get("vmid")))) or {}).get("memory_held_bytes")
    return _int(read) if read is not None and guest.get("type", "lxc") == "lxc" else _int(guest.get("mem_bytes"))


def cgroup_unread(guest: Mapping[str, Any], measured: Mapping[str, Any]) -> bool:
    """A running container whose memory cgroup was not read on the node (it started between the PVE listing and the
    read, or the read found no cgroup): :func:`held_bytes` then has only the PVE API's ``mem``, which misses shared
    memory, so a caller counts it conservatively and says so."""
    return (guest.get("status") == "running" and guest.get("type", "lxc") == "lxc"
            and (measured.get(str(_int(guest.get("vmid")))) or {}).get("memory_held_bytes") is None)


def _unread_note(guest: Mapping[str, Any], counted: str) -> str:
    return ("%s: its memory cgroup was not read on the node, so what it holds is not known (the PVE API's "
            "mem, %s, leaves out shared memory such as SGLang's pinned pools); counted %s. Run the deploy again to read "
            "it." % (guest_label(guest), fmt_gib(_int(guest.get("mem_bytes"))), counted))


def gpu_owners(containers: Sequence[Mapping[str, Any]], guests: Sequence[Mapping[str, Any]],
               node_gpus: Sequence[int] = ()) -> Dict[int, str]:
    """GPU (device minor, /dev/nvidiaN) -> the guest that holds it (devN), for the GPUs the containers ask for; refuses a GPU held by a
    guest the inventory does not place there, and a GPU two inventory containers ask for."""
    managed = {_int(ct["vmid"]) for ct in containers}
    held: Dict[int, str] = {}
    for guest in guests:
        if _int(guest.get("vmid")) in managed:
            continue
        for gpu in guest.get("gpus") or []:
            held.setdefault(int(gpu), guest_label(guest))
    asked: Dict[int, str] = {}
    problems: List[str] = []
    for ct in sorted(containers, key=lambda c: _int(c["vmid"])):
        label = "CT %s (%s)" % (ct["vmid"], ct.get("host") or "")
        for gpu in ct.get("gpus") or []:
            gpu = int(gpu)
            if gpu in held:
                problems.append("%s asks for GPU %d, which %s already has as a devN passthrough" % (label, gpu, held[gpu]))
            elif gpu in asked:
                problems.append("%s and %s both ask for GPU %d" % (asked[gpu], label, gpu))
            else:
                asked[gpu] = label
    if problems:
        free = sorted(set(int(g) for g in node_gpus) - set(held) - set(asked))
        raise DeployError(
            "refused before any change: a GPU is owned by one guest at a time. %s. Give each container GPUs no other "
            "guest holds (pve_gpu_container_gpus)%s, or free the GPU on the other guest first (pct set <vmid> "
            "--delete devN)." % ("; ".join(problems), "; not held by any guest: %s" % ",".join(map(str, free)) if free else ""))
    return {**held, **asked}


def plan_node(requests: Mapping[str, Mapping[str, Any]], containers: Sequence[Mapping[str, Any]],
              node: Mapping[str, Any], guests: Sequence[Mapping[str, Any]], node_reserve_bytes: int,
              others_count: str = "limit", node_name: str = "the node", owner_tag: str = "") -> Dict[str, Any]:
    """Plan every container of one node together (see the module's doc). ``containers``: the inventory's
    containers placed on the node ({host, vmid, memory_mib, gpus}); ``requests``: host -> the request stage's
    result; ``node``: gpu_host_facts' memory and GPUs; ``guests``: every guest of the node from the PVE API
    ({vmid, type, name, status, maxmem_bytes, mem_bytes, gpus}). Returns {gates: {host: gate}, table, ...}."""
    if others_count not in OTHERS_COUNT:
        raise DeployError("pve_gpu_container_node_others_count must be one of %s, got %r" % (", ".join(OTHERS_COUNT), others_count))
    # Each container's own spec first (its VMID, memory, GPUs as a list without repeats, GPUs the node has), then who
    # owns which GPU.
    checked = [(ct, container_spec(ct)) for ct in containers]
    containers = [dict(ct, vmid=spec[0], gpus=spec[2]) for ct, spec in checked]
    vmids = [ct["vmid"] for ct in containers]
    twice = sorted({v for v in vmids if vmids.count(v) > 1})
    if twice:
        raise DeployError("refused before any change: VMID %s is declared by more than one inventory host (%s)" % (
            ", ".join(map(str, twice)), ", ".join(str(ct.get("host")) for ct in containers if ct["vmid"] in twice)))
    for ct in containers:
        check_gpus_exist(ct["vmid"], ct["gpus"], node)
    gpu_owners(containers, guests, sorted(gpus_by_minor(node)[0]))
    for ct in containers:
        if ct["host"] not in requests:
            raise DeployError("%s: no plan request. Run playbooks/deploy.yml: its first play checks the container's settings"
                              % ct["host"])
    args = (containers, node, guests, int(node_reserve_bytes), others_count, node_name, owner_tag)
    result = _commit(requests, *args)
    if not result["fits"]:
        raise DeployError("refused before any change: the containers' plans fit each container, but together they "
                          "overflow node %s.\n%s\n%s" % (node_name, "\n".join(result["table"]), advice(result, requests, args)))
    return result


def _commit(requests: Mapping[str, Mapping[str, Any]], containers: Sequence[Mapping[str, Any]], node: Mapping[str, Any],
            guests: Sequence[Mapping[str, Any]], node_reserve_bytes: int, others_count: str, node_name: str,
            owner_tag: str) -> Dict[str, Any]:
    """The containers planned in VMID order, each against what the ones before it leave, and the node's committed
    memory (rows, other guests, the table, ``fits``). A container's own plan that does not fit raises (node_gate)."""
    by_vmid = {_int(g.get("vmid")): g for g in guests}
    measured = node.get("containers_memory") or {}
    gates: Dict[str, Any] = {}
    rows: List[Dict[str, Any]] = []
    notes: List[str] = []
    to_add = 0  # what the containers planned so far will still take from MemAvailable
    for ct in sorted(containers, key=lambda c: _int(c["vmid"])):
        host = ct["host"]
        guest = by_vmid.get(_int(ct["vmid"]), {})
        held = held_bytes(guest, measured)
        if cgroup_unread(guest, measured):
            notes.append(_unread_note(guest, "its plan's ceiling, as for a container that is not running"))
        container = dict(ct, existing_mem_bytes=held)
        gate = node_gate(requests[host], node, container, node_reserve_bytes, committed_elsewhere_bytes=to_add)
        ceiling, pinned = int(gate["plan"]["ceiling_bytes"]), int(gate["plan"]["engine_pinned_bytes"])
        # A running container whose plan pins no more than it holds now counts what it holds (measured: its pools are
        # pinned at start-up and inside it), as a running container of ours outside this run does; so re-running one
        # or all plans the same. One that is new, stopped, or will pin more commits its ceiling.
        in_use = guest.get("status") == "running" and pinned <= held and not cgroup_unread(guest, measured)
        committed = held if in_use else ceiling
        to_add += max(0, committed - held)
        gates[host] = gate
        rows.append({"vmid": gate["vmid"], "host": host, "limit_bytes": gate["memory_limit_bytes"],
                     "ranks": gate["ranks"], "per_rank_gb": gate["per_rank_gb"], "pinned_bytes": pinned,
                     "overhead_bytes": int(gate["plan"]["overhead_bytes"]), "committed_bytes": committed,
                     "ceiling_bytes": ceiling, "counted_in_use": in_use,
                     "held_bytes": held, "requested_gb": gate["plan"].get("requested_gb")})
    managed = {_int(ct["vmid"]) for ct in containers}
    others = []
    for guest in sorted(guests, key=lambda g: _int(g.get("vmid"))):
        if _int(guest.get("vmid")) in managed:
            continue
        running = guest.get("status") == "running"
        ours = bool(owner_tag) and owner_tag in (guest.get("tags") or []) and running
        if (ours or others_count == "measured") and cgroup_unread(guest, measured):
            counted, basis = _int(guest.get("maxmem_bytes")), "its limit (cgroup not read)"
            notes.append(_unread_note(guest, "its memory limit, %s" % fmt_gib(counted)))
        elif ours or others_count == "measured":
            counted, basis = held_bytes(guest, measured), "its use now"
        else:
            counted, basis = _int(guest.get("maxmem_bytes")), "its limit"
        others.append({"vmid": _int(guest.get("vmid")), "label": guest_label(guest), "limit_bytes": _int(guest.get("maxmem_bytes")),
                       "held_bytes": held_bytes(guest, measured), "counted_bytes": counted,
                       "basis": ("ours, not in this run: " if ours else "not managed, ") + basis})
    total = int(node["mem_total_bytes"])
    committed_total = sum(r["committed_bytes"] for r in rows) + sum(o["counted_bytes"] for o in others) + node_reserve_bytes
    result = {"node": node_name, "mem_total_bytes": total, "node_reserve_bytes": node_reserve_bytes,
              "others_count": others_count, "containers": rows, "others": others,
              "committed_bytes": committed_total, "fits": committed_total <= total, "gates": gates, "notes": notes}
    result["table"] = table(result)
    return result


def calculate_node(plan_input: Any, requests: Mapping[str, Mapping[str, Any]], containers: Sequence[Mapping[str, Any]],
                   node_name: str, node_reserve_bytes: int, requested_gb: Any = None) -> Dict[str, Any]:
    """plan.yml -e plan_node=NODE: the node's plan from the inventory alone (touching no host). ``plan_input`` gives the
    node's facts (mem_total_bytes required; mem_available_bytes, default MemTotal; gpu_memory_mib); the other guests
    of the node are not read offline (deploy reads and counts them). ``requested_gb`` (plan_requested_gb) is one
    host's size: given (not blank) it is refused, never dropped, since each container is planned with its own."""
    if not containers:
        raise DeployError("plan_node=%s: the inventory places no container host on it (pve_gpu_container_node_host); "
                          "name a PVE node that has containers" % node_name[:SHOWN])
    if not is_blank(requested_gb):
        hosts = ", ".join(str(ct.get("host")) for ct in containers)
        first = str(containers[0].get("host"))
        raise DeployError("plan_requested_gb=%s is one container's per-rank size, and plan_node=%s plans each of its "
                          "containers (%s) with the size its own inventory asks for (sglang_server_hicache_requested_gb): "
                          "plan that container with it instead, -e plan_host=%s -e plan_requested_gb=%s, or set its "
                          "sglang_server_hicache_requested_gb and plan the node again"
                          % (clip(requested_gb, SHOWN), node_name[:SHOWN], hosts, first, clip(requested_gb, SHOWN)))
    given = {k: v for k, v in dict(plan_input or {}).items() if not is_blank(v)} if isinstance(plan_input, Mapping) else None
    if given is None:
        raise DeployError("plan_input must be a dict of the node's facts, got %s" % clip(plan_input, SHOWN))
    other = sorted(str(k) for k in given if k not in CALCULATOR_FACT_KEYS)
    if other:
        raise DeployError("with plan_node, plan_input may give only the node's facts (%s); %s come from the containers' "
                          "variables" % (", ".join(CALCULATOR_FACT_KEYS), ", ".join(other)))
    if "mem_total_bytes" not in given:
        raise DeployError("plan_node=%s needs the node's RAM: declare it once on the node's host in the inventory, "
                          "pve_gpu_container_node_mem_total_bytes: N (bytes: free -b on the node, the Mem: total; "
                          "docs/deploy.md, \"The node in the inventory\"), or give it for this run, "
                          "-e '{\"plan_input\": {\"mem_total_bytes\": N}}' (add mem_available_bytes for its MemAvailable)"
                          % node_name[:SHOWN])
    total = memory_bytes("plan_input.mem_total_bytes", given["mem_total_bytes"])
    available = memory_bytes("plan_input.mem_available_bytes", given.get("mem_available_bytes", total))
    if "gpu_memory_mib" not in given:
        for req in requests.values():
            require_gpu_memory(req)
    gpu_mib = setting_int("plan_input.gpu_memory_mib", given.get("gpu_memory_mib", GPU_MEMORY_NOT_READ_MIB), 1024, 4 << 20)
    wanted = sorted({int(g) for ct in containers for g in (ct.get("gpus") or []) if str(g).strip().isdigit()})
    node = {"mem_total_bytes": total, "mem_available_bytes": min(available, total),
            # No node is read offline: the GPUs are the ones asked for, each /dev/nvidiaN taken as given.
            "gpus": [{"index": g, "minor_number": g, "memory_total_mib": gpu_mib} for g in wanted],
            "device_paths": ["/dev/nvidia%d" % g for g in wanted]}
    result = plan_node(requests, containers, node, [], node_reserve_bytes, "limit", node_name)
    notes = ["Planned offline for node %s from the inventory: %d container(s), against the node's RAM %s%s. The node's "
             "other guests are not read here (deploy reads them from the PVE API and counts them)."
             % (node_name, len(containers), fmt_gib(total),
                "" if "mem_available_bytes" in given else
                " (MemAvailable taken as MemTotal: give mem_available_bytes; the OS reserve then counts the node's idle use "
                "as 0, which deploy reads on the node and in each container)")]
    return {"node_plan": result, "notes": notes}


#: The node table's units, said on its header line.
UNITS = "(GiB = 2^30 bytes, GB = 10^9 bytes)"
#: One row of the node table: guest, limit, host KV pools pinned, overheads, commits.
_ROW = "%-32s %12s %42s %12s %12s"


def _pinned_cell(r: Mapping[str, Any]) -> str:
    """The pools of one container with each unit named: the per-rank size in SGLang's decimal GB (--hicache-size),
    then what all ranks pin in GB and in GiB, so that 8 x 43 GB beside 320.4 GiB cannot be misread."""
    return "%d ranks x %d GB -> %s = %s" % (r["ranks"], r["per_rank_gb"], fmt_gb(r["pinned_bytes"]), fmt_gib(r["pinned_bytes"]))


def table(result: Mapping[str, Any]) -> List[str]:
    """The node's committed memory, one line per guest: who commits what (GiB, and SGLang's decimal GB per rank)."""
    lines = [_ROW % ("guest", "limit", "host KV pools pinned", "overheads", "commits") + "  " + UNITS]
    for r in result["containers"]:
        lines.append(_ROW % (
            "CT %d %s" % (r["vmid"], r["host"]), fmt_gib(r["limit_bytes"]), _pinned_cell(r),
            fmt_gib(r["overhead_bytes"]), fmt_gib(r["committed_bytes"]))
            + ("  running: what it holds now" if r.get("counted_in_use") else ""))
    for o in result["others"]:
        row = (o["label"][:32], fmt_gib(o["limit_bytes"]), o["basis"], "", fmt_gib(o["counted_bytes"]))
        lines.append(_ROW % row)
    lines.append(_ROW % ("the node's own reserve", "", "", "", fmt_gib(result["node_reserve_bytes"])))
    verdict = "fits" if result["committed_bytes"] <= result["mem_total_bytes"] else "OVER by %s" % fmt_gib(
        result["committed_bytes"] - result["mem_total_bytes"])
    lines.append(_ROW % ("node %s RAM %s" % (result["node"], fmt_gib(result["mem_total_bytes"])),
                         "", "", "", fmt_gib(result["committed_bytes"])) + "  " + verdict)
    return lines


def advice(result: Mapping[str, Any], requests: Mapping[str, Mapping[str, Any]], args: Sequence[Any]) -> str:
    """What to change: per-rank sizes that fit the node, each checked by planning the node again with them (the
    pools scaled down together, then one GB less at a time), or fewer guests."""
    over = result["committed_bytes"] - result["mem_total_bytes"]
    elsewhere = ("lower the other guests' memory limits (or set pve_gpu_container_node_others_count=measured to count what "
                 "they use now), or place a container on another node")
    pinned = sum(r["pinned_bytes"] for r in result["containers"])
    sized = [r for r in result["containers"] if r["per_rank_gb"]]
    if pinned <= over or not sized:
        return "Even with no host KV pools the node is over: %s." % elsewhere
    keep = (pinned - over) / pinned
    sizes = {r["host"]: max(1, int(r["per_rank_gb"] * keep)) for r in sized}
    while True:
        try:
            fits = _commit(_with_sizes(requests, sizes), *args)["fits"]
        except DeployError:  # a size the release refuses (e.g. a host pool below the device pool up to 0.5.14)
            fits = False
        if fits:
            return "To fit, lower the host KV pools by %s in all (%s), or %s." % (
                fmt_gib(over), "; ".join("%s: sglang_server_hicache_requested_gb=%d" % hs for hs in sorted(sizes.items())),
                elsewhere)
        if all(gb == 1 for gb in sizes.values()):
            return "No per-rank size of the host KV pools fits the node (not even 1 GB per rank): %s." % elsewhere
        sizes = {host: max(1, gb - 1) for host, gb in sizes.items()}


def _with_sizes(requests: Mapping[str, Mapping[str, Any]], sizes: Mapping[str, int]) -> Dict[str, Any]:
    """The requests with ``sglang_server_hicache_requested_gb`` set for the hosts in ``sizes``."""
    out = dict(requests)
    for host, gb in sizes.items():
        req = dict(requests[host])
        req["plan_base"] = dict(req["plan_base"], requested_gb=gb)
        req["requested_gb"] = gb
        out[host] = req
    return out


__all__ = ["OTHERS_COUNT", "plan_node", "calculate_node", "gpu_owners", "held_bytes", "table", "advice", "guest_label"]
