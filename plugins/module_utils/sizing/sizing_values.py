# -*- coding: utf-8 -*-
# Copyright: inferops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Units and the checking of one input value (pure Python, no Ansible imports).

Shared by the sizing model (``hicache*.py``) and the deploy plan (``sglang_*.py``): the byte units and
how a message writes them, the sizing model's error, and the coercion of one value as it arrives from YAML, extra variables
(always strings) or an AWX survey (blank answers), each refusing what it cannot read with a message
that names the key and what to write instead.

Every memory quantity carries its unit in its name: ``_bytes`` (integers), ``_gb`` (1e9 bytes),
``_gib`` (2**30 bytes), ``_mib`` (2**20 bytes).
"""

from __future__ import annotations

import math
import re
from typing import Any, Dict, Mapping, Tuple, Type
from ansible_collections.inferops.gpu_inference.plugins.module_utils.common.errors import InferopsError

GB_BYTES = 10**9
GIB_BYTES = 2**30
MIB_BYTES = 2**20
KIB_BYTES = 2**10

#: A host memory figure below this cannot be a GPU host's: it is a value in the wrong unit.
MIN_PLAUSIBLE_MEMORY_BYTES = 64 * MIB_BYTES
#: No single host has a pebibyte of RAM: a larger figure was converted to bytes twice.
MAX_PLAUSIBLE_MEMORY_BYTES = 2**50
#: A policy amount of memory (overhead, reserve) below this is a GiB or MiB figure passed as bytes.
MIN_PLAUSIBLE_POLICY_BYTES = MIB_BYTES

#: Plausible ranges of the sizing model's whole-number inputs: (minimum, maximum, what a value outside says).
INT_RANGES: Dict[str, Tuple[int, int, str]] = {
    "gpu_count": (1, 64, "the GPUs of this host or container, not of the cluster"),
    "tp_size": (1, 1024, "SGLang's --tp-size"),
    "pp_size": (1, 256, "SGLang's --pp-size"),
    "dp_size": (1, 1024, "SGLang's --dp-size"),
    "nnodes": (1, 1024, "SGLang's --nnodes"),
    "model_num_layers": (1, 1024, "the model's num_hidden_layers"),
    "model_kv_lora_rank": (1, 16384, "config.json kv_lora_rank"),
    "model_qk_rope_head_dim": (0, 4096, "config.json qk_rope_head_dim"),
    "model_num_kv_heads": (1, 1024, "config.json num_key_value_heads"),
    "model_head_dim": (8, 4096, "config.json head_dim"),
    "model_index_head_dim": (1, 4096, "config.json index_head_dim"),
    "model_num_attention_heads": (1, 4096, "config.json num_attention_heads"),
    "device_pool_tokens_per_rank": (1, 10**10, "max_total_num_tokens from /server_info, in tokens"),
    "page_size": (1, 4096, "SGLang's --page-size, in tokens"),
    "other_engine_ranks": (0, 1024, "scheduler ranks of other engines on this host"),
}


def fmt_gb(value_bytes: int, decimals: int = 1) -> str:
    """Decimal GB with one decimal (or ``decimals``), in integer arithmetic (no float overflow for any int)."""
    scale = 10 ** decimals
    parts = (abs(value_bytes) * scale + GB_BYTES // 2) // GB_BYTES
    return "%s%d.%0*d GB" % ("-" if value_bytes < 0 and parts else "", parts // scale, decimals, parts % scale)


def fmt_gib(value_bytes: int) -> str:
    """GiB with two decimals below 10 GiB, one above."""
    if abs(value_bytes) < 10 * GIB_BYTES:
        hundredths = (abs(value_bytes) * 100 + GIB_BYTES // 2) // GIB_BYTES
        return "%s%d.%02d GiB" % ("-" if value_bytes < 0 and hundredths else "", hundredths // 100, hundredths % 100)
    tenths = (abs(value_bytes) * 10 + GIB_BYTES // 2) // GIB_BYTES
    return "%s%d.%d GiB" % ("-" if value_bytes < 0 else "", tenths // 10, tenths % 10)


def fmt_both(value_bytes: int) -> str:
    return "%s (%s)" % (fmt_gb(value_bytes), fmt_gib(value_bytes))


class PlanError(InferopsError):
    """Bad input, or a plan that cannot be made: the message says what was wrong and what to do."""


def clip(value: Any, width: int = 40) -> str:
    """The repr of a value as a message shows it: at most ``width`` characters."""
    text = repr(value)
    return text if len(text) <= width else text[: width - 3] + "..."


def type_word(value: Any) -> str:
    """What a value is, in the words a user of YAML, -e or a survey knows (never an internal class name)."""
    if is_blank(value):
        return "blank"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, Mapping):
        return "mapping"
    if isinstance(value, (list, tuple, set, frozenset)):
        return "list"
    return "value of another kind"


def non_ascii_digits(value: Any) -> bool:
    """Whether a string holds a digit outside 0-9 ("３００", "٤٤"): Python reads those as numbers, nobody types them."""
    return isinstance(value, str) and any(c.isdigit() and not ("0" <= c <= "9") for c in value)


def is_blank(value: Any) -> bool:
    """A survey's unanswered optional field: None (AWX's !unsafe '' resolves to None) or ''."""
    return value is None or (isinstance(value, str) and value.strip() == "")


def as_bool(key: str, value: Any, error: Type[ValueError] = PlanError) -> bool:
    """A boolean from a bool, 0/1 or the words YAML and extra variables use (true/yes/on/1, false/no/off/0);
    anything else raises ``error``."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "yes", "on", "1", "false", "no", "off", "0"):
        return value.strip().lower() in ("true", "yes", "on", "1")
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    raise error("%s must be true or false, got %s" % (key, clip(value)))


def as_int(key: str, value: Any, minimum: int) -> int:
    """A whole number from an int, an integral float or a string of digits (extra-vars are strings)."""
    if isinstance(value, bool):
        raise PlanError("%s must be a number, got the boolean %r" % (key, value))
    if isinstance(value, int):
        result = int(value)
    elif isinstance(value, float):
        if not math.isfinite(value) or not value.is_integer():
            raise PlanError("%s must be a whole number, got %r" % (key, value))
        result = int(value)
    elif isinstance(value, str):
        text = value.strip().replace("_", "")
        match = re.match(r"^([+-]?[0-9]{1,30})(\.0*)?$", text)
        if not match:
            hint = " (write the digits 0-9)" if non_ascii_digits(value) else ""
            raise PlanError("%s must be a whole number, got %s%s" % (key, clip(value), hint))
        result = int(match.group(1))
    else:
        raise PlanError("%s must be a whole number, got a %s %s" % (key, type_word(value), clip(value)))
    if result < minimum:
        raise PlanError("%s must be at least %d, got %d" % (key, minimum, result))
    return result


def ranged_int(key: str, value: Any) -> int:
    """A whole number within the plausible range of ``key`` (INT_RANGES)."""
    low, high, what = INT_RANGES[key]
    result = as_int(key, value, low)
    if result > high:
        raise PlanError("%s=%d is implausible (at most %d): it is %s" % (key, result, high, what))
    return result


def as_float(key: str, value: Any, low: float, high: float, hint: str = "") -> float:
    """A finite number between low and high."""
    if isinstance(value, bool):
        raise PlanError("%s must be a number, got the boolean %r" % (key, value))
    if isinstance(value, str) and (len(value) > 40 or non_ascii_digits(value)):
        raise PlanError("%s must be a number (the digits 0-9), got %s" % (key, clip(value)))
    if value is not None and not isinstance(value, (int, float, str)):
        raise PlanError("%s must be a number between %s and %s, got a %s %s" % (key, low, high, type_word(value), clip(value)))
    try:
        result = float(value)
    except (TypeError, ValueError, OverflowError) as exc:
        raise PlanError("%s must be a number between %s and %s, got %s" % (key, low, high, clip(value))) from exc
    if not math.isfinite(result) or not (low <= result <= high):
        raise PlanError("%s must be between %s and %s, got %s%s" % (key, low, high, clip(value), hint))
    return result


def looks_like_percent(value: Any) -> bool:
    """Whether a fraction was given as a percentage (10 for 0.10)."""
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        return False
    return math.isfinite(number) and 1 <= number <= 100


def memory_bytes(key: str, value: Any) -> int:
    """A host or container memory figure in bytes; a figure in GiB, MiB or converted twice is refused with its unit."""
    result = as_int(key, value, 0)
    if result == 0:
        raise PlanError("%s is 0: a host or container with no memory cannot run SGLang; check the fact it came from" % key)
    if result < MIN_PLAUSIBLE_MEMORY_BYTES:
        if result <= 16384:
            hint = "a GiB or GB figure"
            guess = "%d GiB (%d bytes) or %d GB (%d bytes)" % (result, result * GIB_BYTES, result, result * GB_BYTES)
        else:
            hint = "a MiB figure (like ansible_memtotal_mb)"
            guess = "%d MiB (%d bytes)" % (result, result * MIB_BYTES)
        raise PlanError(
            "%s=%d is only %d bytes, far too small for a GPU host: it looks like %s passed where bytes are "
            "expected; if you meant %s, pass that many bytes (e.g. ansible_memtotal_mb * 1048576)" % (key, result, result, hint, guess)
        )
    if result > MAX_PLAUSIBLE_MEMORY_BYTES:
        raise PlanError(
            "%s=%d is more than 1 PiB, which no single host has: it looks like a figure already in bytes was "
            "multiplied again (KiB x 1024 applied twice); pass the host's bytes once" % (key, result)
        )
    return result


def policy_bytes(key: str, value: Any, total: int) -> int:
    """A policy amount of memory in bytes (a reserve, an overhead), at most the host's RAM ``total``."""
    result = as_int(key, value, 0)
    if 0 < result < MIN_PLAUSIBLE_POLICY_BYTES:
        raise PlanError(
            "%s=%d is only %d bytes: it looks like a GiB or MiB figure passed where bytes are expected "
            "(%d GiB is %d bytes, %d MiB is %d bytes)"
            % (key, result, result, result, result * GIB_BYTES, result, result * MIB_BYTES)
        )
    if result > total:
        raise PlanError(
            "%s=%d bytes is more than the host's RAM (%d bytes): it looks like a figure in the wrong unit" % (key, result, total)
        )
    return result
