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
    calculator (plan.yml) with the same answer as the pinned ansible-core.
Nothing here uses the checkout's .collections link or its ansible.cfg: each ansible command gets its own config.
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
                "meta/ee-bindep.txt", "playbooks/deploy.yml", "playbooks/recover.yml", "playbooks/plan.yml"]
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
    vars_file = os.path.join(REPO, "inventories", "examples", example)
    answers = []
    for bin_dir, path in ((OLDEST_BIN, oldest_installed), (VENV_BIN, installed)):
        env = ansible_env(path)
        env["PATH"] = bin_dir + os.pathsep + os.environ["PATH"]
        proc = run([os.path.join(bin_dir, "ansible-playbook"), f"{FQCN}.plan", "-e", f"@{vars_file}"], env=env)
        answers.append(_plan_answer(proc.stdout))
    assert answers[0] == answers[1]
