"""The extra-variable allow-list of each entry playbook (module_utils/playbook_inputs.py): computed from the roles'
argument_specs and the playbooks, with the names the playbooks set left out; docs/safety.md lists the same."""

from __future__ import annotations

import os

import pytest
import yaml

from ansible_collections.inferops.gpu_inference.plugins.module_utils import playbook_inputs as pi

ROOT = pi.COLLECTION_ROOT


def load(path):
    with open(path, encoding="utf-8") as f:
        return yaml.safe_load(f)


def refusal(names, playbook):
    with pytest.raises(pi.InputsError) as exc:
        pi.refuse_undocumented(names, playbook, pi.allowed(playbook, load))
    return str(exc.value)


@pytest.mark.parametrize("playbook,name", [
    ("plan.yml", "__plan_calculation"), ("plan.yml", "_plan_settings_given"), ("plan.yml", "_plan_host"),
    ("plan.yml", "__plan_host"), ("plan.yml", "__sglang_server_request"), ("plan.yml", "__pve_gpu_container_spec"),
    ("plan.yml", "sglang_server_api_key"),  # plan.yml sets it itself
    ("deploy.yml", "__sglang_server_hicache_size"), ("deploy.yml", "__sglang_server_node_state"),
    ("deploy.yml", "__pve_gpu_container_plan_requests"), ("deploy.yml", "__deploy_cts"),
    ("deploy.yml", "__deploy_relaunch_containers"), ("deploy.yml", "__pve_gpu_container_state"),
    # the public-looking names these values had before they were private: no entry point documents them
    ("plan.yml", "sglang_server_request"), ("plan.yml", "pve_gpu_container_spec"), ("deploy.yml", "sglang_server_hicache_size"),
    ("deploy.yml", "sglang_server_node_state"), ("deploy.yml", "pve_gpu_container_plan_requests"),
    ("deploy.yml", "pve_gpu_container_state"), ("deploy.yml", "sglang_server_request"),
    ("recover.yml", "__gpu_recover_ladder"), ("recover.yml", "gpu_recover_vmid"), ("recover.yml", "gpu_recover_allow_reboot"),
    ("recover.yml", "gpu_recover_result"), ("recover.yml", "_recover_ct_hosts"), ("recover.yml", "__recover_ct_hosts"),
    ("recover.yml", "__deploy_relaunch_nodes"),
])
def test_computed_and_private_names_are_refused_by_name(playbook, name):
    msg = refusal(["awx_job_id", name], playbook)
    assert msg.startswith("refused before any task runs: %s does not accept the extra variable %s" % (playbook, name)), msg
    assert "awx_job_id" not in msg


def test_documented_names_and_awx_meta_vars_are_accepted():
    for playbook, names in (("plan.yml", ["plan_input", "plan_host", "plan_requested_gb", "sglang_server_tp_size"]),
                            ("deploy.yml", ["deploy_containers", "sglang_server_hicache_requested_gb", "pve_gpu_container_gpus"]),
                            ("recover.yml", ["recover_vmid", "recover_relaunch", "gpu_recover_release_grace",
                                             "deploy_containers", "sglang_server_tp_size", "tower_job_id"])):
        pi.refuse_undocumented(names + ["awx_job_template_name"], playbook, pi.allowed(playbook, load))


def test_the_closest_documented_name_is_suggested_and_long_names_are_clipped():
    msg = refusal(["plan_requsted_gb", "sglang_server_tp", "x" * 100000], "plan.yml")
    assert "plan_requsted_gb (did you mean plan_requested_gb?)" in msg
    assert "sglang_server_tp (did you mean sglang_server_tp_size?)" in msg
    assert "(100000 characters)" in msg and len(msg) < 1200


def test_a_key_value_size_with_a_unit_is_refused_with_the_reason():
    msg = refusal(["plan_requested_gb", "_raw_params"], "plan.yml")
    assert "has a space in its value" in msg and "44 GiB" in msg


def test_many_names_are_summed_up():
    msg = refusal(["bad%d" % i for i in range(25)], "deploy.yml")
    assert "and 15 more" in msg


def test_non_string_names_are_refused():
    assert pi.undocumented([1, None, "plan_host"], pi.allowed("plan.yml", load)) == [1, None]


def test_recover_accepts_what_the_deploy_it_imports_accepts_less_what_it_sets():
    rec, dep = pi.allowed("recover.yml", load), pi.allowed("deploy.yml", load)
    assert set(dep) - set(rec) == set()  # deploy_containers comes back as recover's own (the AWX workflow)
    assert {"gpu_recover_vmid", "gpu_recover_service"} & set(rec) == set()


def test_an_unknown_playbook_is_refused():
    with pytest.raises(pi.InputsError, match="playbook must be one of deploy.yml, plan.yml, recover.yml"):
        pi.allowed("site.yml", load)


def test_the_imported_playbook_takes_the_list_of_the_playbook_run(tmp_path):
    books = os.path.join(ROOT, "playbooks")
    assert pi.entry_playbook("deploy.yml", books, [os.path.join(books, "recover.yml")], load) == "recover.yml"
    assert pi.entry_playbook("deploy.yml", books, [os.path.join(books, "deploy.yml")], load) == "deploy.yml"
    # A recover.yml elsewhere (an operator's own) does not widen deploy.yml's list.
    assert pi.entry_playbook("deploy.yml", books, [str(tmp_path / "recover.yml")], load) == "deploy.yml"
    assert pi.entry_playbook("plan.yml", books, [os.path.join(books, "recover.yml")], load) == "plan.yml"
    # By FQCN (ansible-playbook inferops.gpu_inference.recover, as ansible-rulebook's run_playbook starts it).
    assert pi.entry_playbook("deploy.yml", books, ["inferops.gpu_inference.recover"], load) == "recover.yml"
    assert pi.entry_playbook("deploy.yml", books, ["inferops.gpu_inference.recover.yml"], load) == "recover.yml"
    assert pi.entry_playbook("deploy.yml", str(tmp_path), ["inferops.gpu_inference.recover"], load) == "deploy.yml"
    assert pi.entry_playbook("deploy.yml", books, ["other.coll.recover"], load) == "deploy.yml"
    assert pi.run_entry(["inferops.gpu_inference.recover"]) == "recover.yml"
    assert pi.collection_playbook("inferops.gpu_inference.site") is None


def test_every_play_starts_with_the_check():
    for playbook in pi.ENTRY_PLAYBOOKS:
        for play in load(os.path.join(ROOT, "playbooks", playbook)):
            if "ansible.builtin.import_playbook" in play or "import_playbook" in play:
                continue
            first = (play.get("pre_tasks") or play.get("tasks"))[0]
            assert first["inferops.gpu_inference.extra_vars_check"] == {"playbook": playbook}, (playbook, play["name"])
            assert first["run_once"] is True and first["tags"] == ["always"]


def test_safety_md_lists_the_same_names():
    with open(os.path.join(ROOT, "docs", "safety.md"), encoding="utf-8") as f:
        text = f.read()
    begin, end = "<!-- extra-vars: generated by playbook_inputs.markdown() -->\n", "<!-- end extra-vars -->"
    assert begin in text and end in text
    assert text.split(begin, 1)[1].split(end, 1)[0] == pi.markdown(load), (
        "docs/safety.md's list of extra variables differs from the playbooks; regenerate it with "
        "python -c 'import yaml; from ansible_collections.inferops.gpu_inference.plugins.module_utils import "
        "playbook_inputs as p; print(p.markdown(lambda f: yaml.safe_load(open(f))), end=\"\")'")


def test_the_survey_variables_are_accepted_by_their_playbooks():
    cfg = load(os.path.join(ROOT, "awx", "config.yml"))
    by_name = {jt["name"]: os.path.basename(jt["playbook"]) for jt in cfg["inferops_awx_job_templates"]}
    pairs = [(jt["survey"], os.path.basename(jt["playbook"])) for jt in cfg["inferops_awx_job_templates"]]
    pairs += [(wf["survey"], by_name[n["unified_job_template"]["name"]])
              for wf in cfg["inferops_awx_workflows"] for n in wf["workflow_nodes"]]
    for survey, playbook in pairs:
        names = [q["variable"] for q in load(os.path.join(ROOT, "awx", survey))["spec"]]
        pi.refuse_undocumented(names, playbook, pi.allowed(playbook, load))


def test_the_roles_action_applies_the_run_playbooks_list_at_every_stage(tmp_path):
    books = os.path.join(ROOT, "playbooks")
    with pytest.raises(pi.InputsError) as exc:
        pi.refuse_for_run(["plan_requested_gb", "__plan_calculation"], [os.path.join(books, "plan.yml")], load)
    assert str(exc.value).startswith("refused before this step: plan.yml does not accept the extra variable __plan_calculation")
    assert "Nothing has been run" not in str(exc.value)
    pi.refuse_for_run(["recover_vmid", "sglang_server_tp_size"], [os.path.join(books, "recover.yml")], load)


def test_in_an_operators_own_playbook_only_the_roles_namespace_is_checked(tmp_path):
    own = [str(tmp_path / "site.yml")]
    assert pi.run_entry(own) is None
    pi.refuse_for_run(["my_var", "_mine", "sglang_server_tp_size", "gpu_recover_samples", "awx_job_id"], own, load)
    for name in ("__sglang_server_hicache_size", "__sglang_server_launch", "_pve_gpu_container_x", "gpu_recover_result"):
        with pytest.raises(pi.InputsError, match="does not accept the extra variable %s" % name):
            pi.refuse_for_run(["my_var", name], own, load)


def test_role_default_is_the_documented_one_and_matches_the_role_defaults():
    # plan.yml -e plan_node reads the node's reserve without running the role: the figure comes from argument_specs,
    # and argument_specs agrees with defaults/main.yml (the value the role itself uses).
    got = pi.role_default("pve_gpu_container", "main", "pve_gpu_container_node_reserve_bytes", load)
    defaults = load(os.path.join(ROOT, "roles", "pve_gpu_container", "defaults", "main.yml"))
    assert got == defaults["pve_gpu_container_node_reserve_bytes"] == 4 << 30


def test_role_default_of_an_undocumented_option_is_refused():
    with pytest.raises(pi.InputsError, match="documents no default for pve_gpu_container_no_such"):
        pi.role_default("pve_gpu_container", "main", "pve_gpu_container_no_such", load)
