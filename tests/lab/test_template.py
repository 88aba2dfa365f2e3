"""The container template: a failed package step stops `labctl up` with its reason, and the rootfs check
finds what the roles need, or names what is missing (docs/lab.md, "Container template")."""
from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from conftest import LABCTL

from pve import template

TEMPLATE_FILE = "/var/lib/vz/template/cache/debian-13-standard_13.1-1_amd64.tar.zst"
UNREACHABLE = "http://127.0.0.1:9/debian"  # port 9 (discard): nothing listens, the connection is refused


def test_up_fails_with_the_reason_when_the_package_step_fails(lab):
    """`labctl up` with no template and a mirror it cannot reach: it must stop in the template step with
    debootstrap's own reason, the log and what to do, and leave no template behind."""
    aside = f"{TEMPLATE_FILE}.test-aside"
    os.rename(TEMPLATE_FILE, aside)
    try:
        r = subprocess.run([LABCTL, "up"], capture_output=True, text=True, timeout=600,
                           env=dict(os.environ, INFEROPS_LAB_MIRROR=UNREACHABLE))
        assert not os.path.exists(TEMPLATE_FILE) and not os.path.exists(f"{TEMPLATE_FILE}.tmp")
    finally:
        os.replace(aside, TEMPLATE_FILE)
    assert r.returncode == 1, r.stdout + r.stderr
    err = r.stderr
    assert "error in step 'container template'" in err, err
    assert "(debootstrap)" in err and f"Failed getting release file {UNREACHABLE}/dists/trixie/Release" in err, err
    assert "log: /var/lib/inferops-lab/log/template-build.log" in err, err
    assert "what to do:" in err and "INFEROPS_LAB_MIRROR" in err, err
    with open("/var/lib/inferops-lab/log/template-build.log") as f:
        assert UNREACHABLE in f.read()
    # the lab is whole again with its template
    subprocess.run([LABCTL, "-q", "up"], check=True, timeout=600)


@pytest.fixture(scope="module")
def rootfs(lab, tmp_path_factory):
    root = str(tmp_path_factory.mktemp("tmplroot"))
    subprocess.run(f"zstd -dc '{TEMPLATE_FILE}' | tar -C '{root}' --numeric-owner -xf -", shell=True, check=True)
    yield root
    shutil.rmtree(root, ignore_errors=True)


def test_the_lab_template_has_what_the_roles_need(rootfs):
    assert template.verify_rootfs(rootfs) == []
    # what PVE's templates leave for `pct create`: no host keys, no hostname, an empty machine-id
    assert not [n for n in os.listdir(f"{rootfs}/etc/ssh") if n.startswith("ssh_host_")]
    assert not os.path.exists(f"{rootfs}/etc/hostname")
    assert os.path.getsize(f"{rootfs}/etc/machine-id") == 0


@pytest.mark.parametrize("remove,named", [
    ("usr/bin/python3", "python3 runs"),
    ("usr/sbin/sshd", "sshd"),
    ("usr/lib/systemd/systemd", "systemd is the init"),
    ("usr/sbin/ifup", "ifupdown"),
])
def test_the_rootfs_check_names_what_is_missing(rootfs, remove, named):
    path = os.path.join(rootfs, remove)
    os.rename(path, f"{path}.gone")
    try:
        problems = template.verify_rootfs(rootfs)
    finally:
        os.rename(f"{path}.gone", path)
    assert len(problems) == 1 and problems[0].startswith(named), problems


def test_a_build_whose_rootfs_check_fails_is_not_packed(lab, tmp_path, monkeypatch):
    """The check runs before packing: a rootfs missing a piece fails the build in step 'rootfs check'."""
    out = str(tmp_path / "t.tar.zst")

    def fake_debootstrap(cmd, **kw):  # a "successful" debootstrap that left an empty rootfs
        os.makedirs(cmd[-2] + "/etc/ssh", exist_ok=True)
        os.makedirs(cmd[-2] + "/etc/systemd/system", exist_ok=True)
        return subprocess.CompletedProcess(cmd, 0)

    real_run = subprocess.run
    monkeypatch.setattr(template.subprocess, "run",
                        lambda cmd, **kw: fake_debootstrap(cmd, **kw) if cmd[0] == "debootstrap" else real_run(cmd, **kw))
    with pytest.raises(template.BuildError) as e:
        template.build(out, UNREACHABLE, str(tmp_path / "build.log"), str(tmp_path / "work"))
    assert e.value.step == "rootfs check" and "not a Debian rootfs" in e.value.reason
    assert not os.path.exists(out)
