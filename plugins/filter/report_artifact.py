# -*- coding: utf-8 -*-
# Copyright: inferops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
name: report_artifact
short_description: A run's report bounded in size for an AWX artifact (set_stats)
version_added: "0.1.0"
author: inferops contributors
description:
  - AWX deletes a job's private data dir when the job ends, so a report written there is not kept; AWX keeps the
    job's artifacts (aggregate C(set_stats)). This filter returns the report whole when its JSON is at most
    O(max_bytes), else without its largest parts (evidence, processes, memory, actions, the plan's text), and names
    what it dropped.
options:
  _input:
    description: The report, a mapping that serialises to JSON.
    type: dict
    required: true
  max_bytes:
    description: The most bytes of report JSON kept (at least 256).
    type: int
    default: 16384
"""

EXAMPLES = r"""
- name: Keep the report in the job's artifacts
  ansible.builtin.set_stats:
    data:
      my_report: "{{ _report | inferops.gpu_inference.report_artifact }}"
  # => {"report": {...}, "report_bytes": 4897, "report_complete": true, "report_dropped": []}
"""

RETURN = r"""
_value:
  description: C(report) (the report or its reduction), C(report_bytes) (the full report's size),
    C(report_complete) and C(report_dropped) (the keys left out).
  type: dict
"""

from ansible.errors import AnsibleFilterError

from ansible_collections.inferops.gpu_inference.plugins.module_utils.common.report_artifact import (
    ARTIFACT_REPORT_MAX_BYTES, ReportArtifactError, bounded)


def report_artifact(report, max_bytes=ARTIFACT_REPORT_MAX_BYTES):
    """The report bounded for an AWX artifact."""
    try:
        return bounded(report, max_bytes)
    except ReportArtifactError as exc:
        raise AnsibleFilterError("report_artifact: %s" % exc, orig_exc=exc) from exc


class FilterModule(object):
    def filters(self):
        return {"report_artifact": report_artifact}
