# -*- coding: utf-8 -*-
# Copyright: inferops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The one base class of the collection's errors.

Every error module_utils raises for bad input, a refused plan or an unreadable fact derives from InferopsError, so a
module or plugin can catch the collection's own refusals in one clause (and let anything else, a bug, surface). It is
a ValueError: what it reports is a value the caller gave or read that cannot be used. No Ansible imports.
"""

from __future__ import annotations


class InferopsError(ValueError):
    """A refusal or a value the collection cannot use; the message says what was wrong and what to do."""
