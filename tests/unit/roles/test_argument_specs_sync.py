"""Each role's meta/argument_specs.yml agrees with its defaults/main.yml, for every entry point.

Ansible never takes a role variable's value from an argument spec's `default:` (the value always comes from
defaults/main.yml); the spec's `default:` is documentation (ansible-doc, the Galaxy page), and a missing one
reads as null. So the two files must say the same thing:

1. every public variable defaults/main.yml sets is an option of at least one entry point (a role with several
   entry points splits them: pve_gpu_container's node settings are under `main`, the container's under
   `container_spec`); names starting with `_` are private and left out;
2. an option that carries `default:` is a variable defaults/main.yml sets, with the same YAML-loaded value
   (a templated default is compared as the string it is; true is not 1);
3. an option that defaults/main.yml does not set carries no `default:` (its real default is undefined);
4. an option documented without `default:` whose variable defaults/main.yml sets: allowed only when that value
   is null (what a missing `default:` means) or a templated string, whose computed value the description
   explains in words (gpu_recover_report_dir); a literal such as [] or 0 must be written as `default:`;
5. an option documented in several entry points of a role has the same type (and elements) in each;
6. every literal (untemplated) default passes its option's type check, with Ansible's own validator.
"""

from __future__ import annotations

import os
import shutil

import pytest
import yaml

from ansible.module_utils.common.arg_spec import ArgumentSpecValidator

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
ROLES_DIR = os.path.join(ROOT, "roles")
EXPECTED_ROLES = {"gpu_recover", "pve_gpu_container", "sglang_server"}


class _Loader(yaml.SafeLoader):
    """safe_load, plus Ansible's !unsafe and !vault tags (kept as strings; neither is compared as a template)."""


_Loader.add_constructor("!unsafe", lambda loader, node: loader.construct_scalar(node))
_Loader.add_constructor("!vault", lambda loader, node: loader.construct_scalar(node))


def _load(path):
    with open(path, encoding="utf-8") as f:
        return yaml.load(f, Loader=_Loader)  # noqa: S506 - a SafeLoader subclass


def _templated(value):
    return isinstance(value, str) and ("{{" in value or "{%" in value)


def _same(a, b):
    """Equal as YAML values: bool apart from int (True == 1 in Python), int and float alike (10 == 10.0)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


def load_role(role_dir):
    """(defaults, {entry point: options}) of a role directory."""
    defaults_path = os.path.join(role_dir, "defaults", "main.yml")
    defaults = (_load(defaults_path) or {}) if os.path.exists(defaults_path) else {}
    specs_path = os.path.join(role_dir, "meta", "argument_specs.yml")
    if os.path.exists(specs_path):
        specs = (_load(specs_path) or {}).get("argument_specs") or {}
    else:  # argument_specs may also sit in meta/main.yml
        meta_path = os.path.join(role_dir, "meta", "main.yml")
        specs = ((_load(meta_path) or {}).get("argument_specs") or {}) if os.path.exists(meta_path) else {}
    return defaults, {ep: (spec or {}).get("options") or {} for ep, spec in specs.items()}


def _type_errors(name, option, value):
    """Messages of Ansible's validator for one option given one value (empty when it passes)."""
    keep = ("type", "elements", "choices", "options")
    spec = {name: {k: v for k, v in option.items() if k in keep}}
    result = ArgumentSpecValidator(spec).validate({name: value})
    return [str(e) for e in result.errors]


def check_role(role_dir):
    """Every disagreement between a role's defaults/main.yml and meta/argument_specs.yml, as sentences."""
    role = os.path.basename(os.path.normpath(role_dir))
    defaults, entry_points = load_role(role_dir)
    problems = []
    if not isinstance(defaults, dict):
        return [f"{role}: defaults/main.yml is not a mapping"]
    public = {k: v for k, v in defaults.items() if not str(k).startswith("_")}
    if public and not entry_points:
        return [f"{role}: defaults/main.yml sets {len(public)} variables but meta/argument_specs.yml has no entry point"]

    documented = {}
    for ep, options in entry_points.items():
        for name in options:
            documented.setdefault(name, []).append(ep)

    # 1. Every public default is documented somewhere.
    for name in public:
        if name not in documented:
            problems.append(f"{role}: defaults/main.yml sets {name} = {public[name]!r}, "
                            f"documented in no entry point ({', '.join(entry_points)})")

    for ep, options in entry_points.items():
        for name, option in options.items():
            option = option or {}
            where = f"{role}: entry point {ep}, option {name}"
            has_default = "default" in option
            if name in defaults:
                value = defaults[name]
                if has_default:
                    # 2. A documented default is the role's default.
                    if not _same(option["default"], value):
                        problems.append(f"{where}: argument_specs default {option['default']!r} "
                                        f"!= defaults/main.yml {value!r}")
                elif value is not None and not _templated(value):
                    # 4. A missing `default:` means null; a literal default must be written out.
                    problems.append(f"{where}: no default in argument_specs (reads as null) but defaults/main.yml "
                                    f"sets {value!r}")
            elif has_default:
                # 3. No default in the role, so none in the docs.
                problems.append(f"{where}: argument_specs default {option['default']!r} but defaults/main.yml "
                                f"does not set it")

    # 5. The same option has the same type in every entry point.
    for name, eps in documented.items():
        shapes = {ep: ((entry_points[ep][name] or {}).get("type", "str"),
                       (entry_points[ep][name] or {}).get("elements")) for ep in eps}
        if len(set(shapes.values())) > 1:
            problems.append(f"{role}: option {name} differs between entry points: "
                            + ", ".join(f"{ep} type={t} elements={e}" for ep, (t, e) in shapes.items()))

    # 6. Literal defaults pass their own type check.
    for name, value in public.items():
        if value is None or _templated(value) or name not in documented:
            continue
        for ep in documented[name]:
            for err in _type_errors(name, entry_points[ep][name] or {}, value):
                problems.append(f"{role}: entry point {ep}: defaults/main.yml {name} = {value!r} fails its type: {err}")
    return problems


def _roles():
    return sorted(d for d in os.listdir(ROLES_DIR) if os.path.isdir(os.path.join(ROLES_DIR, d)))


def test_every_role_is_checked():
    assert EXPECTED_ROLES <= set(_roles())
    for role in _roles():
        defaults, entry_points = load_role(os.path.join(ROLES_DIR, role))
        assert defaults and entry_points, role


@pytest.mark.parametrize("role", _roles())
def test_argument_specs_agree_with_defaults(role):
    problems = check_role(os.path.join(ROLES_DIR, role))
    assert not problems, "\n".join(problems)


# --- The checker can fail: planted disagreements in a copy of a role -----------------------------------------

def _write(path, data):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        if isinstance(data, str):
            f.write(data)
        else:
            yaml.safe_dump(data, f, sort_keys=False)


GOOD_DEFAULTS = """\
---
demo_port: 30000
demo_enabled: false
demo_args: [--a, --b]
demo_user: "{{ lookup('ansible.builtin.env', 'USER') }}"
demo_report_dir: >-
  {{ lookup('ansible.builtin.env', 'HOME') ~ '/reports' }}
demo_limit: null
_demo_private: 1
"""

GOOD_SPECS = {"argument_specs": {
    "main": {"options": {
        "demo_port": {"type": "int", "default": 30000},
        "demo_enabled": {"type": "bool", "default": False},
        "demo_args": {"type": "list", "elements": "str", "default": ["--a", "--b"]},
        "demo_user": {"type": "str", "default": "{{ lookup('ansible.builtin.env', 'USER') }}"},
        "demo_report_dir": {"type": "str"},  # templated, explained in words
        "demo_limit": {"type": "int"},  # null
        "demo_node_state": {"type": "dict", "required": True},  # the caller passes it
    }},
    "sub": {"options": {"demo_port": {"type": "int", "default": 30000}}},
}}


def _plant(tmp_path, defaults=GOOD_DEFAULTS, specs=None, edit=None):
    role = tmp_path / "demo"
    _write(str(role / "defaults" / "main.yml"), defaults)
    specs = yaml.safe_load(yaml.safe_dump(specs or GOOD_SPECS))
    if edit:
        edit(specs["argument_specs"])
    _write(str(role / "meta" / "argument_specs.yml"), specs)
    return str(role)


def test_the_planted_role_is_clean(tmp_path):
    assert check_role(_plant(tmp_path)) == []


def _set(ep, name, **kw):
    def edit(specs):
        specs[ep]["options"][name].update(kw)
    return edit


def _drop(ep, name, key=None):
    def edit(specs):
        if key:
            del specs[ep]["options"][name][key]
        else:
            del specs[ep]["options"][name]
    return edit


@pytest.mark.parametrize("defaults, edit, expected", [
    pytest.param(GOOD_DEFAULTS + "demo_extra: 1\n", None, "sets demo_extra = 1, documented in no entry point",
                 id="undocumented-default"),
    pytest.param(GOOD_DEFAULTS, _set("main", "demo_port", default=30001),
                 "option demo_port: argument_specs default 30001 != defaults/main.yml 30000", id="different-value"),
    pytest.param(GOOD_DEFAULTS, _set("sub", "demo_port", default=30001),
                 "entry point sub, option demo_port: argument_specs default 30001", id="different-in-second-entry-point"),
    pytest.param(GOOD_DEFAULTS, _set("main", "demo_enabled", default=0),
                 "option demo_enabled: argument_specs default 0 != defaults/main.yml False", id="bool-is-not-int"),
    pytest.param(GOOD_DEFAULTS, _set("main", "demo_args", default=["--a"]),
                 "option demo_args: argument_specs default ['--a']", id="different-list"),
    pytest.param(GOOD_DEFAULTS, _set("main", "demo_user", default="{{ lookup('ansible.builtin.env', 'LOGNAME') }}"),
                 "option demo_user: argument_specs default \"{{ lookup('ansible.builtin.env', 'LOGNAME') }}\"",
                 id="different-template"),
    pytest.param(GOOD_DEFAULTS, _set("main", "demo_node_state", default={}),
                 "option demo_node_state: argument_specs default {} but defaults/main.yml does not set it",
                 id="default-for-unset-variable"),
    pytest.param(GOOD_DEFAULTS, _drop("main", "demo_port", "default"),
                 "option demo_port: no default in argument_specs (reads as null) but defaults/main.yml sets 30000",
                 id="literal-default-undocumented"),
    pytest.param(GOOD_DEFAULTS, _set("main", "demo_limit", default=5),
                 "option demo_limit: argument_specs default 5 != defaults/main.yml None", id="null-documented-as-value"),
    pytest.param(GOOD_DEFAULTS, _set("sub", "demo_port", type="str", default="30000"),
                 "option demo_port differs between entry points", id="type-differs-between-entry-points"),
    pytest.param(GOOD_DEFAULTS.replace("demo_port: 30000", "demo_port: many"), _set("main", "demo_port", default="many"),
                 "demo_port = 'many' fails its type", id="literal-default-wrong-type"),
    pytest.param(GOOD_DEFAULTS, _drop("main", "demo_enabled"), "sets demo_enabled = False, documented in no entry point",
                 id="option-removed"),
])
def test_the_checker_reports_a_planted_disagreement(tmp_path, defaults, edit, expected):
    problems = check_role(_plant(tmp_path, defaults, edit=edit))
    assert any(expected in p for p in problems), problems


def test_the_checker_fails_on_a_real_role_with_one_changed_default(tmp_path):
    """A copy of sglang_server whose defaults/main.yml moves one port: the checker names the variable, both values."""
    copy = tmp_path / "sglang_server"
    shutil.copytree(os.path.join(ROLES_DIR, "sglang_server", "defaults"), copy / "defaults")
    shutil.copytree(os.path.join(ROLES_DIR, "sglang_server", "meta"), copy / "meta")
    path = copy / "defaults" / "main.yml"
    text = path.read_text(encoding="utf-8")
    assert "\nsglang_server_port: 30000\n" in text
    path.write_text(text.replace("\nsglang_server_port: 30000\n", "\nsglang_server_port: 30001\n"), encoding="utf-8")
    problems = check_role(str(copy))
    assert ("sglang_server: entry point main, option sglang_server_port: argument_specs default 30000 "
            "!= defaults/main.yml 30001") in problems, problems
