# -*- coding: utf-8 -*-
# Copyright: inferops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
name: recover_report
short_description: The recover run's report, workflow artifact and summary from the role's raw records
version_added: "0.1.0"
author: inferops contributors
description:
  - Used by the P(inferops.gpu_inference.gpu_recover#role) role at the end of a run. The role keeps only what
    happened (clock readings, each action's result, each verification's diagnosis); this filter computes the
    durations, the rung that cleared the host, the verdict, the report, the artifact and the summary lines.
  - Raises an error naming the bad record when a raw record is malformed.
options:
  _input:
    description:
      - The run's raw record, with keys C(vmid), C(node), C(started_at), C(t_start), C(t_end), C(check_mode),
        C(clean), C(reboot_needed), C(rungs) (raw rung records with C(rung), C(name), C(t0), C(t1), C(t_end),
        C(action), C(poll)), C(before), C(after) and C(report_path); and, for what the run leaves, C(service),
        C(finished) (false for a report written before the end, before and after each rung's action), C(in_progress),
        C(interrupted) (the failed task of a ladder that failed), C(left_read) and C(ct_stopped_by_us).
    type: dict
    required: true
"""

EXAMPLES = r"""
- name: Build the report of the run
  ansible.builtin.set_fact:
    _result: "{{ _raw_run | inferops.gpu_inference.recover_report }}"
  # => {"report": {...}, "artifact": {"vmid": 129, "verdict": "Clean", "cleared_by_rung": 1, ...},
  #     "summary_lines": ["Clean", "...", "Rungs: 1 stop_service: 7.4 s"]}
"""

RETURN = r"""
_value:
  description: C(report) (written to disk and set as gpu_recover_result), C(artifact) (set_stats for AWX) and
    C(summary_lines) (printed).
  type: dict
"""

from collections.abc import Mapping

from ansible.errors import AnsibleFilterError

from ansible_collections.inferops.gpu_inference.plugins.module_utils.recover.recover_ladder import LadderError, build


def recover_report(raw):
    """Return {"report", "artifact", "summary_lines"} for one recover run."""
    if not isinstance(raw, Mapping):
        raise AnsibleFilterError("recover_report: the input must be the run's raw record (a dict), got %s"
                                 % type(raw).__name__)
    try:
        return build(raw)
    except (LadderError, KeyError) as exc:
        raise AnsibleFilterError("recover_report: %s" % exc, orig_exc=exc) from exc


class FilterModule(object):
    def filters(self):
        return {"recover_report": recover_report}
