# -*- coding: utf-8 -*-
# Copyright: inferops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The extra variables each entry playbook accepts: an allow-list (pure Python, no Ansible imports).

Extra variables (``-e``, ``-e @file``, AWX survey answers) outrank every other variable, ``set_fact`` and
``register`` included, so a name a playbook does not document is refused before any task runs instead of being
trusted. What a playbook documents, computed from the files (never a hand-kept list):

- the options of the role entry points it runs (``roles:``, ``include_role``/``import_role`` with ``tasks_from``),
  read from each role's ``meta/argument_specs.yml``, and the inventory variables their documented defaults read
  (``proxmox_api_host`` for ``pve_gpu_container_api_host``); and what the playbooks it imports accept;
- when it reads the inventory model (the filter ``inferops.gpu_inference.gpu_inventory``, in the playbook, a vars
  file it loads or the vars of a role it runs), the inventory variables outside the roles' namespace that the model
  declares it reads (``gpu_inventory.INVENTORY_NAMES``: ``proxmox_vmid``, ``proxmox_node``);
- plus its own inputs, :data:`PLAYBOOK_INPUTS`;
- minus every name the playbook itself sets (play ``vars``, a role's or a task's ``vars``, ``import_playbook``'s
  ``vars``, ``register``): an extra variable of that name would replace the value the playbook computes;
- plus AWX's own job variables (``awx_*``, ``tower_*``), which AWX adds to every job's extra variables.

The action ``inferops.gpu_inference.extra_vars_check`` (first task of each play of deploy.yml, recover.yml and
plan.yml) calls :func:`refuse_undocumented`; docs/safety.md's list of inputs is :func:`markdown` of the same data
(``tests/unit/plugins/module_utils/deploy/test_playbook_inputs.py`` fails when the two differ).
"""
from __future__ import annotations

import difflib
import os
import re
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Set, Tuple
from ansible_collections.inferops.gpu_inference.plugins.module_utils.common.errors import InferopsError
from ansible_collections.inferops.gpu_inference.plugins.module_utils.common.gpu_inventory import INVENTORY_NAMES

# The collection's root (this file is three levels below it, in plugins/module_utils/deploy/).
COLLECTION_ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
COLLECTION = "inferops.gpu_inference"

# AWX adds these to every job's extra variables (awx/main/models/jobs.py awx_meta_vars: awx_job_id,
# awx_job_template_name, awx_user_name, ... and the same names with tower_).
AWX_PREFIXES = ("awx_", "tower_")
# The longest name or value echoed back in a message.
ECHO_WIDTH = 60

_WORKFLOW = ("answered in the AWX workflow 'GPU host: recover then deploy', whose survey answers go to each of its "
             "jobs; not read by this playbook")

_EDA = ("the rule and event that started the run, which ansible-rulebook's run_playbook adds to every playbook it runs "
        "(extensions/eda/rulebooks/gpu_recover.yml); not read by this playbook")

_ARTIFACT = ("the artifact of the recover node of the AWX workflow 'GPU host: recover then deploy' (AWX passes a node's "
             "set_stats to the next node's job as extra vars); not read by this playbook")

# Each entry playbook's own inputs (name: what it means). The roles' settings come from their argument_specs.
PLAYBOOK_INPUTS: Dict[str, Dict[str, str]] = {
    "deploy.yml": {
        "deploy_containers": "the container hosts to deploy (a host pattern, default the group sglang_containers)",
        "deploy_nodes": "the PVE nodes (a host pattern, default the group proxmox_nodes)",
        "recover_vmid": _WORKFLOW,
        "recover_allow_reboot": _WORKFLOW,
        "gpu_recover": _ARTIFACT,
        "ansible_eda": _EDA,
    },
    "plan.yml": {
        "plan_input": "a mapping of hicache_plan keys (facts and layout), as in playbooks/vars/examples/",
        "plan_host": "a container host of the inventory, planned with the variables deploy.yml reads for it",
        "plan_requested_gb": "a per-rank size to ask for (decimal GB); blank or 0 lets the plan choose",
        "plan_node": "a PVE node of the inventory: every container the inventory places on it, planned together",
    },
    "recover.yml": {
        "recover_vmid": "the VMID of the container to recover (required, an integer >= 100)",
        "recover_node": "the node's inventory name or group (default: the node the inventory puts the container on)",
        "recover_allow_reboot": "true lets the last rung reboot the node (default false)",
        "recover_relaunch": "true runs deploy.yml for the container once it is Clean (default false)",
        "recover_service": "the unit to stop in the container (default sglang.service)",
        "recover_allow_undeclared": "true recovers a container the inventory does not declare on the node (default false)",
        "recover_record_baseline": "true judges without the baseline on disk and records it again (default false)",
        "deploy_containers": _WORKFLOW,
        "ansible_eda": _EDA,
    },
}
ENTRY_PLAYBOOKS = tuple(sorted(PLAYBOOK_INPUTS))

Loader = Callable[[str], Any]


class InputsError(InferopsError):
    """An extra variable the playbook does not document, or a playbook this module does not know."""


def clip_name(name: Any, width: int = ECHO_WIDTH) -> str:
    """A name as a message shows it: printable, at most ``width`` characters."""
    text = name if isinstance(name, str) else repr(name)
    text = "".join(c if c.isprintable() else "?" for c in text)
    return text if len(text) <= width else "%s... (%d characters)" % (text[: width - 3], len(text))


def _role_entry(name: str) -> str:
    """A role reference (``inferops.gpu_inference.sglang_server`` or ``sglang_server``) as its directory name."""
    return str(name).rsplit(".", maxsplit=1)[-1]


def _tasks(play: Mapping[str, Any]) -> Iterable[Mapping[str, Any]]:
    """Every task of a play, blocks flattened."""
    stack = [t for key in ("pre_tasks", "tasks", "post_tasks", "handlers") for t in (play.get(key) or [])]
    while stack:
        task = stack.pop(0)
        if not isinstance(task, Mapping):
            continue
        for key in ("block", "rescue", "always"):
            stack.extend(task.get(key) or [])
        yield task


def _include(task: Mapping[str, Any]) -> Optional[Tuple[str, str]]:
    for key, value in task.items():
        if str(key).rsplit(".", maxsplit=1)[-1] in ("include_role", "import_role") and isinstance(value, Mapping):
            return _role_entry(value["name"]), str(value.get("tasks_from") or "main").rsplit(".", 1)[0]
    return None


def playbook_uses(playbook: str, load: Loader, root: str = COLLECTION_ROOT) -> Tuple[Set[Tuple[str, str]], Set[str], List[str]]:
    """What ``playbook`` (a file name under ``playbooks/``) runs: (role, entry point) pairs, the names it sets, and
    the playbooks it imports (their own uses are not included)."""
    plays = load(os.path.join(root, "playbooks", playbook)) or []
    entries: Set[Tuple[str, str]] = set()
    sets: Set[str] = set()
    imports: List[str] = []
    for play in plays:
        if "import_playbook" in play or "ansible.builtin.import_playbook" in play:
            imports.append(os.path.basename(play.get("import_playbook") or play["ansible.builtin.import_playbook"]))
            sets.update(play.get("vars") or {})
            continue
        sets.update(play.get("vars") or {})
        for role in play.get("roles") or []:
            ref = role if isinstance(role, str) else role.get("role") or role.get("name")
            entries.add((_role_entry(ref), "main"))
            if isinstance(role, Mapping):
                sets.update(role.get("vars") or {})
        for task in _tasks(play):
            sets.update(task.get("vars") or {})
            if task.get("register"):
                sets.add(task["register"])
            inc = _include(task)
            if inc:
                entries.add(inc)
    return entries, sets, imports


# A documented default that reads another variable ("{{ proxmox_vmid | default(0) }}", or as the fallback of a renamed
# name, "{{ old_name | default(proxmox_api_timeout | default(10)) }}"): that variable is an input too.
_DEFAULT_READS = re.compile(r"(?:\{\{|default\()\s*([A-Za-z_][A-Za-z0-9_]*)\s*(?:\||\}\}|\))")
# Ansible's own names a default may read, and the literals a default may fall back to (not inputs).
_MAGIC = frozenset({"inventory_hostname", "inventory_hostname_short", "groups", "hostvars", "omit", "playbook_dir",
                    "ansible_check_mode", "role_path", "ansible_play_hosts", "group_names",
                    "true", "false", "none", "True", "False", "None"})


def role_options(role: str, entry: str, load: Loader, root: str = COLLECTION_ROOT) -> Dict[str, str]:
    """The options of one role entry point (name: where it is documented), and the public variables their documented
    defaults read (``proxmox_api_host`` for ``pve_gpu_container_api_host``: the inventory's names; a private name a
    default reads, ``__pve_gpu_container_model``, is the role's own and never an input)."""
    specs = (load(os.path.join(root, "roles", role, "meta", "argument_specs.yml")) or {}).get("argument_specs") or {}
    if entry not in specs:
        raise InputsError("role %s has no entry point %s in meta/argument_specs.yml" % (role, entry))
    out = {}
    for name, spec in (specs[entry].get("options") or {}).items():
        out[name] = "role %s (%s)" % (role, entry)
        for read in _DEFAULT_READS.findall(str(spec.get("default") or "")):
            if read not in _MAGIC and not read.startswith("_"):
                out.setdefault(read, "defaults of role %s (%s), read from the inventory" % (role, entry))
    return out


#: The filter that builds the inventory model, and where its inventory names are declared.
MODEL_FILTER = COLLECTION + ".gpu_inventory"
MODEL_SOURCE = "the inventory model (module_utils/common/gpu_inventory.py), read from the inventory"


def model_names() -> Dict[str, str]:
    """The inventory variables the inventory model reads (name: where that is declared)."""
    return dict.fromkeys(INVENTORY_NAMES, MODEL_SOURCE)


def _mentions(value: Any, needle: str) -> bool:
    if isinstance(value, str):
        return needle in value
    if isinstance(value, Mapping):
        return any(_mentions(k, needle) or _mentions(v, needle) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return any(_mentions(v, needle) for v in value)
    return False


def reads_model(playbook: str, load: Loader, root: str = COLLECTION_ROOT) -> bool:
    """Whether ``playbook`` reads the inventory model: the filter in the playbook itself, in a vars file one of its
    plays loads, or in ``vars/main.yml`` of a role whose entry point it runs (imported playbooks not included)."""
    plays = load(os.path.join(root, "playbooks", playbook)) or []
    if _mentions(plays, MODEL_FILTER):
        return True
    for play in plays:
        for path in (play.get("vars_files") or []) if isinstance(play, Mapping) else []:
            full = os.path.join(root, "playbooks", str(path))
            if os.path.isfile(full) and _mentions(load(full), MODEL_FILTER):
                return True
    for role in sorted({pair[0] for pair in playbook_uses(playbook, load, root)[0]}):
        path = os.path.join(root, "roles", role, "vars", "main.yml")
        if os.path.isfile(path) and _mentions(load(path), MODEL_FILTER):
            return True
    return False


def role_default(role: str, entry: str, name: str, load: Loader, root: str = COLLECTION_ROOT) -> Any:
    """The documented default of one role option (``meta/argument_specs.yml``), for a value read where the role does
    not run (plan.yml reads a node's settings without running the node's role): one figure, kept in one place."""
    specs = (load(os.path.join(root, "roles", role, "meta", "argument_specs.yml")) or {}).get("argument_specs") or {}
    options = (specs.get(entry) or {}).get("options") or {}
    if name not in options or "default" not in options[name]:
        raise InputsError("role %s (%s) documents no default for %s" % (role, entry, name))
    return options[name]["default"]


def allowed(playbook: str, load: Loader, root: str = COLLECTION_ROOT) -> Dict[str, str]:
    """The extra variable names ``playbook`` accepts (name: where it is documented), AWX's prefixes aside."""
    if playbook not in PLAYBOOK_INPUTS:
        raise InputsError("extra_vars_check: playbook must be one of %s, got %s" % (", ".join(ENTRY_PLAYBOOKS), clip_name(playbook)))
    entries, sets, imports = playbook_uses(playbook, load, root)
    names: Dict[str, str] = {}
    for imported in imports:
        names.update(allowed(imported, load, root))
    for role, entry in sorted(entries):
        for name, source in role_options(role, entry, load, root).items():
            names.setdefault(name, source)
    if reads_model(playbook, load, root):
        # The model's names outside the roles' namespace (proxmox_vmid, proxmox_node). Those inside it are extra
        # variables where a role entry point that documents them runs; gpu_recover_eda_relaunch is only the event
        # source's (an inventory name, documented by inventory_documented), no playbook acts on it.
        for name, source in model_names().items():
            if not name.startswith(ROLE_PREFIXES):
                names.setdefault(name, source)
    for name in sets:
        names.pop(name, None)
    for name in PLAYBOOK_INPUTS[playbook]:
        names[name] = "playbooks/%s" % playbook
    return names


def is_awx_meta(name: str) -> bool:
    return name.startswith(AWX_PREFIXES)


def undocumented(names: Iterable[Any], accepted: Mapping[str, str]) -> List[str]:
    """The names among ``names`` that ``accepted`` does not document, in the order given."""
    return [n for n in names if not (isinstance(n, str) and (n in accepted or is_awx_meta(n)))]


def refuse_undocumented(names: Iterable[Any], playbook: str, accepted: Mapping[str, str], first_task: bool = True) -> None:
    """Raise :class:`InputsError` naming each undocumented extra variable with the closest documented name
    (``first_task``: raised by the playbook's first task, before anything has run)."""
    bad = undocumented(names, accepted)
    if not bad:
        return
    when, done = ("before any task runs", " Nothing has been run.") if first_task else ("before this step", "")
    if "_raw_params" in bad:
        raise InputsError(
            "refused " + when + ": an extra variable in key=value form has a space in its value (-e "
            "'plan_requested_gb=44 GiB' reads as plan_requested_gb=44 and a stray word 'GiB', so its unit would be "
            "lost). Sizes are bare whole numbers (decimal GB per rank, no unit); for a value with spaces use JSON or "
            "YAML: -e '{\"name\": \"value with spaces\"}'." + done)
    parts = []
    for name in bad[:10]:
        close = difflib.get_close_matches(name[:200], list(accepted), n=1, cutoff=0.6) if isinstance(name, str) else []
        parts.append(clip_name(name) + (" (did you mean %s?)" % close[0] if close else ""))
    if len(bad) > 10:
        parts.append("and %d more" % (len(bad) - 10))
    raise InputsError(
        "refused %s: %s does not accept the extra variable%s %s. Extra variables (-e, -e @file, "
        "AWX survey answers) outrank every value the playbook and its roles compute, so only the names it documents "
        "are accepted (docs/safety.md lists them: the roles' meta/argument_specs.yml and the playbook's own inputs). "
        "Remove %s, or correct the name.%s"
        % (when, playbook, "" if len(bad) == 1 else "s", "; ".join(parts), "it" if len(bad) == 1 else "them", done))


def collection_playbook(arg: str) -> Optional[str]:
    """The file name of this collection's playbook that ``arg`` names by FQCN (``inferops.gpu_inference.recover``
    -> ``recover.yml``; ansible-playbook runs a collection's playbook by that name), else None."""
    prefix = COLLECTION + "."
    if arg.startswith(prefix):
        stem = arg[len(prefix):]
        stem = stem[:-4] if stem.endswith(".yml") else stem
        if stem + ".yml" in PLAYBOOK_INPUTS:
            return stem + ".yml"
    return None


def entry_playbook(task_playbook: str, task_dir: str, cli_playbooks: Iterable[str], load: Loader,
                   root: str = COLLECTION_ROOT) -> str:
    """Which playbook's list applies to a check in ``task_playbook`` (whose file is in ``task_dir``): the one run from
    the command line when it imports ``task_playbook`` from the same directory (recover.yml importing deploy.yml),
    else ``task_playbook`` itself."""
    for path in cli_playbooks:
        name = os.path.basename(str(path))
        same_dir = os.path.realpath(os.path.dirname(os.path.abspath(str(path)))) == os.path.realpath(task_dir)
        fqcn = collection_playbook(str(path))
        if fqcn:
            # ansible-playbook inferops.gpu_inference.recover (as ansible-rulebook's run_playbook starts it): the
            # collection's own playbook, which imports deploy.yml from the same folder.
            name, same_dir = fqcn, os.path.realpath(task_dir) == os.path.realpath(os.path.join(root, "playbooks"))
        if name in PLAYBOOK_INPUTS and name != task_playbook and same_dir:
            if task_playbook in playbook_uses(name, load, root)[2]:
                return name
    return task_playbook


#: Prefixes of the roles' public settings (what an operator, the inventory or a survey sets); the one list.
ROLE_PREFIXES = ("sglang_server_", "pve_gpu_container_", "gpu_recover_")


def run_entry(cli_playbooks: Iterable[str], root: str = COLLECTION_ROOT) -> Optional[str]:
    """The collection's entry playbook this run was started with (a checkout or an AWX project copy of it: a
    ``playbooks/`` folder beside ``roles/sglang_server``), or None for an operator's own playbook."""
    for path in cli_playbooks:
        if collection_playbook(str(path)):
            return collection_playbook(str(path))
        name = os.path.basename(str(path))
        books = os.path.dirname(os.path.abspath(str(path)))
        if name in PLAYBOOK_INPUTS and os.path.isfile(os.path.join(books, "..", "roles", "sglang_server", "meta", "argument_specs.yml")):
            return name
    return None


def role_documented(load: Loader, root: str = COLLECTION_ROOT) -> Set[str]:
    """Every option of every entry point of the collection's roles."""
    names: Set[str] = set()
    for role in sorted(os.listdir(os.path.join(root, "roles"))):
        path = os.path.join(root, "roles", role, "meta", "argument_specs.yml")
        if os.path.isfile(path):
            for entry in (load(path) or {}).get("argument_specs") or {}:
                names.update(n for n in role_options(role, entry, load, root) if n.startswith(ROLE_PREFIXES))
    return names


def refuse_for_run(names: Iterable[Any], cli_playbooks: Iterable[str], load: Loader, root: str = COLLECTION_ROOT) -> None:
    """The check for an action the roles run (sglang_deploy_plan), at every stage (a run started with
    --start-at-task skips the playbook's first task): the entry playbook's allow-list when the run was started with
    one of the collection's playbooks; in an operator's own playbook, the roles' namespace only (a name of the roles'
    form, ``sglang_server_*`` or ``_``/``__`` before it, that no role entry point documents)."""
    names = list(names)
    entry = run_entry(cli_playbooks, root)
    if entry:
        refuse_undocumented(names, entry, allowed(entry, load, root), first_task=False)
        return
    documented = role_documented(load, root)
    ours = [n for n in names if isinstance(n, str) and n.lstrip("_").startswith(ROLE_PREFIXES)]
    refuse_undocumented(ours, "this playbook (with the roles of %s)" % COLLECTION, dict.fromkeys(documented, ""), first_task=False)


def markdown(load: Loader, root: str = COLLECTION_ROOT) -> str:
    """docs/safety.md's list of each playbook's accepted extra variables (generated; see the module's doc)."""
    lines = []
    for playbook in ENTRY_PLAYBOOKS:
        names = allowed(playbook, load, root)
        own = list(PLAYBOOK_INPUTS[playbook])
        by_source: Dict[str, List[str]] = {}
        for name, source in names.items():
            if name not in own:
                by_source.setdefault(source, []).append(name)
        lines.append("- `%s` (%d names):" % (playbook, len(names)))
        lines.extend("  - `%s`: %s." % (n, PLAYBOOK_INPUTS[playbook][n]) for n in own)
        for source in sorted(by_source):
            lines.append("  - From %s: %s." % (source, ", ".join("`%s`" % n for n in sorted(by_source[source]))))
    lines.append("- Every playbook: AWX's job variables (`awx_*`, `tower_*`).")
    return "\n".join(lines) + "\n"


# --- The inventory's names -------------------------------------------------------------------------------------------
# Extra variables are checked against each playbook's allow-list above. A name in the inventory (host_vars,
# group_vars, the inventory files) cannot outrank what the playbooks compute, but a misspelt one is silently ignored:
# sglang_server_hicache_request_gb: 300 would plan the size the plan picks. So the first play of each entry playbook
# reports every inventory variable of the hosts it concerns that is in the collection's namespace and that nothing
# documents, with the closest documented name.

#: The inventory switch: ``refuse`` (default) or ``warn``, per host (set it in group_vars/all for a whole site).
UNKNOWN_SWITCH = "inferops_unknown_variables"
UNKNOWN_MODES = ("refuse", "warn")
#: The prefixes the collection owns in an inventory: the roles' and the playbooks' own (plan_*, recover_*), and the
#: collection's switches (inferops_*). A name that starts with a misspelling of one (sglang_sever_) is ours too.
INVENTORY_PREFIXES = ROLE_PREFIXES + ("plan_", "recover_", "inferops_")
#: Variables read from the inventory outside the roles' argument_specs (name: what reads it).
INVENTORY_INPUTS: Dict[str, str] = {
    "proxmox_node_ssh_host_keys": "the node's pinned SSH host keys (playbooks/tasks/pin_node_host_keys.yml)",
    UNKNOWN_SWITCH: "refuse (default) or warn: what an unknown inventory variable of the collection's namespace gets",
}


def edit_distance(a: str, b: str, limit: int = 3) -> int:
    """Levenshtein distance between ``a`` and ``b``, with adjacent transpositions counted once; any distance above
    ``limit`` is returned as ``limit + 1``."""
    if abs(len(a) - len(b)) > limit:
        return limit + 1
    prev2: List[int] = []
    prev = list(range(len(b) + 1))
    for i in range(1, len(a) + 1):
        cur = [i] + [0] * len(b)
        for j in range(1, len(b) + 1):
            cur[j] = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] != b[j - 1]))
            if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                cur[j] = min(cur[j], prev2[j - 2] + 1)
        if min(cur) > limit:
            return limit + 1
        prev2, prev = prev, cur
    return min(prev[-1], limit + 1)


def _prefix_slack(prefix: str) -> int:
    """How many edits a prefix may be off and still be taken for it: 2 for the long ones, 1 for plan_ and the like."""
    return 2 if len(prefix) >= 10 else 1


def in_namespace(name: str) -> bool:
    """True when ``name`` is in the collection's namespace: it starts with one of :data:`INVENTORY_PREFIXES`, or its
    leading words (up to an ``_``) are a near miss of one (``sglang_sever_version``, ``pve_gpu_contaner_gpus``)."""
    if name.startswith(INVENTORY_PREFIXES):
        return True
    for i, char in enumerate(name):
        if char == "_" and i > 0:
            head = name[: i + 1]
            if any(edit_distance(head, p, _prefix_slack(p)) <= _prefix_slack(p) for p in INVENTORY_PREFIXES):
                return True
    return False


def inventory_documented(load: Loader, root: str = COLLECTION_ROOT) -> Dict[str, str]:
    """Every name an inventory may set for the collection (name: where it is documented): every option of every
    entry point of its roles, the inventory variables their defaults read (``proxmox_api_host``), those the inventory
    model reads (``proxmox_vmid``), and :data:`INVENTORY_INPUTS`."""
    names: Dict[str, str] = {}
    for role in sorted(os.listdir(os.path.join(root, "roles"))):
        path = os.path.join(root, "roles", role, "meta", "argument_specs.yml")
        if os.path.isfile(path):
            for entry in (load(path) or {}).get("argument_specs") or {}:
                for name, source in role_options(role, entry, load, root).items():
                    names.setdefault(name, source)
    for name, source in model_names().items():
        names.setdefault(name, source)
    names.update(INVENTORY_INPUTS)
    return names


def _closest(name: str, documented: Iterable[str]) -> Optional[str]:
    """The documented name closest to ``name``: the fewest edits, else difflib's best match."""
    documented = sorted(documented)
    best = min(documented, key=lambda d: (edit_distance(name, d, 3), d), default=None)
    if best is not None and edit_distance(name, best, 3) <= 3:
        return best
    close = difflib.get_close_matches(name, documented, n=1, cutoff=0.8)
    return close[0] if close else None


def unknown_inventory_names(names: Iterable[Any], documented: Mapping[str, str]) -> List[Tuple[str, str]]:
    """The inventory names among ``names`` that nothing documents, each with what to say about it: the closest
    documented name, or that it is a playbook's extra variable (given with -e, not read from the inventory).

    A name is judged when it is public (no leading ``_``: private names have their own check, and the rest of an
    inventory is the site's own) and either in the collection's namespace (:func:`in_namespace`) or within two edits
    of a documented name outside it (``proxmox_vmdi`` for ``proxmox_vmid``)."""
    others = [d for d in documented if not d.startswith(INVENTORY_PREFIXES)]
    extra_inputs = {n: p for p in ENTRY_PLAYBOOKS for n in PLAYBOOK_INPUTS[p]}
    out: List[Tuple[str, str]] = []
    for name in names:
        if not isinstance(name, str) or name.startswith("_") or name in documented:
            continue
        near_other = len(name) >= 8 and any(edit_distance(name, d, 2) <= 2 for d in others)
        if not (in_namespace(name) or near_other):
            continue
        if name in extra_inputs:
            hint = "an extra variable of %s: give it with -e, the inventory's value is not read" % extra_inputs[name]
        else:
            close = _closest(name[:200], documented)
            hint = "did you mean %s?" % close if close else "no documented name is close"
        out.append((name, hint))
    return out


def unknown_mode(value: Any, host: str) -> str:
    """The switch's value for ``host``: refuse when not set; an unknown value is refused (never taken for warn)."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return "refuse"
    text = str(value).strip().lower()
    if text not in UNKNOWN_MODES:
        raise InputsError("%s=%s (inventory of %s) must be refuse or warn. Nothing has been run."
                          % (UNKNOWN_SWITCH, clip_name(value), clip_name(host)))
    return text


def inventory_message(found: Mapping[str, List[Tuple[str, str]]], refused: bool) -> str:
    """The text for the unknown inventory names ``found`` (host: [(name, hint)]), refused or warned about."""
    parts = []
    for host in found:
        items = found[host]
        shown = "; ".join("%s (%s)" % (clip_name(n), h) for n, h in items[:10])
        more = " and %d more" % (len(items) - 10) if len(items) > 10 else ""
        parts.append("%s: %s%s" % (clip_name(host), shown, more))
    names = sum(len(v) for v in found.values())
    head = ("refused before any task runs: the inventory gives " if refused else "the inventory gives ")
    text = (head + "variable%s in the namespace of %s that no role or playbook of it documents, so %s would be "
            "ignored: %s. The documented names are the roles' meta/argument_specs.yml options (docs/safety.md, "
            "\"Inventory variables\"). Correct the name in host_vars, group_vars or the inventory file, or remove it."
            % ("" if names == 1 else "s", COLLECTION, "its value" if names == 1 else "their values", " | ".join(parts)))
    if refused:
        return text + (" To be warned instead of refused, set %s: warn for the host (e.g. in group_vars/all). "
                       "Nothing has been run." % UNKNOWN_SWITCH)
    return text + " (%s: warn)" % UNKNOWN_SWITCH
