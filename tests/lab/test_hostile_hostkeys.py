"""Hostile: a machine impersonating the node under AWX's ANSIBLE_HOST_KEY_CHECKING=False; a tampered NVIDIA installer.

AWX copies ANSIBLE_HOST_KEY_CHECKING=False into every job's environment (tests/awx/runner/awx_job.py,
AWX_ANSIBLE_SETTINGS, is what these runs get). The impostor is a real sshd on another port of this machine with a host
key of its own that accepts the lab's client key (so, were its key not checked, it would receive everything, as the
control run shows). Refusals are checked from the world: the impostor's and the node's sshd logs (no "Accepted
publickey": no authentication, so no byte of the run reached them), and the files a run would write on the node and
in CT 184, never only from ansible's message.

The installer: a copy of the lab's installer with one line added (it would touch a marker as root in the container)
sits where the node's installer is looked for; the inventory's sha256 is the genuine one (labgpu writes
SHA256SUMS.json beside the installers it builds). The role's install tasks fetch it through the pinned node
connection and copy it into CT 184, and refuse to run it: no marker, no installer log in the container. The genuine
file then runs (its log appears).
"""
from __future__ import annotations

import os
import pathlib
import shutil
import socket
import subprocess
import tempfile
import time
import uuid

import hashlib
import json

import pytest
import yaml

from conftest import LAB, NODE, REPO, pct, running_ct

import awx_job  # tests/awx/runner (pytest.ini)

VMID = 184
IMPOSTOR_PORT = 22184
NODE_LOG = f"{LAB}/log/sshd.log"
PROBE = os.path.join(REPO, "tests", "lab", "hostkeys_probe.yml")
INSTALL_PROBE = os.path.join(REPO, "tests", "lab", "install_probe.yml")
WHEELS = f"{LAB}/packages"
INSTALLERS = f"{LAB}/nvidia"
NODE_KEY_PUB = f"{LAB}/ssh/ssh_host_ed25519_key.pub"
BIN = os.path.join(REPO, ".venv", "bin")


def _accepted(log: str) -> int:
    try:
        with open(log, errors="replace") as f:
            return sum("Accepted publickey" in line for line in f)
    except FileNotFoundError:
        return 0


def _wait_port(port: int) -> None:
    for _ in range(100):
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise AssertionError(f"nothing listens on 127.0.0.1:{port}")


@pytest.fixture(scope="module")
def ct184(lab, api_root):
    yield from running_ct(api_root, VMID)


@pytest.fixture(scope="module")
def impostor(lab, tmp_path_factory):
    """An sshd on 127.0.0.1:22184 with its own host key, accepting the lab's client key; pct there is the node's."""
    d = tmp_path_factory.mktemp("impostor")
    key = d / "host_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "impostor", "-f", str(key)], check=True)
    log = d / "sshd.log"
    cfg = d / "sshd_config"
    cfg.write_text(f"""Port {IMPOSTOR_PORT}
ListenAddress 127.0.0.1
HostKey {key}
PidFile {d}/sshd.pid
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
PubkeyAuthentication yes
AuthorizedKeysFile {LAB}/ssh/authorized_keys
UsePAM no
LogLevel INFO
SetEnv INFEROPS_LAB_NODE={NODE}
Subsystem sftp /usr/lib/openssh/sftp-server
""")
    os.makedirs("/run/sshd", exist_ok=True)
    proc = subprocess.Popen(["/usr/sbin/sshd", "-D", "-f", str(cfg), "-E", str(log)])
    try:
        _wait_port(IMPOSTOR_PORT)
        yield {"port": IMPOSTOR_PORT, "log": str(log), "key": (d / "host_key.pub").read_text().strip()}
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.fixture
def probe():
    """Paths a run would write: on the node (this machine) and in CT 184; removed afterwards. A short HOME (ssh's
    ControlPath is a socket path, under 108 bytes)."""
    tag = uuid.uuid4().hex[:12]
    d = tempfile.mkdtemp(prefix="hk", dir="/tmp")
    p = {"secret": "not-for-impostors-" + tag, "node_file": f"/tmp/inferops-hostkeys-probe-{tag}",
         "ct_file": f"/root/inferops-hostkeys-probe-{tag}", "dir": pathlib.Path(d)}
    yield p
    shutil.rmtree(d, ignore_errors=True)
    if os.path.exists(p["node_file"]):
        os.unlink(p["node_file"])
    pct("exec", str(VMID), "--", "rm", "-f", p["ct_file"])


def _inventory(tmp_path, port: int, keys) -> str:
    common = {"ansible_host": "127.0.0.1", "ansible_port": port, "ansible_user": "root",
              "ansible_python_interpreter": "/usr/bin/python3"}
    inv = {"all": {"vars": {}, "children": {
        "proxmox_nodes": {"hosts": {"pve1": dict(common, ansible_connection="ssh",
                                                 ansible_ssh_private_key_file=f"{LAB}/ssh/id_ed25519",
                                                 ansible_ssh_common_args="-o IdentitiesOnly=yes")}},
        "sglang_containers": {"hosts": {"ct184": dict(common, ansible_connection="inferops.gpu_inference.pct_remote",
                                                      ansible_private_key_file=f"{LAB}/ssh/id_ed25519",
                                                      proxmox_vmid=VMID)}}}}}
    if keys is not None:
        inv["all"]["vars"]["proxmox_node_ssh_host_keys"] = keys
    path = tmp_path / "hosts.yml"
    path.write_text(yaml.safe_dump(inv))
    return str(path)


def _awx_env(tmp_path) -> dict:
    """AWX's ANSIBLE_* settings (host key checking off, no known_hosts recorded) over a clean HOME, as a job's."""
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    env.update(awx_job.AWX_ANSIBLE_SETTINGS, HOME=str(home), ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg"),
               ANSIBLE_FORCE_COLOR="False", PATH=BIN + ":" + os.environ.get("PATH", ""))
    assert env["ANSIBLE_HOST_KEY_CHECKING"] == "False"
    return env


def _run_probe(p, inventory, host: str):
    """(rc, output with whitespace folded) of the probe playbook on one host (pve1: the node's ssh; ct184: pct_remote)."""
    r = subprocess.run([os.path.join(BIN, "ansible-playbook"), "-i", inventory, PROBE, "-l", host,
                        "-e", f"probe_secret={p['secret']}", "-e", f"probe_node_file={p['node_file']}",
                        "-e", f"probe_ct_file={p['ct_file']}"],
                       cwd=REPO, env=_awx_env(p["dir"]), capture_output=True, text=True, timeout=240)
    return r.returncode, " ".join((r.stdout + r.stderr).split())


def _ct_has(path: str) -> bool:
    return pct("exec", str(VMID), "--", "test", "-e", path).returncode == 0


def _node_key() -> str:
    with open(NODE_KEY_PUB) as f:
        return f.read().strip()


def test_impostor_gets_nothing_from_either_connection(ct184, impostor, probe):
    # Control: without the pin (a plain ad-hoc copy, AWX's environment), the impostor takes the secret: the attack is real.
    inv_plain = _inventory(probe["dir"], impostor["port"], None)
    before = _accepted(impostor["log"])
    r = subprocess.run([os.path.join(BIN, "ansible"), "-i", inv_plain, "pve1", "-m", "ansible.builtin.copy",
                        "-a", f"content={probe['secret']} dest={probe['node_file']} mode=0600"],
                       cwd=REPO, env=_awx_env(probe["dir"]), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert _accepted(impostor["log"]) > before
    with open(probe["node_file"]) as f:
        assert f.read() == probe["secret"]
    os.unlink(probe["node_file"])

    # The node's real key pinned, the impostor answering at the node's address: both connections refuse it.
    before = _accepted(impostor["log"])
    inv = _inventory(probe["dir"], impostor["port"], [_node_key()])
    rc, out = _run_probe(probe, inv, "pve1")
    assert rc != 0, out
    assert "Host key verification failed" in out or "REMOTE HOST IDENTIFICATION HAS CHANGED" in out, out
    rc, out = _run_probe(probe, inv, "ct184")
    assert rc != 0, out
    assert "which is not one the inventory pins" in out and "Refused before authenticating" in out, out
    # From the world: the impostor authenticated nobody after the control run, and nothing was written anywhere.
    assert _accepted(impostor["log"]) == before
    assert not os.path.exists(probe["node_file"])
    assert not _ct_has(probe["ct_file"])


def test_pinned_key_connects_both(ct184, probe):
    inv = _inventory(probe["dir"], 2222, [_node_key()])
    before = _accepted(NODE_LOG)
    rc, out = _run_probe(probe, inv, "pve1")
    assert rc == 0, out
    assert _accepted(NODE_LOG) > before        # ssh authenticated
    before = _accepted(NODE_LOG)
    rc, out = _run_probe(probe, inv, "ct184")
    assert rc == 0, out
    assert _accepted(NODE_LOG) > before        # paramiko (pct exec) authenticated
    with open(probe["node_file"]) as f:
        assert f.read() == probe["secret"] + "\n"
    got = pct("exec", str(VMID), "--", "cat", probe["ct_file"])
    assert got.returncode == 0 and got.stdout == probe["secret"] + "\n"
    # The pinned known_hosts file: the controller user's own, mode 0600 in a 0700 directory.
    d = probe["dir"] / "home" / ".ansible" / "inferops-ssh"
    assert oct(os.stat(d).st_mode & 0o777) == "0o700"
    files = [f for f in os.listdir(d) if f.startswith("known_hosts-")]
    assert files and all(oct(os.stat(d / f).st_mode & 0o777) == "0o600" for f in files)


def test_missing_key_is_refused_before_connecting(ct184, probe):
    before = _accepted(NODE_LOG)
    inv = _inventory(probe["dir"], 2222, None)   # the real node: a connection would succeed
    for host in ("pve1", "ct184"):
        rc, out = _run_probe(probe, inv, host)
        assert rc != 0, out
        for needle in ("no SSH host key is pinned", "Nothing was sent", "cat /etc/ssh/ssh_host_ed25519_key.pub",
                       "ssh-keygen -lf", "ssh-keyscan"):
            assert needle in out, (host, needle, out)
    assert _accepted(NODE_LOG) == before
    assert not os.path.exists(probe["node_file"])
    assert not _ct_has(probe["ct_file"])


def test_wrong_pinned_key_refused_at_the_real_node(ct184, impostor, probe):
    """The node is real, the pinned key is not its: refused too (an operator's wrong pin never falls back to TOFU)."""
    before = _accepted(NODE_LOG)
    inv = _inventory(probe["dir"], 2222, [impostor["key"]])
    rc, out = _run_probe(probe, inv, "pve1")
    assert rc != 0, out
    assert "Host key verification failed" in out or "REMOTE HOST IDENTIFICATION HAS CHANGED" in out, out
    rc, out = _run_probe(probe, inv, "ct184")
    assert rc != 0, out
    assert "which is not one the inventory pins" in out, out
    assert _accepted(NODE_LOG) == before
    assert not os.path.exists(probe["node_file"])
    assert not _ct_has(probe["ct_file"])


def _node_driver_version() -> str:
    r = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                       capture_output=True, text=True, timeout=60, check=True)
    return r.stdout.split()[0]


def _run_install_probe(p, version: str, ct_version: str, launch_result: dict, **role_vars):
    extra = dict(probe_driver_version=version, probe_ct_driver_version=ct_version, probe_launch_result=launch_result,
                 **role_vars)
    r = subprocess.run([os.path.join(BIN, "ansible-playbook"), "-i", _inventory(p["dir"], 2222, [_node_key()]),
                        INSTALL_PROBE, "-e", json.dumps(extra)],
                       cwd=REPO, env=_awx_env(p["dir"]), capture_output=True, text=True, timeout=240)
    return r.returncode, " ".join((r.stdout + r.stderr).split())


def _installer_plan(version: str, sha256: str) -> dict:
    return {"install": {"remake_venv": False, "pip": False, "user": False},
            "supply": {"installer": {"needed": True, "file": f"NVIDIA-Linux-x86_64-{version}.run", "sha256": sha256,
                                     "source": "node"},
                       "pip": {"requirements": ""}}}


def test_tampered_installer_is_not_run_genuine_one_is(ct184, probe):
    version = _node_driver_version()
    name = f"NVIDIA-Linux-x86_64-{version}.run"
    with open(f"{INSTALLERS}/SHA256SUMS.json") as f:
        genuine_sha = json.load(f)[version]
    marker = f"/root/inferops-tampered-{uuid.uuid4().hex[:8]}"
    tampered = probe["dir"] / "tampered"
    tampered.mkdir()
    with open(f"{INSTALLERS}/{name}") as f:
        text = f.read()
    shebang, rest = text.split("\n", 1)
    (tampered / name).write_text(f"{shebang}\ntouch {marker}\n{rest}")
    os.chmod(tampered / name, 0o700)
    pct("exec", str(VMID), "--", "rm", "-f", "/var/log/nvidia-installer.log", f"/root/{name}")

    rc, out = _run_install_probe(probe, version, "", _installer_plan(version, genuine_sha),
                                 sglang_server_nvidia_installer_node_dir=str(tampered),
                                 sglang_server_nvidia_installer_cache_dir=str(probe["dir"] / "cache-tampered"))
    assert rc != 0, out
    assert "it was not run" in out and genuine_sha in out, out
    # From the world: the file reached the container (copied), but nothing of it ran as root there.
    assert _ct_has(f"/root/{name}"), out
    assert not _ct_has(marker)
    assert not _ct_has("/var/log/nvidia-installer.log")

    rc, out = _run_install_probe(probe, version, "", _installer_plan(version, genuine_sha),
                                 sglang_server_nvidia_installer_node_dir=INSTALLERS,
                                 sglang_server_nvidia_installer_cache_dir=str(probe["dir"] / "cache-genuine"))
    log = pct("exec", str(VMID), "--", "cat", "/var/log/nvidia-installer.log")
    assert log.returncode == 0 and f"command line: /root/{name}" in log.stdout, out
    assert not _ct_has(marker)


def _sha256(path) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def test_pip_require_hashes_refuses_a_tampered_wheel(ct184, probe):
    """sglang_server_pip_hashes: the collection's requirements file (supply_chain.requirements, the product's) under
    pip --require-hashes. A wheelhouse whose sglang wheel differs from the pinned hash installs nothing; the genuine
    one installs (read from the venv in CT 184)."""
    from ansible_collections.inferops.gpu_inference.plugins.module_utils.deploy import supply_chain
    version = "0.5.21"
    wheels = sorted(f for f in os.listdir(WHEELS) if f.endswith(".whl"))
    spt = [f for f in wheels if f.startswith("setproctitle-")]
    hashes = {f"sglang=={version}": [_sha256(f"{WHEELS}/sglang-{version}-py3-none-any.whl")],
              "setproctitle==%s" % spt[0].split("-")[1]: [_sha256(f"{WHEELS}/{f}") for f in spt]}
    plan = {"install": {"remake_venv": True, "pip": True, "user": False},
            "supply": {"installer": {"needed": False, "file": "", "sha256": "", "source": ""},
                       "pip": {"requirements": supply_chain.requirements(version, [], hashes)}}}
    node_version = _node_driver_version()
    venv = "/opt/inferops-hk/venv"
    tampered = probe["dir"] / "wheels"
    tampered.mkdir()
    for f in wheels:
        shutil.copyfile(f"{WHEELS}/{f}", tampered / f)
    with open(tampered / f"sglang-{version}-py3-none-any.whl", "ab") as f:
        f.write(b"\0")   # one byte more: another file than the one the inventory pins
    role = dict(sglang_server_version=version, sglang_server_venv=venv, sglang_server_wheelhouse_dir="/opt/inferops-hk/wheels")

    rc, out = _run_install_probe(probe, node_version, node_version, plan, sglang_server_wheelhouse_src=str(tampered), **role)
    assert rc != 0, out
    assert "DO NOT MATCH THE HASHES" in out, out   # pip's own refusal, not another failure
    site = pct("exec", str(VMID), "--", "sh", "-c", f"ls -d {venv}/lib/python3*/site-packages/sglang* 2>/dev/null")
    assert site.stdout.strip() == "", site.stdout   # nothing of the tampered wheel installed

    rc, out = _run_install_probe(probe, node_version, node_version, plan, sglang_server_wheelhouse_src=WHEELS, **role)
    assert rc == 0, out
    site = pct("exec", str(VMID), "--", "sh", "-c", f"ls -d {venv}/lib/python3*/site-packages/sglang-{version}.dist-info")
    assert site.returncode == 0, out
