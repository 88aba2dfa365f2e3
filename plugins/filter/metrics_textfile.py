# -*- coding: utf-8 -*-
# Copyright: inferops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
name: metrics_textfile
short_description: A node_exporter textfile-collector file from a deploy or recover report
version_added: "0.1.0"
author: inferops contributors
description:
  - Used by the roles P(inferops.gpu_inference.gpu_recover#role) and P(inferops.gpu_inference.sglang_server#role) to
    write C(inferops_recover_<vmid>.prom) and C(inferops_deploy_<vmid>.prom) on the node (docs/recover.md, "Metrics").
  - The text is computed by C(plugins/module_utils/recover/metrics_textfile.py); a figure the report lacks is left out.
options:
  _input:
    description: The report (recover's C(gpu_recover_result), or the content of deploy.json).
    type: dict
    required: true
  kind:
    description: Which report it is.
    type: str
    choices: [recover, deploy]
    required: true
  ended_at:
    description: When the run ended, in seconds since the epoch.
    type: float
    required: true
"""

EXAMPLES = r"""
- name: The recover metrics of the run
  ansible.builtin.set_fact:
    _prom: "{{ gpu_recover_result | inferops.gpu_inference.metrics_textfile('recover', now().timestamp()) }}"
"""

RETURN = r"""
_value:
  description: The file's text (Prometheus text exposition format), ending with a newline.
  type: str
"""

from ansible.errors import AnsibleFilterError

from ansible_collections.inferops.gpu_inference.plugins.module_utils.recover.metrics_textfile import (
    MetricsError, deploy_metrics, recover_metrics)


def metrics_textfile(report, kind, ended_at):
    try:
        if kind == "recover":
            return recover_metrics(report, float(ended_at))
        if kind == "deploy":
            return deploy_metrics(report, float(ended_at))
    except (MetricsError, TypeError, ValueError) as exc:
        raise AnsibleFilterError("metrics_textfile: %s" % exc, orig_exc=exc) from exc
    raise AnsibleFilterError("metrics_textfile: kind must be recover or deploy, got %r" % (kind,))


class FilterModule(object):
    def filters(self):
        return {"metrics_textfile": metrics_textfile}
