# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The attribute descriptions every module of the collection shares (as community.general.attributes)."""

from __future__ import annotations


class ModuleDocFragment:
    # Each module keeps its own support level and details; the descriptions live here once.
    DOCUMENTATION = r"""
options: {}
attributes:
  check_mode:
    description: Can run in check_mode and return changed status prediction without modifying target.
  diff_mode:
    description: Will return details on what has changed (or possibly needs changing in check_mode), when in diff mode.
"""

    FACTS = r"""
options: {}
attributes:
  facts:
    description: Action returns an C(ansible_facts) dictionary that will update existing host facts.
"""

    # An action that only computes on the controller (the deploy's stages, the calculators): it changes nothing.
    COMPUTE = r"""
options: {}
attributes:
  check_mode:
    support: full
    details: The action only computes; it never changes anything.
  diff_mode:
    support: none
"""
