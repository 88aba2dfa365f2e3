"""The collection as users get it: the tarball `ansible-galaxy collection build` makes, and what is built from it.

Run by `make package` with the Python of .build/package-venv (tests/package/requirements.txt); the oldest
ansible-core that meta/runtime.yml claims is in .build/package-oldest (tests/package/requirements-oldest.txt).
  - the tarball's listing: exactly the allowed top-level entries, nothing of the project around the collection
    (lab, tests, molecule, inventories, ansible.cfg, vault files ...), every file of the collection's directories;
  - MANIFEST.json agrees with galaxy.yml (dependencies, version, license, URLs), and the dependencies are exactly
    the other collections the YAML names;
  - galaxy-importer (Galaxy's import checks, ansible-lint included) passes with no error and no warning;
  - `ansible-builder introspect` of the installed tarball lists exactly meta/ee-requirements.txt and meta/ee-bindep.txt;
  - `ansible-builder create` with execution-environment.yml makes a build context that installs this tarball;
  - the oldest claimed ansible-core installs the tarball, syntax-checks the three playbooks from it and runs the
    calculator (plan.yml) with the same answer as the pinned ansible-core;
  - as an operator runs it: the tarball installed into an empty collections path, the calculator run from a directory
    with no ansible.cfg (ansible-core's defaults: the default callback, JSON results) for a host and for a node, with
    and without a requested size: its plan and its refusals read as lines, each explanation printed once.
Nothing here uses the checkout's .collections link or its ansible.cfg: each ansible command gets its own config
(the operator's run: none at all).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile

import pytest
import yaml

REPO = os.path.realpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
BUILD = os.path.join(REPO, ".build")
VENV_BIN = os.path.dirname(sys.executable)
OLDEST_BIN = os.environ.get("PKG_OLDEST_BIN", os.path.join(BUILD, "package-oldest", "bin"))
INSTALL = os.path.join(BUILD, "pkg-install")
INSTALL_OLDEST = os.path.join(BUILD, "pkg-install-oldest")
EE_CONTEXT = os.path.join(BUILD, "ee-context")
WORK = os.path.join(BUILD, "package")

with open(os.path.join(REPO, "galaxy.yml")) as _f:
    GALAXY = yaml.safe_load(_f)
NAMESPACE, NAME, VERSION = GALAXY["namespace"], GALAXY["name"], GALAXY["version"]
TARBALL = os.path.join(BUILD, f"{NAMESPACE}-{NAME}-{VERSION}.tar.gz")
FQCN = f"{NAMESPACE}.{NAME}"

# Top-level entries of the artifact, exactly.
ALLOWED_TOP = {
    "CHANGELOG.rst", "FILES.json", "LICENSE", "MANIFEST.json", "README.md",
    "changelogs", "docs", "extensions", "meta", "playbooks", "plugins", "roles",
}
# Directories whose every file (git's view: tracked or not ignored) ships, but for the patterns below.
SHIPPED_DIRS = ["docs", "extensions", "meta", "playbooks", "plugins", "roles"]
# Path components and file names that must never ship, anywhere (the project's own top-level files, galaxy.yml,
# requirements*, execution-environment.yml, are kept out by ALLOWED_TOP).
FORBIDDEN_PARTS = {
    "tests", "molecule", "benchmarks", "inventories", "reports", ".config", ".ci", ".venv", ".build",
    ".collections", ".pytest_cache", ".hypothesis", "__pycache__", "awx", "collections", "fragments",
    "ansible.cfg", "Makefile",
}
FORBIDDEN_NAME = re.compile(r"(^\.|\.pyc$|\.pyo$|\.tar\.gz$|^vault\.ya?ml$|\.orig$|\.rej$|~$|\.swp$)")
PLAYBOOKS = ["deploy", "recover", "plan"]


def run(cmd, env=None, cwd=None, check=True, timeout=300):
    """Run a command, print it and its output (pytest shows it on failure), return the CompletedProcess."""
    full_env = dict(os.environ)
    full_env.update(env or {})
    proc = subprocess.run(cmd, cwd=cwd or WORK, env=full_env, capture_output=True, text=True, timeout=timeout)
    print("$", " ".join(cmd), f"(rc {proc.returncode})")
    print(proc.stdout[-6000:])
    print(proc.stderr[-6000:], file=sys.stderr)
    if check:
        assert proc.returncode == 0, f"{cmd[0]} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


def ansible_env(collections_path: str) -> dict:
    """An ansible.cfg of its own: only collections_path (not the checkout's link, not site-packages)."""
    cfg = os.path.join(WORK, f"ansible-{os.path.basename(collections_path)}.cfg")
    with open(cfg, "w") as f:
        f.write(f"[defaults]\ncollections_path = {collections_path}\ncollections_scan_sys_path = false\n"
                f"inventory = localhost,\nlocal_tmp = {WORK}/tmp\n")
    return {"ANSIBLE_CONFIG": cfg, "ANSIBLE_COLLECTIONS_PATH": collections_path, "ANSIBLE_NOCOLOR": "1",
            "ANSIBLE_HOME": os.path.join(WORK, "ansible-home"), "PATH": VENV_BIN + os.pathsep + os.environ["PATH"]}


def non_comment_lines(path: str) -> list[str]:
    with open(path) as f:
        return [line.strip() for line in f if line.strip() and not line.lstrip().startswith("#")]


# What a user's checkout holds beside the collection that git ignores: planted in the copy that is built, so the
# manifest's excludes are checked whatever this checkout happens to hold (test_nothing_forbidden).
PLANTED = ["roles/sglang_server/__pycache__/x.cpython-312.pyc", "plugins/modules/x.pyc", "roles/sglang_server/vault.yml",
           "docs/deploy.md.orig", "playbooks/.secret", "plugins/filter/x.py~", "inventories/lab/group_vars/all/vault.yml"]


def checkout_copy() -> str:
    """The checkout as git sees it (tracked or not ignored), plus PLANTED. Built from a copy, not in place:
    `ansible-galaxy collection build` stats every file under the directory it builds, and the offline tier's other
    targets (make -j2) write and remove temporary files under .build and reports meanwhile (CI, 2026-12-04: a
    .pyc.<n> of ansible-test's sanity run vanished mid-build and failed it)."""
    src = os.path.join(BUILD, "package-src")  # not under WORK, where the ansible commands run
    subprocess.run(["rm", "-rf", src], check=True)
    names = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO, capture_output=True,
                           check=True).stdout.decode().split("\0")
    for name in [n for n in names if n]:
        path = os.path.join(REPO, name)
        if not os.path.lexists(path):
            continue  # deleted in the work tree, not yet in the index
        os.makedirs(os.path.dirname(os.path.join(src, name)), exist_ok=True)
        shutil.copy2(path, os.path.join(src, name), follow_symlinks=False)
    for name in PLANTED:
        os.makedirs(os.path.dirname(os.path.join(src, name)), exist_ok=True)
        with open(os.path.join(src, name), "w") as f:
            f.write("planted by tests/package\n")
    return src


@pytest.fixture(scope="session")
def tarball() -> str:
    os.makedirs(WORK, exist_ok=True)
    if os.path.exists(TARBALL):
        os.remove(TARBALL)
    run([os.path.join(VENV_BIN, "ansible-galaxy"), "collection", "build", "--output-path", BUILD, checkout_copy()],
        env=ansible_env(INSTALL))
    assert os.path.isfile(TARBALL)
    return TARBALL


@pytest.fixture(scope="session")
def members(tarball) -> dict[str, tarfile.TarInfo]:
    with tarfile.open(tarball) as tf:
        return {m.name.rstrip("/"): m for m in tf.getmembers()}


@pytest.fixture(scope="session")
def manifest(tarball) -> dict:
    with tarfile.open(tarball) as tf:
        return json.load(tf.extractfile("MANIFEST.json"))


@pytest.fixture(scope="session")
def installed(tarball) -> str:
    subprocess.run(["rm", "-rf", INSTALL], check=True)
    # --no-deps: Galaxy may be unreachable, and introspect must see this collection alone.
    run([os.path.join(VENV_BIN, "ansible-galaxy"), "collection", "install", "--no-deps", "-p", INSTALL, tarball],
        env=ansible_env(INSTALL))
    path = os.path.join(INSTALL, "ansible_collections", NAMESPACE, NAME)
    assert os.path.isfile(os.path.join(path, "MANIFEST.json"))
    return INSTALL


def test_top_level_entries(members):
    top = {name.split("/")[0] for name in members}
    assert top == ALLOWED_TOP, f"unexpected: {sorted(top - ALLOWED_TOP)}, missing: {sorted(ALLOWED_TOP - top)}"


def test_nothing_forbidden(members):
    bad = []
    for name, member in members.items():
        parts = name.split("/")
        if set(parts) & FORBIDDEN_PARTS or FORBIDDEN_NAME.search(parts[-1]):
            bad.append(name)
        if not (member.isfile() or member.isdir()):
            bad.append(f"{name} (neither a file nor a directory)")
    assert not bad, f"must not ship: {bad}"


def test_collection_files_all_ship(members):
    """Every file git sees under the shipped directories is in the tarball (a new kind of file is not lost)."""
    out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "--", *SHIPPED_DIRS], cwd=REPO,
                         capture_output=True, text=True, check=True).stdout.split()
    expected = {p for p in out if os.path.isfile(os.path.join(REPO, p))
                and not FORBIDDEN_NAME.search(os.path.basename(p)) and "__pycache__" not in p.split("/")}
    missing = sorted(expected - set(members))
    assert not missing, f"not shipped: {missing}"


def test_required_files(members):
    required = ["README.md", "LICENSE", "CHANGELOG.rst", "changelogs/changelog.yaml", "changelogs/config.yaml",
                "meta/runtime.yml", "meta/execution-environment.yml", "meta/ee-requirements.txt",
                "meta/ee-bindep.txt", "playbooks/deploy.yml", "playbooks/recover.yml", "playbooks/plan.yml",
                # What the docs point an operator at: the calculator's example variable files, the EDA pins.
                "extensions/eda/requirements.txt"]
    required += [f"playbooks/vars/examples/{f}" for f in os.listdir(os.path.join(REPO, "playbooks", "vars", "examples"))]
    for role in sorted(os.listdir(os.path.join(REPO, "roles"))):
        required += [f"roles/{role}/README.md", f"roles/{role}/meta/main.yml", f"roles/{role}/meta/argument_specs.yml"]
    docs = [f"docs/{d}" for d in os.listdir(os.path.join(REPO, "docs")) if d.endswith(".md")]
    assert docs, "docs/ has no .md"
    missing = [p for p in required + docs if p not in members]
    assert not missing, f"missing: {missing}"


def test_license_is_gplv3(tarball):
    with tarfile.open(tarball) as tf:
        text = tf.extractfile("LICENSE").read().decode()
    assert "GNU GENERAL PUBLIC LICENSE" in text and "Version 3, 29 June 2007" in text
    assert "END OF TERMS AND CONDITIONS" in text, "not the full text"
    assert GALAXY["license"] == ["GPL-3.0-or-later"]


def test_manifest_agrees_with_galaxy_yml(manifest):
    info = manifest["collection_info"]
    assert info["dependencies"] == GALAXY["dependencies"]
    for key in ("namespace", "name", "version", "license", "repository", "documentation", "issues", "homepage"):
        assert info[key] == GALAXY[key], key
    for key in ("repository", "documentation", "issues", "homepage"):
        assert info[key].startswith("https://github.com/inferops/gpu_inference"), key


def test_dependencies_are_the_collections_used():
    """galaxy.yml's dependencies are exactly the other collections our YAML names by FQCN."""
    fqcn = re.compile(r"\b([a-z0-9_]+)\.([a-z0-9_]+)\.[a-z0-9_]+\b")
    used = set()
    for top in ("roles", "playbooks", os.path.join("inventories", "example")):
        for dirpath, _, files in os.walk(os.path.join(REPO, top)):
            for name in files:
                if name.endswith((".yml", ".yaml", ".j2")):
                    with open(os.path.join(dirpath, name), errors="replace") as f:
                        for ns, coll in fqcn.findall(f.read()):
                            if ns in ("community", "ansible") and coll != "builtin":
                                used.add(f"{ns}.{coll}")
    assert set(GALAXY["dependencies"]) == used


def test_version_claims_agree():
    with open(os.path.join(REPO, "meta", "runtime.yml")) as f:
        requires = yaml.safe_load(f)["requires_ansible"]
    low = re.fullmatch(r">=(\d+\.\d+)\.0", requires)
    assert low, f"requires_ansible {requires!r}: expected '>=X.Y.0'"
    for role in sorted(os.listdir(os.path.join(REPO, "roles"))):
        with open(os.path.join(REPO, "roles", role, "meta", "main.yml")) as f:
            assert str(yaml.safe_load(f)["galaxy_info"]["min_ansible_version"]) == low.group(1), role
    pins = non_comment_lines(os.path.join(REPO, "tests", "package", "requirements-oldest.txt"))
    assert pins == [f"ansible-core=={low.group(1)}.0"], "requirements-oldest.txt must pin requires_ansible's lower bound"


def test_galaxy_importer(tarball):
    full = dict(os.environ, GALAXY_IMPORTER_CONFIG=os.path.join(REPO, "tests", "package", "galaxy-importer.cfg"),
                GALAXY_IMPORTER_ANSIBLE_LOCAL_TMP=os.path.join(WORK, "importer-tmp"),
                PATH=VENV_BIN + os.pathsep + os.environ["PATH"])
    full.pop("ANSIBLE_CONFIG", None)  # the checkout's ansible.cfg (the Makefile exports it) points at .collections
    proc = subprocess.run([sys.executable, "-m", "galaxy_importer.main", tarball], cwd=WORK, env=full,
                          capture_output=True, text=True, timeout=600)
    print(proc.stdout, proc.stderr)
    problems = [line for line in (proc.stdout + proc.stderr).splitlines() if line.startswith(("ERROR", "WARNING"))]
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "Importer processing completed successfully" in proc.stdout
    assert not problems, "\n".join(problems)
    with open(os.path.join(WORK, "importer_result.json")) as f:
        result = json.load(f)
    assert result["metadata"]["dependencies"] == GALAXY["dependencies"]
    assert result["requires_ansible"]


def test_introspect_lists_exactly_meta_files(installed):
    proc = run([os.path.join(VENV_BIN, "ansible-builder"), "introspect", "--sanitize", installed])
    docs = [d for d in yaml.safe_load_all(proc.stdout) if d]
    assert len(docs) == 1, proc.stdout
    strip = re.compile(r"\s+# from collection .*$")
    got_python = [strip.sub("", line) for line in docs[0].get("python", [])]
    got_system = [strip.sub("", line) for line in docs[0].get("system", [])]
    assert all(f"from collection {FQCN}" in line for line in docs[0]["python"] + docs[0]["system"])
    assert got_python == non_comment_lines(os.path.join(REPO, "meta", "ee-requirements.txt"))
    assert got_system == non_comment_lines(os.path.join(REPO, "meta", "ee-bindep.txt"))


def test_ee_requirements_pinned_like_requirements_txt():
    pins = dict(line.split("==") for line in non_comment_lines(os.path.join(REPO, "requirements.txt")))
    for line in non_comment_lines(os.path.join(REPO, "meta", "ee-requirements.txt")):
        name, version = line.split("==")
        assert pins.get(name) == version, f"{line}: requirements.txt pins {name}=={pins.get(name)}"


def test_ee_build_context_installs_the_tarball(tarball):
    subprocess.run(["rm", "-rf", EE_CONTEXT], check=True)
    run([os.path.join(VENV_BIN, "ansible-builder"), "create", "-f", os.path.join(REPO, "execution-environment.yml"),
         "-c", EE_CONTEXT, "--output-filename", "Containerfile"], cwd=REPO)
    with open(os.path.join(EE_CONTEXT, "_build", "requirements.yml")) as f:
        galaxy_reqs = yaml.safe_load(f)
    name = os.path.basename(tarball)
    assert galaxy_reqs == {"collections": [{"name": f"collections/{name}", "type": "file"}]}
    copied = os.path.join(EE_CONTEXT, "_build", "collections", name)
    with open(copied, "rb") as a, open(tarball, "rb") as b:
        assert a.read() == b.read(), "the context's tarball is not the one just built"
    with open(os.path.join(EE_CONTEXT, "Containerfile")) as f:
        containerfile = f.read()
    assert "COPY _build /build" in containerfile and "WORKDIR /build" in containerfile
    assert re.search(r"^RUN .*ansible-galaxy collection install .*-r requirements\.yml", containerfile, re.M)
    core = [line for line in non_comment_lines(os.path.join(REPO, "requirements.txt")) if line.startswith("ansible-core==")]
    runner = [line for line in non_comment_lines(os.path.join(REPO, "requirements-dev.txt"))
              if line.startswith("ansible-runner==")]
    assert f'ARG ANSIBLE_INSTALL_REFS="{core[0]} {runner[0]}"' in containerfile
    assert 'ARG PYCMD="/usr/bin/python3.12"' in containerfile


@pytest.fixture(scope="session")
def oldest_installed(tarball) -> str:
    """The tarball installed by the oldest claimed ansible-core's own ansible-galaxy."""
    env = ansible_env(INSTALL_OLDEST)
    version = run([os.path.join(OLDEST_BIN, "ansible"), "--version"], env=env).stdout.splitlines()[0]
    pin = non_comment_lines(os.path.join(REPO, "tests", "package", "requirements-oldest.txt"))[0].split("==")[1]
    assert f"[core {pin}]" in version, version
    subprocess.run(["rm", "-rf", INSTALL_OLDEST], check=True)
    run([os.path.join(OLDEST_BIN, "ansible-galaxy"), "collection", "install", "--no-deps", "-p", INSTALL_OLDEST, tarball],
        env=env)
    return INSTALL_OLDEST


@pytest.mark.parametrize("playbook", PLAYBOOKS)
def test_oldest_core_syntax_check(oldest_installed, playbook):
    env = ansible_env(oldest_installed)
    env["PATH"] = OLDEST_BIN + os.pathsep + os.environ["PATH"]
    proc = run([os.path.join(OLDEST_BIN, "ansible-playbook"), "--syntax-check", f"{FQCN}.{playbook}"], env=env)
    assert f"{oldest_installed}/ansible_collections/{NAMESPACE}/{NAME}/playbooks/{playbook}.yml" in proc.stdout


def _plan_answer(stdout: str) -> str:
    found = re.findall(r'"msg": "(--hicache-size \d+)"', stdout)
    assert found, stdout[-3000:]
    return found[-1]


@pytest.mark.parametrize("example", ["llama-3-70b-8gpu.yml", "kimi-k2-incident.yml"])
def test_oldest_core_calculator(oldest_installed, installed, example):
    """plan.yml from the built collection gives the same size on the oldest claimed ansible-core as on the pin."""
    vars_file = os.path.join(REPO, "playbooks", "vars", "examples", example)
    answers = []
    for bin_dir, path in ((OLDEST_BIN, oldest_installed), (VENV_BIN, installed)):
        env = ansible_env(path)
        env["PATH"] = bin_dir + os.pathsep + os.environ["PATH"]
        proc = run([os.path.join(bin_dir, "ansible-playbook"), f"{FQCN}.plan", "-e", f"@{vars_file}"], env=env)
        answers.append(_plan_answer(proc.stdout))
    assert answers[0] == answers[1]


# --- The calculator as an operator runs it: the installed tarball, no ansible.cfg anywhere, ansible-core's defaults.

OPERATOR_INVENTORY = {"all": {"children": {
    "proxmox_nodes": {"hosts": {"pve1": {"ansible_host": "pve1.example.org"}}},
    "sglang_containers": {"hosts": {"ct129": {
        "proxmox_vmid": 129, "pve_gpu_container_node_host": "pve1", "pve_gpu_container_gpus": [0, 1, 2, 3, 4, 5, 6, 7],
        "pve_gpu_container_memory_mib": 450560, "sglang_server_version": "0.5.9", "sglang_server_tp_size": 8,
        "sglang_server_model_path": "/srv/models/Kimi-K2-Instruct", "sglang_server_model_preset": "kimi-k2"}}}}}}
# The incident node: 449 GiB of RAM, 8 GPUs of 97887 MiB (the one fact the inventory above does not give).
NODE_INPUT = {"plan_input": {"mem_total_bytes": 482110078976, "gpu_memory_mib": 97887}}
PLAN_REFUSED = "Refused: the plan does not fit; the arithmetic is printed above (Show the plan)."


@pytest.fixture(scope="session")
def operator(tarball, tmp_path_factory):
    """An empty collections path with the tarball installed, and an empty working directory (also HOME: no
    ~/.ansible.cfg); the environment has no ANSIBLE_* variable but ANSIBLE_COLLECTIONS_PATH."""
    root = tmp_path_factory.mktemp("operator")
    collections, cwd = root / "collections", root / "work"
    collections.mkdir()
    cwd.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    env.update(HOME=str(cwd), PATH=VENV_BIN + os.pathsep + os.environ["PATH"], ANSIBLE_COLLECTIONS_PATH=str(collections))
    assert not os.listdir(collections)
    proc = subprocess.run([os.path.join(VENV_BIN, "ansible-galaxy"), "collection", "install", "--no-deps", "-p",
                           str(collections), tarball], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    with open(cwd / "hosts.yml", "w") as f:
        yaml.safe_dump(OPERATOR_INVENTORY, f)
    version = subprocess.run([os.path.join(VENV_BIN, "ansible-playbook"), "--version"], cwd=cwd, env=env,
                             capture_output=True, text=True, check=True).stdout
    assert "config file = None" in version, version
    return {"env": env, "cwd": str(cwd), "collection": str(collections / "ansible_collections" / NAMESPACE / NAME)}


def operator_plan(operator, *args):
    """ansible-playbook inferops.gpu_inference.plan ARGS as the operator runs it; stdout and stderr together."""
    cmd = [os.path.join(VENV_BIN, "ansible-playbook"), f"{FQCN}.plan", *args]
    proc = subprocess.run(cmd, cwd=operator["cwd"], env=operator["env"], capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    print("$", " ".join(cmd), f"(rc {proc.returncode})\n{out[-8000:]}")
    assert "Traceback" not in out
    # Line-shaped: no text with its line breaks printed as \n inside one JSON string, wherever it comes from.
    assert "\\n" not in out, "a message printed with \\n inside one line"
    # Nothing of the checkout (an error's origin names the playbook's path).
    assert REPO not in out
    return proc.returncode, out


def printed_list(out: str, task: str, key: str = "msg") -> list:
    """The list the task printed under ``key``, read line by line: each element must be exactly one line."""
    lines = out[out.index(f"TASK [{task}]"):].splitlines()
    start = lines.index(f'    "{key}": [')
    got = []
    for line in lines[start + 1:]:
        if line.rstrip() == "    ]" or line.rstrip() == "    ],":
            return got
        assert line.startswith('        "'), f"not one element a line: {line!r}"
        text = line.strip()
        got.append(json.loads(text[:-1] if text.endswith(",") else text))  # one whole JSON string, or it raises
    raise AssertionError(f"{task}: the list of {key} does not end")


def in_process_plan(operator, plan_input: dict, requested_gb=None) -> dict:
    """The installed collection's calculator (module_utils, pure Python) called directly, in a separate Python."""
    code = ("import json, sys\n"
            "from ansible_collections.inferops.gpu_inference.plugins.module_utils.deploy import sglang_deploy\n"
            "args = json.load(sys.stdin)\n"
            "print(json.dumps(sglang_deploy.calculate(args['plan_input'], args['requested_gb'])))\n")
    env = dict(operator["env"], PYTHONPATH=os.path.dirname(os.path.dirname(os.path.dirname(operator["collection"]))))
    proc = subprocess.run([sys.executable, "-c", code], input=json.dumps({"plan_input": plan_input, "requested_gb": requested_gb}),
                          env=env, capture_output=True, text=True, check=True)
    return json.loads(proc.stdout)


def shown_plan(calculation: dict) -> list:
    """What plan.yml shows of a calculation, one element a line (its notes, the picture, the arithmetic, warnings)."""
    plan = calculation["plan"]
    notes = calculation["notes"] + ([""] if calculation["notes"] else [])
    return notes + plan["picture"] + [""] + plan["explain"] + ["WARNING: " + w for w in plan["warnings"]]


def test_operator_plan_from_the_shipped_example(operator):
    example = os.path.join(operator["collection"], "playbooks", "vars", "examples", "kimi-k2-incident.yml")
    assert os.path.isfile(example), "the example the docs point at is not in the installed collection"
    with open(example) as f:
        plan_input = yaml.safe_load(f)["plan_input"]
    rc, out = operator_plan(operator, "-e", f"@{example}")
    assert rc == 0
    shown = printed_list(out, "Show the plan")
    assert shown == shown_plan(in_process_plan(operator, plan_input))
    assert any(line.startswith("Plan: --hicache-size 48 per rank") for line in shown), shown  # the incident's answer
    assert '"msg": "--hicache-size 48"' in out


def test_operator_plan_refuses_the_incident_size_once(operator):
    example = os.path.join(operator["collection"], "playbooks", "vars", "examples", "kimi-k2-incident.yml")
    with open(example) as f:
        plan_input = yaml.safe_load(f)["plan_input"]
    rc, out = operator_plan(operator, "-e", f"@{example}", "-e", "plan_requested_gb=300")
    assert rc != 0
    shown = printed_list(out, "Show the plan")
    calculation = in_process_plan(operator, plan_input, 300)
    assert not calculation["plan"]["fits"]
    assert shown == shown_plan(calculation)
    # The arithmetic once (the plan shown), the refusal one short line (the error and the failed result repeat it).
    assert out.count("DOES NOT FIT") == 1 and out.count("Largest safe value: --hicache-size 48") == 1, out
    assert any(line.startswith("Requested --hicache-size 300: 8 ranks x 300.0 GB = 2400.0 GB pinned") for line in shown)
    assert f"[ERROR]: Task failed: Action failed: {PLAN_REFUSED}" in out and f'"msg": "{PLAN_REFUSED}"' in out


def test_operator_plan_for_an_inventory_host(operator):
    rc, out = operator_plan(operator, "-i", "hosts.yml", "-e", "plan_host=ct129",
                            "-e", json.dumps({"plan_input": {"gpu_memory_mib": 97887}}))
    assert rc == 0
    shown = printed_list(out, "Show the plan")
    assert shown[0].startswith("Planned offline for ct129 (CT 129,")
    plan_line = [line for line in shown if line.startswith("Plan: --hicache-size ")]
    assert len(plan_line) == 1
    size = re.match(r"Plan: --hicache-size (\d+) per rank", plan_line[0]).group(1)
    assert f'"msg": "--hicache-size {size}"' in out
    rc, out = operator_plan(operator, "-i", "hosts.yml", "-e", "plan_host=ct129", "-e", "plan_requested_gb=300",
                            "-e", json.dumps({"plan_input": {"gpu_memory_mib": 97887}}))
    assert rc != 0
    shown = printed_list(out, "Show the plan")
    assert any(line.startswith("Requested --hicache-size 300: 8 ranks x 300.0 GB") and "DOES NOT FIT" in line
               for line in shown), shown
    assert out.count("DOES NOT FIT") == 1, out
    assert f'"msg": "{PLAN_REFUSED}"' in out


def test_operator_plan_for_a_node(operator):
    rc, out = operator_plan(operator, "-i", "hosts.yml", "-e", "plan_node=pve1", "-e", json.dumps(NODE_INPUT))
    assert rc == 0
    shown = printed_list(out, "Show the node's plan")
    assert shown[0].startswith("Planned offline for node pve1 from the inventory: 1 container(s)")
    table = shown[shown.index("") + 1:]
    assert table[0].split()[:7] == ["guest", "limit", "host", "KV", "pools", "pinned", "overheads"]
    assert "(GiB = 2^30 bytes, GB = 10^9 bytes)" in table[0]
    assert table[1].startswith("CT 129 ct129 ") and table[-1].startswith("node pve1 RAM ") and table[-1].endswith("fits")


def test_operator_plan_for_a_node_refuses_a_requested_size(operator):
    rc, out = operator_plan(operator, "-i", "hosts.yml", "-e", "plan_node=pve1", "-e", json.dumps(NODE_INPUT),
                            "-e", "plan_requested_gb=300")
    assert rc != 0
    assert "TASK [Show the node's plan]" not in out, "planned anyway"
    # Refused naming the way that plans the size: the container, with plan_host.
    assert re.search(r"plan_requested_gb='?300'? is one container's per-rank size", out), out
    assert re.search(r"-e plan_host=ct129 -e plan_requested_gb='?300'?", out), out


def test_operator_plan_for_a_node_whose_container_does_not_fit(operator):
    """A container of the node asking for 300 GB per rank: the node's plan refuses it, the arithmetic one line an
    element of msg_lines (printed once), the message itself one line."""
    rc, out = operator_plan(operator, "-i", "hosts.yml", "-e", "plan_node=pve1", "-e", json.dumps(NODE_INPUT),
                            "-e", "sglang_server_hicache_requested_gb=300")
    assert rc != 0
    assert "TASK [Show the node's plan]" not in out
    lines = printed_list(out, "Compute the node's plan", key="msg_lines")
    assert any(line.startswith("Requested --hicache-size 300: 8 ranks x 300.0 GB") and "DOES NOT FIT" in line
               for line in lines), lines
    assert "" in lines and any(line.startswith(" ! KV pools ") for line in lines), lines  # the picture, its columns kept
    assert out.count("DOES NOT FIT") == 1, out
    assert re.search(r'"msg": "CT 129: refused before any change, the HiCache plan does not fit\.[^"\n]*msg_lines', out), out
