"""collections/requirements.yml, the way AWX's project sync uses it: from a checkout of the project (no
.collections link), `ansible-galaxy collection install -r collections/requirements.yml` into an empty collections
path installs inferops.gpu_inference with its plugins, offline, and the playbooks then resolve its FQCNs."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT

BIN = os.path.dirname(sys.executable)


@pytest.fixture(scope="module")
def checkout(tmp_path_factory):
    """The project as AWX checks it out: the files git tracks (or would), nothing built."""
    dest = tmp_path_factory.mktemp("project")
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, capture_output=True,
                           check=True).stdout.split(b"\0")
    for rel in filter(None, files):
        src = os.path.join(ROOT, rel.decode())
        if os.path.isfile(src) and not os.path.islink(src):
            os.makedirs(os.path.dirname(os.path.join(dest, rel.decode())), exist_ok=True)
            with open(src, "rb") as f, open(os.path.join(dest, rel.decode()), "wb") as g:
                g.write(f.read())
    return str(dest)


def test_project_sync_installs_the_collection(checkout, tmp_path):
    if importlib.util.find_spec("distlib") is None:
        pytest.skip("ansible-galaxy needs the Python library distlib to build from galaxy.yml's manifest: "
                    "pip install distlib (the execution environment needs it too)")
    target = tmp_path / "collections"
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    env["ANSIBLE_COLLECTIONS_PATH"] = str(target)
    run = subprocess.run([os.path.join(BIN, "ansible-galaxy"), "collection", "install", "-r", "collections/requirements.yml"],
                         cwd=checkout, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert run.returncode == 0, run.stdout + run.stderr
    installed = target / "ansible_collections" / "inferops" / "gpu_inference"
    manifest = json.loads((installed / "MANIFEST.json").read_text())["collection_info"]
    assert (manifest["namespace"], manifest["name"]) == ("inferops", "gpu_inference")
    for rel in ("plugins/action/sglang_deploy_plan.py", "plugins/module_utils/deploy/sglang_deploy.py", "plugins/filter/hicache_plan.py",
                "roles/sglang_server/tasks/plan_request.yml", "roles/pve_gpu_container/defaults/main.yml"):
        assert (installed / rel).is_file(), rel

    # The project's playbook, run from the checkout, finds the collection where the sync put it.
    plan = subprocess.run([os.path.join(BIN, "ansible-playbook"), "playbooks/plan.yml", "-i", "inventories/lab/hosts.yml",
                           "-e", "plan_host=ct129"], cwd=checkout, env=env, capture_output=True, text=True, timeout=300,
                          check=False)
    assert plan.returncode == 0, plan.stdout + plan.stderr
    assert "--hicache-size 1" in plan.stdout
