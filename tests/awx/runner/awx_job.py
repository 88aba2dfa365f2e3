"""A job of this project laid out and run the way AWX lays out and runs a job template's job, without AWX.

Every rule below is AWX's, cited by file and function (ansible/awx at e21dd0a0933fd544d1fe2513c54fe41203775eb5):

- Launch: ``awx/main/models/mixins.py`` ``SurveyJobTemplateMixin._accept_or_ignore_variables`` validates the
  launch's answers alone (``_survey_element_validation``, required questions included even when they have a
  default); ``_update_unified_job_kwargs`` then adds the survey defaults that pass validation under the answers.
- Project: the job's ``project/`` is the project at its synced revision (``RunJob`` copies the project cache of
  ``scm_revision``), here ``git archive`` of a commit; project sync's ``awx/playbooks/project_update.yml`` installs
  ``collections/requirements.yml`` into ``requirements_collections``. A job template may name only a playbook
  ``Project.playbooks`` lists (``awx/main/models/projects.py``; ``could_be_playbook`` and ``skip_directory`` of
  ``awx/main/utils/ansible.py``).
- Inventory: an inventory sourced from the project is imported by ``ansible-inventory --list --export``
  (``RunInventoryUpdate.build_args``) and written for each job as a script printing JSON
  (``BaseTask.write_inventory_file`` with ``Inventory.get_script_data(hostvars=True, towervars=True)``).
- ``env/extravars``: ``RunJob.build_extra_vars_file``: the job's extra vars, then ``Job.awx_meta_vars()`` over them,
  dumped by ``awx/main/utils/safe_yaml.py`` ``safe_dump`` (every string ``!unsafe``).
- ``env/envvars``: ``BaseTask.build_env`` (the ``ANSIBLE_*`` settings of ``awx/settings/defaults.py``,
  ``AWX_PRIVATE_DATA_DIR``) and ``RunJob.build_env`` (``JOB_ID``, ``INVENTORY_ID``, ``PROJECT_REVISION``, ...), then each
  credential's ``CredentialType.inject_credential`` (``awx/main/models/credential.py``). Nothing of the caller's
  environment: a job runs in its execution environment's.
- ``env/cmdline``: ``RunJob.build_args`` (``--check``, ``-u`` the Machine credential's user or root, ``-l``) and the
  ``-e @file`` of credentials' extra_vars injectors. ``env/settings``: ``BaseTask.run``'s ``runner_settings``.
- What is kept: ``status``, ``artifacts`` (the ``artifact_data`` of the ``playbook_on_stats`` event,
  ``awx/main/tasks/callback.py`` ``RunnerCallback.event_handler``) and the events' stdout; the private data dir is
  deleted after the job (``AWX_CLEANUP_PATHS``, ``BaseTask.run``'s finally).
"""
from __future__ import annotations

import configparser
import glob
import json
import os
import re
import shlex
import shutil
import stat
import subprocess
import sys
import tempfile
from copy import copy
from typing import Any, Dict, List, Mapping, Optional, Tuple

import yaml
from jinja2.sandbox import ImmutableSandboxedEnvironment

AWX_COMMIT = "e21dd0a0933fd544d1fe2513c54fe41203775eb5"
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
BIN = os.path.dirname(sys.executable)

# awx/settings/defaults.py: the ANSIBLE_* settings BaseTask.build_env copies into every job's environment.
AWX_ANSIBLE_SETTINGS = {
    "ANSIBLE_HOST_KEY_CHECKING": "False",
    "ANSIBLE_PARAMIKO_RECORD_HOST_KEYS": "False",
    "ANSIBLE_FORCE_COLOR": "True",
    "ANSIBLE_INVENTORY_UNPARSED_FAILED": "True",
}
# awx/main/constants.py ENV_BLOCKLIST and CredentialTypeInjectorField.validate_env_var_allowed (ANSIBLE_*).
ENV_BLOCKLIST = frozenset((
    "VIRTUAL_ENV", "PATH", "PYTHONPATH", "JOB_ID", "INVENTORY_ID", "INVENTORY_SOURCE_ID", "INVENTORY_UPDATE_ID",
    "AD_HOC_COMMAND_ID", "REST_API_URL", "REST_API_TOKEN", "MAX_EVENT_RES", "CALLBACK_QUEUE", "CALLBACK_CONNECTION",
    "CACHE", "JOB_CALLBACK_DEBUG", "INVENTORY_HOSTVARS", "AWX_HOST", "PROJECT_REVISION", "SUPERVISOR_CONFIG_PATH",
))
# awx/settings/defaults.py MAX_EVENT_RES_DATA; TOWER_URL_BASE (the installer sets it; this is its default).
MAX_EVENT_RES_DATA = 700000
TOWER_URL_BASE = "https://platformhost"


class LaunchRefused(ValueError):
    """What AWX's API answers a launch with (400, variables_needed_to_start / extra_vars)."""


# ---------------------------------------------------------------------------------------------------------------
# Launch: awx/main/models/mixins.py SurveyJobTemplateMixin
# ---------------------------------------------------------------------------------------------------------------

def _choices(value: Any) -> List[str]:
    value = copy(value)
    if isinstance(value, str):
        return [c for c in value.splitlines() if c.strip() != ""]
    return list(value or [])


def survey_element_validation(element: Mapping[str, Any], data: Mapping[str, Any], validate_required: bool = True) -> List[str]:
    """SurveyJobTemplateMixin._survey_element_validation (password placeholders aside: no survey here has one)."""
    var, qtype = element["variable"], element["type"]
    errors: List[str] = []
    if var not in data and element["required"]:
        if validate_required:
            errors.append("'%s' value missing" % var)
    elif qtype in ("textarea", "text", "password"):
        if var in data:
            value = data[var]
            if not isinstance(value, str):
                return ["Value %s for '%s' expected to be a string." % (value, var)]
            if element.get("min") not in ("", None) and len(value) < int(element["min"]):
                errors.append("'%s' value %s is too small (length is %s must be at least %s)." % (var, value, len(value), element["min"]))
            if element.get("max") not in ("", None) and len(value) > int(element["max"]):
                errors.append("'%s' value %s is too large (must be no more than %s)." % (var, value, element["max"]))
    elif qtype == "integer":
        if var in data:
            value = data[var]
            if type(value) is not int:  # noqa: E721  (AWX's exact test: bool is refused too)
                return ["Value %s for '%s' expected to be an integer." % (value, var)]
            if element.get("min") not in ("", None) and value < int(element["min"]):
                errors.append("'%s' value %s is too small (must be at least %s)." % (var, value, element["min"]))
            if element.get("max") not in ("", None) and value > int(element["max"]):
                errors.append("'%s' value %s is too large (must be no more than %s)." % (var, value, element["max"]))
    elif qtype == "float":
        if var in data:
            value = data[var]
            if type(value) not in (float, int):
                return ["Value %s for '%s' expected to be a numeric type." % (value, var)]
            if element.get("min") not in ("", None) and value < float(element["min"]):
                errors.append("'%s' value %s is too small (must be at least %s)." % (var, value, element["min"]))
            if element.get("max") not in ("", None) and value > float(element["max"]):
                errors.append("'%s' value %s is too large (must be no more than %s)." % (var, value, element["max"]))
    elif qtype == "multiselect":
        if var in data:
            if type(data[var]) is not list:
                errors.append("'%s' value is expected to be a list." % var)
            else:
                errors += ["Value %s for '%s' expected to be one of %s." % (v, var, _choices(element["choices"]))
                           for v in data[var] if v not in _choices(element["choices"])]
    elif qtype == "multiplechoice":
        if var in data and data[var] not in _choices(element["choices"]):
            errors.append("Value %s for '%s' expected to be one of %s." % (data[var], var, _choices(element["choices"])))
    return errors


def accept_or_ignore_variables(survey: Optional[Mapping[str, Any]], data: Mapping[str, Any],
                               ask_variables_on_launch: bool = False) -> Tuple[Dict[str, Any], Dict[str, Any], Dict[str, List[str]]]:
    """SurveyJobTemplateMixin._accept_or_ignore_variables: (accepted, rejected, errors) for the launch's answers."""
    extra_vars = dict(data)
    accepted: Dict[str, Any] = {}
    rejected: Dict[str, Any] = {}
    errors: Dict[str, List[str]] = {}
    if survey:
        survey_errors: List[str] = []
        for element in survey.get("spec", []):
            key = element.get("variable")
            element_errors = survey_element_validation(element, data)
            if element_errors:
                survey_errors += element_errors
                if key in extra_vars:
                    rejected[key] = extra_vars.pop(key)
            elif key in extra_vars:
                accepted[key] = extra_vars.pop(key)
        if survey_errors:
            errors["variables_needed_to_start"] = survey_errors
    if ask_variables_on_launch:
        accepted.update(extra_vars)
        extra_vars = {}
    if extra_vars:
        rejected.update(extra_vars)
        errors["extra_vars"] = ["Variables %s are not allowed on launch. Check the Prompt on Launch setting on the Job "
                                "Template to include Extra Variables." % ", ".join(str(k) for k in extra_vars)]
    return accepted, rejected, errors


def update_unified_job_kwargs(survey: Optional[Mapping[str, Any]], runtime_extra_vars: Mapping[str, Any],
                              template_extra_vars: Optional[Mapping[str, Any]] = None) -> Dict[str, Any]:
    """SurveyJobTemplateMixin._update_unified_job_kwargs: JT extra_vars, then the survey defaults that pass
    validation, then the runtime extra vars (the launch's, or a workflow node's)."""
    extra_vars = dict(template_extra_vars or {})
    for element in (survey or {}).get("spec", []):
        default = element.get("default")
        if default is not None and not survey_element_validation(element, {element["variable"]: default}):
            extra_vars[element["variable"]] = default
    extra_vars.update(runtime_extra_vars)
    return extra_vars


def launch_extra_vars(survey: Optional[Mapping[str, Any]], answers: Mapping[str, Any]) -> Dict[str, Any]:
    """A launch through the API (POST .../launch/ with extra_vars): refused as AWX refuses it, else the job's
    extra vars. Without a survey the template is taken to prompt for variables (ask_variables_on_launch)."""
    accepted, _rejected, errors = accept_or_ignore_variables(survey, answers, ask_variables_on_launch=not survey)
    if errors:
        raise LaunchRefused("AWX refuses this launch: " + json.dumps(errors, sort_keys=True))
    return update_unified_job_kwargs(survey, accepted)


# ---------------------------------------------------------------------------------------------------------------
# The private data dir
# ---------------------------------------------------------------------------------------------------------------

class _UnsafeDumper(yaml.SafeDumper):
    """awx/main/utils/safe_yaml.py SafeStringDumper: every string (keys included) becomes !unsafe."""

    def represent_data(self, data):
        if isinstance(data, str):
            return self.represent_scalar("!unsafe", data)
        return super().represent_data(data)


def awx_safe_dump(extra_vars: Mapping[str, Any]) -> str:
    """awx/main/utils/safe_yaml.py safe_dump(vars) without a safe_dict: one YAML document per top-level key."""
    return "".join(yaml.dump_all([{k: v}], None, Dumper=_UnsafeDumper, default_flow_style=False) for k, v in extra_vars.items())


def _write_private(path: str, content: str, mode: int = stat.S_IRUSR | stat.S_IWUSR) -> str:
    """BaseTask.write_private_data_file: a file only the job's user reads."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w", encoding="utf-8") as f:
        f.write(content)
    os.chmod(path, mode)
    return path


def git_revision(rev: str = "HEAD") -> str:
    return subprocess.run(["git", "rev-parse", "--verify", rev + "^{commit}"], cwd=ROOT, capture_output=True, text=True,
                          check=True).stdout.strip()


def project_checkout(dest: str, revision: str) -> None:
    """The project at a committed revision (what AWX's project sync checks out), never the working tree."""
    os.makedirs(dest, exist_ok=True)
    archive = subprocess.run(["git", "archive", "--format=tar", revision], cwd=ROOT, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", dest], input=archive, check=True)


def project_copy(dest: str, source_dir: str) -> None:
    """A project that is not this repository (a site's own repository, e.g. awx/site-template): its files as the
    sync checks them out. The caller gives the directory; AWX would clone the project's Git URL."""
    shutil.copytree(source_dir, dest, symlinks=True, dirs_exist_ok=True)


# awx/main/utils/ansible.py: the lines that make a .yml/.yaml file a playbook AWX offers for a job template.
VALID_PLAYBOOK_RE = re.compile(r"^\s*?-?\s*?(?:hosts|(ansible\.builtin\.)?include|(ansible\.builtin\.)?import_playbook):\s*?.*?$")


def skip_directory(relative_directory_path: str) -> bool:
    """awx/main/utils/ansible.py skip_directory: roles/, tasks/, group_vars/, host_vars/ and dot folders are not searched."""
    parts = relative_directory_path.split(os.sep)
    if "roles" in parts or "tasks" in parts or "group_vars" in parts or "host_vars" in parts:
        return True
    return any(part.startswith(".") for part in parts)


def could_be_playbook(path: str) -> bool:
    """awx/main/utils/ansible.py could_be_playbook: a .yml/.yaml file with a line matching VALID_PLAYBOOK_RE, or
    vault-encrypted."""
    if os.path.splitext(path)[-1] not in (".yml", ".yaml"):
        return False
    with open(path, encoding="utf-8", errors="ignore") as f:
        for n, line in enumerate(f):
            if VALID_PLAYBOOK_RE.match(line) or (n == 0 and line.startswith("$ANSIBLE_VAULT;")):
                return True
    return False


def project_playbooks(project: str) -> List[str]:
    """awx/main/models/projects.py Project.playbooks: what a job template of this project may name (the API refuses
    any other: serializers.py JobTemplateSerializer.validate, 'Playbook not found for project.'). skip_directory is
    given the path relative to the project here; AWX gives it the absolute one (a project path with a folder named
    roles or tasks, or a dot folder, would hide every playbook in AWX)."""
    found = []
    for dirpath, _dirnames, filenames in os.walk(project):
        rel = os.path.relpath(dirpath, project)
        if rel != "." and skip_directory(rel):
            continue
        for name in filenames:
            if could_be_playbook(os.path.join(dirpath, name)):
                found.append(os.path.normpath(os.path.join(rel, name)))
    return sorted(found, key=str.lower)


def project_sync(project: str, collections_dir: str) -> None:
    """awx/playbooks/project_update.yml: ansible-galaxy collection install -r collections/requirements.yml, with
    the project as the current directory, into the job's requirements_collections."""
    env = {"PATH": BIN + os.pathsep + "/usr/bin:/bin", "HOME": os.path.dirname(project), "LANG": "C.UTF-8",
           "ANSIBLE_FORCE_COLOR": "false"}  # GALAXY_TASK_ENV
    subprocess.run([os.path.join(BIN, "ansible-galaxy"), "collection", "install", "-r", "collections/requirements.yml",
                    "-p", collections_dir], cwd=project, env=env, check=True, stdout=subprocess.DEVNULL)


def inventory_script_data(project: str, source_path: str, inventory_id: int = 1) -> Dict[str, Any]:
    """An inventory sourced from the project: imported as AWX imports it (ansible-inventory --list --export), then
    written back as Inventory.get_script_data(hostvars=True, towervars=True) gives it to a job."""
    source = os.path.join(project, source_path)
    env = {"PATH": BIN + os.pathsep + "/usr/bin:/bin", "HOME": os.path.dirname(project), "LANG": "C.UTF-8"}
    out = subprocess.run([os.path.join(BIN, "ansible-inventory"), "--list", "--export", "-i", source, "--playbook-dir",
                          os.path.dirname(source)], cwd=project, env=env, capture_output=True, text=True, check=True).stdout
    exported = json.loads(out)
    hostvars = exported.get("_meta", {}).get("hostvars", {})
    groups = {name: g for name, g in exported.items() if name not in ("_meta", "all")}
    hosts = sorted(set(hostvars) | {h for g in groups.values() for h in g.get("hosts", [])})
    data: Dict[str, Any] = {"all": {}}
    if exported.get("all", {}).get("vars"):
        data["all"]["vars"] = exported["all"]["vars"]  # the all group's vars become the inventory's variables
    grouped = set()
    names = []
    for name, group in groups.items():
        if name == "ungrouped":  # awx-manage inventory_import does not import ansible's implicit group
            continue
        info = {k: group[k] for k in ("hosts", "children", "vars") if group.get(k)}
        grouped.update(group.get("hosts", []))
        if info:
            data[name] = info
        names.append(name)
    data["all"]["hosts"] = [h for h in hosts if h not in grouped]
    if names:
        data["all"]["children"] = names
    data["_meta"] = {"hostvars": {}}
    for host_id, host in enumerate(hosts, start=1):
        hv = dict(hostvars.get(host, {}))
        for prefix in ("host", "tower"):
            hv.update({"remote_%s_enabled" % prefix: "true", "remote_%s_id" % prefix: host_id})
        data["_meta"]["hostvars"][host] = hv
    return data


def write_inventory_script(pdd: str, script_data: Mapping[str, Any]) -> str:
    """BaseTask.write_inventory_file: inventory/hosts, mode 0700, a Python script that prints the JSON."""
    content = "#! /usr/bin/env python3\n# -*- coding: utf-8 -*-\nprint(%r)\n" % json.dumps(script_data)
    return _write_private(os.path.join(pdd, "inventory", "hosts"), content, stat.S_IRWXU)


def load_credential_inputs(inputs: Mapping[str, Any], base: str = ROOT) -> Dict[str, Any]:
    """A credential's inputs, where a value '@PATH' is read from that file (a secret never in the command line)."""
    out: Dict[str, Any] = {}
    for key, value in inputs.items():
        if isinstance(value, str) and value.startswith("@"):
            with open(os.path.join(base, value[1:]), encoding="utf-8") as f:
                value = f.read().rstrip("\n") if not value.endswith(".pem") else f.read()
        out[key] = value
    return out


def inject_credential(ctype: Mapping[str, Any], inputs: Mapping[str, Any], env: Dict[str, str], safe_env: Dict[str, str],
                      args: List[str], pdd: str) -> None:
    """CredentialType.inject_credential for a custom credential type: file injectors into env/ (0600), env injectors
    (a prohibited name skipped), extra_vars injectors into a file passed as -e @file."""
    namespace: Dict[str, Any] = {}
    safe_namespace: Dict[str, Any] = {}

    class TowerNamespace:
        pass
    tower = TowerNamespace()
    namespace["tower"] = safe_namespace["tower"] = tower
    secret = {f["id"] for f in (ctype.get("inputs") or {}).get("fields", []) if f.get("secret")}
    for name, value in inputs.items():
        if type(value) is bool:
            namespace[name] = safe_namespace[name] = value
            continue
        if name in secret:
            safe_namespace[name] = "**********"
        elif len(value):
            safe_namespace[name] = value
        if len(value):
            namespace[name] = value
    for field in (ctype.get("inputs") or {}).get("fields", []):
        if field.get("type") == "boolean" and field["id"] not in inputs:
            namespace[field["id"]] = safe_namespace[field["id"]] = False
    sandbox = ImmutableSandboxedEnvironment()
    injectors = ctype.get("injectors") or {}
    for label, tmpl in (injectors.get("file") or {}).items():
        data = sandbox.from_string(tmpl).render(**namespace)
        handle, path = tempfile.mkstemp(dir=os.path.join(pdd, "env"))
        with os.fdopen(handle, "w") as f:
            f.write(data)
        os.chmod(path, stat.S_IRUSR | stat.S_IWUSR)
        if "." not in label:
            tower.filename = path
        else:
            if not hasattr(tower, "filename"):
                tower.filename = TowerNamespace()
            setattr(tower.filename, label.split(".")[1], path)
    for var, tmpl in (injectors.get("env") or {}).items():
        if var.startswith("ANSIBLE_") or var in ENV_BLOCKLIST:
            continue  # 'Ignoring prohibited env var'
        env[var] = sandbox.from_string(tmpl).render(**namespace)
        safe_env[var] = sandbox.from_string(tmpl).render(**safe_namespace)

    def build(node):
        if isinstance(node, dict):
            return {build(k): build(v) for k, v in node.items()}
        if isinstance(node, list):
            return [build(x) for x in node]
        return sandbox.from_string(node).render(**namespace)
    extra = build(injectors.get("extra_vars") or {})
    if extra:
        handle, path = tempfile.mkstemp(dir=os.path.join(pdd, "env"))
        with os.fdopen(handle, "w") as f:
            f.write(awx_safe_dump(extra))
        os.chmod(path, stat.S_IRUSR)
        args.extend(["-e", "@%s" % path])


def read_ansible_config(project: str, names: List[str]) -> Dict[str, str]:
    """awx/main/utils/ansible.py read_ansible_config: [defaults] of the project's ansible.cfg (the EE's
    /etc/ansible/ansible.cfg too in AWX; none in this harness's environment)."""
    parser = configparser.ConfigParser()
    parser.read([os.path.join(project, "ansible.cfg")])
    if "defaults" not in parser:
        return {}
    return {n: parser["defaults"][n] for n in names if n in parser["defaults"]}


def awx_meta_vars(job: Mapping[str, Any]) -> Dict[str, Any]:
    """UnifiedJob.awx_meta_vars and Job.awx_meta_vars for a job launched by a user (or spawned by a workflow)."""
    r: Dict[str, Any] = {}
    for name in ("awx", "tower"):
        r["%s_job_id" % name] = job["id"]
        r["%s_job_launch_type" % name] = job["launch_type"]
        if job.get("workflow_job_id"):
            r["%s_workflow_job_id" % name] = job["workflow_job_id"]
            r["%s_workflow_job_name" % name] = job["workflow_job_name"]
            r["%s_workflow_job_launch_type" % name] = "manual"
        r["%s_user_id" % name] = 1
        r["%s_user_name" % name] = "admin"
        r["%s_user_email" % name] = ""
        r["%s_user_first_name" % name] = ""
        r["%s_user_last_name" % name] = ""
        r["%s_inventory_id" % name] = job["inventory_id"]
        r["%s_inventory_name" % name] = job["inventory_name"]
        r["%s_project_revision" % name] = job["revision"]
        r["%s_project_scm_branch" % name] = "main"
        r["%s_job_template_id" % name] = job["template_id"]
        r["%s_job_template_name" % name] = job["template_name"]
        r["%s_execution_node" % name] = "localhost"
    return r


def build_private_data_dir(pdd: str, job: Mapping[str, Any]) -> Dict[str, Any]:
    """Lay out ``pdd`` as RunJob does for ``job`` (a dict: playbook, inventory, extra_vars, credentials,
    job_type, limit, revision, id ...). Returns what it wrote (paths and the values), for the tests."""
    project = os.path.join(pdd, "project")
    if job.get("project_dir"):
        project_copy(project, job["project_dir"])
    else:
        project_checkout(project, job["revision"])
    if job["playbook"] not in project_playbooks(project):
        raise LaunchRefused("AWX refuses this job template: playbook %s is not one of the project's playbooks %s"
                            % (job["playbook"], project_playbooks(project)))
    collections_dir = os.path.join(pdd, "requirements_collections")
    project_sync(project, collections_dir)
    script = write_inventory_script(pdd, inventory_script_data(project, job["inventory"]))
    os.makedirs(os.path.join(pdd, "env"), exist_ok=True)
    os.makedirs(os.path.join(pdd, "cp"), mode=0o700, exist_ok=True)
    extra_vars = dict(job["extra_vars"])
    extra_vars.update(awx_meta_vars(job))
    _write_private(os.path.join(pdd, "env", "extravars"), awx_safe_dump(extra_vars))
    env: Dict[str, str] = dict(AWX_ANSIBLE_SETTINGS)
    env["AWX_PRIVATE_DATA_DIR"] = pdd
    env.update({"JOB_ID": str(job["id"]), "INVENTORY_ID": str(job["inventory_id"]), "PROJECT_REVISION": job["revision"],
                "ANSIBLE_RETRY_FILES_ENABLED": "False", "MAX_EVENT_RES": str(MAX_EVENT_RES_DATA), "AWX_HOST": TOWER_URL_BASE,
                # '/runner/cp' in AWX: the private data dir is mounted at /runner in the execution environment.
                "ANSIBLE_SSH_CONTROL_PATH_DIR": os.path.join(pdd, "cp")})
    # RunJob.build_env's path_vars: the project's ansible.cfg value (read_ansible_config) before the defaults, the
    # project sync's folder first.
    config = read_ansible_config(project, ["collections_paths", "roles_path", "collections_path"])
    for key, setting, folder, default in (
            ("ANSIBLE_COLLECTIONS_PATHS", "collections_paths", "requirements_collections", "~/.ansible/collections:/usr/share/ansible/collections"),
            ("ANSIBLE_ROLES_PATH", "roles_path", "requirements_roles", "~/.ansible/roles:/usr/share/ansible/roles:/etc/ansible/roles"),
            ("ANSIBLE_COLLECTIONS_PATH", "collections_path", "requirements_collections", "~/.ansible/collections:/usr/share/ansible/collections")):
        paths = default.split(":")
        if setting in config:
            for path in config[setting].split(":"):
                if path not in paths:
                    paths = [config[setting]] + paths
        env[key] = os.pathsep.join([os.path.join(pdd, folder)] + paths)
    safe_env = dict(env)
    args: List[str] = []
    if job.get("job_type") == "check":
        args.append("--check")
    args.extend(["-u", job.get("machine_user") or "root"])
    if job.get("limit"):
        args.extend(["-l", job["limit"]])
    for ctype, inputs in job.get("credentials", []):
        inject_credential(ctype, inputs, env, safe_env, args, pdd)
    _write_private(os.path.join(pdd, "env", "envvars"), yaml.safe_dump(env))
    _write_private(os.path.join(pdd, "env", "cmdline"), " ".join(shlex.quote(a) for a in args))
    _write_private(os.path.join(pdd, "env", "settings"),
                   json.dumps({"job_timeout": 0, "suppress_ansible_output": True, "suppress_output_file": True}))
    return {"inventory": script, "extra_vars": extra_vars, "env": env, "safe_env": safe_env, "args": args}


# The environment the job's process starts with: the execution environment's (awx-ee: PATH, HOME, LANG), never the
# caller's. HOME is the private data dir, as /runner is the EE user's home there.
def ee_environment(pdd: str) -> Dict[str, str]:
    return {"PATH": BIN + os.pathsep + "/usr/local/bin:/usr/bin:/bin", "HOME": pdd, "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}


def run_job(pdd: str, job: Mapping[str, Any]) -> Dict[str, Any]:
    """Run the job as the worker does (ansible-runner on the private data dir), and return what AWX keeps of it:
    status, rc, artifact_data (the playbook_on_stats event's), the events' stdout."""
    ident = str(job["id"])
    cmd = [os.path.join(BIN, "ansible-runner"), "run", pdd, "-p", job["playbook"], "--inventory",
           os.path.join(pdd, "inventory", "hosts"), "--ident", ident]
    proc = subprocess.run(cmd, env=ee_environment(pdd), capture_output=True, text=True, check=False)
    artifacts = os.path.join(pdd, "artifacts", ident)
    events = []
    for path in glob.glob(os.path.join(artifacts, "job_events", "*.json")):
        with open(path, encoding="utf-8") as f:
            events.append(json.load(f))
    events.sort(key=lambda e: e.get("counter", 0))
    stats = [e.get("event_data", {}).get("artifact_data") for e in events if e.get("event") == "playbook_on_stats"]
    status = "error"
    if os.path.exists(os.path.join(artifacts, "status")):
        with open(os.path.join(artifacts, "status"), encoding="utf-8") as f:
            status = f.read().strip()
    rc = None
    if os.path.exists(os.path.join(artifacts, "rc")):
        with open(os.path.join(artifacts, "rc"), encoding="utf-8") as f:
            rc = int(f.read().strip() or -1)
    stdout = "\n".join(e["stdout"] for e in events if e.get("stdout"))
    return {"id": job["id"], "name": job["template_name"], "status": status, "rc": rc,
            "artifact_data": (stats[-1] if stats else None) or {}, "stdout": stdout,
            "runner_output": proc.stdout[-4000:] + proc.stderr[-4000:]}


def run(job: Mapping[str, Any], keep: Optional[str] = None) -> Dict[str, Any]:
    """Lay out, run, and (unless ``keep``) delete the private data dir, as AWX_CLEANUP_PATHS does."""
    pdd = keep or tempfile.mkdtemp(prefix="awx_%s_" % job["id"])
    if keep:
        shutil.rmtree(pdd, ignore_errors=True)
        os.makedirs(pdd)
    try:
        built = build_private_data_dir(pdd, job)
        result = run_job(pdd, job)
        result["extra_vars"] = built["extra_vars"]
        result["safe_env"] = built["safe_env"]
        result["cmdline"] = built["args"]
        return result
    finally:
        if not keep:
            shutil.rmtree(pdd, ignore_errors=True)


def load_yaml(path: str) -> Any:
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        return yaml.safe_load(f)


def credentials_from_file(path: str) -> List[Tuple[Dict[str, Any], Dict[str, Any]]]:
    """A YAML list of {type: awx/credential_types/<file>.yml, inputs: {...}} (values '@PATH' read from files)."""
    out = []
    for cred in load_yaml(path) or []:
        ctype = dict(load_yaml(cred["type"]), _file=cred["type"])
        out.append((ctype, load_credential_inputs(cred.get("inputs") or {})))
    return out


def new_job(template: Mapping[str, Any], extra_vars: Mapping[str, Any], job_id: int, revision: str, inventory: str,
            credentials=(), job_type: str = "run", workflow: Optional[Mapping[str, Any]] = None,
            limit: str = "", project_dir: str = "") -> Dict[str, Any]:
    """The job a launch creates from a job template of awx/config.yml (project_dir: a project that is not this
    repository, copied from that directory instead of git archive of the commit)."""
    return {"project_dir": project_dir, "id": job_id, "template_id": template.get("id", 1), "template_name": template["name"],
            "playbook": template["playbook"], "extra_vars": dict(extra_vars), "revision": revision,
            "inventory": inventory, "inventory_id": 1, "inventory_name": os.path.dirname(inventory) or inventory,
            "credentials": list(credentials), "job_type": job_type, "limit": limit,
            "launch_type": "workflow" if workflow else "manual",
            "workflow_job_id": (workflow or {}).get("id"), "workflow_job_name": (workflow or {}).get("name")}


def tail(text: str, width: int = 6000) -> str:
    return text[-width:]


def strip_color(text: str) -> str:
    return re.sub(r"\x1b\[[0-9;]*m", "", text)
