# -*- coding: utf-8 -*-
# Copyright: inferops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The guard of the deploy's variables against the inventory and blank survey answers (pure Python, no Ansible imports).

Every value the roles and playbooks compute is private (``__role_*``, ``_role_*``, ``__<playbook>_*``); extra
variables (``-e``, AWX survey answers) are an allow-list (``playbook_inputs.py``). A private name set in the
inventory for a host is a misunderstanding worth stopping: the action plugin
``inferops.gpu_inference.sglang_deploy_plan`` refuses it at every stage (:func:`refuse_injected`), and says when a
role setting arrives blank among the extra variables (:func:`blank_extra_vars_note`: an AWX survey question left
unanswered hides the inventory's value).
"""
from __future__ import annotations

from typing import Any, List, Mapping, Sequence

from ansible_collections.inferops.gpu_inference.plugins.module_utils.deploy.playbook_inputs import ROLE_PREFIXES
from ansible_collections.inferops.gpu_inference.plugins.module_utils.deploy.sglang_request import DeployError
from ansible_collections.inferops.gpu_inference.plugins.module_utils.sizing.sizing_values import is_blank

__all__ = ["ROLE_PREFIXES", "PRIVATE_PREFIXES", "injected_names", "refuse_injected", "blank_extra_vars", "blank_extra_vars_note"]
# Every value the roles and the entry playbooks compute or keep private has one of these forms (docs/development.md:
# ``_role_*`` role constants, ``__role_*`` runtime values, ``__<playbook>_*`` a playbook's own values); no computed
# value sits under a public name, so no list of computed names is kept.
PRIVATE_PREFIXES = ("__sglang_server_", "__pve_gpu_container_", "_sglang_server_", "_pve_gpu_container_", "__deploy_",
                    "__gpu_recover", "_gpu_recover_", "__plan_", "__recover_")


def injected_names(names: Sequence[str]) -> List[str]:
    """The private names among ``names`` (variable names the operator supplied)."""
    return sorted(n for n in names if isinstance(n, str) and n.startswith(PRIVATE_PREFIXES))


def refuse_injected(names: Sequence[str], where: str) -> None:
    bad = injected_names(names)
    if bad:
        raise DeployError(
            "refused before any change: %s set %s, which the roles or playbooks compute (or keep private). "
            "Such a value is never read from the operator, so it is not accepted. Remove it; to ask for a HiCache size, "
            "set sglang_server_hicache_requested_gb (decimal GB per rank), which is checked against the plan."
            % (where, ", ".join(bad))
        )


def blank_extra_vars(extra_vars: Mapping[str, Any]) -> List[str]:
    """The role settings among the extra variables that are blank (None or ''), as AWX passes a survey question
    left unanswered. Each one hides the value the inventory sets for the host."""
    return sorted(k for k, v in extra_vars.items() if isinstance(k, str) and k.startswith(ROLE_PREFIXES) and is_blank(v))


def blank_extra_vars_note(names: Sequence[str]) -> str:
    """What to tell the operator about blank role settings among the extra variables ('' when there are none)."""
    if not names:
        return ""
    return ("%s %s blank in the extra variables (an AWX survey question left unanswered arrives as '' or null): blank "
            "means the role's default here, and an extra variable hides any value the inventory sets for the host. "
            "Answer the question, or leave it out of the launch, to keep the inventory's value."
            % (", ".join(names), "is" if len(names) == 1 else "are"))
