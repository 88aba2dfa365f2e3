#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: inferops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# The work is done by the action plugin of the same name (plugins/action/sglang_request.py) on the controller.
from __future__ import annotations

DOCUMENTATION = r"""
module: sglang_request
short_description: Check the SGLang settings of one container and describe what its HiCache plan needs
version_added: "0.1.0"
author:
  - inferops team (@inferops)
description:
  - The operator's settings (the role C(sglang_server)'s variables, survey answers) checked and normalised
    (C(module_utils/deploy/sglang_request.py)) - layout, version, the requested size, the service (bind address, API key
    policy, port), the extra arguments. Runs in the container host's variable context without connecting to it, so that
    the node play can refuse a plan before it changes anything.
  - A blank role setting among the extra variables (an unanswered survey question) is said as a warning.
options:
  settings:
    description: The role's settings, see the role C(sglang_server)'s argument specs (entry point C(plan_request)).
    type: dict
    required: true
extends_documentation_fragment:
  - inferops.gpu_inference.attributes
  - inferops.gpu_inference.deploy_stage
"""

EXAMPLES = r"""
- name: Check the settings
  inferops.gpu_inference.sglang_request:
    settings: {version: "0.5.21", tp_size: 2, model_path: /opt/models/m, model_preset: kimi-k2, requested_gb: ""}
  register: __sglang_server_request_result
"""

RETURN = r"""
request:
  description: The normalised settings (C(layout), C(service), C(version), C(plan_base), the plan's input without facts).
  type: dict
  returned: success
msg_lines:
  description: >-
    When the task fails with a message of several lines (a plan that does not fit, with its arithmetic): the lines
    after the first, one a line; C(msg) is the first line.
  type: list
  elements: str
  returned: failure with a message of several lines
"""
