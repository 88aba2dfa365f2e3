# -*- coding: utf-8 -*-
# Copyright: inferops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The deploy plan's first stage: the operator's settings checked and normalised (pure Python, no Ansible imports).

``request(settings)`` takes the role variables and survey answers of one container and returns the layout, the
version, the requested size, the plan's input without facts (``plan_base``), the service (bind address, API key
policy, port) and the extra arguments; the later stages (``sglang_deploy.py``) plan from it.  It refuses anything
the plan owns being set another way (``--hicache-size`` in extra args).  Every refusal raises :class:`DeployError`,
whose message says what was wrong and what to do.
"""
from __future__ import annotations

import ipaddress
import math
import re
from typing import Any, Dict, List, Mapping, Optional

from ansible_collections.inferops.gpu_inference.plugins.module_utils.sizing import overhead_offer
from ansible_collections.inferops.gpu_inference.plugins.module_utils.sizing.hicache_pools import place_ranks
from ansible_collections.inferops.gpu_inference.plugins.module_utils.sizing.hicache_releases import parse_version, release_rules
from ansible_collections.inferops.gpu_inference.plugins.module_utils.common.safe_text import (
    control_char,
    control_message,
    env_name_message,
    option_message,
    user_name_message,
)
from ansible_collections.inferops.gpu_inference.plugins.module_utils.sizing.sizing_values import (
    GB_BYTES,
    GIB_BYTES,
    PlanError,
    as_bool,
    clip,
    is_blank,
    non_ascii_digits,
    type_word,
)
from ansible_collections.inferops.gpu_inference.plugins.module_utils.common.errors import InferopsError

#: How many characters of a bad value a message shows.
SHOWN = 60

# Flags whose value the plan decides; extra args may not set them (nor any prefix of them: SGLang's
# argparse accepts unambiguous abbreviations, so --hicache-si 300 would be --hicache-size 300).
OWNED_FLAGS = (
    "--model-path", "--model", "--host", "--port", "--api-key", "--admin-api-key",
    "--tp-size", "--tensor-parallel-size", "--tp", "--pp-size", "--pipeline-parallel-size", "--pp",
    "--dp-size", "--data-parallel-size", "--dp", "--enable-dp-attention", "--attn-dp-size",
    "--nnodes", "--node-rank", "--dist-init-addr",
    "--enable-hierarchical-cache", "--hicache-size", "--hicache-ratio", "--kv-cache-dtype",
    "--served-model-name",
)

LOOPBACK_NAMES = ("localhost", "ip6-localhost")
_FACT_OR_LAYOUT_KEYS = frozenset({"mem_total_bytes", "mem_available_bytes", "mem_limit_bytes", "gpu_count", "gpu_memory_mib",
                                  "sglang_version", "tp_size", "pp_size", "dp_size", "enable_dp_attention", "nnodes",
                                  "attn_dp_size", "draft_kv_bytes_per_token", "requested_gb", "kv_cache_dtype", "model_preset"})


class DeployError(InferopsError):
    """A setting or a fact that makes the deploy unsafe or impossible; the message says what to do."""


# --- one setting --------------------------------------------------------------------------------------

def setting_int(name: str, value: Any, minimum: int, maximum: int, what: str = "") -> int:
    """A whole number of a setting (also as a string of digits, as extra variables give it) within [minimum, maximum]."""
    if isinstance(value, bool):
        raise DeployError("%s must be a whole number, got the boolean %r%s" % (name, value, what))
    if isinstance(value, float):
        if not math.isfinite(value) or not value.is_integer():
            raise DeployError("%s must be a whole number, got %r%s" % (name, value, what))
        value = int(value)
    if isinstance(value, str):
        text = value.strip()
        if not re.fullmatch(r"[+-]?[0-9]{1,12}", text):
            digits = " (write the digits 0-9)" if non_ascii_digits(value) else ""
            raise DeployError("%s must be a whole number, got %s%s%s" % (name, clip(value, SHOWN), digits, what))
        value = int(text)
    if not isinstance(value, int):
        kind = "a " + type_word(value)
        shown = clip(list(value) if isinstance(value, (list, tuple)) else value, SHOWN)
        raise DeployError("%s must be a whole number, got %s %s%s" % (name, kind, shown, what))
    if not minimum <= value <= maximum:
        raise DeployError("%s must be between %d and %d, got %d%s" % (name, minimum, maximum, value, what))
    return value


def _text(name: str, value: Any, blank_ok: bool = True) -> str:
    if is_blank(value):
        if blank_ok:
            return ""
        raise DeployError("%s must be set" % name)
    if not isinstance(value, str):
        raise DeployError("%s must be a string, got a %s %s" % (name, type_word(value), clip(value, SHOWN)))
    return value.strip()


def parse_requested_gb(value: Any, name: str = "sglang_server_hicache_requested_gb") -> Optional[int]:
    """A requested per-rank size as an operator or a survey gives it: None/''/0 = let the plan choose; a whole
    number of decimal GB (also as a string, "4"); "300GB", "1.5" are refused with the reason."""
    if is_blank(value):
        return None
    if isinstance(value, str):
        text = value.strip()
        unit = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([A-Za-z]+)", text)
        if unit:
            raise DeployError(
                "%s=%s: give a bare whole number of decimal GB per rank (SGLang's --hicache-size unit), without a unit: "
                "%s GB is %s; if you meant GiB, %s GiB is %.1f GB." % (
                    name, clip(value, SHOWN), unit.group(1), unit.group(1) + " x 10^9 bytes", unit.group(1),
                    float(unit.group(1)) * GIB_BYTES / GB_BYTES)
            )
        if re.fullmatch(r"\d+\.\d*[1-9]\d*", text):
            raise DeployError("%s=%s: --hicache-size is a whole number of GB (SGLang's argparse type is int); "
                              "round it down to %d" % (name, clip(value, SHOWN), int(float(text))))
    size = setting_int(name, value, 0, 1_000_000, " (decimal GB per rank; 0 or blank lets the plan choose)")
    return size or None


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
    if is_blank(value):
        return []
    if isinstance(value, str):
        raise DeployError("%s must be a list of arguments (e.g. ['--max-running-requests', '64']), got the string %s"
                          % (name, clip(value, SHOWN)))
    if not isinstance(value, (list, tuple)):
        raise DeployError("%s must be a list of arguments, got a %s" % (name, type_word(value)))
    args = []
    for item in value:
        if isinstance(item, bool) or not isinstance(item, (str, int, float)):
            raise DeployError("%s: every item must be a string or a number, got %s" % (name, clip(item, SHOWN)))
        text = str(item)
        found = control_char(text)
        if found is not None:
            raise DeployError("%s: the argument %s contains the control character %s: "
                              "each argument is one word of the unit's ExecStart line; remove it" % (name, clip(item, SHOWN), found))
        flag = _owned_flag(text)
        if flag:
            raise DeployError(
                "%s contains %s, which sets %s: the deploy plan owns that flag (set it through the role's variable, "
                "e.g. sglang_server_hicache_requested_gb for --hicache-size, sglang_server_tp_size for --tp-size)"
                % (name, clip(text, SHOWN), flag))
        args.append(text)
    return args


def _names_draft_model(arg: str) -> bool:
    """--speculative-draft-model-path, as given or as an abbreviation argparse would accept, with or without =value."""
    flag = arg.split("=", 1)[0]
    full = "--speculative-draft-model-path"
    return len(flag) >= len("--speculative-draft-model-p") and (full.startswith(flag) or flag.startswith(full))


def _host(value: Any) -> str:
    text = _text("sglang_server_host", value)
    if not text:
        return ""
    try:
        ipaddress.ip_address(text)
    except ValueError:
        if text not in LOOPBACK_NAMES:
            raise DeployError("sglang_server_host=%s must be an IP address (or empty for the container's own address)"
                              % clip(value, SHOWN))
    return text


def is_loopback(host: str) -> bool:
    """Whether SGLang bound to host is reachable only from inside the container."""
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


#: The layout settings whose blank value means their documented default (meta/argument_specs.yml); the request
#: says so in its notes, which the plan's warnings and plan.yml's notes show.
_BLANK_MEANS_DEFAULT = {"tp_size": 1, "pp_size": 1, "dp_size": 1, "attn_dp_size": 1, "enable_dp_attention": False}


def _check_unit_settings(s: Mapping[str, Any]) -> None:
    """The settings written into the unit or its environment file besides the argv: the service user (User=,
    Group=, useradd) and the environment (EnvironmentFile=, one KEY="value" line each); and the extra packages, each
    one positional argument of pip. A value of the environment may be secret: a message names its key, never the
    value."""
    if "user" in s:
        refused = user_name_message("sglang_server_user", s["user"])
        if refused:
            raise DeployError(refused)
    packages = s.get("pip_extra_packages")
    if packages is not None:
        if not isinstance(packages, (list, tuple)):
            raise DeployError("sglang_server_pip_extra_packages must be a list of requirement strings, got a %s"
                              % type_word(packages))
        for item in packages:
            text = str(item)
            if not isinstance(item, str) or not text.strip() or text.lstrip().startswith("-") \
                    or control_char(text) is not None or any(c.isspace() for c in text):
                raise DeployError("sglang_server_pip_extra_packages: %s is not one requirement (such as 'hf_transfer' or "
                                  "'flashinfer-python==0.2.5'): no spaces or control characters, and no leading '-', "
                                  "which pip would read as an option (an index URL of the caller's choosing)"
                                  % clip(item, SHOWN))
    env = s.get("environment")
    if env is None:
        return
    if not isinstance(env, Mapping):
        raise DeployError("sglang_server_environment must be a dict of variable names to values, got a %s" % type_word(env))
    for key, value in env.items():
        refused = env_name_message("sglang_server_environment", key)
        if refused:
            raise DeployError(refused)
        if value is None or isinstance(value, (list, dict, tuple)):
            raise DeployError("sglang_server_environment: %s must be a string or a number, got a %s (the value is not shown)"
                              % (key, type_word(value)))
        found = control_char(str(value))
        if found is not None:
            raise DeployError("sglang_server_environment: the value of %s contains the control character %s (the value "
                              "is not shown): a line break in the environment file would start a variable of its own; "
                              "remove it" % (key, found))


# --- stage 1: the operator's settings -------------------------------------------------------------------

def request(settings: Mapping[str, Any]) -> Dict[str, Any]:
    """Check and normalise the settings of one container. Raises DeployError.

    A blank setting (None or '': an AWX survey question left unanswered arrives as either) is not given: the
    default applies, and a required one is reported as not set."""
    s = {k: v for k, v in dict(settings).items() if not is_blank(v)}
    notes = ["sglang_server_%s was given blank ('' or null), so not given: the documented default %s is used"
             % (key, default) for key, default in _BLANK_MEANS_DEFAULT.items() if key in settings and is_blank(settings[key])]
    version = _text("sglang_server_version", s.get("version"), blank_ok=False)
    try:
        parse_version(version)
    except PlanError as exc:
        raise DeployError("sglang_server_version: %s" % exc) from exc
    cluster = s.get("cluster") or []
    if not isinstance(cluster, (list, tuple)):
        raise DeployError("sglang_server_cluster_group must name an inventory group, got %s" % clip(cluster, SHOWN))
    me = s.get("inventory_hostname")
    if cluster and me not in cluster:
        raise DeployError("%s is not in its sglang_server_cluster_group (%s); add it to the group or unset the variable"
                          % (me, ", ".join(map(str, cluster))))
    if cluster:
        s.setdefault("nnodes", len(cluster))
        s.setdefault("node_rank", list(cluster).index(me))
    layout = {
        "tp_size": setting_int("sglang_server_tp_size", s.get("tp_size", 1), 1, 1024),
        "pp_size": setting_int("sglang_server_pp_size", s.get("pp_size", 1), 1, 1024),
        "dp_size": setting_int("sglang_server_dp_size", s.get("dp_size", 1), 1, 1024),
        "enable_dp_attention": as_bool("sglang_server_enable_dp_attention", s.get("enable_dp_attention", False), DeployError),
        "attn_dp_size": setting_int("sglang_server_attn_dp_size", s.get("attn_dp_size", 1), 1, 1024),
        "nnodes": setting_int("the number of containers in sglang_server_cluster_group", s.get("nnodes", 1), 1, 1024),
        "node_rank": setting_int("the node rank", s.get("node_rank", 0), 0, 1023),
    }
    if layout["node_rank"] >= layout["nnodes"]:
        raise DeployError("node rank %d is not below nnodes %d: this container is not in sglang_server_cluster_group"
                          % (layout["node_rank"], layout["nnodes"]))
    if layout["enable_dp_attention"] and layout["dp_size"] > 1 and layout["tp_size"] % layout["dp_size"]:
        raise DeployError("sglang_server_enable_dp_attention with dp_size %d needs tp_size divisible by it, got tp_size %d "
                          "(SGLang asserts tp_size %% dp_size == 0 with DP attention)" % (layout["dp_size"], layout["tp_size"]))
    draft = setting_int("sglang_server_draft_kv_bytes_per_token", s.get("draft_kv_bytes_per_token", 0), 0, 64 << 20)

    for name in ("policy", "plan_extra"):
        value = s.get(name)
        if not is_blank(value) and not isinstance(value, Mapping):
            var = "sglang_server_hicache_policy" if name == "policy" else "sglang_server_plan_extra"
            raise DeployError("%s must be a dict, got %s" % (var, clip(value, SHOWN)))
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
    if layout["attn_dp_size"] > 1:
        plan_base["attn_dp_size"] = layout["attn_dp_size"]
    if draft:
        plan_base["draft_kv_bytes_per_token"] = draft
    if preset:
        plan_base["model_preset"] = preset
    requested = parse_requested_gb(s.get("requested_gb"))
    if requested:
        plan_base["requested_gb"] = requested
    # The overheads this host's last verify measured (its deploy report), offered, never applied.
    offered = overhead_offer.offer_note(s.get("last_report"), policy, str(s.get("inventory_hostname") or "this host"))
    if offered:
        notes.append(offered)

    host = _host(s.get("host"))
    api_key_set = as_bool("an API key being set", s.get("api_key_set", False), DeployError)
    allow_open = as_bool("sglang_server_allow_unauthenticated", s.get("allow_unauthenticated", False), DeployError)
    if host and not is_loopback(host) and not api_key_set and not allow_open:
        raise DeployError(
            "sglang_server_host=%s is reachable beyond the container's loopback and no sglang_server_api_key is set: "
            "anyone who reaches it could use the server. Set sglang_server_api_key (from Vault or an AWX credential), "
            "bind to 127.0.0.1, or say so by name with sglang_server_allow_unauthenticated=true." % host)
    service = {
        "host": host,
        "port": setting_int("sglang_server_port", s.get("port", 30000), 1, 65535),
        "api_key_set": api_key_set,
        "allow_unauthenticated": allow_open,
        "model_path": _text("sglang_server_model_path", s.get("model_path"), blank_ok=False),
        "served_model_name": _text("sglang_server_served_model_name", s.get("served_model_name")),
        "dist_init_host": _text("sglang_server_dist_init_host", s.get("dist_init_host")),
        "dist_init_port": setting_int("sglang_server_dist_init_port", s.get("dist_init_port", 50000), 1, 65535),
    }
    # Each of these is written into the systemd unit (ExecStart) and the launch record: a line break would start a
    # directive of the caller's choosing; a leading "-" would be an option to SGLang's argument parser.
    for key in ("model_path", "served_model_name", "dist_init_host"):
        refused = control_message("sglang_server_" + key, s.get(key), "the systemd unit (ExecStart)") \
            or option_message("sglang_server_" + key, service[key], "SGLang's argument parser")
        if refused:
            raise DeployError(refused)
    _check_unit_settings(s)
    if not service["model_path"].startswith("/"):
        raise DeployError("sglang_server_model_path=%s must be an absolute path inside the container" % clip(service["model_path"], SHOWN))
    if layout["nnodes"] > 1 and not service["dist_init_host"]:
        raise DeployError("a multi-node server (%d containers in sglang_server_cluster_group) needs "
                          "sglang_server_dist_init_host (node rank 0's address)" % layout["nnodes"])
    tolerance = s.get("verify_memory_tolerance", 0.10)
    if isinstance(tolerance, bool) or not isinstance(tolerance, (int, float, str)):
        raise DeployError("sglang_server_verify_memory_tolerance_fraction must be a fraction, got %s" % clip(tolerance, SHOWN))
    try:
        tolerance = float(tolerance)
    except ValueError as exc:
        raise DeployError("sglang_server_verify_memory_tolerance_fraction must be a fraction, got %s" % clip(tolerance, SHOWN)) from exc
    if not 0 <= tolerance < 1:
        raise DeployError("sglang_server_verify_memory_tolerance_fraction must be a fraction between 0 and 1 (0.10 for 10 percent), "
                          "got %s" % clip(s.get("verify_memory_tolerance"), SHOWN))
    extra_args = _extra_args(s.get("extra_args"))
    if not draft and any(_names_draft_model(a) for a in extra_args):
        raise DeployError(
            "sglang_server_extra_args start a speculative draft model (--speculative-draft-model-path), whose host pool "
            "(the target's token count, outside --hicache-size) the plan must price: set "
            "sglang_server_draft_kv_bytes_per_token to the draft model's KV bytes per token per rank (docs/sizing.md)")
    return {
        "version": version,
        "verify_memory_tolerance": tolerance,
        "layout": layout,
        # The inventory hosts of the server's containers, node rank = position (empty: one container).
        "cluster": [str(h) for h in cluster],
        "plan_base": plan_base,
        "kv_cache_dtype": kv_dtype,
        "requested_gb": requested,
        "service": service,
        "extra_args": extra_args,
        "notes": notes,
    }


def layout_text(layout: Mapping[str, Any]) -> str:
    """The layout as the messages name it: tp x pp (x dp) over nodes."""
    dp = "" if (layout["enable_dp_attention"] or layout["dp_size"] == 1) else " x dp %d" % layout["dp_size"]
    return "tp %d x pp %d%s over %d node(s)" % (layout["tp_size"], layout["pp_size"], dp, layout["nnodes"])


def ranks_on_this_node(req: Mapping[str, Any]) -> int:
    """Scheduler ranks SGLang's launcher starts in this container for the layout (hicache_pools.place_ranks)."""
    lay = req["layout"]
    newest = max(rules.release for rules in release_rules(req["version"]))
    dpa = lay["enable_dp_attention"] and lay["dp_size"] > 1
    dp = lay["dp_size"]
    if lay.get("attn_dp_size", 1) > 1 and dp == 1:
        dpa, dp = True, lay["attn_dp_size"]  # --attn-dp-size: attention DP groups over the TP ranks, no extra ranks
    try:
        return place_ranks(lay["tp_size"], lay["pp_size"], dp, dpa, lay["nnodes"], newest).ranks_per_node
    except PlanError as exc:
        raise DeployError("%s: %s" % (layout_text(lay), exc)) from exc
