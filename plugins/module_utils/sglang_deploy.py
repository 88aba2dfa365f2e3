# -*- coding: utf-8 -*-
# Copyright: inferops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""One deploy plan for an SGLang server in a GPU container, computed in one place (no Ansible imports).

Stages, each called once per play by the action plugin ``inferops.gpu_inference.sglang_deploy_plan``:

``request(settings)``
    The operator's settings (role variables, survey answers) checked and normalised: layout, version,
    the requested size, the service (bind address, API key policy, port) and the extra arguments.
    Refuses anything the plan owns being set another way (``--hicache-size`` in extra args, or a
    computed variable passed with ``-e``).
``node_gate(request, node, container)``
    On the PVE node, before any change: the container's GPUs exist, the layout uses exactly them, its
    memory limit leaves the node its reserve, and the HiCache plan fits the declared limit.
``launch(request, node_state, container_facts)``
    In the container, for the value actually launched: the plan from the container's own view, the
    exact argv of the unit, what the start guard must see, and the bounds verify checks.
``verify(launch, running, measure)``
    What runs compared with the launch: the server's own arguments and the memory its ranks pinned.

Every refusal raises :class:`DeployError` whose message says what was wrong and what to do.
"""
from __future__ import annotations

import ipaddress
import math
import re
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from ansible_collections.inferops.gpu_inference.plugins.module_utils import hicache

MIB_BYTES = 1024 * 1024

# Variables that the roles compute. A value given for one of them by the operator (-e, a survey, the
# inventory) would outrank the computed one (Ansible's precedence puts extra vars above set_fact and
# register), so their presence in the input is refused rather than trusted.
COMPUTED_NAMES = frozenset({
    "sglang_server_hicache_size",
    "sglang_server_plan",
    "sglang_server_plan_request",
    "sglang_server_request",
    "sglang_server_launch",
    "sglang_server_result",
    "pve_gpu_container_state",
    "pve_gpu_container_spec",
    "pve_gpu_container_gate",
    "sglang_server_node_state",
    "pve_gpu_container_plan_requests",
})
# Prefixes of the roles' public settings (what an operator, the inventory or a survey sets).
ROLE_PREFIXES = ("sglang_server_", "pve_gpu_container_")
PRIVATE_PREFIXES = ("__sglang_server_", "__pve_gpu_container_", "_sglang_server_", "_pve_gpu_container_", "__deploy_")

# Flags whose value the plan decides; extra args may not set them (nor any prefix of them: SGLang's
# argparse accepts unambiguous abbreviations, so --hicache-si 300 would be --hicache-size 300).
OWNED_FLAGS = (
    "--model-path", "--model", "--host", "--port", "--api-key", "--admin-api-key",
    "--tp-size", "--tensor-parallel-size", "--tp", "--pp-size", "--pipeline-parallel-size", "--pp",
    "--dp-size", "--data-parallel-size", "--dp", "--enable-dp-attention",
    "--nnodes", "--node-rank", "--dist-init-addr",
    "--enable-hierarchical-cache", "--hicache-size", "--hicache-ratio", "--kv-cache-dtype",
    "--served-model-name",
)

LOOPBACK_NAMES = ("localhost", "ip6-localhost")
_FACT_OR_LAYOUT_KEYS = frozenset({"mem_total_bytes", "mem_available_bytes", "mem_limit_bytes", "gpu_count", "gpu_memory_mib",
                                  "sglang_version", "tp_size", "pp_size", "dp_size", "enable_dp_attention", "nnodes",
                                  "requested_gb", "kv_cache_dtype", "model_preset"})


class DeployError(ValueError):
    """A setting or a fact that makes the deploy unsafe or impossible; the message says what to do."""


# --- helpers ------------------------------------------------------------------------------------------

def _clip(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _blank(value: Any) -> bool:
    """A survey's unanswered optional field: None (AWX's !unsafe '' resolves to None) or ''."""
    return value is None or (isinstance(value, str) and value.strip() == "")


def _int(name: str, value: Any, minimum: int, maximum: int, what: str = "") -> int:
    if isinstance(value, bool):
        raise DeployError("%s must be a whole number, got the boolean %r%s" % (name, value, what))
    if isinstance(value, float):
        if not math.isfinite(value) or not value.is_integer():
            raise DeployError("%s must be a whole number, got %r%s" % (name, value, what))
        value = int(value)
    if isinstance(value, str):
        text = value.strip()
        if not re.fullmatch(r"[+-]?\d{1,12}", text):
            raise DeployError("%s must be a whole number, got %s%s" % (name, _clip(value), what))
        value = int(text)
    if not isinstance(value, int):
        kind = "a list" if isinstance(value, (list, tuple)) else "a dict" if isinstance(value, Mapping) else type(value).__name__
        raise DeployError("%s must be a whole number, got %s %s%s" % (name, kind, _clip(list(value) if isinstance(value, (list, tuple)) else value), what))
    if not minimum <= value <= maximum:
        raise DeployError("%s must be between %d and %d, got %d%s" % (name, minimum, maximum, value, what))
    return value


def _bool(name: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "yes", "on", "1", "false", "no", "off", "0"):
        return value.strip().lower() in ("true", "yes", "on", "1")
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    raise DeployError("%s must be true or false, got %s" % (name, _clip(value)))


def _text(name: str, value: Any, blank_ok: bool = True) -> str:
    if _blank(value):
        if blank_ok:
            return ""
        raise DeployError("%s must be set" % name)
    if not isinstance(value, str):
        raise DeployError("%s must be a string, got %s %s" % (name, type(value).__name__, _clip(value)))
    return value.strip()


def injected_names(names: Sequence[str]) -> List[str]:
    """The computed or private names among ``names`` (variable names the operator supplied)."""
    return sorted(n for n in names if isinstance(n, str) and (n in COMPUTED_NAMES or n.startswith(PRIVATE_PREFIXES)))


def refuse_injected(names: Sequence[str], where: str) -> None:
    bad = injected_names(names)
    if bad:
        raise DeployError(
            "refused before any change: %s set %s, which the roles compute (or keep private). A value given "
            "there would outrank the computed one, so it is not accepted. Remove it; to ask for a HiCache size, "
            "set sglang_server_hicache_requested_gb (decimal GB per rank), which is checked against the plan."
            % (where, ", ".join(bad))
        )


def _requested_gb(value: Any, name: str = "sglang_server_hicache_requested_gb") -> Optional[int]:
    """A requested per-rank size as an operator or a survey gives it: None/''/0 = let the plan choose; a whole
    number of decimal GB (also as a string, "4"); "300GB", "1.5" are refused with the reason."""
    if _blank(value):
        return None
    if isinstance(value, str):
        text = value.strip()
        unit = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([A-Za-z]+)", text)
        if unit:
            raise DeployError(
                "%s=%s: give a bare whole number of decimal GB per rank (SGLang's --hicache-size unit), without a unit: "
                "%s GB is %s; if you meant GiB, %s GiB is %.1f GB." % (
                    name, _clip(value), unit.group(1), unit.group(1) + " x 10^9 bytes", unit.group(1),
                    float(unit.group(1)) * hicache.GIB_BYTES / hicache.GB_BYTES)
            )
        if re.fullmatch(r"\d+\.\d*[1-9]\d*", text):
            raise DeployError("%s=%s: --hicache-size is a whole number of GB (SGLang's argparse type is int); "
                              "round it down to %d" % (name, _clip(value), int(float(text))))
    size = _int(name, value, 0, 1_000_000, " (decimal GB per rank; 0 or blank lets the plan choose)")
    return size or None


def blank_extra_vars(extra_vars: Mapping[str, Any]) -> List[str]:
    """The role settings among the extra variables that are blank (None or ''), as AWX passes a survey question
    left unanswered. Each one hides the value the inventory sets for the host."""
    return sorted(k for k, v in extra_vars.items() if isinstance(k, str) and k.startswith(ROLE_PREFIXES) and _blank(v))


def blank_extra_vars_note(names: Sequence[str]) -> str:
    """What to tell the operator about blank role settings among the extra variables ('' when there are none)."""
    if not names:
        return ""
    return ("%s %s blank in the extra variables (an AWX survey question left unanswered arrives as '' or null): blank "
            "means the role's default here, and an extra variable hides any value the inventory sets for the host. "
            "Answer the question, or leave it out of the launch, to keep the inventory's value."
            % (", ".join(names), "is" if len(names) == 1 else "are"))


def _owned_flag(arg: str) -> Optional[str]:
    if not arg.startswith("--") or arg == "--":
        return None
    option = arg.split("=", 1)[0]
    for flag in OWNED_FLAGS:
        if flag == option or (len(option) > 3 and flag.startswith(option)):
            return flag
    return None


def _extra_args(value: Any) -> List[str]:
    name = "sglang_server_extra_args"
    if _blank(value):
        return []
    if isinstance(value, str):
        raise DeployError("%s must be a list of arguments (e.g. ['--max-running-requests', '64']), got the string %s"
                          % (name, _clip(value)))
    if not isinstance(value, (list, tuple)):
        raise DeployError("%s must be a list of arguments, got %s" % (name, type(value).__name__))
    args = []
    for item in value:
        if isinstance(item, bool) or not isinstance(item, (str, int, float)):
            raise DeployError("%s: every item must be a string or a number, got %s" % (name, _clip(item)))
        text = str(item)
        if "\n" in text or "\x00" in text:
            raise DeployError("%s: an argument contains a newline or NUL: %s" % (name, _clip(item)))
        flag = _owned_flag(text)
        if flag:
            raise DeployError(
                "%s contains %s, which sets %s: the deploy plan owns that flag (set it through the role's variable, "
                "e.g. sglang_server_hicache_requested_gb for --hicache-size, sglang_server_tp_size for --tp-size)"
                % (name, _clip(text), flag))
        args.append(text)
    return args


def _host(value: Any) -> str:
    text = _text("sglang_server_host", value)
    if not text:
        return ""
    try:
        ipaddress.ip_address(text)
    except ValueError:
        if text not in LOOPBACK_NAMES:
            raise DeployError("sglang_server_host=%s must be an IP address (or empty for the container's own address)"
                              % _clip(value))
    return text


def _is_loopback(host: str) -> bool:
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


# --- stage 1: the operator's settings -------------------------------------------------------------------

def request(settings: Mapping[str, Any]) -> Dict[str, Any]:
    """Check and normalise the settings of one container. Raises DeployError.

    A blank setting (None or '': an AWX survey question left unanswered arrives as either) is not given: the
    default applies, and a required one is reported as not set."""
    s = {k: v for k, v in dict(settings).items() if not _blank(v)}
    version = _text("sglang_server_version", s.get("version"), blank_ok=False)
    try:
        hicache.parse_version(version)
    except hicache.PlanError as exc:
        raise DeployError("sglang_server_version: %s" % exc) from exc
    cluster = s.get("cluster") or []
    if not isinstance(cluster, (list, tuple)):
        raise DeployError("sglang_server_cluster_group must name an inventory group, got %s" % _clip(cluster))
    me = s.get("inventory_hostname")
    if cluster and me not in cluster:
        raise DeployError("%s is not in its sglang_server_cluster_group (%s); add it to the group or unset the variable"
                          % (me, ", ".join(map(str, cluster))))
    if cluster:
        s.setdefault("nnodes", len(cluster))
        s.setdefault("node_rank", list(cluster).index(me))
    layout = {
        "tp_size": _int("sglang_server_tp_size", s.get("tp_size", 1), 1, 1024),
        "pp_size": _int("sglang_server_pp_size", s.get("pp_size", 1), 1, 1024),
        "dp_size": _int("sglang_server_dp_size", s.get("dp_size", 1), 1, 1024),
        "enable_dp_attention": _bool("sglang_server_enable_dp_attention", s.get("enable_dp_attention", False)),
        "nnodes": _int("the number of containers in sglang_server_cluster_group", s.get("nnodes", 1), 1, 1024),
        "node_rank": _int("the node rank", s.get("node_rank", 0), 0, 1023),
    }
    if layout["node_rank"] >= layout["nnodes"]:
        raise DeployError("node rank %d is not below nnodes %d: this container is not in sglang_server_cluster_group"
                          % (layout["node_rank"], layout["nnodes"]))
    if layout["enable_dp_attention"] and layout["dp_size"] > 1 and layout["tp_size"] % layout["dp_size"]:
        raise DeployError("sglang_server_enable_dp_attention with dp_size %d needs tp_size divisible by it, got tp_size %d "
                          "(SGLang asserts tp_size %% dp_size == 0 with DP attention)" % (layout["dp_size"], layout["tp_size"]))

    for name in ("policy", "plan_extra"):
        value = s.get(name)
        if not _blank(value) and not isinstance(value, Mapping):
            var = "sglang_server_hicache_policy" if name == "policy" else "sglang_server_plan_extra"
            raise DeployError("%s must be a dict, got %s" % (var, _clip(value)))
    policy = dict(s.get("policy") or {})
    extra = dict(s.get("plan_extra") or {})
    owned = sorted(k for k in set(policy) | set(extra) if k in _FACT_OR_LAYOUT_KEYS)
    if owned:
        raise DeployError("sglang_server_hicache_policy / sglang_server_plan_extra set %s, which come from the facts or "
                          "the layout variables; remove them" % ", ".join(owned))

    preset = _text("sglang_server_model_preset", s.get("model_preset"))
    kv_dtype = _text("sglang_server_kv_cache_dtype", s.get("kv_cache_dtype")) or "auto"
    plan_base = dict(extra)
    plan_base.update(policy)
    plan_base.update({
        "sglang_version": version,
        "tp_size": layout["tp_size"],
        "pp_size": layout["pp_size"],
        "dp_size": layout["dp_size"],
        "enable_dp_attention": layout["enable_dp_attention"],
        "nnodes": layout["nnodes"],
        "kv_cache_dtype": kv_dtype,
    })
    if preset:
        plan_base["model_preset"] = preset
    requested = _requested_gb(s.get("requested_gb"))
    if requested:
        plan_base["requested_gb"] = requested

    host = _host(s.get("host"))
    api_key_set = _bool("an API key being set", s.get("api_key_set", False))
    allow_open = _bool("sglang_server_allow_unauthenticated", s.get("allow_unauthenticated", False))
    if host and not _is_loopback(host) and not api_key_set and not allow_open:
        raise DeployError(
            "sglang_server_host=%s is reachable beyond the container's loopback and no sglang_server_api_key is set: "
            "anyone who reaches it could use the server. Set sglang_server_api_key (from Vault or an AWX credential), "
            "bind to 127.0.0.1, or say so by name with sglang_server_allow_unauthenticated=true." % host)
    service = {
        "host": host,
        "port": _int("sglang_server_port", s.get("port", 30000), 1, 65535),
        "api_key_set": api_key_set,
        "allow_unauthenticated": allow_open,
        "model_path": _text("sglang_server_model_path", s.get("model_path"), blank_ok=False),
        "served_model_name": _text("sglang_server_served_model_name", s.get("served_model_name")),
        "dist_init_host": _text("sglang_server_dist_init_host", s.get("dist_init_host")),
        "dist_init_port": _int("sglang_server_dist_init_port", s.get("dist_init_port", 50000), 1, 65535),
    }
    if not service["model_path"].startswith("/"):
        raise DeployError("sglang_server_model_path=%s must be an absolute path inside the container" % _clip(service["model_path"]))
    if layout["nnodes"] > 1 and not service["dist_init_host"]:
        raise DeployError("a multi-node server (%d containers in sglang_server_cluster_group) needs "
                          "sglang_server_dist_init_host (node rank 0's address)" % layout["nnodes"])
    tolerance = s.get("verify_memory_tolerance", 0.10)
    if isinstance(tolerance, bool) or not isinstance(tolerance, (int, float, str)):
        raise DeployError("sglang_server_verify_memory_tolerance must be a fraction, got %s" % _clip(tolerance))
    try:
        tolerance = float(tolerance)
    except ValueError as exc:
        raise DeployError("sglang_server_verify_memory_tolerance must be a fraction, got %s" % _clip(tolerance)) from exc
    if not 0 <= tolerance < 1:
        raise DeployError("sglang_server_verify_memory_tolerance must be a fraction between 0 and 1 (0.10 for 10 percent), "
                          "got %s" % _clip(s.get("verify_memory_tolerance")))
    return {
        "version": version,
        "verify_memory_tolerance": tolerance,
        "layout": layout,
        "plan_base": plan_base,
        "kv_cache_dtype": kv_dtype,
        "requested_gb": requested,
        "service": service,
        "extra_args": _extra_args(s.get("extra_args")),
    }


def _plan(data: Mapping[str, Any]) -> Dict[str, Any]:
    try:
        return hicache.plan(data)
    except hicache.PlanError as exc:
        raise DeployError("the HiCache plan cannot be computed: %s" % exc) from exc


def _layout_text(layout: Mapping[str, Any]) -> str:
    dp = "" if (layout["enable_dp_attention"] or layout["dp_size"] == 1) else " x dp %d" % layout["dp_size"]
    return "tp %d x pp %d%s over %d node(s)" % (layout["tp_size"], layout["pp_size"], dp, layout["nnodes"])


def ranks_on_this_node(req: Mapping[str, Any]) -> int:
    """Scheduler ranks SGLang's launcher starts in this container for the layout (hicache.place_ranks)."""
    lay = req["layout"]
    keys = hicache.behaviour_releases(hicache.parse_version(req["version"]))[0]
    dpa = lay["enable_dp_attention"] and lay["dp_size"] > 1
    try:
        return hicache.place_ranks(lay["tp_size"], lay["pp_size"], lay["dp_size"], dpa, lay["nnodes"], max(keys)).ranks_per_node
    except hicache.PlanError as exc:
        raise DeployError("%s: %s" % (_layout_text(lay), exc)) from exc


def _refuse_plan(header: str, plan: Mapping[str, Any]) -> None:
    raise DeployError("\n".join([header] + list(plan["explain"]) + [""] + list(plan["picture"])))


# --- stage 2: the node gate -------------------------------------------------------------------------------

def _container_spec(container: Mapping[str, Any]) -> Tuple[int, int, List[int]]:
    """The declared container's VMID, memory limit (MiB) and GPU indexes, checked."""
    vmid = _int("pve_gpu_container_vmid (proxmox_vmid)", container.get("vmid"), 100, 999_999_999)
    memory_mib = _int("pve_gpu_container_memory_mib", container.get("memory_mib"), 1, 1 << 40)
    wanted = container.get("gpus") or []
    if not isinstance(wanted, (list, tuple)) or not wanted:
        raise DeployError("CT %d: pve_gpu_container_gpus must list the node GPU indexes to pass through, e.g. [0, 1]" % vmid)
    wanted = [_int("pve_gpu_container_gpus item", g, 0, 1023) for g in wanted]
    if len(set(wanted)) != len(wanted):
        raise DeployError("CT %d: pve_gpu_container_gpus lists a GPU twice: %s" % (vmid, wanted))
    return vmid, memory_mib, wanted


def _ranks_match_gpus(req: Mapping[str, Any], vmid: int, wanted: Sequence[int]) -> int:
    ranks = ranks_on_this_node(req)
    if ranks != len(wanted):
        raise DeployError(
            "CT %d: %s puts %d scheduler rank(s) on this node (one per GPU), but %d GPU(s) are passed through (%s). "
            "Make pve_gpu_container_gpus match the layout, or change the layout." % (
                vmid, _layout_text(req["layout"]), ranks, len(wanted), ",".join(map(str, wanted))))
    return ranks


def node_gate(req: Mapping[str, Any], node: Mapping[str, Any], container: Mapping[str, Any],
              node_reserve_bytes: int) -> Dict[str, Any]:
    """Check one container against the node's facts before anything changes; return the node's plan."""
    vmid, memory_mib, wanted = _container_spec(container)
    node_gpus = {int(g["index"]): g for g in node.get("gpus") or []}
    node_nodes = set(node.get("device_paths") or [])
    missing = [g for g in wanted if g not in node_gpus]
    missing_nodes = ["/dev/nvidia%d" % g for g in wanted if "/dev/nvidia%d" % g not in node_nodes]
    if missing or missing_nodes:
        have = ",".join(map(str, sorted(node_gpus))) or "none"
        lacking = "; missing device nodes: " + ", ".join(missing_nodes) if missing_nodes else ""
        raise DeployError(
            "CT %d asks for GPUs %s but the node has %d GPU(s) (indexes %s)%s. Set pve_gpu_container_gpus to GPUs "
            "the node has." % (vmid, ",".join(map(str, wanted)), len(node_gpus), have, lacking))
    limit = memory_mib * MIB_BYTES
    total = int(node["mem_total_bytes"])
    if limit + node_reserve_bytes > total:
        raise DeployError(
            "CT %d: memory %d MiB (%s) + the node's own reserve %s exceeds the node's RAM %s: a container limit at or "
            "above host RAM protects nothing. Lower pve_gpu_container_memory_mib." % (
                vmid, memory_mib, hicache.fmt_gib(limit), hicache.fmt_gib(node_reserve_bytes), hicache.fmt_gib(total)))
    ranks = _ranks_match_gpus(req, vmid, wanted)
    data = dict(req["plan_base"])
    existing = int(container.get("existing_mem_bytes") or 0)
    data.update({
        "mem_total_bytes": total,
        # Memory a running container already uses counts as available to it, so a re-run plans the same size.
        "mem_available_bytes": min(int(node["mem_available_bytes"]) + existing, total),
        "mem_limit_bytes": limit,
        "gpu_count": len(wanted),
        "gpu_memory_mib": min(int(node_gpus[g]["memory_total_mib"]) for g in wanted),
    })
    plan = _plan(data)
    if not plan["fits"]:
        _refuse_plan("CT %d: refused before any change, the HiCache plan does not fit." % vmid, plan)
    if int(plan["engine_ranks_per_host"]) != ranks:
        raise DeployError("internal: the plan counts %s ranks, the launcher %d" % (plan["engine_ranks_per_host"], ranks))
    return {"vmid": vmid, "fits": True, "per_rank_gb": plan["per_rank_gb"], "ranks": ranks, "plan": plan,
            "memory_limit_bytes": limit, "gpus": [node_gpus[g] for g in wanted], "gpu_indexes": wanted}


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


def _check_port(port: int, ct: Mapping[str, Any]) -> None:
    """Refuse a port another program listens on (`ss -Hltnp` lines); the running SGLang's own listener is fine."""
    ours = {int(p) for p in ct.get("unit_pids") or []}
    for line in ct.get("listeners") or []:
        fields = str(line).split()
        if len(fields) < 4 or not fields[3].endswith(":%d" % port):
            continue
        users = re.findall(r'\("([^"]*)",pid=(\d+)', str(line))
        others = [(name, int(pid)) for name, pid in users if int(pid) not in ours]
        if others or not users:
            who = ", ".join("%s (pid %d)" % o for o in others) or "a process this check cannot see"
            raise DeployError("port %d is already in use in the container by %s: set sglang_server_port to a free port"
                              % (port, who))


def launch(req: Mapping[str, Any], node_state: Mapping[str, Any], ct: Mapping[str, Any], paths: Mapping[str, str]) -> Dict[str, Any]:
    """The plan for the value actually launched, from the container's own view, and everything that follows."""
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
            "to the layout." % (_layout_text(layout), ranks, len(gpu_nodes), ", ".join(gpu_nodes) or "none"))
    _check_model(service["model_path"], ct)
    _check_port(service["port"], ct)
    declared_limit = int(node_state["memory_limit_bytes"])
    cgroup_limit = ct.get("cgroup_memory_limit_bytes")
    limit = min(int(cgroup_limit), declared_limit) if cgroup_limit else declared_limit
    total = int(ct["mem_total_bytes"])
    data = dict(req["plan_base"])
    data.update({
        "mem_total_bytes": total,
        # What a running SGLang holds is added back: the plan is for the container without it.
        "mem_available_bytes": min(int(ct["mem_available_bytes"]) + int(ct.get("unit_held_bytes") or 0), total),
        "mem_limit_bytes": limit,
        "gpu_count": len(gpu_nodes),
        "gpu_memory_mib": min(int(g["memory_total_mib"]) for g in node_state["gpus"]),
    })
    plan = _plan(data)
    if int(plan["engine_ranks_per_host"]) != ranks:
        raise DeployError("internal: the plan counts %s ranks, the launcher %d" % (plan["engine_ranks_per_host"], ranks))
    if not plan["fits"]:
        _refuse_plan("Refused: the HiCache plan does not fit this container; nothing was changed.", plan)
    size = int(plan["per_rank_gb"])

    host = service["host"] or _primary_address(ct.get("addresses") or [])
    if not host:
        raise DeployError("the container has no global IPv4 address to bind SGLang to (ip -4 addr shows %s); set "
                          "sglang_server_host (127.0.0.1 keeps it inside the container)" % (list(ct.get("addresses") or []) or "none"))
    if not _is_loopback(host) and not service["api_key_set"] and not service["allow_unauthenticated"]:
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

    pinned_total = int(plan["pinned_per_rank_bytes"]) * ranks
    required = int(plan["reserve_bytes"]) + int(plan["overhead_bytes"]) + pinned_total
    health_host = "127.0.0.1" if host in ("0.0.0.0", "::") else host
    return {
        "hicache_size_gb": size,
        "ranks": ranks,
        "argv": argv,
        "sglang_args": args,
        "bind_host": host,
        "health_url": "http://%s:%d" % (("[%s]" % health_host) if ":" in health_host else health_host, service["port"]),
        # What the start guard (the launcher) checks against the argv it is about to run.
        "guard": {
            "hicache_size_gb": size,
            "owned": {"--hicache-size": str(size), "--tp-size": str(layout["tp_size"]), "--host": host,
                      "--port": str(service["port"])},
            "required_available_bytes": required,
            "gpu_used_max_mib": int(paths.get("gpu_used_max_mib", 256)),
            "nvidia_smi": paths.get("nvidia_smi", "/usr/bin/nvidia-smi"),
        },
        # What verify compares the running server with.
        "expected_running": {
            "hicache_size": size, "enable_hierarchical_cache": True, "tp_size": layout["tp_size"],
            "pp_size": layout["pp_size"], "dp_size": layout["dp_size"], "model_path": service["model_path"],
            "port": service["port"], "host": host,
        },
        "bounds": {
            "planned_pinned_bytes": pinned_total,
            "ceiling_bytes": pinned_total + int(plan["overhead_bytes"]),
        },
        "plan": plan,
        "memory_limit_bytes": limit,
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


# --- stage 4: verify --------------------------------------------------------------------------------

def verify(ln: Mapping[str, Any], running: Optional[Mapping[str, Any]], measure: Mapping[str, Any],
           node_rank: int, tolerance: float) -> Dict[str, Any]:
    """Compare the running server with the launch. ``running`` is /server_info (None on node ranks > 0)."""
    if not 0 <= float(tolerance) < 1:
        raise DeployError("sglang_server_verify_memory_tolerance must be a fraction between 0 and 1, got %r" % tolerance)
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
                          % (hicache.fmt_gb(held), hicache.fmt_gb(planned), round(tolerance * 100)))
    if unit_held > ceiling:
        mismatches.append("the unit holds %s, above the plan's ceiling %s" % (hicache.fmt_gb(unit_held), hicache.fmt_gb(ceiling)))
    return {
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
    }


# --- the calculator (playbooks/plan.yml) -------------------------------------------------------------------

# The node's facts, which only a run on the node reads; the offline plan of an inventory host takes them from
# plan_input when given.
CALCULATOR_FACT_KEYS = ("mem_total_bytes", "mem_available_bytes", "gpu_memory_mib")
# hicache.plan requires gpu_memory_mib but reads it only for releases that assert, at start-up, that the host pool
# holds more tokens than the device pool (up to 0.5.14). For later releases a GPU memory that nobody gave is passed
# as this placeholder (hicache's smallest accepted value); for those releases it is asked for instead.
_GPU_MEMORY_NOT_READ_MIB = 1024


def calculate(plan_input: Any, requested_gb: Any = None, req: Optional[Mapping[str, Any]] = None,
              container: Optional[Mapping[str, Any]] = None, host: str = "") -> Dict[str, Any]:
    """The calculator, touching no host. Without ``req``: the plan of the facts and layout in ``plan_input``.
    With ``req`` (the request stage's result for an inventory host) and ``container`` (its declared container):
    the plan deploy would make for that host, against its declared memory limit unless ``plan_input`` gives the
    node's facts. ``requested_gb`` (plan_requested_gb) is a size as a survey gives it; blank = not given."""
    if not _blank(plan_input) and not isinstance(plan_input, Mapping):
        raise DeployError("plan_input must be a dict of hicache_plan keys (ansible-doc -t filter "
                          "inferops.gpu_inference.hicache_plan), got %s" % _clip(plan_input))
    given = {k: v for k, v in dict(plan_input or {}).items() if not _blank(v)}
    own = given.pop("requested_gb", None)
    override = _requested_gb(requested_gb, "plan_requested_gb")
    notes: List[str] = []
    if req is None:
        if not given:
            raise DeployError("Nothing to plan: pass a variable file with a plan_input dict (-e @inventories/examples/"
                              "kimi-k2-incident.yml), or plan an inventory host: -i <inventory> -e plan_host=<container host>")
        data = dict(given)
        requested = override or _requested_gb(own, "plan_input.requested_gb")
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
    vmid, memory_mib, wanted = _container_spec(container or {})
    ranks = _ranks_match_gpus(req, vmid, wanted)
    limit = memory_mib * MIB_BYTES
    data = dict(req["plan_base"])
    if override:
        data["requested_gb"] = override
        notes.append("plan_requested_gb=%d overrides %s's sglang_server_hicache_requested_gb (%s)."
                     % (override, host, req.get("requested_gb") or "none: the plan chooses"))
    if "gpu_memory_mib" not in given:
        releases = hicache.behaviour_releases(hicache.parse_version(req["version"]))[0]
        asserts = [hicache.Rules(r) for r in releases if hicache.Rules(r).asserts_host_exceeds_device]
        if asserts and "device_pool_tokens_per_rank" not in data:
            raise DeployError(
                "SGLang %s checks at start-up that the host pool holds more tokens than the device pool, which depends on "
                "the GPUs' memory: give it, e.g. -e '{\"plan_input\": {\"gpu_memory_mib\": 97887}}' (nvidia-smi "
                "--query-gpu=memory.total --format=csv,noheader,nounits on the node), or device_pool_tokens_per_rank in "
                "sglang_server_plan_extra" % req["version"])
    data.update({
        "mem_total_bytes": given.get("mem_total_bytes", limit),
        "mem_available_bytes": given.get("mem_available_bytes", given.get("mem_total_bytes", limit)),
        "mem_limit_bytes": limit,
        "gpu_count": len(wanted),
        "gpu_memory_mib": given.get("gpu_memory_mib", _GPU_MEMORY_NOT_READ_MIB),
    })
    plan = _plan(data)
    if int(plan["engine_ranks_per_host"]) != ranks:
        raise DeployError("internal: the plan counts %s ranks, the launcher %d" % (plan["engine_ranks_per_host"], ranks))
    if "mem_available_bytes" in given:
        basis = "the node's facts given in plan_input and the container's declared memory limit %s" % hicache.fmt_gib(limit)
    else:
        basis = ("its declared memory limit %s (pve_gpu_container_memory_mib); deploy plans against the node's "
                 "MemAvailable as read then, which can only lower the size" % hicache.fmt_gib(limit))
    notes.insert(0, "Planned offline for %s (CT %d, %s, %d GPU(s): %s) from the inventory, against %s. The API key and "
                 "the bind address are not checked here (deploy checks them)."
                 % (host, vmid, _layout_text(req["layout"]), len(wanted), ",".join(map(str, wanted)), basis))
    return {"plan": plan, "notes": notes, "vmid": vmid}


def _num(value: Any) -> Optional[float]:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None
