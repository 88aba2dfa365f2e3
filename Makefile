# inferops.gpu_inference: set-up, tests, lab, demo and benchmarks.
# The two commands a new machine needs are `make demo` and `make test`; every target installs what it uses.
SHELL := /bin/bash
.ONESHELL:
.SHELLFLAGS := -eu -o pipefail -c

ROOT      := $(abspath .)
VENV      := $(ROOT)/.venv
BIN       := $(VENV)/bin
COLL_LINK := $(ROOT)/.collections/ansible_collections/inferops/gpu_inference
BUILD_DIR := $(ROOT)/.build/ansible_collections/inferops/gpu_inference
export PATH := $(BIN):$(PATH)
export ANSIBLE_CONFIG := $(ROOT)/ansible.cfg
export PYTHONDONTWRITEBYTECODE := 1
# The lab writes its inventory's vault with a generated password (tests/lab/labctl up); only the targets
# that run against the lab read it, so the others work on a machine where the lab never ran.
LAB_VAULT_PASS := /var/lib/inferops-lab/vault-pass
LAB_TARGETS    := lab-test hostile molecule demo bench
$(LAB_TARGETS): export ANSIBLE_VAULT_PASSWORD_FILE ?= $(LAB_VAULT_PASS)
# The roles write their reports outside any checkout by default (~/.local/state/inferops/reports); the lab's runs
# keep theirs in this checkout's reports/, where the tests, the benchmarks and `make demo` read them.
$(LAB_TARGETS): export INFEROPS_REPORT_DIR ?= $(ROOT)/reports

# ansible-core 2.21 needs Python >= 3.12: take the first interpreter that really runs.
PYTHON ?= $(shell for p in python3.13 python3.12 $$(ls -d /root/.pyenv/versions/3.1[23]*/bin/python3.1[23] 2>/dev/null) /usr/bin/python3.12; do \
            "$$p" -c 'import sys; assert sys.version_info >= (3, 12)' >/dev/null 2>&1 && { command -v "$$p"; break; }; done)

.PHONY: help setup setup-core test check unit property pure lint sanity controller-requirements lab lab-down lab-test hostile \
        molecule demo plan bench clean device-check awx-check corpus safety-doc v2kernel

help:
	@echo "make demo     bring up the lab and run deploy.yml on it, then print the report"
	@echo "make test     run every test (unit, lint, sanity, controller requirements, lab, molecule)"
	@echo "make check    the fast tier: unit, lint and the tests that need no lab (about a minute)"
	@echo "make hostile  the hostile set alone: a tenant or host user attacks deploy, recover and the event source"
	@echo "make property the sizing model's property test against its oracle, 100,000+ layouts"
	@echo "make plan     print a HiCache sizing plan (VARS=playbooks/vars/examples/<file>.yml)"
	@echo "make lab / make lab-down   bring the lab up / tear it down"
	@echo "make bench    run the benchmarks (under 15 min; BENCH_FULL=1 for the full grid, about 36 min)"
	@echo "make bench-capacity  the sizing plan at real host sizes (no lab; seconds)"

$(BIN)/python:
	@test -n "$(PYTHON)" || { echo "error: no Python >= 3.12 found; install one (ansible-core 2.21 needs it) or pass PYTHON=/path/to/python3.12" >&2; exit 1; }
	"$(PYTHON)" -m venv "$(VENV)"

# The calculator needs ansible-core alone (its pin from requirements.txt); everything else the whole toolchain.
$(BIN)/.stamp-core: requirements.txt | $(BIN)/python
	"$(BIN)/pip" install --quiet --disable-pip-version-check "$$(grep -E '^ansible-core==' requirements.txt)"
	touch "$@"

$(BIN)/.stamp: requirements.txt requirements-dev.txt | $(BIN)/python
	"$(BIN)/pip" install --quiet --disable-pip-version-check -r requirements-dev.txt
	touch "$(BIN)/.stamp-core" "$@"

$(COLL_LINK):
	mkdir -p "$(dir $@)"
	ln -sfn ../../.. "$@"

setup-core: $(BIN)/.stamp-core $(COLL_LINK)
setup: $(BIN)/.stamp $(COLL_LINK)

unit: setup
	cd "$(COLL_LINK)" && "$(BIN)/python" -m pytest -q tests/unit

# The sizing model's property test at full strength (docs/sizing.md): 170,000 examples, of which at least
# 100,000 layouts that the plan sizes (not refused) are checked against the independent oracle (`make unit`
# runs 2,000). About a quarter of an hour (15-18 min) on two cores.
PROPERTY_EXAMPLES ?= 170000
PROPERTY_MIN_PLANNED ?= 100000
property: setup
	cd "$(COLL_LINK)" && HICACHE_PROPERTY_EXAMPLES=$(PROPERTY_EXAMPLES) HICACHE_PROPERTY_MIN_LAYOUTS=$(PROPERTY_MIN_PLANNED) \
	  HICACHE_PROPERTY_MIN_PLANNED=$(PROPERTY_MIN_PLANNED) "$(BIN)/python" -m pytest -q -p no:cacheprovider tests/unit/plugins/test_hicache_property.py

# Tests that need neither root nor the lab (the SGLang stand-in's arithmetic and the simulated PVE node's rules, in-process).
PURE_TESTS := tests/lab/test_sglang_units.py tests/lab/test_pve_units.py tests/lab/test_gpu_units.py
pure: setup
	"$(BIN)/python" -m pytest -q -p no:cacheprovider $(PURE_TESTS)

check: unit pure lint awx-check corpus

# The playbook-level input corpus (tests/corpus/inputs/: bad, tricky and forged extra variables through every input
# path, each with the message it must produce): every case in-process, a representative third through the real
# playbooks (ansible-playbook, ansible-runner as AWX runs a job), in parallel. Offline; about half a minute.
corpus: setup
	"$(BIN)/python" tests/corpus/run_inputs.py

# docs/safety.md's list of each playbook's extra variables, regenerated from the roles' argument_specs and the
# playbooks (a unit test fails while it differs).
safety-doc: setup
	"$(BIN)/python" tests/corpus/gen_safety_doc.py

# AWX as code (awx/): surveys and credential types against AWX's rules and the roles' variables, apply.yml's
# options, project sync of collections/requirements.yml, and plan.yml with survey answers as AWX passes them.
# Offline; about half a minute.
awx-check: setup
	"$(BIN)/python" -m pytest -q -p no:cacheprovider tests/awx

lint: setup
	"$(BIN)/yamllint" -s .
	"$(BIN)/ansible-lint" --offline -q
	"$(BIN)/antsibull-changelog" lint

# ansible-test needs the collection at .../ansible_collections/NS/NAME: copy what the collection ships
# (and its unit tests) there and run the sanity tests in ansible-test's own pinned virtualenvs.
# The collection's one dependency is copied beside it, where ansible-test's import test looks
# (plugins/connection/pct_remote.py extends community.proxmox's connection): the copy the `ansible` package carries.
SANITY_PATHS := galaxy.yml meta plugins roles playbooks extensions changelogs README.md tests/unit
sanity: setup
	pipver=$$(grep -oP "pip='\\K[0-9.]+" "$(VENV)"/lib/python3*/site-packages/ansible_test/_internal/python_requirements.py | head -n1)
	mkdir -p ~/.ansible/test/cache && cp tests/sanity/get_pip_offline.py ~/.ansible/test/cache/get_pip_$${pipver//./_}.py
	rm -rf "$(BUILD_DIR)" && mkdir -p "$(BUILD_DIR)"
	git ls-files -co --exclude-standard -z -- $(SANITY_PATHS) | xargs -0 -r cp --parents -P -t "$(BUILD_DIR)/"
	printf 'tests/output/\n' > "$(BUILD_DIR)/.gitignore"
	rm -rf "$(ROOT)/.build/ansible_collections/community" && mkdir -p "$(ROOT)/.build/ansible_collections/community"
	cp -r "$(VENV)"/lib/python3*/site-packages/ansible_collections/community/proxmox "$(ROOT)/.build/ansible_collections/community/"
	cd "$(BUILD_DIR)" && git init -q . && git add -A >/dev/null && \
	  "$(BIN)/ansible-test" sanity --venv --requirements --python 3.12 --color no

# requirements.txt alone (a controller's install) must run deploy and recover: a venv built from it
# syntax-checks both playbooks and imports every third-party module our plugins and the ones we use import.
CTRL_VENV := $(ROOT)/.build/controller-venv
controller-requirements: $(COLL_LINK)
	@test -n "$(PYTHON)" || { echo "error: no Python >= 3.12 found (pass PYTHON=...)" >&2; exit 1; }
	rm -rf "$(CTRL_VENV)"
	"$(PYTHON)" -m venv "$(CTRL_VENV)"
	"$(CTRL_VENV)/bin/pip" install --quiet --disable-pip-version-check -r requirements.txt
	"$(CTRL_VENV)/bin/python" tests/controller/check_requirements.py

# The collection as users get it (tests/package/test_package.py): the built tarball's listing and MANIFEST.json,
# galaxy-importer on it, ansible-builder introspect of the installed tarball and the build context of
# execution-environment.yml (no image is built: no container engine here), and the oldest ansible-core that
# meta/runtime.yml claims. Its tools have their own virtualenvs (tests/package/requirements*.txt). About a minute.
PKG_VENV   := $(ROOT)/.build/package-venv
PKG_OLDEST := $(ROOT)/.build/package-oldest
.PHONY: package
$(PKG_VENV)/.stamp: tests/package/requirements.txt
	@test -n "$(PYTHON)" || { echo "error: no Python >= 3.12 found (pass PYTHON=...)" >&2; exit 1; }
	rm -rf "$(PKG_VENV)" && "$(PYTHON)" -m venv "$(PKG_VENV)"
	"$(PKG_VENV)/bin/pip" install --quiet --disable-pip-version-check -r tests/package/requirements.txt
	touch "$@"

$(PKG_OLDEST)/.stamp: tests/package/requirements-oldest.txt
	@test -n "$(PYTHON)" || { echo "error: no Python >= 3.12 found (pass PYTHON=...)" >&2; exit 1; }
	rm -rf "$(PKG_OLDEST)" && "$(PYTHON)" -m venv "$(PKG_OLDEST)"
	"$(PKG_OLDEST)/bin/pip" install --quiet --disable-pip-version-check -r tests/package/requirements-oldest.txt
	touch "$@"

package: $(PKG_VENV)/.stamp $(PKG_OLDEST)/.stamp
	PKG_OLDEST_BIN="$(PKG_OLDEST)/bin" "$(PKG_VENV)/bin/python" -m pytest -v -p no:cacheprovider tests/package

plan: setup-core
	"$(BIN)/ansible-playbook" playbooks/plan.yml $(if $(VARS),-e @$(VARS),)

# cgroup v2 on a real kernel (tests/v2kernel, docs/lab.md "cgroup v2 on a real kernel"): Debian's kernel package
# under QEMU's software emulation, a pure cgroup v2 hierarchy, a real LXC container started with the cgroup keys PVE 9
# writes, and the collection's own cgroup code checked against the kernel's files. Installs qemu-system-x86 and lxc
# (apt, as root) and downloads the kernel and busybox-static packages into .build/v2kernel the first time. Not the
# lab: no lock, no daemons left. 30-40 s a run (boot 8-11 s, checks 20-30 s); 53 s on a fresh machine.
v2kernel:
	"$(ROOT)/tests/v2kernel/vmctl" test

lab: setup
	"$(ROOT)/tests/lab/labctl" up

lab-down: setup
	"$(ROOT)/tests/lab/labctl" down

lab-test: lab
	"$(BIN)/python" -m pytest -q --durations=15 tests/lab

# The hostile set (docs/safety.md, "Threat model"): a tenant or host user attacks deploy, recover and the event source
# (tests/lab/test_hostile_*.py); each attack is refused or contained, read from the world. Part of lab-test.
hostile: lab
	"$(BIN)/python" -m pytest -q --durations=15 tests/lab/test_hostile_*.py

# Molecule scenarios run on the lab (create/destroy call tests/lab/labctl); one at a time. `default` deploys,
# verifies, then runs recover's cases as its side_effect (`molecule test -s recover` runs those on their own);
# `multinode` deploys one server over pve1 and pve2, verifies it and recovers it whole after one node's ranks die.
# What failed is printed again at the end (reports/molecule-*-failure.txt), where a CI log's tail shows it.
MOLECULE_SCENARIOS ?= default multinode
molecule: lab eda-setup
	for s in $(MOLECULE_SCENARIOS); do
	  rm -f reports/molecule-*-failure.txt
	  "$(BIN)/molecule" test -s "$$s" || { cat reports/molecule-*-failure.txt 2>/dev/null; exit 1; }
	done

demo: lab
	"$(BIN)/ansible-playbook" -i inventories/lab/hosts.yml playbooks/deploy.yml
	@echo; echo "Report: $(ROOT)/reports/ct129/deploy.txt (JSON beside it)"; echo; cat "$(ROOT)/reports/ct129/deploy.txt"

# The offline tier (no lab; v2kernel installs its apt packages as root the first time) two at a time, each target's
# output kept together; then the lab tier in order
# (lab-test and molecule share the one lab, and a busy CPU could shift what the stand-in and the node plans measure).
OFFLINE_TESTS := unit pure lint awx-check corpus sanity package controller-requirements v2kernel
test:
	$(MAKE) -j2 --output-sync=target $(OFFLINE_TESTS)
	$(MAKE) lab-test molecule

# Benchmarks, not tests: deploy (full and no-change re-run), sizing (five rules launched in a lab container),
# recover (every lab fault); tables on stdout, JSON and the picture in reports/.
$(BIN)/.stamp-bench: requirements-bench.txt | $(BIN)/.stamp
	"$(BIN)/pip" install --quiet --disable-pip-version-check -r requirements-bench.txt
	touch "$@"

# By default under 15 minutes on the lab's machine kind (1 full deploy + 3 re-runs, 4 sizing configurations, each
# fault once); BENCH_FULL=1 runs the whole grid (2 full deploys x 2 re-runs, 22 configurations, each fault twice:
# about 36 minutes).
BENCH_FULL ?=
BENCH_DEPLOY_ARGS  := $(if $(BENCH_FULL),--full 2 --reruns 2,)
BENCH_SIZING_ARGS  := $(if $(BENCH_FULL),--grid full,--grid quick)
BENCH_RECOVER_ARGS := $(if $(BENCH_FULL),--repeat 2,)
bench: lab $(BIN)/.stamp-bench eda-setup bench-capacity
	"$(BIN)/python" benchmarks/deploy_bench.py $(BENCH_DEPLOY_ARGS)
	"$(BIN)/python" benchmarks/sizing_bench.py $(BENCH_SIZING_ARGS)
	"$(BIN)/python" benchmarks/recover_bench.py $(BENCH_RECOVER_ARGS)
	"$(BIN)/python" benchmarks/eda_bench.py
	"$(BIN)/python" benchmarks/plot.py

# The capacity grid (docs/sizing.md, "Capacity at real host sizes"): the plan at real host sizes (256 GiB to 4 TiB)
# against SGLang's own check and the safe budget; pure Python, no lab, a few seconds. reports/bench-capacity.{json,png}.
.PHONY: bench-capacity
bench-capacity: setup $(BIN)/.stamp-bench
	"$(BIN)/python" benchmarks/capacity_bench.py

# Event-Driven Ansible (extensions/eda/, docs/recover.md "Unattended recovery"): ansible-rulebook in its own
# virtualenv (its pins are its own: extensions/eda/requirements.txt); its Java runtime comes with the lab's packages
# (tests/lab/labctl up installs openjdk-17-jre-headless). The rulebook runs ansible-playbook from .venv on PATH.
EDA_VENV := $(ROOT)/.build/eda-venv
$(EDA_VENV)/.stamp: extensions/eda/requirements.txt
	@test -n "$(PYTHON)" || { echo "error: no Python >= 3.12 found (pass PYTHON=...)" >&2; exit 1; }
	rm -rf "$(EDA_VENV)" && "$(PYTHON)" -m venv "$(EDA_VENV)"
	"$(EDA_VENV)/bin/pip" install --quiet --disable-pip-version-check -r extensions/eda/requirements.txt
	touch "$@"
.PHONY: eda-setup
eda-setup: setup $(EDA_VENV)/.stamp

clean:
	rm -rf .build .collections tests/output

# On a machine with a real NVIDIA GPU only (never resets or reconfigures it): tests/device/README.md.
device-check: setup
	tests/device/run.sh
