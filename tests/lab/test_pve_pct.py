"""/usr/sbin/pct of the simulated node: exit codes, environment, locks, memory limits inside the CT."""
from __future__ import annotations

import os
import subprocess

from conftest import REPO, pct

MIB = 1024 * 1024


def test_exec_exit_codes(ct):
    assert pct("exec", str(ct), "--", "true").returncode == 0
    assert pct("exec", str(ct), "--", "false").returncode == 1
    assert pct("exec", str(ct), "--", "sh", "-c", "exit 7").returncode == 7
    assert pct("exec", str(ct), "--", "sh", "-c", "kill -TERM $$").returncode == 128 + 15
    assert pct("exec", str(ct), "--", "sh", "-c", "kill -KILL $$").returncode == 128 + 9


def test_exec_environment_and_errors(ct):
    r = pct("exec", str(ct), "--", "sh", "-c", 'echo "$PATH"; cat /etc/hostname')
    assert r.stdout.split() == ["/sbin:/bin:/usr/sbin:/usr/bin", f"labtest{ct}"]
    r = pct("exec", "4242", "--", "true")
    assert r.returncode == 255 and "Configuration file 'nodes/pve1/lxc/4242.conf' does not exist" in r.stderr
    r = pct("exec", str(ct), "--")
    assert r.returncode == 255 and "missing command" in r.stderr


def test_status_config_list(ct):
    assert pct("status", str(ct)).stdout == "status: running\n"
    verbose = pct("status", str(ct), "--verbose").stdout
    assert f"maxmem: {512 * MIB}\n" in verbose and "pid: " in verbose
    assert "memory: 512\n" in pct("config", str(ct)).stdout
    assert any(ln.split()[:2] == [str(ct), "running"] for ln in pct("list").stdout.splitlines())
    r = pct("start", str(ct))
    assert r.returncode == 255 and f"CT {ct} already running" in r.stderr


def test_memory_limit_inside_ct(ct):
    r = pct("exec", str(ct), "--", "free", "-b")
    total = int(r.stdout.splitlines()[1].split()[1])
    assert total == 512 * MIB, r.stdout
    # hotplug: pct set on a running CT changes the cgroup limit at once (PVE writes memory.max)
    assert pct("set", str(ct), "--memory", "384").returncode == 0
    try:
        r = pct("exec", str(ct), "--", "free", "-b")
        assert int(r.stdout.splitlines()[1].split()[1]) == 384 * MIB, r.stdout
    finally:
        assert pct("set", str(ct), "-memory", "512").returncode == 0


def test_oom_kill(ct):
    hog = "b = bytearray(700 * 1024 * 1024)\nfor i in range(0, len(b), 4096): b[i] = 1\nprint('survived')"
    r = pct("exec", str(ct), "--", "/usr/bin/python3", "-c", hog)
    assert r.returncode == 128 + 9 and "survived" not in r.stdout, r


def test_locked_ct(ct):
    assert pct("set", str(ct), "--lock", "backup").returncode == 0
    try:
        r = pct("shutdown", str(ct), "--timeout", "5", "--forceStop", "1")
        assert r.returncode == 255 and "CT is locked (backup)" in r.stderr
        r = pct("stop", str(ct))
        assert r.returncode == 255 and "CT is locked (backup)" in r.stderr
        assert pct("stop", str(ct), "--skiplock").returncode == 0
        assert pct("status", str(ct)).stdout == "status: stopped\n"
        r = pct("exec", str(ct), "--", "true")
        assert r.returncode == 255 and f"container '{ct}' not running!" in r.stderr
        r = pct("stop", str(ct), "--skiplock")
        assert r.returncode == 255 and f"CT {ct} not running" in r.stderr
    finally:
        assert pct("unlock", str(ct)).returncode == 0
    assert pct("start", str(ct)).returncode == 0
    assert pct("status", str(ct)).stdout == "status: running\n"


def test_shutdown_and_reboot(ct):
    from conftest import wait_running_systemd
    wait_running_systemd(ct)
    assert pct("shutdown", str(ct), "--timeout", "30", "--forceStop", "1").returncode == 0
    assert pct("status", str(ct)).stdout == "status: stopped\n"
    assert pct("start", str(ct)).returncode == 0
    wait_running_systemd(ct)
    assert pct("reboot", str(ct), "--timeout", "30").returncode == 0
    assert pct("status", str(ct)).stdout == "status: running\n"
    wait_running_systemd(ct)


def test_ansible_setup_through_pct_remote(ct):
    env = dict(os.environ, ANSIBLE_VAULT_PASSWORD_FILE="/var/lib/inferops-lab/vault-pass",
               ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg"))
    r = subprocess.run([os.path.join(REPO, ".venv", "bin", "ansible"), "-i", "inventories/lab/hosts.yml",
                        "ct129", "-e", f"proxmox_vmid={ct}", "-m", "ansible.builtin.setup",
                        "-a", "filter=ansible_memtotal_mb,ansible_hostname"],
                       capture_output=True, text=True, cwd=REPO, env=env, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "ansible_memtotal_mb: 512\n" in r.stdout and f"ansible_hostname: labtest{ct}\n" in r.stdout, r.stdout


def test_unknown_options_and_commands_are_refused(ct):
    """PVE's CLI: Getopt's `Unknown option: <name>`, `400 unable to parse option`, exit 255; nothing done."""
    for args in (["set", str(ct), "--skiplock", "1", "--memory", "300"], ["stop", str(ct), "--forceStop", "1"],
                 ["status", str(ct), "--current"], ["shutdown", str(ct), "--skiplock"]):
        r = pct(*args)
        assert r.returncode == 255, r
        assert f"Unknown option: {args[2].lstrip('-')}" in r.stderr and "400 unable to parse option" in r.stderr, r
    assert "memory: 512\n" in pct("config", str(ct)).stdout
    r = pct("frobnicate", str(ct))
    assert r.returncode == 255 and "ERROR: unknown command 'pct frobnicate'" in r.stderr, r
    r = pct("stop", str(ct), "--overrule-shutdown", "1")  # PVE has it; the lab refuses rather than ignores it
    assert r.returncode == 255 and "not simulated" in r.stderr, r
    assert pct("status", str(ct)).stdout == "status: running\n"


def test_set_read_only_required_and_unset_options(ct):
    r = pct("set", str(ct), "--unprivileged", "0")
    assert r.returncode == 255 and "unable to modify read-only option: 'unprivileged'" in r.stderr, r
    r = pct("set", str(ct), "--delete", "memory")
    assert r.returncode == 255 and "unable to delete required option 'memory'" in r.stderr, r
    r = pct("set", str(ct), "--delete", "bogus")
    assert r.returncode == 255 and "delete: unknown option 'bogus'" in r.stderr, r
    r = pct("set", str(ct), "--delete", "searchdomain")  # not set: a warning, exit 0
    assert r.returncode == 0 and "cannot delete 'searchdomain' - not set in current configuration!" in r.stderr, r
    r = pct("pending", str(ct))
    assert r.returncode == 0 and "cur memory: 512\n" in r.stdout and "digest" not in r.stdout, r
