# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The node_exporter textfile-collector files deploy's verify and recover write on the node (docs/recover.md,
"Metrics"), from their own JSON reports, and the one the event source gpu_watch writes where it runs (the nodes it
cannot read, the budgets it spent): the text exposition format (one ``# HELP`` and ``# TYPE`` per metric family,
``name{label="value"} number`` lines, label values escaped, a final newline), which the collector reads from
``*.prom`` files that are written whole (the role's copy renames a temporary file into place).

Alert rules over these metrics ship beside them: extensions/eda/prometheus/inferops-gpu-rules.yml.
No Ansible imports; unit-tested in tests/unit/plugins/module_utils/recover/test_metrics_textfile.py.
"""

from __future__ import annotations

import math
import re
from typing import Any, Iterable, Mapping, Optional
from ansible_collections.inferops.gpu_inference.plugins.module_utils.common.errors import InferopsError

_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
_LABEL = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")

# name: (type, help). Units in the names (Prometheus's own convention: _bytes, _seconds).
FAMILIES: dict[str, tuple[str, str]] = {
    "inferops_deploy_planned_pinned_bytes": ("gauge", "Pinned host bytes the plan gives the container's ranks."),
    "inferops_deploy_measured_pinned_bytes": ("gauge", "Pinned host bytes deploy's verify measured in the ranks."),
    "inferops_deploy_node_budget_bytes": ("gauge", "The plan's budget for host KV pools on the container's node."),
    "inferops_deploy_verify_ok": ("gauge", "1 when the running server matched the plan at deploy's verify."),
    "inferops_deploy_node_plan_fits": ("gauge", "1 when every container the node carries fits its memory together."),
    "inferops_deploy_timestamp_seconds": ("gauge", "When deploy's verify wrote this file (Unix time)."),
    "inferops_recover_last_clean": ("gauge", "1 when the container's last recover run ended Clean, else 0."),
    "inferops_recover_last_rung": ("gauge", "The rung that cleared the last recover run (0: already clean, -1: not cleared)."),
    "inferops_recover_reboot_needed": ("gauge", "1 when the last recover run found that the node needs a reboot."),
    "inferops_recover_duration_seconds": ("gauge", "Seconds the last recover run took (its time to Clean when clean)."),
    "inferops_recover_last_run_timestamp_seconds": ("gauge", "When the last recover run ended (Unix time)."),
    "inferops_recover_in_progress": ("gauge", "1 while a recover run climbs its ladder (written before and after each "
                                     "rung's action); a 1 that stays: the run stopped without its verdict."),
    "inferops_recover_interrupted": ("gauge", "1 when the last recover run's ladder failed before its end (its report "
                                     "says where and the state it left)."),
    "inferops_watch_last_poll_timestamp_seconds": ("gauge", "When the event source gpu_watch last ended a poll (Unix time)."),
    "inferops_watch_node_up": ("gauge", "0 once gpu_watch could not read the node for its unreachable_polls polls in a row, else 1."),
    "inferops_watch_node_failed_polls": ("gauge", "Polls in a row in which gpu_watch read no container of the node."),
    "inferops_watch_node_last_read_timestamp_seconds": ("gauge", "When gpu_watch last read a container of the node (Unix time)."),
    "inferops_watch_budget_exhausted": ("gauge", "1 when gpu_watch spent the container's recovery budget and stopped recovering it."),
}


class MetricsError(InferopsError):
    """A report that cannot be turned into metrics."""


def _escape(value: Any) -> str:
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value: Any) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "NaN"
        if math.isinf(value):
            return "+Inf" if value > 0 else "-Inf"
        return repr(value)
    raise MetricsError("not a number: %r" % (value,))


def render(samples: Iterable[tuple[str, Mapping[str, Any], Any]]) -> str:
    """Samples (name, labels, value) as the text format, grouped by family in FAMILIES's order; None values are left
    out (a figure the report does not have is absent, never 0)."""
    by_name: dict[str, list[str]] = {}
    for name, labels, value in samples:
        if name not in FAMILIES or not _NAME.match(name):
            raise MetricsError("unknown metric %r" % (name,))
        if value is None:
            continue
        for key in labels:
            if not _LABEL.match(key) or key.startswith("__"):
                raise MetricsError("bad label name %r" % (key,))
        text = ",".join('%s="%s"' % (k, _escape(v)) for k, v in sorted(labels.items()))
        by_name.setdefault(name, []).append("%s%s %s" % (name, "{%s}" % text if text else "", _number(value)))
    lines: list[str] = []
    for name, (kind, helptext) in FAMILIES.items():
        if name in by_name:
            lines += ["# HELP %s %s" % (name, helptext), "# TYPE %s %s" % (name, kind)] + by_name[name]
    return "\n".join(lines) + "\n" if lines else ""


def _int(value: Any) -> Optional[int]:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def recover_metrics(report: Mapping[str, Any], ended_at: float) -> str:
    """The file recover writes for one container from its report (recover_ladder.build's ``report``)."""
    if not isinstance(report, Mapping) or "vmid" not in report:
        raise MetricsError("recover_metrics needs the recover report (with vmid), got %r" % type(report).__name__)
    labels = {"vmid": str(int(report["vmid"])), "node": str(report.get("node") or "")}
    if report.get("finished") is False:
        # Written during the run: only that it runs. The last run's figures are not known here, and a run's end
        # (last_run_timestamp, which counts recoveries) is not reached yet.
        return render([("inferops_recover_in_progress", labels, True)])
    clean = report.get("verdict") == "Clean"
    cleared = report.get("cleared_by_rung")
    return render([
        ("inferops_recover_last_clean", labels, clean),
        ("inferops_recover_last_rung", labels, int(cleared) if cleared is not None else (0 if clean else -1)),
        ("inferops_recover_reboot_needed", labels, bool(report.get("reboot_needed"))),
        ("inferops_recover_duration_seconds", labels, float(report["seconds"]) if report.get("seconds") is not None else None),
        ("inferops_recover_last_run_timestamp_seconds", labels, float(ended_at)),
        ("inferops_recover_in_progress", labels, False),
        ("inferops_recover_interrupted", labels, bool(report.get("interrupted"))),
    ])


def watch_metrics(nodes: Mapping[str, Mapping[str, Any]], containers: Iterable[Mapping[str, Any]],
                  polled_at: float) -> str:
    """The file the event source gpu_watch writes where it runs, after each poll: each node's state
    (eda_watch.Policy.node_states: up, failed_polls, last_read_at), each watched container's budget (``vmid``,
    ``node``, ``exhausted``), and the poll's time, so that a source that stops polling is seen too."""
    samples: list[tuple[str, Mapping[str, Any], Any]] = [("inferops_watch_last_poll_timestamp_seconds", {}, float(polled_at))]
    for node, st in sorted(nodes.items()):
        labels = {"node": str(node)}
        samples += [("inferops_watch_node_up", labels, bool(st.get("up"))),
                    ("inferops_watch_node_failed_polls", labels, int(st.get("failed_polls") or 0)),
                    ("inferops_watch_node_last_read_timestamp_seconds", labels,
                     float(st["last_read_at"]) if st.get("last_read_at") is not None else None)]
    for ct in containers:
        samples.append(("inferops_watch_budget_exhausted", {"vmid": str(int(ct["vmid"])), "node": str(ct["node"])},
                        bool(ct.get("exhausted"))))
    return render(samples)


def deploy_metrics(report: Mapping[str, Any], ended_at: float) -> str:
    """The file deploy's verify writes for one container from its deploy report (deploy.json's content)."""
    if not isinstance(report, Mapping) or "vmid" not in report:
        raise MetricsError("deploy_metrics needs the deploy report (with vmid), got %r" % type(report).__name__)
    labels = {"vmid": str(int(report["vmid"])), "node": str(report.get("node") or ""), "host": str(report.get("host") or "")}
    verify = report.get("verify") or {}
    plan = report.get("plan") or {}
    return render([
        ("inferops_deploy_planned_pinned_bytes", labels, _int(verify.get("planned_pinned_bytes"))),
        ("inferops_deploy_measured_pinned_bytes", labels, _int(verify.get("ranks_held_bytes"))),
        ("inferops_deploy_node_budget_bytes", labels, _int(plan.get("budget_bytes"))),
        ("inferops_deploy_verify_ok", labels, bool(verify.get("ok")) if "ok" in verify else None),
        ("inferops_deploy_node_plan_fits", labels,
         bool(report["node_plan_fits"]) if isinstance(report.get("node_plan_fits"), bool) else None),
        ("inferops_deploy_timestamp_seconds", labels, float(ended_at)),
    ])
