# -*- coding: utf-8 -*-
# Copyright: inferops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""One deploy plan for an SGLang server in a GPU container, computed in one place (no Ansible imports).

Stages, each called once per play by the action plugin ``inferops.gpu_inference.sglang_deploy_plan``:

``request(settings)`` (``sglang_request.py``)
    The operator's settings (role variables, survey answers) checked and normalised: layout, version,
    the requested size, the service (bind address, API key policy, port) and the extra arguments.
    Refuses anything the plan owns being set another way (``--hicache-size`` in extra args); the names
    that extra variables may not set (``-e`` of a computed variable) are refused by ``sglang_extra_vars.py``.
``node_gate(request, node, container)``
    On the PVE node, before any change: the container's GPUs exist, the layout uses exactly them, its
    memory limit leaves the node its reserve, and the HiCache plan fits the declared limit.
``launch(request, node_state, container_facts)``
    In the container: the size the node issued, checked in the container's own view (which may lower it,
    never raise it), the exact argv of the unit, what the start guard must see, and the bounds verify checks.
``verify(launch, running, measure)``
    What runs compared with the launch: the server's own arguments and the memory its ranks pinned.
``calculate(plan_input, ...)``
    The calculator of ``playbooks/plan.yml``, touching no host.

Every byte figure of the plan (the size, what the ranks pin, the MemAvailable a start needs, the ceiling verify
allows) is one ``hicache.plan`` returns; nothing here prices a pool or multiplies a per-rank figure by the ranks.
Every refusal raises :class:`DeployError` whose message says what was wrong and what to do.
"""
from __future__ import annotations

import ipaddress
import re
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from ansible_collections.inferops.gpu_inference.plugins.module_utils.sizing import hicache, overhead_offer
from ansible_collections.inferops.gpu_inference.plugins.module_utils.sizing.hicache_releases import release_rules, server_info_path
from ansible_collections.inferops.gpu_inference.plugins.module_utils.deploy.sglang_request import (
    SHOWN,
    DeployError,
    is_loopback,
    layout_text,
    parse_requested_gb,
    ranks_on_this_node,
    setting_int,
)
from ansible_collections.inferops.gpu_inference.plugins.module_utils.sizing.sizing_values import (
    MIB_BYTES,
    PlanError,
    as_bool,
    clip,
    fmt_gb,
    fmt_gib,
    is_blank,
    memory_bytes as _memory_bytes,
)
from ansible_collections.inferops.gpu_inference.plugins.module_utils.common.gpu_inventory import VMID_MAX, VMID_MIN

#: The largest container memory limit accepted (64 TiB, in MiB): more is a figure in KiB or bytes.
MAX_CONTAINER_MEMORY_MIB = 64 << 20
#: The smallest memory limit accepted for a GPU container (4 GiB, in MiB). Each SGLang rank and its front end are
#: Python processes that load PyTorch and the CUDA runtime, about a GiB of host memory each before any weight or KV
#: pool (the sizing policy budgets 8 GiB a rank), so no server starts below it; a smaller figure is almost always
#: GiB written where MiB is meant (440 for 440 GiB), which the plan would otherwise report only as a budget that
#: its headroom overflows many times over.
MIN_GPU_CONTAINER_MEMORY_MIB = 4096


def memory_bytes(name: str, value: Any) -> int:
    try:
        return _memory_bytes(name, value)
    except PlanError as exc:
        raise DeployError(str(exc)) from exc


def is_zero_request(value: Any) -> bool:
    """plan_requested_gb given as 0 (or "0"): clear any size the host asks for."""
    return not isinstance(value, bool) and (value == 0 or (isinstance(value, str) and value.strip() in ("0", "+0", "-0")))


# --- the plan of one host -----------------------------------------------------------------------------

def plan_data(req: Mapping[str, Any], facts: Mapping[str, Any], held_bytes: Optional[int] = None) -> Dict[str, Any]:
    """What hicache.plan is given: the request's layout, model and policy (``plan_base``) with one host's facts
    (mem_total_bytes, mem_available_bytes, mem_limit_bytes, gpu_count, gpu_memory_mib, and requested_gb when a
    size is asked for another way). ``held_bytes``: memory the deploy itself already holds there (a running
    container or SGLang), added back to MemAvailable up to MemTotal, so that a re-run plans the same size."""
    data = dict(req["plan_base"])
    data.update(facts)
    if held_bytes is not None:
        data["mem_available_bytes"] = min(int(facts["mem_available_bytes"]) + held_bytes, int(facts["mem_total_bytes"]))
    return data


def _plan(data: Mapping[str, Any]) -> Dict[str, Any]:
    try:
        return hicache.plan(data)
    except hicache.PlanError as exc:
        raise DeployError("the HiCache plan cannot be computed: %s" % exc) from exc


def _host_plan(req: Mapping[str, Any], facts: Mapping[str, Any], ranks: int, held_bytes: Optional[int] = None) -> Dict[str, Any]:
    """The sizing model's plan of the request on one host (plan_data), whose ranks must be the launcher's."""
    plan = _plan(plan_data(req, facts, held_bytes))
    if int(plan["engine_ranks_per_host"]) != ranks:
        raise DeployError("internal: the plan counts %s ranks, the launcher %d" % (plan["engine_ranks_per_host"], ranks))
    return plan


def _refuse_plan(header: str, plan: Mapping[str, Any]) -> None:
    raise DeployError("\n".join([header] + list(plan["explain"]) + [""] + list(plan["picture"])))


# --- stage 2: the node gate -------------------------------------------------------------------------------

def container_spec(container: Mapping[str, Any]) -> Tuple[int, int, List[int]]:
    """The declared container's VMID, memory limit (MiB) and GPUs (device minors: N is /dev/nvidiaN), checked."""
    vmid = setting_int("pve_gpu_container_vmid (proxmox_vmid)", container.get("vmid"), VMID_MIN, VMID_MAX)
    memory_mib = setting_int("pve_gpu_container_memory_mib", container.get("memory_mib"), 16, MAX_CONTAINER_MEMORY_MIB,
                             " (MiB: 65536 is 64 GiB; the most is 64 TiB, more than any PVE node has; a larger figure is "
                             "KiB or bytes)")
    if memory_mib < MIN_GPU_CONTAINER_MEMORY_MIB:
        raise DeployError(
            "CT %d: pve_gpu_container_memory_mib=%d is %s, too little for a GPU container running SGLang (each rank is "
            "a Python process with PyTorch and the CUDA runtime, about a GiB of host memory before any pool). "
            "pve_gpu_container_memory_mib is MiB: %d GiB is %d. The least accepted is %d (4 GiB)."
            % (vmid, memory_mib, fmt_gib(memory_mib * MIB_BYTES), memory_mib, memory_mib * 1024, MIN_GPU_CONTAINER_MEMORY_MIB))
    wanted = container.get("gpus") or []
    if not isinstance(wanted, (list, tuple)) or not wanted:
        raise DeployError("CT %d: pve_gpu_container_gpus must list the node's GPUs to pass through by device number "
                          "(N for /dev/nvidiaN), e.g. [0, 1]" % vmid)
    wanted = [setting_int("pve_gpu_container_gpus item", g, 0, 1023) for g in wanted]
    if len(set(wanted)) != len(wanted):
        raise DeployError("CT %d: pve_gpu_container_gpus lists a GPU twice: %s" % (vmid, wanted))
    return vmid, memory_mib, wanted


def _ranks_match_gpus(req: Mapping[str, Any], vmid: int, wanted: Sequence[int]) -> int:
    ranks = ranks_on_this_node(req)
    if ranks != len(wanted):
        raise DeployError(
            "CT %d: %s puts %d scheduler rank(s) on this node (one per GPU), but %d GPU(s) are passed through (%s). "
            "Make pve_gpu_container_gpus match the layout, or change the layout.%s" % (
                vmid, layout_text(req["layout"]), ranks, len(wanted), ",".join(map(str, wanted)),
                "".join(" (%s.)" % note for note in req.get("notes") or [])))
    return ranks


def gpus_by_minor(node: Mapping[str, Any]) -> Tuple[Dict[int, Any], List[str]]:
    """The node's GPUs (gpu_host_facts rows) by device minor, /dev/nvidiaN: the ``minor_number`` the driver gives
    (nvidia-smi -q), never the nvidia-smi index; and the GPUs whose minor is unknown, named."""
    by_minor: Dict[int, Any] = {}
    unknown: List[str] = []
    for g in node.get("gpus") or []:
        if g.get("minor_number") is None:
            unknown.append("GPU index %s (%s)" % (g.get("index"), g.get("pci_bus_id") or "bus id unknown"))
        else:
            by_minor[int(g["minor_number"])] = g
    return by_minor, unknown


def check_gpus_exist(vmid: int, wanted: Sequence[int], node: Mapping[str, Any]) -> Dict[int, Any]:
    """The node's GPUs by device minor (pve_gpu_container_gpus N is /dev/nvidiaN); refuses GPUs (or their device
    nodes) the node does not have, and a GPU whose minor the driver does not give."""
    node_gpus, unknown = gpus_by_minor(node)
    node_nodes = set(node.get("device_paths") or [])
    missing = [g for g in wanted if g not in node_gpus]
    missing_nodes = ["/dev/nvidia%d" % g for g in wanted if "/dev/nvidia%d" % g not in node_nodes]
    if missing and unknown:
        problems = "; ".join(str(p) for p in node.get("gpu_numbering_problems") or []) or "no minor_number read"
        raise DeployError(
            "CT %d asks for /dev/nvidia%s, but which GPU that device node is cannot be read from the node's driver "
            "(nvidia-smi -q gives no Minor Number for %s: %s); the device minor is not taken to be the nvidia-smi "
            "index. Fix nvidia-smi -q on the node, then deploy again." % (
                vmid, ",".join(map(str, missing)), ", ".join(unknown), problems))
    if missing or missing_nodes:
        have = ",".join(map(str, sorted(node_gpus))) or "none"
        lacking = "; missing device nodes: " + ", ".join(missing_nodes) if missing_nodes else ""
        raise DeployError(
            "CT %d asks for GPUs %s but the node has %d GPU(s) (/dev/nvidiaN for N in %s)%s. Set pve_gpu_container_gpus "
            "to GPUs the node has." % (vmid, ",".join(map(str, wanted)), len(node_gpus), have, lacking))
    return node_gpus


def node_gate(req: Mapping[str, Any], node: Mapping[str, Any], container: Mapping[str, Any],
              node_reserve_bytes: int, committed_elsewhere_bytes: int = 0) -> Dict[str, Any]:
    """Check one container against the node's facts before anything changes; return its plan on the node.
    ``committed_elsewhere_bytes``: what the node's other containers planned in the same run will still take from
    MemAvailable (node_plan.plan_node plans a node's containers together)."""
    vmid, memory_mib, wanted = container_spec(container)
    node_gpus = check_gpus_exist(vmid, wanted, node)
    limit = memory_mib * MIB_BYTES
    total = int(node["mem_total_bytes"])
    if limit + node_reserve_bytes > total:
        raise DeployError(
            "CT %d: memory %d MiB (%s) + the node's own reserve %s exceeds the node's RAM %s: a container limit at or "
            "above host RAM protects nothing. Lower pve_gpu_container_memory_mib." % (
                vmid, memory_mib, fmt_gib(limit), fmt_gib(node_reserve_bytes), fmt_gib(total)))
    ranks = _ranks_match_gpus(req, vmid, wanted)
    available = int(node["mem_available_bytes"]) - int(committed_elsewhere_bytes)
    if committed_elsewhere_bytes and available + int(container.get("existing_mem_bytes") or 0) < 64 * MIB_BYTES:
        raise DeployError(
            "CT %d: refused before any change: the node's MemAvailable %s is taken by the containers planned before it "
            "on this node (%s they will still pin and hold), leaving none for this one. Plan fewer or smaller containers "
            "on the node." % (vmid, fmt_gib(int(node["mem_available_bytes"])), fmt_gib(int(committed_elsewhere_bytes))))
    facts = {"mem_total_bytes": total, "mem_available_bytes": available, "mem_limit_bytes": limit,
             "gpu_count": len(wanted), "gpu_memory_mib": min(int(node_gpus[g]["memory_total_mib"]) for g in wanted)}
    # Memory a running container already uses counts as available to it, so a re-run plans the same size.
    plan = _host_plan(req, facts, ranks, held_bytes=int(container.get("existing_mem_bytes") or 0))
    if not plan["fits"]:
        shared = (" It is planned against the node's MemAvailable %s less %s that the containers planned before it on "
                  "this node will still pin and hold (they are planned together)." % (
                      fmt_gib(int(node["mem_available_bytes"])), fmt_gib(int(committed_elsewhere_bytes)))
                  if committed_elsewhere_bytes else "")
        _refuse_plan("CT %d: refused before any change, the HiCache plan does not fit.%s" % (vmid, shared), plan)
    return {"vmid": vmid, "fits": True, "per_rank_gb": plan["per_rank_gb"], "ranks": ranks, "plan": plan,
            "memory_limit_bytes": limit, "gpus": [node_gpus[g] for g in wanted], "gpu_minors": wanted}


# --- stage 3: the launch in the container -------------------------------------------------------------

def _primary_address(addresses: Sequence[str]) -> str:
    """The first global IPv4 address from `ip -4 -o addr show scope global` lines (or bare addresses)."""
    for line in addresses or []:
        m = re.search(r"\binet\s+([0-9.]+)", str(line))
        text = m.group(1) if m else str(line).split("/", maxsplit=1)[0].strip()
        try:
            addr = ipaddress.ip_address(text)
        except ValueError:
            continue
        if addr.version == 4 and not addr.is_loopback and not addr.is_link_local and not addr.is_unspecified:
            return str(addr)
    return ""


def _check_model(model_path: str, ct: Mapping[str, Any]) -> None:
    src = ct.get("model_src") or ""
    if src:
        if ct.get("model_src_present") is False:
            raise DeployError("sglang_server_model_src=%s has no config.json on the controller: it is not a model directory "
                              "(Hugging Face layout). Fix sglang_server_model_src, or empty it when the model is already "
                              "in the container at sglang_server_model_path." % src)
    elif ct.get("model_present") is False:
        raise DeployError("%s/config.json does not exist in the container: set sglang_server_model_path to the model's "
                          "directory there (bind mount, shared storage), or sglang_server_model_src to copy it from the "
                          "controller." % model_path)


def _check_port(port: int, ct: Mapping[str, Any], yours: Sequence[int] = ()) -> None:
    """Refuse a port another program listens on (`ss -Hltnp` lines); the running SGLang's own listener is fine.
    ``yours``: PIDs (in the container) of the SGLang the operator started by hand in a container being taken over."""
    ours = {int(p) for p in ct.get("unit_pids") or []}
    hand_run = {int(p) for p in yours or []}
    for line in ct.get("listeners") or []:
        fields = str(line).split()
        if len(fields) < 4 or not fields[3].endswith(":%d" % port):
            continue
        users = re.findall(r'\("([^"]*)",pid=(\d+)', str(line))
        others = [(name, int(pid)) for name, pid in users if int(pid) not in ours]
        if others and all(pid in hand_run for _name, pid in others):
            raise DeployError("port %d is held by your server, the SGLang started by hand in this container (pid %s): "
                              "the take-over stops it before the unit starts on the same port; set "
                              "pve_gpu_container_adopt_interrupt=true for the take-over to stop it (docs/deploy.md, "
                              "\"Taking over an existing container\")" % (port, ", ".join(str(p) for _n, p in others)))
        if others or not users:
            who = ", ".join("%s (pid %d)" % o for o in others) or "a process this check cannot see"
            raise DeployError("port %d is already in use in the container by %s: set sglang_server_port to a free port"
                              % (port, who))


def issued_size_gb(node_state: Mapping[str, Any]) -> int:
    """The per-rank size the node's gate planned and committed for this container (its entry's ``node_plan``)."""
    issued = (node_state.get("node_plan") or {}).get("per_rank_gb") if isinstance(node_state, Mapping) else None
    if isinstance(issued, bool) or not str(issued if issued is not None else "").strip().isdigit() or int(issued) < 1:
        raise DeployError("the node play issued no HiCache size for this container (its node_plan.per_rank_gb is %s): "
                          "run playbooks/deploy.yml, whose node play plans each container before the container play"
                          % clip(issued, SHOWN))
    return int(issued)


def launch(req: Mapping[str, Any], node_state: Mapping[str, Any], ct: Mapping[str, Any], paths: Mapping[str, str]) -> Dict[str, Any]:
    """The launch of the size the node issued (``node_state.node_plan``), checked in the container's own view and
    lowered when that view holds less, and everything that follows (argv, guard, bounds)."""
    layout = req["layout"]
    service = req["service"]
    gpu_nodes = sorted(p for p in ct.get("device_paths") or [] if re.fullmatch(r"/dev/nvidia\d+", p))
    node_driver = str(node_state.get("driver_version") or "")
    declared = str(ct.get("declared_driver_version") or "")
    if declared and declared != node_driver:
        raise DeployError("the node runs NVIDIA driver %s but sglang_server_nvidia_driver_version is %s: the container's "
                          "userspace must equal the node's kernel module exactly" % (node_driver, declared))
    ranks = ranks_on_this_node(req)
    if ranks != len(gpu_nodes):
        raise DeployError(
            "%s = %d rank(s) in this container, but it sees %d GPU device node(s) (%s). Match pve_gpu_container_gpus "
            "to the layout." % (layout_text(layout), ranks, len(gpu_nodes), ", ".join(gpu_nodes) or "none"))
    _check_model(service["model_path"], ct)
    _check_port(service["port"], ct, node_state.get("adopt_hand_run") or ())
    declared_limit = int(node_state["memory_limit_bytes"])
    cgroup_limit = ct.get("cgroup_memory_limit_bytes")
    limit = min(int(cgroup_limit), declared_limit) if cgroup_limit else declared_limit
    facts = {"mem_total_bytes": int(ct["mem_total_bytes"]), "mem_available_bytes": ct["mem_available_bytes"],
             "mem_limit_bytes": limit, "gpu_count": len(gpu_nodes),
             "gpu_memory_mib": min(int(g["memory_total_mib"]) for g in node_state["gpus"])}
    # What a running SGLang holds is added back: the plan is for the container without it.
    held = int(ct.get("unit_held_bytes") or 0)
    plan = _host_plan(req, facts, ranks, held_bytes=held)
    if not plan["fits"]:
        _refuse_plan("Refused: the HiCache plan does not fit this container; nothing was changed.", plan)
    # The node issued the size (its gate planned it against the node's MemAvailable and committed it in the node's
    # budget). The container's own view (lxcfs) does not see the node's other tenants, so it may lower that size, never
    # raise it: a larger one would pin memory the node's plan gave to no one.
    issued_gb = issued_size_gb(node_state)
    notes = list(req.get("notes") or [])
    if int(plan["per_rank_gb"]) > issued_gb:
        own_gb = int(plan["per_rank_gb"])
        plan = _host_plan(req, dict(facts, requested_gb=issued_gb), ranks, held_bytes=held)
        if not plan["fits"]:
            _refuse_plan("Refused: the %d GB per rank the node issued does not fit this container; nothing was changed."
                         % issued_gb, plan)
        notes.append("--hicache-size %d: the size the node issued from its MemAvailable (this container's own view "
                     "alone would allow %d GB per rank; it does not see the node's other tenants)" % (issued_gb, own_gb))
    plan["warnings"] = notes + list(plan.get("warnings") or [])
    size = int(plan["per_rank_gb"])

    host = service["host"] or _primary_address(ct.get("addresses") or [])
    if not host:
        raise DeployError("the container has no global IPv4 address to bind SGLang to (ip -4 addr shows %s); set "
                          "sglang_server_host (127.0.0.1 keeps it inside the container)" % (list(ct.get("addresses") or []) or "none"))
    if not is_loopback(host) and not service["api_key_set"] and not service["allow_unauthenticated"]:
        raise DeployError(
            "SGLang would listen on %s (the container's address) without an API key. Set sglang_server_api_key (Vault or an "
            "AWX credential), set sglang_server_host=127.0.0.1, or allow it by name with "
            "sglang_server_allow_unauthenticated=true." % host)

    args = ["--model-path", service["model_path"], "--host", host, "--port", str(service["port"]),
            "--tp-size", str(layout["tp_size"])]
    if layout["pp_size"] > 1:
        args += ["--pp-size", str(layout["pp_size"])]
    if layout["dp_size"] > 1:
        args += ["--dp-size", str(layout["dp_size"])]
    if layout["enable_dp_attention"] and layout["dp_size"] > 1:
        args += ["--enable-dp-attention"]
    if layout.get("attn_dp_size", 1) > 1:
        args += ["--attn-dp-size", str(layout["attn_dp_size"])]
    if req["kv_cache_dtype"] != "auto":
        args += ["--kv-cache-dtype", req["kv_cache_dtype"]]
    args += ["--enable-hierarchical-cache", "--hicache-size", str(size)]
    if layout["nnodes"] > 1:
        args += ["--nnodes", str(layout["nnodes"]), "--node-rank", str(layout["node_rank"]),
                 "--dist-init-addr", "%s:%d" % (service["dist_init_host"], service["dist_init_port"])]
    if service["served_model_name"]:
        args += ["--served-model-name", service["served_model_name"]]
    args += list(req["extra_args"])
    argv = [paths["python"], paths["launcher"], "--launch", paths["launch_json"]]
    if service["api_key_set"]:
        argv += ["--api-key-file", paths["api_key_file"]]
    argv += ["--"] + args

    # The launch contract (the memory tool's `contract`): every file the start reads, the virtualenv's distributions
    # and the model when the deploy copies it. The unit's ExecStartPre records it at each start (--record); configure
    # compares it with what is installed (--compare) and restarts the server when they differ. So the restart is
    # decided from the files and the running unit, not from a handler that a failed or interrupted run loses.
    contract_args = ["contract", "--unit", paths["unit"], "--state", paths["contract_state"], "--venv", paths["venv"]]
    for path in (paths["unit_path"], paths["launch_json"], paths["env_file"], paths["api_key_file"], paths["launcher"]):
        contract_args += ["--file", path]
    if ct.get("model_src"):
        contract_args += ["--tree", service["model_path"]]

    health_host = "127.0.0.1" if host in ("0.0.0.0", "::") else host
    health_url = "http://%s:%d" % (("[%s]" % health_host) if ":" in health_host else health_host, service["port"])
    # The memory tool's `verify` arguments: node rank 0 serves the API, whose path for the server's own arguments
    # depends on the release (hicache_releases.server_info_path); the key is read from its file in the container.
    verify_args = ["--health-url", health_url]
    if int(layout["node_rank"]) == 0:
        verify_args += ["--info-path", server_info_path(req["version"])]
    if service["api_key_set"]:
        verify_args += ["--api-key-file", paths["api_key_file"]]
    return {
        "contract_args": contract_args,
        "verify_args": verify_args,
        "hicache_size_gb": size,
        "ranks": ranks,
        "argv": argv,
        "sglang_args": args,
        "bind_host": host,
        "health_url": health_url,
        # What the start guard (the launcher) checks against the argv it is about to run.
        "guard": {
            "hicache_size_gb": size,
            "owned": {"--hicache-size": str(size), "--tp-size": str(layout["tp_size"]), "--host": host,
                      "--port": str(service["port"])},
            # The MemAvailable the plan's fit was decided on: the reserve, the processes and every pool.
            "required_available_bytes": int(plan["required_available_bytes"]),
            "gpu_used_max_mib": int(paths.get("gpu_used_max_mib", 256)),
            "nvidia_smi": paths.get("nvidia_smi", "/usr/bin/nvidia-smi"),
        },
        # What verify compares the running server with.
        "expected_running": {
            "hicache_size": size, "enable_hierarchical_cache": True, "tp_size": layout["tp_size"],
            "pp_size": layout["pp_size"], "dp_size": _attention_dp(layout) or layout["dp_size"], "model_path": service["model_path"],
            "port": service["port"], "host": host,
        },
        "bounds": {
            "planned_pinned_bytes": int(plan["engine_pinned_bytes"]),
            "ceiling_bytes": int(plan["ceiling_bytes"]),
        },
        "plan": plan,
        "memory_limit_bytes": limit,
    }


def install_steps(version: str, installed: Optional[Mapping[str, Any]]) -> Dict[str, bool]:
    """Which install steps a run needs, from preflight's read in the container (``installed``: venv_pip_present,
    sglang_installed_version, user_as_wanted) and the extra packages asked (pip_extra_packages). Without a read,
    every step runs."""
    read = dict(installed or {})

    def flag(key: str) -> bool:  # not read (None) is false: the step runs
        return read.get(key) is not None and as_bool("preflight's %s" % key, read[key], DeployError)

    pip_present = flag("venv_pip_present")
    return {
        # A run cut while `python3 -m venv` made the virtualenv leaves one without pip, which the pip module then
        # refuses on every later run: made again.
        "remake_venv": not pip_present,
        # pip would find sglang==version installed and change nothing; extra packages are always left to pip.
        "pip": (not pip_present or bool(read.get("pip_extra_packages"))
                or str(read.get("sglang_installed_version") or "") != str(version)),
        "user": not flag("user_as_wanted"),
    }


_LAUNCH_PLAN_KEYS = ("sglang_version", "per_rank_gb", "ranks_per_host", "engine_ranks_per_host", "kv_bytes_per_token",
                     "host_tokens_per_rank", "pinned_per_rank_bytes", "total_pinned_bytes", "reserve_bytes",
                     "overhead_bytes", "allocation")


def launch_record(ln: Mapping[str, Any], version: str) -> Dict[str, Any]:
    """What /etc/sglang/launch.json holds: only what decides the launch (figures that move with MemAvailable
    stay out, so an unchanged configuration never restarts the server)."""
    p = ln["plan"]
    return {
        "sglang_version": version,
        "hicache_size": ln["hicache_size_gb"],
        "argv": ln["argv"],
        "sglang_args": ln["sglang_args"],
        "plan": {k: p[k] for k in _LAUNCH_PLAN_KEYS},
        "memory_limit_bytes": ln["memory_limit_bytes"],
        "guard": ln["guard"],
    }


# --- the restart of a server over several containers -----------------------------------------------------

def server_restart(host: str, own: Mapping[str, Any], nnodes: int, members: Sequence[str],
                   members_compare: Mapping[str, Optional[Mapping[str, Any]]]) -> Dict[str, Any]:
    """Whether this container's SGLang restarts, and why. ``own``: the memory tool's ``contract --compare`` answer in
    this container (``restart``, ``restart_reasons``). A server over several containers (``nnodes`` > 1) restarts
    whole: when another member of this run (``members``: the server's containers in this run, ``members_compare``:
    each one's answer, None when not read) restarts, so does this one, in the same tasks (the ranks of a restarted
    half would wait in a rendezvous the running half never joins, and the running half fails on its dead peer)."""
    reasons = [str(r) for r in (own or {}).get("restart_reasons") or []]
    restart = bool((own or {}).get("restart")) or bool(reasons)
    if not restart and int(nnodes) > 1:
        others = sorted(m for m in members if m != host and bool(((members_compare or {}).get(m) or {}).get("restart")))
        if others:
            restart = True
            reasons = ["another container of the same server restarts (%s): the server restarts whole" % ", ".join(others)]
    return {"restart": restart, "reasons": reasons}


# --- stage 4: verify --------------------------------------------------------------------------------

def verify(ln: Mapping[str, Any], running: Optional[Mapping[str, Any]], measure: Mapping[str, Any],
           node_rank: int, tolerance: float) -> Dict[str, Any]:
    """Compare the running server with the launch. ``running`` is /server_info (None on node ranks > 0)."""
    if not 0 <= float(tolerance) < 1:
        raise DeployError("sglang_server_verify_memory_tolerance_fraction must be a fraction between 0 and 1, got %r" % tolerance)
    expected = dict(ln["expected_running"])
    seen = {}
    mismatches = []
    if node_rank == 0:
        info = dict(running or {})
        for key, want in expected.items():
            got = info.get(key)
            seen[key] = got
            if key == "host":
                continue  # SGLang may report the bind address as given or resolved
            if key == "dp_size" and want > 1 and _num(got) == 1 and _num(info.get("attn_dp_size")) == want:
                continue  # 0.5.22+ reports attention DP as attn_dp_size N, dp_size 1 (ServerArgs.resolved_dict)
            if got != want and not (isinstance(want, int) and not isinstance(got, bool) and _num(got) == want):
                mismatches.append("%s: running %r, planned %r" % (key, got, want))
    planned = int(ln["bounds"]["planned_pinned_bytes"])
    ceiling = int(ln["bounds"]["ceiling_bytes"] * (1 + float(tolerance)))
    floor = int(planned * (1 - float(tolerance)))
    ranks_seen = int(measure.get("rank_count") or 0)
    held = int(measure.get("ranks_held_bytes") or 0)
    unit_held = int(measure.get("unit_held_bytes") or 0)
    if ranks_seen != int(ln["ranks"]):
        mismatches.append("scheduler ranks: %d running, %d planned" % (ranks_seen, int(ln["ranks"])))
    if held < floor:
        mismatches.append("the ranks hold %s, below the planned %s (less %d%%): the host pools are not pinned as planned"
                          % (fmt_gb(held), fmt_gb(planned), round(tolerance * 100)))
    if unit_held > ceiling:
        mismatches.append("the unit holds %s, above the plan's ceiling %s" % (fmt_gb(unit_held), fmt_gb(ceiling)))
    seen_overhead = overhead_seen(ln, held, unit_held, ranks_seen)
    return {
        # The report's memory line (deploy.txt), hundredths of a GB: measured and planned differ by little.
        "memory_text": "ranks pinned %s (planned %s); unit holds %s (ceiling %s)"
                       % tuple(fmt_gb(b, 2) for b in (held, planned, unit_held, ceiling)),
        "ok": not mismatches,
        "mismatches": mismatches,
        "running": seen,
        "expected": expected,
        "ranks_seen": ranks_seen,
        "ranks_planned": int(ln["ranks"]),
        "ranks_held_bytes": held,
        "planned_pinned_bytes": planned,
        "floor_bytes": floor,
        "unit_held_bytes": unit_held,
        "ceiling_bytes": ceiling,
        "overhead_seen": seen_overhead,
    }


def _attention_dp(layout: Mapping[str, Any]) -> int:
    """The attention DP width of a layout (0: none): --attn-dp-size, or --dp-size with --enable-dp-attention."""
    if layout.get("attn_dp_size", 1) > 1:
        return int(layout["attn_dp_size"])
    return int(layout["dp_size"]) if layout["enable_dp_attention"] and layout["dp_size"] > 1 else 0


def overhead_seen(ln: Mapping[str, Any], ranks_held: int, unit_held: int, ranks_seen: int) -> Dict[str, Any]:
    """The process overhead the running server shows (RSS, anonymous and shared, beyond the planned pools) next to
    what the plan budgets for it: the measurement docs/sizing.md asks operators to feed back into the policy."""
    planned_pools = int(ln["bounds"]["planned_pinned_bytes"])
    budgeted = int(ln["plan"].get("overhead_bytes") or 0)
    ranks_beyond = max(ranks_held - planned_pools, 0)
    per_rank = ranks_beyond // ranks_seen if ranks_seen else 0
    frontend = max(unit_held - ranks_held, 0)
    offered = overhead_offer.offer(per_rank, frontend, ranks_seen)
    return {
        "per_rank_bytes": per_rank,
        "frontend_bytes": frontend,
        "total_bytes": ranks_beyond + frontend,
        "budgeted_bytes": budgeted,
        # Offered for the next plan, never applied: the report prints it, the next plan of this host reads it back
        # from the report (overhead_offer.offer_note).
        "offer": offered["settings"],
        "offer_text": offered["text"],
        "text": "processes beyond the pools: %s per rank (%d ranks) + front-end %s = %s, against the %s the plan budgets "
                "(rank_overhead_bytes x ranks + frontend_overhead_bytes + other_committed_bytes)"
                % (fmt_gb(per_rank), ranks_seen, fmt_gb(frontend), fmt_gb(ranks_beyond + frontend), fmt_gb(budgeted)),
    }


# --- the calculator (playbooks/plan.yml) -------------------------------------------------------------------

# The node's facts, which only a run on the node reads; the offline plan of an inventory host takes them from
# plan_input when given.
CALCULATOR_FACT_KEYS = ("mem_total_bytes", "mem_available_bytes", "gpu_memory_mib")
# plan_input keys that have no default: blank (an unanswered question, '' or null) is refused, never read as 1.
NO_DEFAULT_KEYS = frozenset({"tp_size", "pp_size", "dp_size", "nnodes", "gpu_count", "gpu_memory_mib", "mem_total_bytes",
                             "mem_available_bytes", "mem_limit_bytes", "sglang_version", "enable_dp_attention"})
# hicache.plan requires gpu_memory_mib but reads it only for releases that assert, at start-up, that the host pool
# holds more tokens than the device pool (up to 0.5.14). For later releases a GPU memory that nobody gave is passed
# as this placeholder (hicache's smallest accepted value); for those releases it is asked for instead.
GPU_MEMORY_NOT_READ_MIB = 1024


def require_gpu_memory(req: Mapping[str, Any]) -> None:
    """Offline, the GPUs' memory is not read: refused for a release whose start-up check depends on it."""
    asserts = [rules for rules in release_rules(req["version"]) if rules.asserts_host_exceeds_device]
    if asserts and "device_pool_tokens_per_rank" not in req["plan_base"]:
        raise DeployError(
            "SGLang %s checks at start-up that the host pool holds more tokens than the device pool, which depends on "
            "the GPUs' memory: declare it on the node's host in the inventory, pve_gpu_container_node_gpu_memory_mib: 97887 "
            "(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits on the node; docs/deploy.md, \"The node "
            "in the inventory\"), or give it for this run, -e '{\"plan_input\": {\"gpu_memory_mib\": 97887}}', or "
            "device_pool_tokens_per_rank in sglang_server_plan_extra" % req["version"])


def calculate(plan_input: Any, requested_gb: Any = None, req: Optional[Mapping[str, Any]] = None,
              container: Optional[Mapping[str, Any]] = None, host: str = "") -> Dict[str, Any]:
    """The calculator, touching no host. Without ``req``: the plan of the facts and layout in ``plan_input``.
    With ``req`` (the request stage's result for an inventory host) and ``container`` (its declared container):
    the plan deploy would make for that host, against its declared memory limit unless ``plan_input`` gives the
    node's facts. ``requested_gb`` (plan_requested_gb) is a size as a survey gives it; blank = not given."""
    if not is_blank(plan_input) and not isinstance(plan_input, Mapping):
        raise DeployError("plan_input must be a dict of hicache_plan keys (ansible-doc -t filter "
                          "inferops.gpu_inference.hicache_plan), got %s" % clip(plan_input, SHOWN))
    blank = sorted(str(k) for k, v in dict(plan_input or {}).items() if is_blank(v))
    refused = [k for k in blank if k in NO_DEFAULT_KEYS]
    if refused:
        raise DeployError("plan_input: %s %s blank ('' or null), and a blank layout or memory figure is not read as 1 or as "
                          "any default: give %s, or leave %s out of plan_input (tp_size, pp_size, dp_size and nnodes then "
                          "mean 1, and the explanation says so)" % (", ".join(refused), "is" if len(refused) == 1 else "are",
                                                                    "its value" if len(refused) == 1 else "their values",
                                                                    "it" if len(refused) == 1 else "them"))
    given = {k: v for k, v in dict(plan_input or {}).items() if not is_blank(v)}
    own = given.pop("requested_gb", None)
    override = parse_requested_gb(requested_gb, "plan_requested_gb")
    notes: List[str] = []
    if blank:
        notes.append("plan_input: %s blank, so not given: the documented default is used." % ", ".join(blank))
    if req is None:
        if not given:
            raise DeployError("Nothing to plan: pass a variable file with a plan_input dict (the collection ships examples "
                              "in its playbooks/vars/examples/: -e @<collection>/playbooks/vars/examples/kimi-k2-incident.yml, "
                              "where `ansible-galaxy collection list inferops.gpu_inference` shows <collection>'s directory), "
                              "or plan an inventory host: -i <inventory> -e plan_host=<container host>")
        data = dict(given)
        requested = override or parse_requested_gb(own, "plan_input.requested_gb")
        if requested:
            data["requested_gb"] = requested
        return {"plan": _plan(data), "notes": notes}

    if own is not None:
        raise DeployError("with plan_host, ask for a size with -e plan_requested_gb=N (or the host's "
                          "sglang_server_hicache_requested_gb), not plan_input.requested_gb")
    other = sorted(str(k) for k in given if k not in CALCULATOR_FACT_KEYS)
    if other:
        raise DeployError("with plan_host, plan_input may give only the node's facts (%s); %s come from %s's variables "
                          "(sglang_server_*, pve_gpu_container_*): set those with -e instead, e.g. -e sglang_server_tp_size=4"
                          % (", ".join(CALCULATOR_FACT_KEYS), ", ".join(other), host or "the host"))
    vmid, memory_mib, wanted = container_spec(container or {})
    ranks = _ranks_match_gpus(req, vmid, wanted)
    limit = memory_mib * MIB_BYTES
    if "mem_total_bytes" in given:
        node_total = memory_bytes("plan_input.mem_total_bytes", given["mem_total_bytes"])
        if limit > node_total:
            raise DeployError("CT %d: pve_gpu_container_memory_mib=%d (%s) is more than the node's RAM (mem_total_bytes %s): "
                              "a container limit above the node's RAM protects nothing. pve_gpu_container_memory_mib is "
                              "MiB; give the container less than the node has."
                              % (vmid, memory_mib, fmt_gib(limit), fmt_gib(node_total)))
    facts: Dict[str, Any] = {}
    if is_zero_request(requested_gb) and req.get("requested_gb"):
        notes.append("plan_requested_gb=0 clears %s's sglang_server_hicache_requested_gb (%s): the plan chooses."
                     % (host, req.get("requested_gb")))
        req = dict(req, requested_gb=None, plan_base={k: v for k, v in req["plan_base"].items() if k != "requested_gb"})
    if override:
        facts["requested_gb"] = override
        notes.append("plan_requested_gb=%d overrides %s's sglang_server_hicache_requested_gb (%s)."
                     % (override, host, req.get("requested_gb") or "none: the plan chooses"))
    if "gpu_memory_mib" not in given:
        require_gpu_memory(req)
    facts.update({
        "mem_total_bytes": given.get("mem_total_bytes", limit),
        "mem_available_bytes": given.get("mem_available_bytes", given.get("mem_total_bytes", limit)),
        "mem_limit_bytes": limit,
        "gpu_count": len(wanted),
        "gpu_memory_mib": given.get("gpu_memory_mib", GPU_MEMORY_NOT_READ_MIB),
    })
    plan = _host_plan(req, facts, ranks)
    notes.extend(req.get("notes") or [])
    if "mem_available_bytes" in given:
        basis = "the node's facts given in plan_input and the container's declared memory limit %s" % fmt_gib(limit)
    else:
        basis = ("its declared memory limit %s (pve_gpu_container_memory_mib); deploy plans against the node's "
                 "MemAvailable as read then, which can only lower the size" % fmt_gib(limit))
    notes.insert(0, "Planned offline for %s (CT %d, %s, %d GPU(s): %s) from the inventory, against %s. The API key and "
                 "the bind address are not checked here (deploy checks them)."
                 % (host, vmid, layout_text(req["layout"]), len(wanted), ",".join(map(str, wanted)), basis))
    return {"plan": plan, "notes": notes, "vmid": vmid}


def _num(value: Any) -> Optional[float]:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None
