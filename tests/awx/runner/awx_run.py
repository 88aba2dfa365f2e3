#!/usr/bin/env python3
"""Run a playbook of this project the way AWX runs a job template: through ansible-runner, in a private data dir
laid out as AWX lays it out, with survey answers dumped into env/extravars as AWX dumps them (every string
tagged !unsafe, awx/main/utils/safe_yaml.py), credentials injected as environment variables (env/envvars), and the
collection installed from the project by collections/requirements.yml, as a project sync does.

  tests/awx/runner/awx_run.py [--json-out FILE] --playbook playbooks/plan.yml --survey awx/surveys/plan.yml \\
      --inventory inventories/lab/hosts.yml --answer plan_host=ct129 --answer plan_requested_gb=

An answer NAME= is a blank answer (''), NAME=null a null one (AWX 24 sends null for an unanswered text question);
values are YAML (--answer sglang_server_tp_size=4 is the integer 4, NAME="'4'" the string). --env NAME=VALUE adds a credential's
environment variable, --unanswered NAME puts NAME: null in the extra vars without the launch check (what AWX
24.6 stores for an optional text question left unanswered, ansible/awx#16205), --check runs with job type check, --keep DIR keeps the private data dir there.
The survey's defaults are applied first and the answers checked against the survey (AWX's launch validation).
Exit status: ansible-runner's rc. Needs ansible-runner and distlib (requirements-dev.txt has ansible-runner).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
sys.path.insert(0, os.path.dirname(HERE))
import awx_rules  # noqa: E402  (tests/awx/awx_rules.py)


class _UnsafeDumper(yaml.SafeDumper):
    """awx/main/utils/safe_yaml.py SafeStringDumper: every string becomes !unsafe."""

    def represent_data(self, data):
        if isinstance(data, str):
            return self.represent_scalar("!unsafe", data)
        return super().represent_data(data)


def awx_safe_dump(extra_vars):
    """awx/main/utils/safe_yaml.py safe_dump(vars) without a safe_dict: one YAML document per top-level key."""
    return "".join(yaml.dump_all([{k: v}], None, Dumper=_UnsafeDumper, default_flow_style=False) for k, v in extra_vars.items())


def survey_extra_vars(survey, answers):
    """SurveyJobTemplateMixin._update_unified_job_kwargs: JT survey defaults (those that pass validation), then the
    launch's answers; refused like AWX refuses a launch when an answer breaks the survey."""
    extra = {}
    for item in (survey or {}).get("spec", []):
        if item.get("default") is not None and not awx_rules.element_errors(item, {item["variable"]: item["default"]}):
            extra[item["variable"]] = item["default"]
    errors = [e for item in (survey or {}).get("spec", []) for e in awx_rules.element_errors(item, dict(extra, **answers))]
    if errors:
        raise SystemExit("AWX would refuse this launch: " + "; ".join(errors))
    extra.update(answers)
    return extra


def project_files(dest):
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, capture_output=True,
                           check=True).stdout.split(b"\0")
    for rel in filter(None, (f.decode() for f in files)):
        src = os.path.join(ROOT, rel)
        if os.path.isfile(src) and not os.path.islink(src):
            os.makedirs(os.path.dirname(os.path.join(dest, rel)), exist_ok=True)
            shutil.copy2(src, os.path.join(dest, rel))


def build(pdd, args):
    project = os.path.join(pdd, "project")
    project_files(project)
    # Project sync: collections/requirements.yml into the job's collections path.
    collections = os.path.join(pdd, "requirements_collections")
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    env["ANSIBLE_COLLECTIONS_PATH"] = collections
    galaxy = os.path.join(os.path.dirname(sys.executable), "ansible-galaxy")
    subprocess.run([galaxy, "collection", "install", "-r", "collections/requirements.yml"], cwd=project, env=env,
                   check=True, stdout=subprocess.DEVNULL)
    # The inventory with its group_vars/host_vars, as an inventory sourced from the project.
    src = os.path.join(ROOT, os.path.dirname(args.inventory))
    shutil.copytree(src, os.path.join(pdd, "inventory"), ignore=shutil.ignore_patterns("*.example", ".gitignore"))
    answers = {}
    for a in args.answer:
        name, _, value = a.partition("=")
        answers[name] = "" if value == "" else yaml.safe_load(value)
    survey = yaml.safe_load(open(os.path.join(ROOT, args.survey), encoding="utf-8")) if args.survey else None
    extra = survey_extra_vars(survey, answers)
    extra.update({name: None for name in args.unanswered})
    extra.update({"awx_job_id": 1, "awx_job_template_name": os.path.basename(args.playbook), "tower_job_id": 1})
    os.makedirs(os.path.join(pdd, "env"), exist_ok=True)
    with open(os.path.join(pdd, "env", "extravars"), "w", encoding="utf-8") as f:
        f.write(awx_safe_dump(extra))
    envvars = {"ANSIBLE_COLLECTIONS_PATH": collections, "ANSIBLE_FORCE_COLOR": "False"}
    envvars.update(dict(e.split("=", 1) for e in args.env))
    with open(os.path.join(pdd, "env", "envvars"), "w", encoding="utf-8") as f:
        yaml.safe_dump(envvars, f)
    if args.check:
        with open(os.path.join(pdd, "env", "cmdline"), "w", encoding="utf-8") as f:
            f.write("--check")
    return extra


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--playbook", required=True)
    p.add_argument("--inventory", required=True, help="the inventory's hosts.yml, relative to the repository")
    p.add_argument("--survey", help="the job template's survey, e.g. awx/surveys/plan.yml")
    p.add_argument("--answer", action="append", default=[])
    p.add_argument("--env", action="append", default=[])
    p.add_argument("--unanswered", action="append", default=[])
    p.add_argument("--check", action="store_true")
    p.add_argument("--keep")
    p.add_argument("--json-out", help="write {status, rc, artifact_data, stdout_tail} there (what AWX keeps of the job)")
    args = p.parse_args(argv)
    import ansible_runner

    # ansible-runner runs ansible-playbook from PATH: the one beside this interpreter (the virtualenv's).
    os.environ["PATH"] = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")
    # An AWX job's environment has none of the lab's settings: the reports go where the roles put them under
    # AWX (the job's artifact directory), not into INFEROPS_REPORT_DIR.
    os.environ.pop("INFEROPS_REPORT_DIR", None)

    pdd = args.keep or tempfile.mkdtemp(prefix="awx-job-")
    try:
        extra = build(pdd, args)
        print("extra vars (env/extravars):\n" + open(os.path.join(pdd, "env", "extravars"), encoding="utf-8").read(), flush=True)
        r = ansible_runner.run(private_data_dir=pdd, playbook=args.playbook,
                               inventory=os.path.join(pdd, "inventory", os.path.basename(args.inventory)), quiet=False)
        stats = [e["event_data"].get("artifact_data") for e in r.events if e.get("event") == "playbook_on_stats"]
        print("status: %s, rc: %s, artifacts (set_stats): %s" % (r.status, r.rc, json.dumps(stats[-1] if stats else {})))
        if args.json_out:
            with open(os.path.join(pdd, "artifacts", r.config.ident, "stdout"), encoding="utf-8", errors="replace") as f:
                tail = f.read()[-6000:]
            with open(args.json_out, "w", encoding="utf-8") as f:
                json.dump({"status": r.status, "rc": r.rc, "artifact_data": stats[-1] if stats else {},
                           "artifact_dir": r.config.artifact_dir, "stdout_tail": tail}, f, indent=2)
        del extra
        return r.rc
    finally:
        if not args.keep:
            shutil.rmtree(pdd, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
