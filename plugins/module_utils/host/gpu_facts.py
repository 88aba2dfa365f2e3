# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Pure parsing and collection logic for the gpu_host_facts module.

No Ansible imports: everything here is plain, typed Python that the unit tests call
directly. Functions that read files take a ``root`` prefix (default ``/``) so that the
tests can point them at a temporary directory laid out like ``/proc`` and ``/sys``.

Units are in every name: ``*_bytes`` for host memory (``/proc/meminfo`` reports kB,
that is KiB, which we multiply by 1024), ``*_mib`` for GPU memory (nvidia-smi with
``nounits`` reports MiB).
"""

from __future__ import annotations

import os
import re
import stat
from typing import Any, Callable, Optional

from ansible_collections.inferops.gpu_inference.plugins.module_utils.host.procfs import (
    cgroup_path_of, join_root, parse_proc_cgroup, read_text)
from ansible_collections.inferops.gpu_inference.plugins.module_utils.common.errors import InferopsError

# Fields asked of ``nvidia-smi --query-gpu``; the order is the order of the csv columns.
GPU_QUERY_FIELDS: tuple[str, ...] = (
    "index",
    "name",
    "memory.total",
    "memory.used",
    "uuid",
    "pci.bus_id",
    "driver_version",
    "persistence_mode",
    "utilization.gpu",
)
# Keys of the dictionaries returned for each GPU, same order as GPU_QUERY_FIELDS.
GPU_KEYS: tuple[str, ...] = (
    "index",
    "name",
    "memory_total_mib",
    "memory_used_mib",
    "uuid",
    "pci_bus_id",
    "driver_version",
    "persistence_mode",
    "utilization_gpu_pct",
)
GPU_INT_KEYS = frozenset({"index", "memory_total_mib", "memory_used_mib", "utilization_gpu_pct"})
# The column that may itself contain commas (overflow columns are folded back into it).
_GPU_FREE_TEXT_COLUMN = 1  # name

COMPUTE_APPS_QUERY_FIELDS: tuple[str, ...] = ("pid", "process_name", "used_memory", "gpu_uuid")
COMPUTE_APP_KEYS: tuple[str, ...] = ("pid", "process_name", "used_memory_mib", "gpu_uuid")
COMPUTE_APP_INT_KEYS = frozenset({"pid", "used_memory_mib"})
_APP_FREE_TEXT_COLUMN = 1  # process_name (a path may contain commas)

# nvidia-smi prints these for values a GPU or driver does not report.
NA_VALUES = frozenset(
    {
        "",
        "n/a",
        "[n/a]",
        "[not supported]",
        "not supported",
        "[unknown error]",
        "unknown error",
        "[insufficient permissions]",
        "[gpu is lost]",
        "[requested functionality has been deprecated]",
    }
)

# /proc/meminfo fields reported, and the names they get (all in bytes).
MEMINFO_FIELDS: dict[str, str] = {
    "MemTotal": "mem_total_bytes",
    "MemFree": "mem_free_bytes",
    "MemAvailable": "mem_available_bytes",
    "Cached": "cached_bytes",
    "Shmem": "shmem_bytes",
    "Mlocked": "mlocked_bytes",
    "Unevictable": "unevictable_bytes",
    "SwapTotal": "swap_total_bytes",
    "SwapFree": "swap_free_bytes",
    "Hugepagesize": "hugepage_size_bytes",
}
# /proc/meminfo fields that are counts, not sizes.
MEMINFO_COUNT_FIELDS: dict[str, str] = {
    "HugePages_Total": "hugepages_total",
    "HugePages_Free": "hugepages_free",
}

# A cgroup memory limit at or above this is "no limit". cgroup v1 reports an unlimited
# memory.limit_in_bytes as PAGE_COUNTER_MAX * PAGE_SIZE (9223372036854771712 with 4 KiB
# pages); no real machine has 4 EiB of memory.
CGROUP_UNLIMITED_THRESHOLD_BYTES = 1 << 62

# NVIDIA character-device majors (as listed in /proc/devices): /dev/nvidiaN is 195:N,
# nvidiactl 195:255, nvidia-modeset 195:254; nvidia-uvm's major is dynamic.
NVIDIA_MAJOR = 195


class ParseError(InferopsError):
    """Raised when input does not have the expected format; the message says what was wrong."""


def na_to_none(value: str) -> Optional[str]:
    text = value.strip()
    if text.lower() in NA_VALUES:
        return None
    return text


def _to_int(value: Optional[str], what: str) -> Optional[int]:
    if value is None:
        return None
    text = value.strip()
    # Tolerate units when the caller forgot ``nounits`` ("81559 MiB").
    text = re.sub(r"\s*MiB$", "", text)
    try:
        return int(text)
    except ValueError:
        raise ParseError(f"expected an integer for {what}, got {value!r}") from None


def _split_csv_line(line: str, expected: int, free_text_column: int) -> list[str]:
    """Split one nvidia-smi csv line into ``expected`` columns.

    nvidia-smi does not quote its csv; a comma inside a free-text column (a GPU name or a
    process path) therefore shows up as extra columns, which are folded back into that column.
    """
    parts = [p.strip() for p in line.split(",")]
    if len(parts) < expected:
        raise ParseError(f"expected {expected} comma-separated columns, got {len(parts)} in line {line!r}")
    extra = len(parts) - expected
    if extra:
        merged = ", ".join(parts[free_text_column : free_text_column + extra + 1])
        parts = parts[:free_text_column] + [merged] + parts[free_text_column + extra + 1 :]
    return parts


def _parse_csv(
    text: str, keys: tuple[str, ...], int_keys: frozenset[str], free_text_column: int
) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        if line.lower().startswith("no running") or line.lower().startswith("no devices"):
            continue
        parts = _split_csv_line(line, len(keys), free_text_column)
        row: dict[str, Any] = {}
        for key, value in zip(keys, parts):
            cleaned = na_to_none(value)
            row[key] = _to_int(cleaned, key) if key in int_keys else cleaned
        rows.append(row)
    return rows


def parse_gpu_csv(text: str) -> list[dict[str, Any]]:
    """Parse ``nvidia-smi --query-gpu=<GPU_QUERY_FIELDS> --format=csv,noheader,nounits``.

    "[N/A]" and similar become None; index and memory columns become int (MiB).
    """
    return _parse_csv(text, GPU_KEYS, GPU_INT_KEYS, _GPU_FREE_TEXT_COLUMN)


def parse_compute_apps_csv(text: str) -> list[dict[str, Any]]:
    """Parse ``nvidia-smi --query-compute-apps=pid,process_name,used_memory,gpu_uuid --format=csv,noheader,nounits``."""
    return _parse_csv(text, COMPUTE_APP_KEYS, COMPUTE_APP_INT_KEYS, _APP_FREE_TEXT_COLUMN)


def gpu_query_args(nvidia_smi: str) -> list[str]:
    return [nvidia_smi, "--query-gpu=" + ",".join(GPU_QUERY_FIELDS), "--format=csv,noheader,nounits"]


def compute_apps_query_args(nvidia_smi: str) -> list[str]:
    return [
        nvidia_smi,
        "--query-compute-apps=" + ",".join(COMPUTE_APPS_QUERY_FIELDS),
        "--format=csv,noheader,nounits",
    ]


def parse_meminfo(text: str) -> dict[str, Optional[int]]:
    """Parse /proc/meminfo into byte values (kB lines are KiB: multiplied by 1024).

    Returns every key of MEMINFO_FIELDS and MEMINFO_COUNT_FIELDS; a field the kernel (or
    lxcfs, inside a container) does not print is None.
    """
    raw: dict[str, tuple[int, Optional[str]]] = {}
    for line in text.splitlines():
        if ":" not in line:
            continue
        name, _sep, rest = line.partition(":")
        fields = rest.split()
        if not fields:
            continue
        try:
            number = int(fields[0])
        except ValueError:
            continue
        unit = fields[1] if len(fields) > 1 else None
        raw[name.strip()] = (number, unit)
    if "MemTotal" not in raw:
        raise ParseError("no MemTotal line: this does not look like /proc/meminfo")
    result: dict[str, Optional[int]] = {}
    for field, key in MEMINFO_FIELDS.items():
        if field not in raw:
            result[key] = None
            continue
        number, unit = raw[field]
        if unit is None:
            result[key] = number
        elif unit.lower() == "kb":
            result[key] = number * 1024
        else:
            raise ParseError(f"unexpected unit {unit!r} for {field} in /proc/meminfo")
    for field, key in MEMINFO_COUNT_FIELDS.items():
        result[key] = raw[field][0] if field in raw else None
    return result


def parse_cgroup_memory_value(text: Optional[str]) -> Optional[int]:
    """Parse a cgroup memory file (memory.max, memory.current, memory.limit_in_bytes, ...).

    "max" (v2) and huge values (v1's unlimited) mean no limit and give None; a missing
    file (None) gives None.
    """
    if text is None:
        return None
    value = text.strip()
    if not value or value == "max":
        return None
    try:
        number = int(value)
    except ValueError:
        raise ParseError(f"expected a byte count or 'max' in a cgroup memory file, got {value!r}") from None
    if number >= CGROUP_UNLIMITED_THRESHOLD_BYTES:
        return None
    return number


def _ancestors(cgroup_path: str) -> list[str]:
    """'/a/b' -> ['/a/b', '/a', '/'] (deepest first)."""
    parts = [p for p in cgroup_path.split("/") if p]
    return ["/" + "/".join(parts[:i]) if i else "/" for i in range(len(parts), -1, -1)]


def collect_cgroup_memory(root: str = "/") -> dict[str, Any]:
    """Memory limit and usage of the cgroup this process runs in.

    The limit is the smallest limit found from this process's cgroup up to the top of the
    visible cgroup tree; usage is read where that limit was found, or, with no limit, at the
    topmost visible cgroup that reports usage (inside a container: the whole container).
    Inside a PVE container the limit is set one level above the container's cgroup namespace
    and may not be visible; lxcfs then reports it as MemTotal in /proc/meminfo.
    """
    result: dict[str, Any] = {
        "version": None,
        "path": None,
        "memory_limit_bytes": None,
        "memory_usage_bytes": None,
        "limit_cgroup": None,
    }
    parsed = parse_proc_cgroup(read_text(join_root(root, "/proc/self/cgroup")))
    v2_path, v1_memory_path = cgroup_path_of(parsed, ""), cgroup_path_of(parsed, "memory")
    candidates: list[tuple[str, str, str, str]] = []  # (cgroup, dir, limit file, usage file)
    if v2_path is not None and os.path.exists(join_root(root, "/sys/fs/cgroup/cgroup.controllers")):
        result["version"] = 2
        result["path"] = v2_path
        for cg in _ancestors(v2_path):
            candidates.append((cg, join_root(root, "/sys/fs/cgroup" + cg), "memory.max", "memory.current"))
    elif v1_memory_path is not None:
        result["version"] = 1
        result["path"] = v1_memory_path
        for cg in _ancestors(v1_memory_path):
            candidates.append(
                (cg, join_root(root, "/sys/fs/cgroup/memory" + cg), "memory.limit_in_bytes", "memory.usage_in_bytes")
            )
    else:
        return result

    best_limit: Optional[int] = None
    best_usage: Optional[int] = None
    best_cgroup: Optional[str] = None
    top_usage: Optional[int] = None
    for cg, directory, limit_file, usage_file in candidates:
        if not os.path.isdir(directory):
            # A path from outside our cgroup namespace view; skip it.
            continue
        limit = parse_cgroup_memory_value(read_text(os.path.join(directory, limit_file)))
        usage = parse_cgroup_memory_value(read_text(os.path.join(directory, usage_file)))
        if usage is not None:
            top_usage = usage
        if limit is not None and (best_limit is None or limit < best_limit):
            best_limit, best_usage, best_cgroup = limit, usage, cg
    result["memory_limit_bytes"] = best_limit
    result["memory_usage_bytes"] = best_usage if best_limit is not None else top_usage
    result["limit_cgroup"] = best_cgroup
    return result


def parse_environ(data: bytes) -> dict[str, str]:
    """Parse a NUL-separated /proc/PID/environ."""
    env: dict[str, str] = {}
    for item in data.split(b"\0"):
        if b"=" in item:
            key, _sep, value = item.partition(b"=")
            env[key.decode("utf-8", "replace")] = value.decode("utf-8", "replace")
    return env


def detect_container(root: str = "/", detect_virt_output: Optional[str] = None) -> dict[str, Any]:
    """Whether this runs in a container, and which kind.

    Sources, first match wins: ``systemd-detect-virt --container`` output (passed in by the
    caller, None when the tool is absent), ``/run/systemd/container``, ``container=`` in
    ``/proc/1/environ``.
    """
    if detect_virt_output is not None:
        kind = detect_virt_output.strip()
        if kind and kind != "none":
            return {"in_container": True, "type": kind, "source": "systemd-detect-virt"}
    marker = read_text(join_root(root, "/run/systemd/container"))
    if marker and marker.strip():
        return {"in_container": True, "type": marker.strip(), "source": "/run/systemd/container"}
    try:
        with open(join_root(root, "/proc/1/environ"), "rb") as handle:
            env = parse_environ(handle.read())
    except OSError:
        env = {}
    if env.get("container"):
        return {"in_container": True, "type": env["container"], "source": "/proc/1/environ"}
    if detect_virt_output is not None:
        return {"in_container": False, "type": None, "source": "systemd-detect-virt"}
    return {"in_container": False, "type": None, "source": "/proc/1/environ"}


def describe_device(path: str, st_mode: int, st_rdev: int) -> dict[str, Any]:
    """Type ("char", "block", "other"), major and minor of a device node."""
    if stat.S_ISCHR(st_mode):
        kind = "char"
    elif stat.S_ISBLK(st_mode):
        kind = "block"
    elif stat.S_ISDIR(st_mode):
        kind = "directory"
    else:
        kind = "other"
    is_dev = kind in ("char", "block")
    return {
        "path": path,
        "type": kind,
        "major": os.major(st_rdev) if is_dev else None,
        "minor": os.minor(st_rdev) if is_dev else None,
        "mode": "0%03o" % stat.S_IMODE(st_mode),
    }


def list_nvidia_devices(
    root: str = "/", stat_fn: Callable[[str], os.stat_result] = os.stat
) -> list[dict[str, Any]]:
    """The NVIDIA device nodes under /dev (/dev/nvidia*, and /dev/nvidia-caps/*), sorted by path."""
    dev = join_root(root, "/dev")
    found: list[dict[str, Any]] = []
    try:
        names = sorted(os.listdir(dev))
    except OSError:
        return found
    paths: list[str] = []
    for name in names:
        if not name.startswith("nvidia"):
            continue
        paths.append("/dev/" + name)
        if name == "nvidia-caps":
            try:
                paths.extend("/dev/nvidia-caps/" + sub for sub in sorted(os.listdir(os.path.join(dev, name))))
            except OSError:
                pass
    for path in paths:
        try:
            st = stat_fn(join_root(root, path))
        except OSError:
            continue
        found.append(describe_device(path, st.st_mode, st.st_rdev))
    return found


_NVRM_VERSION_RE = re.compile(r"Kernel Module(?:\s+for\s+\S+)?\s+(\d+\.\d+(?:\.\d+)?)")


def parse_driver_version_file(text: Optional[str]) -> Optional[str]:
    """Kernel module version from /proc/driver/nvidia/version ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15 ...")."""
    if not text:
        return None
    match = _NVRM_VERSION_RE.search(text)
    return match.group(1) if match else None


def read_host_memory(root: str = "/") -> dict[str, Optional[int]]:
    text = read_text(join_root(root, "/proc/meminfo"))
    if text is None:
        raise ParseError("cannot read /proc/meminfo")
    return parse_meminfo(text)


def read_kernel_module_version(root: str = "/") -> Optional[str]:
    return parse_driver_version_file(read_text(join_root(root, "/proc/driver/nvidia/version")))


# Driver builds whose kernel module is reported not to build on a kernel series, as (driver branches, first patch
# release that builds, first kernel (major, minor) that breaks, source). A node on PVE 9 boots the newest installed
# proxmox-kernel: a DKMS module that does not build for it is simply absent after the reboot.
_DRIVER_KERNEL_BREAKS: tuple[tuple[tuple[int, ...], Optional[tuple[int, ...]], tuple[int, int], str], ...] = (
    ((550, 555), None, (6, 17),
     "the 550/555 kernel modules fail to build on 6.17 (NVIDIA/open-gpu-kernel-modules#1143: 550.163.01 and "
     "555.58.02 on 6.17.13-2-pve, PVE 9.1, whose default kernel is 6.17); a 580.x driver builds there"),
    ((580,), (580, 159, 4), (7, 1),
     "580.x before 580.159.04 fails to build on Linux 7.1 (void-linux/void-packages#61087: 580.142; NVIDIA's "
     "580.159.04 notes: 'Fixed kernel module build issue with Linux kernel v7.1')"),
)


def _numbers(text: str) -> tuple[int, ...]:
    out = []
    for part in re.split(r"[.\-+]", str(text)):
        if not part.isdigit():
            break
        out.append(int(part))
    return tuple(out)


def driver_kernel_problem(driver_version: Optional[str], kernel_release: str) -> Optional[str]:
    """Why the NVIDIA driver ``driver_version`` is known not to build its kernel module for ``kernel_release``
    (``uname -r``, e.g. 6.17.13-2-pve), or None when no known report says so."""
    driver = _numbers(driver_version or "")
    kernel = _numbers(kernel_release)
    if len(driver) < 2 or len(kernel) < 2:
        return None
    for branches, fixed_in, breaks_from, why in _DRIVER_KERNEL_BREAKS:
        if driver[0] in branches and kernel[:2] >= breaks_from and (fixed_in is None or driver < fixed_in):
            return f"NVIDIA driver {driver_version} with kernel {kernel_release}: {why}"
    return None


def node_kernels(root: str = "/") -> list[str]:
    """The kernel releases the node runs or can boot: the running one (``uname -r``, for root "/") and each with a
    module tree under /lib/modules; sorted."""
    try:
        names = set(os.listdir(join_root(root, "/lib/modules")))
    except OSError:
        names = set()
    if root == "/":
        names.add(os.uname().release)
    return sorted(n for n in names if _numbers(n))


def summarize_gpus(gpus: list[dict[str, Any]]) -> dict[str, Any]:
    """Count and totals over the parsed GPU rows (None-safe)."""
    total = sum(g["memory_total_mib"] or 0 for g in gpus)
    used = sum(g["memory_used_mib"] or 0 for g in gpus)
    versions = sorted({g["driver_version"] for g in gpus if g.get("driver_version")})
    return {
        "gpu_count": len(gpus),
        "gpu_memory_total_mib": total,
        "gpu_memory_used_mib": used,
        "driver_version": versions[0] if len(versions) == 1 else None,
        "driver_versions": versions,
    }
