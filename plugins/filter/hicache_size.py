# -*- coding: utf-8 -*-
# Copyright: inferops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
name: hicache_size
short_description: The safe per-rank C(--hicache-size) for SGLang, or an error with the arithmetic
version_added: "0.1.0"
author: inferops contributors
description:
  - Returns the C(--hicache-size) (decimal GB per rank, an int) computed by P(inferops.gpu_inference.hicache_plan#filter)
    from the same input.
  - Raises an error whose message is the plan's explanation when nothing fits, or when O(requested_gb) (or
    C(requested_gb) in the input) does not fit; in that case it returns the requested size when it fits.
options:
  _input:
    description: The same flat dict of facts and policy as P(inferops.gpu_inference.hicache_plan#filter).
    type: dict
    required: true
  requested_gb:
    description: A per-rank size to check and return if it fits. Any other input key may also be given as a keyword.
    type: int
seealso:
  - plugin: inferops.gpu_inference.hicache_plan
    plugin_type: filter
"""

EXAMPLES = r"""
- name: Render SGLang's arguments with a safe size
  ansible.builtin.set_fact:
    sglang_args: "--tp-size 8 --enable-hierarchical-cache --hicache-size {{ facts | inferops.gpu_inference.hicache_size }}"
  # => "--tp-size 8 --enable-hierarchical-cache --hicache-size 44" on the incident host

- name: Fails, explaining that 8 ranks x 300.0 GB = 2400.0 GB pinned does not fit the budget
  ansible.builtin.debug:
    msg: "{{ facts | inferops.gpu_inference.hicache_size(requested_gb=300) }}"
"""

RETURN = r"""
_value:
  description: The C(--hicache-size) to pass, decimal GB per rank.
  type: int
"""

from collections.abc import Mapping

from ansible.errors import AnsibleFilterError

from ansible_collections.inferops.gpu_inference.plugins.module_utils.sizing.hicache import PlanError, size_gb


def hicache_size(facts, **overrides):
    """Return the per-rank --hicache-size, or raise with the plan's arithmetic."""
    if not isinstance(facts, Mapping):
        raise AnsibleFilterError("hicache_size: the input must be a dict of facts and policy, got %s" % type(facts).__name__)
    data = dict(facts)
    data.update(overrides)
    try:
        return size_gb(data)
    except PlanError as exc:
        raise AnsibleFilterError("hicache_size: %s" % exc, orig_exc=exc) from exc


class FilterModule(object):
    def filters(self):
        return {"hicache_size": hicache_size}
