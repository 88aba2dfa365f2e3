"""What the lab's world looks like, read from the world itself (never from a report the roles wrote).

Used by the bad-input corpus, the -e bypass test and the secret scan (tests/corpus/). Run on the lab's node
(this machine), as root.
"""
from __future__ import annotations

import hashlib
import os
import subprocess

ROOT = os.path.realpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
LAB = "/var/lib/inferops-lab"
VMID = 129
BYSTANDER = 130
INVENTORY = os.path.join(ROOT, "inventories", "lab", "hosts.yml")


def sh(argv: list[str], timeout: int = 60) -> str:
    r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    return r.stdout if r.returncode == 0 else f"<rc {r.returncode}: {r.stderr.strip()[:200]}>"


def sha(path: str) -> str:
    try:
        with open(path, "rb") as f:
            return hashlib.sha1(f.read()).hexdigest()
    except OSError as exc:
        return f"<{exc.strerror}>"


def in_ct(vmid: int, *cmd: str) -> str:
    return sh(["/usr/sbin/pct", "exec", str(vmid), "--", *cmd]).strip()


def state() -> dict:
    """The things a deploy changes: CT configs (PVE's digest is the file's SHA1), which CTs exist and run, the
    server's PIDs, and the unit, plan and key files in the container."""
    unit_pids = in_ct(VMID, "sh", "-c", "cat /sys/fs/cgroup/systemd/system.slice/sglang.service/cgroup.procs "
                                        "/sys/fs/cgroup/system.slice/sglang.service/cgroup.procs 2>/dev/null | sort -n")
    return {
        "ct_list": sh(["/usr/sbin/pct", "list"]),
        "ct129_conf": sha(f"/etc/pve/lxc/{VMID}.conf"),
        "ct130_conf": sha(f"/etc/pve/lxc/{BYSTANDER}.conf"),
        "server_pids": unit_pids.split(),
        "files": in_ct(VMID, "sha1sum", "/etc/systemd/system/sglang.service", "/etc/sglang/launch.json",
                       "/etc/sglang/api-key", "/etc/sglang/sglang.env"),
        "users": in_ct(VMID, "getent", "passwd", "sglang"),
    }


def diff(before: dict, after: dict) -> list[str]:
    return [f"{k}: {before[k]!r} -> {after.get(k)!r}" for k in before if before[k] != after.get(k)]


def secret(name: str) -> str:
    with open(f"{LAB}/secrets/{name}") as f:
        return f.read().strip()


def playbook_env() -> dict:
    env = dict(os.environ)
    env.update(ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0",
               ANSIBLE_VAULT_PASSWORD_FILE=f"{LAB}/vault-pass",
               ANSIBLE_COLLECTIONS_PATH=os.path.join(ROOT, ".collections"))
    return env


def ansible_playbook() -> str:
    return os.path.join(ROOT, ".venv", "bin", "ansible-playbook")
