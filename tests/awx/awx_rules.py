"""AWX's own validation rules for surveys and custom credential types, written down from its source.

Survey specs: ``awx/api/views/__init__.py`` ``JobTemplateSurveySpec._validate_spec_data`` (what the API refuses
when the spec is saved) and ``awx/main/models/mixins.py`` ``SurveyJobTemplateMixin._survey_element_validation``
(what a launch refuses; a default that fails it is silently not applied). Credential types:
``awx/main/fields.py`` ``CredentialTypeInputField`` / ``CredentialTypeInjectorField`` and
``awx/main/constants.py`` ``ENV_BLOCKLIST`` (ansible/awx at e21dd0a0933fd544d1fe2513c54fe41203775eb5).
"""

from __future__ import annotations

import re
from typing import Any, Dict, List, Mapping

from jinja2 import StrictUndefined
from jinja2.exceptions import SecurityError, TemplateSyntaxError, UndefinedError
from jinja2.sandbox import ImmutableSandboxedEnvironment

SURVEY_TYPE_MAPPING = {"text": str, "textarea": str, "password": str, "multiplechoice": str, "multiselect": str,
                       "integer": int, "float": (float, int)}
ENV_BLOCKLIST = frozenset((
    "VIRTUAL_ENV", "PATH", "PYTHONPATH", "JOB_ID", "INVENTORY_ID", "INVENTORY_SOURCE_ID", "INVENTORY_UPDATE_ID",
    "AD_HOC_COMMAND_ID", "REST_API_URL", "REST_API_TOKEN", "MAX_EVENT_RES", "CALLBACK_QUEUE", "CALLBACK_CONNECTION",
    "CACHE", "JOB_CALLBACK_DEBUG", "INVENTORY_HOSTVARS", "AWX_HOST", "PROJECT_REVISION", "SUPERVISOR_CONFIG_PATH",
))
IDENTIFIER = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")


def _choices(value: Any) -> List[str]:
    if isinstance(value, str):
        return [c for c in value.splitlines() if c.strip() != ""]
    return list(value or [])


def element_errors(item: Mapping[str, Any], data: Mapping[str, Any]) -> List[str]:
    """SurveyJobTemplateMixin._survey_element_validation for one answer set ``data``."""
    var, qtype = item["variable"], item["type"]
    errors: List[str] = []
    if var not in data:
        return ["'%s' value missing" % var] if item["required"] else []
    value = data[var]
    if qtype in ("text", "textarea", "password"):
        if not isinstance(value, str):
            return ["Value %s for '%s' expected to be a string." % (value, var)]
        if item.get("min") not in ("", None) and len(value) < int(item["min"]):
            errors.append("'%s' value %s is too small (length must be at least %s)." % (var, value, item["min"]))
        if item.get("max") not in ("", None) and len(value) > int(item["max"]):
            errors.append("'%s' value %s is too large (must be no more than %s)." % (var, value, item["max"]))
    elif qtype in ("integer", "float"):
        if (qtype == "integer" and type(value) is not int) or (qtype == "float" and type(value) not in (float, int)):
            return ["Value %s for '%s' expected to be %s." % (value, var, "an integer" if qtype == "integer" else "a numeric type")]
        if item.get("min") not in ("", None) and value < item["min"]:
            errors.append("'%s' value %s is too small (must be at least %s)." % (var, value, item["min"]))
        if item.get("max") not in ("", None) and value > item["max"]:
            errors.append("'%s' value %s is too large (must be no more than %s)." % (var, value, item["max"]))
    elif qtype == "multiselect":
        if type(value) is not list:
            return ["'%s' value is expected to be a list." % var]
        errors += ["Value %s for '%s' expected to be one of %s." % (v, var, _choices(item["choices"]))
                   for v in value if v not in _choices(item["choices"])]
    elif qtype == "multiplechoice":
        if value not in _choices(item["choices"]):
            errors.append("Value %s for '%s' expected to be one of %s." % (value, var, _choices(item["choices"])))
    return errors


def survey_errors(spec: Any) -> List[str]:
    """Everything AWX would refuse in ``spec`` when it is saved or a launch uses its defaults, and what Ansible
    needs (variable names that are identifiers; password defaults empty or AWX's $encrypted$ placeholder)."""
    errors: List[str] = []
    if not isinstance(spec, Mapping):
        return ["the survey spec must be a dict with name, description and spec"]
    for field, kind in (("name", str), ("description", str), ("spec", list)):
        if field not in spec:
            errors.append("Field '%s' is missing from survey spec." % field)
        elif not isinstance(spec[field], kind):
            errors.append("Expected %s for field '%s'." % (kind.__name__, field))
    if errors:
        return errors
    if not spec["spec"]:
        return ["'spec' doesn't contain any items."]
    seen = set()
    for idx, item in enumerate(spec["spec"]):
        where = "question %d" % idx
        if not isinstance(item, Mapping):
            errors.append("Survey %s is not a json object." % where)
            continue
        missing = [f for f in ("type", "question_name", "variable", "required") if f not in item]
        if missing:
            errors.append("'%s' missing from survey %s" % ("', '".join(missing), where))
            continue
        for f in ("type", "question_name", "variable"):
            if not isinstance(item[f], str):
                errors.append("'%s' in survey %s expected to be string." % (f, where))
        if not isinstance(item["required"], bool):
            errors.append("'required' in survey %s expected to be boolean." % where)
        if errors:
            continue
        var, qtype = item["variable"], item["type"]
        where = "%s (%s)" % (where, var)
        if var in seen:
            errors.append("'variable' '%s' duplicated in survey %s." % (var, where))
        seen.add(var)
        if not IDENTIFIER.match(var):
            errors.append("variable %r in survey %s is not a valid Ansible variable name" % (var, where))
        if qtype not in SURVEY_TYPE_MAPPING:
            errors.append("'%s' in survey %s is not one of the allowed question types %s" % (qtype, where, sorted(SURVEY_TYPE_MAPPING)))
            continue
        if "default" in item and item["default"] != "" and item["default"] is not None \
                and not isinstance(item["default"], SURVEY_TYPE_MAPPING[qtype]):
            errors.append("Default value %r in survey %s expected to be %s." % (item["default"], where, qtype))
        for key in ("min", "max"):
            if key in item and item[key] is not None and (isinstance(item[key], bool) or not isinstance(item[key], int)):
                errors.append("The %s limit in survey %s expected to be integer." % (key, where))
        if qtype in ("multiplechoice", "multiselect"):
            if "choices" not in item:
                errors.append("Survey %s of type %s must specify choices." % (where, qtype))
                continue
            choices = _choices(item["choices"])
            if len(set(choices)) != len(choices) or not choices:
                errors.append("choices of survey %s are empty or repeated: %r" % (where, choices))
            if "default" in item and item["default"] not in ("", None):
                defaults = _choices(item["default"]) if isinstance(item["default"], str) else list(item["default"])
                if qtype == "multiplechoice" and len(defaults) > 1:
                    errors.append("Multiple Choice (Single Select) can only have one default value (%s)." % where)
                if any(d not in choices for d in defaults):
                    errors.append("Default choice must be answered from the choices listed (%s)." % where)
        if qtype == "password" and item.get("default") not in (None, "", "$encrypted$"):
            errors.append("survey %s: a password default must be empty or $encrypted$, never a secret in the file" % where)
        if isinstance(item.get("default"), str) and item["default"].startswith("$encrypted$") and qtype != "password":
            errors.append("$encrypted$ is a reserved keyword for password question defaults (%s)." % where)
        # A default that fails the launch-time validation is silently not applied (SurveyJobTemplateMixin).
        if item.get("default") is not None and qtype != "password":
            default = item["default"]
            if qtype == "multiselect" and isinstance(default, str):
                default = _choices(default)
            for e in element_errors(item, {var: default}):
                errors.append("the default of survey %s would be dropped by AWX: %s" % (where, e))
    return errors


CREDENTIAL_FIELD_KEYS = {"type", "format", "choices", "id", "label", "help_text", "multiline", "secret", "ask_at_runtime", "default"}


def _render_all(injectors: Mapping[str, Any], namespace: Mapping[str, Any], undefined=None) -> Dict[str, Any]:
    env = ImmutableSandboxedEnvironment(undefined=undefined) if undefined else ImmutableSandboxedEnvironment()
    out: Dict[str, Any] = {}
    for kind in ("file", "env", "extra_vars"):
        out[kind] = {k: env.from_string(v).render(**namespace) for k, v in (injectors.get(kind) or {}).items()}
    return out


def credential_type_errors(ct: Any) -> List[str]:
    """CredentialTypeInputField and CredentialTypeInjectorField validation of one custom credential type."""
    if not isinstance(ct, Mapping):
        return ["a credential type must be a dict"]
    errors: List[str] = []
    if not isinstance(ct.get("name"), str) or not ct["name"]:
        errors.append("name is required")
    if ct.get("kind") not in ("cloud", "net"):
        errors.append("kind must be cloud or net for a custom credential type, got %r" % ct.get("kind"))
    inputs = ct.get("inputs") or {}
    if set(inputs) - {"fields", "required"}:
        errors.append("inputs has unknown keys %s" % sorted(set(inputs) - {"fields", "required"}))
    ids = []
    for field in inputs.get("fields") or []:
        unknown = set(field) - CREDENTIAL_FIELD_KEYS
        if unknown:
            errors.append("input field %s has keys AWX refuses: %s" % (field.get("id"), sorted(unknown)))
        if "id" not in field or "label" not in field:
            errors.append("input field %r needs id and label" % field)
            continue
        if not re.match(r"^[a-zA-Z_]+[a-zA-Z0-9_]*$", field["id"]):
            errors.append("%s is an invalid variable name" % field["id"])
        if field["id"] == "tower":
            errors.append('"tower" is a reserved field name')
        if field["id"] in ids:
            errors.append("field IDs must be unique (%s)" % field["id"])
        ids.append(field["id"])
        ftype = field.get("type", "string")
        if ftype not in ("string", "boolean"):
            errors.append("field %s: type must be string or boolean" % field["id"])
        for key in ("choices", "multiline", "format", "secret"):
            if key in field and ftype != "string":
                errors.append("%s not allowed for %s type (%s)" % (key, ftype, field["id"]))
        if "format" in field and field["format"] not in ("ssh_private_key", "url"):
            errors.append("field %s: format must be ssh_private_key or url" % field["id"])
    for rid in inputs.get("required") or []:
        if rid not in ids:
            errors.append("required names %s, which is no input field" % rid)
    injectors = ct.get("injectors") or {}
    if set(injectors) - {"file", "env", "extra_vars"}:
        errors.append("injectors has unknown keys %s" % sorted(set(injectors) - {"file", "env", "extra_vars"}))
    files = list((injectors.get("file") or {}).keys())
    for key in files:
        if not re.match(r"^template(\.[a-zA-Z_]+[a-zA-Z0-9_]*)?$", key):
            errors.append("file injector key %s must be template or template.<name>" % key)
    if "template" in files and len(files) > 1:
        errors.append("Must use multi-file syntax when injecting multiple files")
    for var, value in (injectors.get("env") or {}).items():
        if not re.match(r"^[a-zA-Z_]+[a-zA-Z0-9_]*$", var):
            errors.append("env var name %s is invalid" % var)
        if var.startswith("ANSIBLE_"):
            errors.append("Environment variable %s may affect Ansible configuration so its use is not allowed in credentials." % var)
        if var in ENV_BLOCKLIST:
            errors.append("Environment variable %s is not allowed to be used in credentials." % var)
        if not isinstance(value, str) or not re.match(r"^[\x00-\x7F]*$", value):
            errors.append("env var %s must be an ASCII string template" % var)
    # Every template must render with every input defined (StrictUndefined), as AWX checks when it is saved.

    class _Files:
        pass
    tower = _Files()
    if "template" in files:
        tower.filename = "EXAMPLE_FILENAME"
    elif files:
        tower.filename = _Files()
        for key in files:
            setattr(tower.filename, key.split(".")[1], "EXAMPLE_FILENAME")
    try:
        _render_all(injectors, dict({i: "EXAMPLE" for i in ids}, tower=tower), StrictUndefined)
    except (UndefinedError, SecurityError, TemplateSyntaxError) as exc:
        errors.append("an injector template does not render: %s" % exc)
    return errors


def render_injectors(ct: Mapping[str, Any], inputs: Mapping[str, Any], filename: str = "/runner/env/tmpXYZ") -> Dict[str, Any]:
    """What AWX injects for a credential with ``inputs``: a field left empty is absent from the namespace."""
    class _Tower:
        pass
    tower = _Tower()
    tower.filename = filename
    namespace = {k: v for k, v in inputs.items() if isinstance(v, bool) or len(v)}
    return _render_all(ct.get("injectors") or {}, dict(namespace, tower=tower))
