"""The extra-variable allow-list of each entry playbook (module_utils/deploy/playbook_inputs.py): computed from the roles'
argument_specs and the playbooks, with the names the playbooks set left out; docs/safety.md lists the same."""

from __future__ import annotations

import os

import pytest
import yaml

from ansible_collections.inferops.gpu_inference.plugins.module_utils.deploy import playbook_inputs as pi

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
            args = dict(first["inferops.gpu_inference.extra_vars_check"])
            inventory_hosts = args.pop("inventory_hosts", None)
            assert args == {"playbook": playbook}, (playbook, play["name"])
            assert first["run_once"] is True and first["tags"] == ["always"]
            # the inventory's names are checked in the first play, for the hosts of the whole run
            assert (inventory_hosts is not None) == (play is load(os.path.join(ROOT, "playbooks", playbook))[0] or
                                                     play["name"] == load(os.path.join(ROOT, "playbooks", playbook))[0]["name"]), play["name"]


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


# --- The inventory's names ---------------------------------------------------------------------------------------------

DOCUMENTED = pi.inventory_documented(load)


def test_edit_distance_counts_insertions_deletions_substitutions_and_swaps():
    assert pi.edit_distance("sglang_sever_", "sglang_server_") == 1
    assert pi.edit_distance("proxmox_vmdi", "proxmox_vmid") == 1  # one swap
    assert pi.edit_distance("abc", "abc") == 0
    assert pi.edit_distance("kitten", "sitting") == 3
    assert pi.edit_distance("a" * 20, "b" * 20, limit=2) == 3  # anything past the limit is limit + 1


@pytest.mark.parametrize("name,expected", [
    ("sglang_server_hicache_request_gb", "did you mean sglang_server_hicache_requested_gb?"),
    ("sglang_sever_version", "did you mean sglang_server_version?"),
    ("sglangserver_tp_size", "did you mean sglang_server_tp_size?"),
    ("pve_gpu_contaner_gpus", "did you mean pve_gpu_container_gpus?"),
    ("gpu_recovr_allow_reboot", "did you mean gpu_recover_allow_reboot?"),
    ("proxmox_vmdi", "did you mean proxmox_vmid?"),
    ("proxmox_nod", "did you mean proxmox_node?"),
    ("inferops_unknown_variable", "did you mean inferops_unknown_variables?"),
    ("plan_requested_gb", "an extra variable of plan.yml: give it with -e"),
    ("recover_allow_reboot", "an extra variable of recover.yml: give it with -e"),
])
def test_an_unknown_name_of_the_namespace_is_reported_with_the_closest_documented_name(name, expected):
    found = pi.unknown_inventory_names([name], DOCUMENTED)
    assert len(found) == 1 and found[0][0] == name
    assert found[0][1].startswith(expected), found


@pytest.mark.parametrize("name", [
    # documented: the roles' options, what their defaults read, the playbooks' inventory inputs
    "sglang_server_version", "sglang_server_hicache_requested_gb", "pve_gpu_container_gpus", "gpu_recover_samples",
    "proxmox_vmid", "proxmox_node", "proxmox_api_host", "proxmox_node_ssh_host_keys", "inferops_unknown_variables",
    # private (their own check refuses the computed ones), Ansible's, and the site's own names
    "__sglang_server_request", "_anything", "ansible_host", "ansible_python_interpreter", "proxmox_bridge",
    "proxmox_bridge_gateway", "proxmox_api_url", "vault_sglang_api_key", "ntp_servers", "site_name", "sglang",
])
def test_documented_private_and_foreign_names_are_left_alone(name):
    assert pi.unknown_inventory_names([name], DOCUMENTED) == []


def test_the_repositorys_inventories_carry_no_unknown_name():
    names = set()
    for folder in ("example", "lab", "lab-multinode"):
        base = os.path.join(ROOT, "inventories", folder)
        names.update(_inventory_vars(load(os.path.join(base, "hosts.yml"))["all"]))
        for sub in ("group_vars", "host_vars"):
            for dirpath, _dirs, files in os.walk(os.path.join(base, sub), followlinks=True):
                for fname in files:
                    if fname.endswith((".yml", ".example")):
                        names.update(load_inventory_file(os.path.join(dirpath, fname)) or {})
    assert {"sglang_server_version", "proxmox_vmid", "proxmox_api_host", "ansible_connection"} <= names  # all read
    assert pi.unknown_inventory_names(sorted(names), DOCUMENTED) == []


class _InventoryLoader(yaml.SafeLoader):  # pylint: disable=too-many-ancestors
    """YAML as an inventory file holds it: a value may be !vault (the lab's generated vault.yml); only names count."""


_InventoryLoader.add_constructor("!vault", lambda loader, node: "<vaulted>")


def load_inventory_file(path):
    with open(path, encoding="utf-8") as f:
        return yaml.load(f, Loader=_InventoryLoader)  # nosec: a SafeLoader with one more tag


def _inventory_vars(group):
    """The variable names of a YAML inventory group: its vars, its hosts' vars, its children's."""
    yield from (group.get("vars") or {})
    for host_vars in (group.get("hosts") or {}).values():
        yield from (host_vars or {})
    for child in (group.get("children") or {}).values():
        yield from _inventory_vars(child or {})


def test_the_switch_is_refuse_by_default_warn_on_request_and_nothing_else():
    assert pi.unknown_mode(None, "ct129") == "refuse"
    assert pi.unknown_mode("", "ct129") == "refuse"
    assert pi.unknown_mode("refuse", "ct129") == "refuse"
    assert pi.unknown_mode(" Warn ", "ct129") == "warn"
    with pytest.raises(pi.InputsError) as exc:
        pi.unknown_mode("ignore", "ct129")
    assert "inferops_unknown_variables=ignore (inventory of ct129) must be refuse or warn" in str(exc.value)


def test_the_message_names_the_host_the_name_the_suggestion_and_the_switch():
    found = {"ct129": pi.unknown_inventory_names(["sglang_server_hicache_request_gb", "sglang_sever_version"], DOCUMENTED)}
    refused = pi.inventory_message(found, refused=True)
    assert refused.startswith("refused before any task runs: the inventory gives variables")
    assert ("ct129: sglang_server_hicache_request_gb (did you mean sglang_server_hicache_requested_gb?); "
            "sglang_sever_version (did you mean sglang_server_version?)") in refused
    assert "set inferops_unknown_variables: warn" in refused and refused.endswith("Nothing has been run.")
    warned = pi.inventory_message(found, refused=False)
    assert not warned.startswith("refused") and "Nothing has been run" not in warned
    assert "(inferops_unknown_variables: warn)" in warned


def test_many_unknown_names_are_summed_up_and_clipped():
    names = ["sglang_server_x%02d" % i for i in range(12)] + ["sglang_server_" + "y" * 300]
    found = pi.unknown_inventory_names(names, DOCUMENTED)
    assert len(found) == 13
    text = pi.inventory_message({"ct129": found}, refused=True)
    assert "and 3 more" in text and "y" * 100 not in text


def test_every_documented_option_is_an_inventory_name():
    for role in ("sglang_server", "pve_gpu_container", "gpu_recover"):
        specs = load(os.path.join(ROOT, "roles", role, "meta", "argument_specs.yml"))["argument_specs"]
        for entry in specs.values():
            for option in entry.get("options") or {}:
                assert option in DOCUMENTED, option


def test_the_inventory_model_s_names_come_from_its_declaration():
    from ansible_collections.inferops.gpu_inference.plugins.module_utils.common import gpu_inventory as gi
    # No role default reads proxmox_vmid or proxmox_node any more: the model declares them, and every entry playbook
    # reads the model (itself, a vars file, or a role's vars), so each accepts them, sourced from the model.
    role_reads = {n for role, entry in (("pve_gpu_container", "main"), ("pve_gpu_container", "container_spec"))
                  for n in pi.role_options(role, entry, load)}
    assert {"proxmox_vmid", "proxmox_node"} & role_reads == set()
    for playbook in pi.ENTRY_PLAYBOOKS:
        assert pi.reads_model(playbook, load), playbook
        accepted = pi.allowed(playbook, load)
        assert accepted["proxmox_vmid"] == accepted["proxmox_node"] == pi.MODEL_SOURCE, playbook
        # the model's names of the roles' namespace only where a role entry point documents them
        assert "gpu_recover_eda_relaunch" not in accepted, playbook
    assert set(gi.INVENTORY_NAMES) <= set(DOCUMENTED)
    assert DOCUMENTED["gpu_recover_eda_relaunch"] == pi.MODEL_SOURCE


def test_a_playbook_that_does_not_read_the_model_does_not_take_its_names(tmp_path):
    (tmp_path / "playbooks").mkdir()
    (tmp_path / "roles").mkdir()
    (tmp_path / "playbooks" / "plan.yml").write_text("- hosts: localhost\n  vars_files: [vars/x.yml]\n  tasks: []\n")
    (tmp_path / "playbooks" / "vars").mkdir()
    (tmp_path / "playbooks" / "vars" / "x.yml").write_text("a: 1\n")
    assert not pi.reads_model("plan.yml", load, str(tmp_path))
    assert "proxmox_vmid" not in pi.allowed("plan.yml", load, str(tmp_path))
    (tmp_path / "playbooks" / "vars" / "x.yml").write_text("a: \"{{ hostvars | inferops.gpu_inference.gpu_inventory(groups) }}\"\n")
    assert pi.reads_model("plan.yml", load, str(tmp_path))
    assert pi.allowed("plan.yml", load, str(tmp_path))["proxmox_vmid"] == pi.MODEL_SOURCE


def test_a_private_name_a_role_default_reads_is_never_an_input():
    specs = {"argument_specs": {"main": {"options": {
        "pve_gpu_container_hostname": {"default": "sglang-{{ __pve_gpu_container_model | default(1) }}"},
        "pve_gpu_container_api_host": {"default": "{{ proxmox_api_host | default('') }}"}}}}}
    got = pi.role_options("pve_gpu_container", "main", lambda path: specs)
    assert set(got) == {"pve_gpu_container_hostname", "pve_gpu_container_api_host", "proxmox_api_host"}
