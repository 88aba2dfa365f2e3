"""The node's hardware declared in the inventory (module_utils/host/node_facts.py): checked as given, merged under
-e plan_input key by key for the offline plan, and compared with what deploy reads on the node."""

from __future__ import annotations

import pytest

from ansible_collections.inferops.gpu_inference.plugins.module_utils.host import node_facts as nf
from ansible_collections.inferops.gpu_inference.plugins.module_utils.deploy.sglang_request import DeployError

PVE1 = {
    "pve_gpu_container_node_gpu_model": "RTX PRO 6000",
    "pve_gpu_container_node_gpu_memory_mib": 97887,
    "pve_gpu_container_node_gpu_count": "8",  # as a survey or a templated value gives it
    "pve_gpu_container_node_mem_total_bytes": 482110078976,
}
LIVE_GPUS = [{"index": i, "name": "NVIDIA RTX PRO 6000 Blackwell Server Edition", "memory_total_mib": 97887} for i in range(8)]


def refused(call, *args):
    with pytest.raises(DeployError) as exc:
        call(*args)
    return str(exc.value)


def test_declared_facts_are_checked_and_blank_ones_are_not_declared():
    assert nf.declared(PVE1, "pve1") == {"gpu_model": "RTX PRO 6000", "gpu_memory_mib": 97887, "gpu_count": 8,
                                         "mem_total_bytes": 482110078976}
    assert nf.declared({"pve_gpu_container_node_gpu_model": None, "pve_gpu_container_node_gpu_count": ""}, "pve1") == {}


@pytest.mark.parametrize("name,value,words", [
    ("pve_gpu_container_node_gpu_memory_mib", "96 GiB", "must be a whole number, got '96 GiB' (MiB per GPU, inventory of node pve1: nvidia-smi"),
    ("pve_gpu_container_node_gpu_memory_mib", 96, "must be between 1024 and 4194304, got 96"),
    ("pve_gpu_container_node_gpu_count", 0, "must be between 1 and 64, got 0"),
    ("pve_gpu_container_node_mem_total_bytes", 449, "looks like a GiB or GB figure"),
    ("pve_gpu_container_node_gpu_model", 6000, "must be the GPU's model as nvidia-smi names it"),
])
def test_a_declared_fact_in_the_wrong_unit_or_type_is_refused_naming_the_node(name, value, words):
    message = refused(nf.declared, {name: value}, "pve1")
    assert message.startswith(name) and words in message and "inventory of node pve1" in message


def test_plan_input_merges_over_the_declared_facts_key_by_key_and_the_notes_say_which():
    facts = nf.declared(PVE1, "pve1")
    merged, notes = nf.merge_plan_input({"gpu_memory_mib": 97000, "mem_available_bytes": 400000000000}, facts, "pve1")
    assert merged == {"gpu_memory_mib": 97000, "mem_available_bytes": 400000000000, "mem_total_bytes": 482110078976}
    assert "plan_input.gpu_memory_mib=97000 overrides node pve1's pve_gpu_container_node_gpu_memory_mib=97887." in notes
    assert ("mem_total_bytes from node pve1's pve_gpu_container_node_mem_total_bytes in the inventory: 482110078976 bytes "
            "(449.0 GiB).") in notes
    assert "Node pve1 declares 8 x RTX PRO 6000." in notes


def test_a_blank_plan_input_key_takes_the_declared_value_and_nothing_declared_changes_nothing():
    facts = nf.declared(PVE1, "pve1")
    merged, _notes = nf.merge_plan_input({"gpu_memory_mib": ""}, facts, "pve1")
    assert merged["gpu_memory_mib"] == 97887
    assert nf.merge_plan_input({"gpu_memory_mib": 97000}, {}, "pve1") == ({"gpu_memory_mib": 97000}, [])
    assert nf.merge_plan_input(None, {}, "pve1") == ({}, [])
    assert nf.merge_plan_input("text", facts, "pve1") == ("text", [])  # the calculator refuses it


def test_a_container_asking_for_a_gpu_beyond_the_declared_count_is_refused():
    facts = nf.declared(dict(PVE1, pve_gpu_container_node_gpu_count=4), "pve1")
    message = refused(nf.check_gpus_declared, facts, [{"host": "ct129", "gpus": [0, 1, 2, 3, 4, 5]}], "pve1")
    assert "ct129 asks for GPU(s) 4,5 (pve_gpu_container_gpus), and node pve1 declares 4 GPU(s), indices 0-3" in message
    nf.check_gpus_declared(facts, [{"host": "ct129", "gpus": [0, 1, 2, 3]}], "pve1")
    nf.check_gpus_declared({}, [{"host": "ct129", "gpus": [9]}], "pve1")  # nothing declared: nothing checked


def test_what_deploy_reads_matches_the_declaration():
    notes = nf.check_live(nf.declared(PVE1, "pve1"), LIVE_GPUS, 482110078976 - 50 * 2**20, "pve1")
    assert notes == ["Node pve1 matches its inventory: 8 GPU(s), 97887 MiB per GPU, "
                     "NVIDIA RTX PRO 6000 Blackwell Server Edition, RAM 449.0 GiB."]
    assert nf.check_live({}, LIVE_GPUS, 482110078976, "pve1") == []


def test_each_difference_from_the_declaration_is_refused_with_both_figures():
    facts = nf.declared(PVE1, "pve1")
    gpus = [dict(g, memory_total_mib=95000, name="NVIDIA H100") for g in LIVE_GPUS[:7]]
    message = refused(nf.check_live, facts, gpus, 480 * 2**30, "pve1")
    assert message.startswith("Node pve1 is not the node its inventory declares: ")
    assert "pve_gpu_container_node_gpu_count=8, and nvidia-smi shows 7 GPU(s)" in message
    assert "pve_gpu_container_node_gpu_memory_mib=97887, and nvidia-smi's memory.total is 95000 MiB" in message
    assert "pve_gpu_container_node_gpu_model=RTX PRO 6000, and nvidia-smi names the GPUs NVIDIA H100" in message
    assert ("pve_gpu_container_node_mem_total_bytes=482110078976 (449.0 GiB), and the node's MemTotal is "
            "515396075520 bytes (480.0 GiB), more than 1% apart") in message
    assert message.endswith("Nothing has been changed.")
