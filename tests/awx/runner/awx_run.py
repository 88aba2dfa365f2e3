#!/usr/bin/env python3
"""Launch a job template of awx/config.yml the way AWX launches and runs it, without AWX (tests/awx/runner/awx_job.py
has the rules, each cited from AWX's source): the launch's answers validated against the survey alone, the survey's
defaults added under them, the project at a committed revision, the inventory as AWX's JSON inventory script, AWX's
job environment, cmdline, settings and meta variables, credentials injected by their types' injectors.

  tests/awx/runner/awx_run.py [--json-out FILE] --playbook playbooks/plan.yml --survey awx/surveys/plan.yml \\
      --inventory inventories/lab/hosts.yml --answer plan_host=ct129 --answer plan_requested_gb=0

An answer NAME= is a blank answer (''), NAME=null a null one; values are YAML (--answer sglang_server_tp_size=4 is
the integer 4, NAME="'4'" the string). --unanswered NAME puts NAME: null into the extra vars without the launch check
(what AWX 24.6 stored for an optional text question left unanswered, ansible/awx#16205). Without --survey every
answer is accepted (a template that prompts for variables). --credentials FILE: a YAML list of {type: credential type
file, inputs: {...}} (an input '@PATH' is read from that file). --check: job type check. --revision: the commit
(default HEAD; uncommitted changes are not part of the project, as in AWX). --keep DIR keeps the private data dir.
Exit status: the playbook's rc (AWX's launch refusal: 2, before anything runs).
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import yaml

import awx_job  # beside this script, on sys.path as its directory


def parse_answers(items):
    answers = {}
    for item in items:
        name, _, value = item.partition("=")
        answers[name] = "" if value == "" else yaml.safe_load(value)
    return answers


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--playbook", required=True)
    p.add_argument("--inventory", required=True, help="the inventory source in the project, e.g. inventories/lab/hosts.yml")
    p.add_argument("--survey", help="the job template's survey, e.g. awx/surveys/plan.yml")
    p.add_argument("--answer", action="append", default=[])
    p.add_argument("--unanswered", action="append", default=[])
    p.add_argument("--credentials")
    p.add_argument("--check", action="store_true")
    p.add_argument("--revision", default="HEAD")
    p.add_argument("--keep")
    p.add_argument("--json-out", help="write what AWX keeps of the job: {status, rc, artifact_data, stdout_tail}")
    args = p.parse_args(argv)
    survey = awx_job.load_yaml(args.survey) if args.survey else None
    try:
        extra = awx_job.launch_extra_vars(survey, parse_answers(args.answer))
    except awx_job.LaunchRefused as exc:
        print(exc, file=sys.stderr)
        return 2
    extra.update({name: None for name in args.unanswered})
    template = {"name": os.path.basename(args.playbook), "playbook": args.playbook}
    creds = awx_job.credentials_from_file(args.credentials) if args.credentials else []
    job = awx_job.new_job(template, extra, 1, awx_job.git_revision(args.revision), args.inventory, creds,
                          job_type="check" if args.check else "run")
    result = awx_job.run(job, keep=os.path.abspath(args.keep) if args.keep else None)
    print(awx_job.strip_color(result["stdout"]))
    print("extra vars (env/extravars): %s" % json.dumps({k: v for k, v in result["extra_vars"].items()
                                                         if not k.startswith(("awx_", "tower_"))}, sort_keys=True))
    print("status: %s, rc: %s, artifact_data: %s" % (result["status"], result["rc"], json.dumps(result["artifact_data"])))
    if result["status"] == "error":
        print(result["runner_output"], file=sys.stderr)
    if args.json_out:
        with open(args.json_out, "w", encoding="utf-8") as f:
            json.dump({"status": result["status"], "rc": result["rc"], "artifact_data": result["artifact_data"],
                       "stdout_tail": awx_job.tail(awx_job.strip_color(result["stdout"]))}, f, indent=2)
    return result["rc"] if isinstance(result["rc"], int) else 1


if __name__ == "__main__":
    sys.exit(main())
