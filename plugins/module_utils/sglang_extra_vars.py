# -*- coding: utf-8 -*-
# Copyright: inferops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The guard of the deploy's variables against extra variables (pure Python, no Ansible imports).

Extra variables (``-e``, AWX survey answers) outrank ``set_fact`` and ``register`` in Ansible's precedence, so a
value given there for a variable the roles compute would silently replace the computed one.  The action plugin
``inferops.gpu_inference.sglang_deploy_plan`` refuses such names at every stage (:func:`refuse_injected`), and says
when a role setting arrives blank among them (:func:`blank_extra_vars_note`: an AWX survey question left unanswered
hides the inventory's value).
"""
from __future__ import annotations

from typing import Any, List, Mapping, Sequence

from ansible_collections.inferops.gpu_inference.plugins.module_utils.sglang_request import DeployError
from ansible_collections.inferops.gpu_inference.plugins.module_utils.sizing_values import is_blank

# Variables that the roles compute. A value given for one of them by the operator (-e, a survey, the
# inventory) would outrank the computed one (Ansible's precedence puts extra vars above set_fact and
# register), so their presence in the input is refused rather than trusted.
COMPUTED_NAMES = frozenset({
    "sglang_server_hicache_size",
    "sglang_server_plan",
    "sglang_server_plan_request",
    "sglang_server_request",
    "sglang_server_launch",
    "sglang_server_result",
    "pve_gpu_container_state",
    "pve_gpu_container_spec",
    "pve_gpu_container_gate",
    "sglang_server_node_state",
    "pve_gpu_container_plan_requests",
})
# Prefixes of the roles' public settings (what an operator, the inventory or a survey sets).
ROLE_PREFIXES = ("sglang_server_", "pve_gpu_container_")
PRIVATE_PREFIXES = ("__sglang_server_", "__pve_gpu_container_", "_sglang_server_", "_pve_gpu_container_", "__deploy_")


def injected_names(names: Sequence[str]) -> List[str]:
    """The computed or private names among ``names`` (variable names the operator supplied)."""
    return sorted(n for n in names if isinstance(n, str) and (n in COMPUTED_NAMES or n.startswith(PRIVATE_PREFIXES)))


def refuse_injected(names: Sequence[str], where: str) -> None:
    bad = injected_names(names)
    if bad:
        raise DeployError(
            "refused before any change: %s set %s, which the roles compute (or keep private). A value given "
            "there would outrank the computed one, so it is not accepted. Remove it; to ask for a HiCache size, "
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
