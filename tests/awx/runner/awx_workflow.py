#!/usr/bin/env python3
"""Launch a workflow of awx/config.yml the way AWX launches it and its scheduler runs its nodes, without AWX.

  tests/awx/runner/awx_workflow.py --workflow "GPU host: recover then deploy" --inventory inventories/lab/hosts.yml \\
      --credentials tests/awx/lab_credentials.yml --answer recover_vmid=129 --answer deploy_containers=ct129 \\
      --answer "recover_allow_reboot='false'" [--json-out FILE] [--keep DIR]

AWX's rules (ansible/awx at e21dd0a0933fd544d1fe2513c54fe41203775eb5):
- the launch's answers are validated against the workflow's survey alone and its defaults added under them
  (``SurveyJobTemplateMixin._accept_or_ignore_variables`` and ``_update_unified_job_kwargs`` of the
  WorkflowJobTemplate);
- each node's job gets ``WorkflowJobNode.get_job_kwargs`` (``awx/main/models/workflow.py``): the node's own
  extra_data, the ``artifact_data`` of every ancestor job over it, the workflow job's extra vars over both (they
  bypass the job template's survey and prompts); ``JobTemplate.create_unified_job`` then adds the job template's
  survey defaults under them (``_update_unified_job_kwargs``); a spawned job's survey is not validated
  (``awx/main/scheduler/task_manager.py`` ``spawn_workflow_graph_jobs``);
- a node runs when its parent finished on the matching edge (``success_nodes``, ``failure_nodes``,
  ``always_nodes``; ``awx/main/scheduler/dag_workflow.py`` ``bfs_nodes_to_run``), the others are do-not-run; the
  workflow fails when a failed node has no failure or always path (``has_workflow_failed``).
Each job runs as tests/awx/runner/awx_job.py lays it out. Exit status: 0 when the workflow succeeded.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, Dict, List, Mapping, Optional

import awx_job  # beside this script, on sys.path as its directory
from awx_run import parse_answers


def _config() -> Dict[str, Any]:
    return awx_job.load_yaml("awx/config.yml")


def _template(config: Mapping[str, Any], name: str) -> Dict[str, Any]:
    for idx, jt in enumerate(config["inferops_awx_job_templates"], start=1):
        if jt["name"] == name:
            return dict(jt, id=idx)
    raise SystemExit("no job template %r in awx/config.yml" % name)


def _credentials_for(template: Mapping[str, Any], available: List[Any]) -> List[Any]:
    """The template's credentials of awx/config.yml (credential_types), from those given."""
    wanted = [t for t in template.get("credential_types", []) if t != "machine"]
    out = []
    for ctype, inputs in available:
        if any(os.path.basename(ctype.get("_file", "")) == t + ".yml" for t in wanted):
            out.append((ctype, inputs))
    return out


def run_workflow(name: str, answers: Mapping[str, Any], inventory: str, credentials: List[Any], revision: str,
                 keep: Optional[str] = None) -> Dict[str, Any]:
    config = _config()
    wf = next((w for w in config["inferops_awx_workflows"] if w["name"] == name), None)
    if wf is None:
        raise SystemExit("no workflow %r in awx/config.yml" % name)
    survey = awx_job.load_yaml(os.path.join("awx", wf["survey"])) if wf.get("survey") else None
    wj_extra_vars = awx_job.launch_extra_vars(survey, answers)  # raises LaunchRefused
    nodes = {n["identifier"]: n for n in wf["workflow_nodes"]}
    edges = {ident: {kind: [c["identifier"] for c in (n.get("related") or {}).get(kind, [])]
                     for kind in ("success_nodes", "failure_nodes", "always_nodes")} for ident, n in nodes.items()}
    parents: Dict[str, List[Any]] = {ident: [] for ident in nodes}
    for ident, kinds in edges.items():
        for kind, children in kinds.items():
            for child in children:
                parents[child].append((ident, kind))
    workflow = {"id": 100, "name": name}
    jobs: Dict[str, Dict[str, Any]] = {}
    ancestor_artifacts: Dict[str, Dict[str, Any]] = {}
    do_not_run: set = set()
    order = [i for i in nodes if not parents[i]]
    done: List[str] = []
    job_id = 1
    while order:
        ident = order.pop(0)
        node = nodes[ident]
        # WorkflowJobNode.get_job_kwargs: node extra_data, then ancestors' artifacts, then the workflow's extra vars.
        aa: Dict[str, Any] = {}
        for parent, _kind in parents[ident]:
            aa.update(ancestor_artifacts.get(parent, {}))
            if parent in jobs:
                aa.update(jobs[parent]["artifact_data"])
        ancestor_artifacts[ident] = aa
        extra_vars = dict(node.get("extra_data") or {})
        extra_vars.update({k: v for k, v in aa.items() if k != "_ansible_no_log"})
        extra_vars.update(wj_extra_vars)
        jt = _template(config, node["unified_job_template"]["name"])
        jt_survey = awx_job.load_yaml(os.path.join("awx", jt["survey"])) if jt.get("survey") else None
        extra_vars = awx_job.update_unified_job_kwargs(jt_survey, extra_vars)  # JobTemplate.create_unified_job
        job = awx_job.new_job(jt, extra_vars, job_id, revision, inventory, _credentials_for(jt, credentials),
                              workflow=workflow)
        job_id += 1
        result = awx_job.run(job, keep=os.path.join(keep, ident) if keep else None)
        result["node"] = ident
        jobs[ident] = result
        done.append(ident)
        status = result["status"]
        follow = edges[ident]["always_nodes"] + (edges[ident]["success_nodes"] if status == "successful"
                                                  else edges[ident]["failure_nodes"])
        for kind in ("success_nodes", "failure_nodes", "always_nodes"):
            for child in edges[ident][kind]:
                if child not in follow:
                    do_not_run.add(child)
        for child in follow:
            # _are_relevant_parents_finished: every parent that may still run has a finished job.
            if all(p in jobs or p in do_not_run for p, _k in parents[child]) and child not in order and child not in jobs:
                order.append(child)
    failed = [i for i, r in jobs.items() if r["status"] != "successful"
              and not (edges[i]["failure_nodes"] or edges[i]["always_nodes"])]
    return {"name": name, "status": "failed" if failed else "successful", "extra_vars": wj_extra_vars,
            "nodes": [dict(jobs[i], stdout_tail=awx_job.tail(awx_job.strip_color(jobs[i].pop("stdout")))) for i in done],
            "do_not_run": sorted(do_not_run - set(jobs))}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workflow", required=True)
    p.add_argument("--inventory", required=True)
    p.add_argument("--credentials")
    p.add_argument("--answer", action="append", default=[])
    p.add_argument("--revision", default="HEAD")
    p.add_argument("--keep")
    p.add_argument("--json-out")
    args = p.parse_args(argv)
    creds = awx_job.credentials_from_file(args.credentials) if args.credentials else []
    try:
        result = run_workflow(args.workflow, parse_answers(args.answer), args.inventory, creds,
                              awx_job.git_revision(args.revision), os.path.abspath(args.keep) if args.keep else None)
    except awx_job.LaunchRefused as exc:
        print(exc, file=sys.stderr)
        return 2
    for node in result["nodes"]:
        print("node %s: job %s %s (rc %s); extra vars %s; artifact_data %s" % (
            node["node"], node["id"], node["status"], node["rc"],
            json.dumps({k: v for k, v in node["extra_vars"].items() if not k.startswith(("awx_", "tower_"))}, sort_keys=True),
            json.dumps(node["artifact_data"])[:2000]))
        if node["status"] != "successful":
            print(node["stdout_tail"][-3000:])
    print("workflow %s: %s; do not run: %s" % (result["name"], result["status"], result["do_not_run"]))
    if args.json_out:
        for node in result["nodes"]:
            node.pop("safe_env", None)
        with open(args.json_out, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=2)
    return 0 if result["status"] == "successful" else 1


if __name__ == "__main__":
    sys.exit(main())
