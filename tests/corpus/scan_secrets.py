#!/usr/bin/env python3
"""The secret scan: no token, password or API key in anything a run prints or keeps.

  tests/corpus/scan_secrets.py        (root, on the lab, with CT 129 deployed)

1. deploy.yml through ansible-runner, prepared the way AWX prepares a job (a private data dir with the project,
   the inventory, env/extravars holding the survey answers as !unsafe strings, every optional answer blank, and
   env/envvars), at verbosity -vvv. Scanned: runner's stdout, and every file under artifacts/ (job events, the
   command, the environment). Then the server that runs is checked: its /proc/PID/cmdline and its /server_info
   carry the --hicache-size of /etc/sglang/launch.json (blank answers changed nothing).
2. recover.yml --check -vvv (ansible-playbook), its output scanned.
3. Everything a user of the container can read: every /proc/PID/cmdline, the unit, launch.json.
The secrets are the lab's: the root@pam password, the API token secret, the SGLang API key and the vault password.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import labstate  # beside this script, on sys.path as its directory


def secrets() -> dict:
    values = {"root password": labstate.secret("root-password"), "API token secret": labstate.secret("token-secret"),
              "SGLang API key": labstate.secret("sglang-api-key")}
    with open(f"{labstate.LAB}/vault-pass") as f:
        values["vault password"] = f.read().strip()
    for name, value in values.items():
        if len(value) < 8:
            raise SystemExit(f"scan: the lab's {name} is too short to scan for reliably")
    return values


def find(found: list, where: str, text: str, values: dict) -> None:
    for name, value in values.items():
        if value in text:
            found.append(f"{name} in {where}")


def runner_deploy(values: dict, found: list) -> dict:
    pdd = tempfile.mkdtemp(prefix="inferops-runner-")
    try:
        os.makedirs(os.path.join(pdd, "env"))
        os.makedirs(os.path.join(pdd, "inventory"))
        os.symlink(labstate.ROOT, os.path.join(pdd, "project"))
        shutil.copy(labstate.INVENTORY, os.path.join(pdd, "inventory", "hosts.yml"))
        for sub in ("group_vars", "host_vars"):
            os.symlink(os.path.join(labstate.ROOT, "inventories", "lab", sub), os.path.join(pdd, "inventory", sub))
        # AWX writes survey answers as !unsafe strings; unanswered optional fields are empty.
        with open(os.path.join(pdd, "env", "extravars"), "w") as f:
            f.write("---\n"
                    "sglang_server_hicache_requested_gb: !unsafe ''\n"
                    "sglang_server_served_model_name: !unsafe ''\n"
                    "sglang_server_nvidia_driver_version: !unsafe ''\n"
                    "sglang_server_extra_args: !unsafe ''\n")
        env = labstate.playbook_env()
        with open(os.path.join(pdd, "env", "envvars"), "w") as f:
            json.dump({k: env[k] for k in ("ANSIBLE_VAULT_PASSWORD_FILE", "ANSIBLE_COLLECTIONS_PATH", "ANSIBLE_NOCOLOR",
                                           "ANSIBLE_CONFIG")}, f)
        with open(os.path.join(pdd, "env", "settings"), "w") as f:
            json.dump({"suppress_ansible_output": False}, f)
        runner = os.path.join(os.path.dirname(labstate.ansible_playbook()), "ansible-runner")
        start = time.monotonic()
        r = subprocess.run([runner, "run", pdd, "-p", "playbooks/deploy.yml", "--inventory", os.path.join(pdd, "inventory"),
                            "--cmdline=-vvv", "--ident", "deploy"], capture_output=True, text=True, timeout=1500,
                           env=dict(env, PATH=os.path.dirname(runner) + os.pathsep + env.get("PATH", "")))
        seconds = time.monotonic() - start
        find(found, "ansible-runner's stdout", r.stdout + r.stderr, values)
        scanned = 0
        for base, _dirs, files in os.walk(os.path.join(pdd, "artifacts")):
            for name in files:
                path = os.path.join(base, name)
                with open(path, errors="replace") as f:
                    find(found, os.path.relpath(path, pdd), f.read(), values)
                scanned += 1
        return {"rc": r.returncode, "seconds": round(seconds, 1), "artifact_files": scanned,
                "tail": (r.stdout + r.stderr)[-2000:]}
    finally:
        shutil.rmtree(pdd, ignore_errors=True)


def main() -> int:
    values = secrets()
    control: list[str] = []  # the matcher finds a secret in real output (a scan that cannot fail proves nothing)
    find(control, "control", subprocess.run(["cat", f"{labstate.LAB}/secrets/sglang-api-key"], capture_output=True,
                                            text=True).stdout, values)
    if control != ["SGLang API key in control"]:
        raise SystemExit(f"scan: the control failed: {control}")
    found: list[str] = []
    problems: list[str] = []
    launch_before = json.loads(labstate.in_ct(labstate.VMID, "cat", "/etc/sglang/launch.json") or "{}")

    res = runner_deploy(values, found)
    print(f"scan: deploy through ansible-runner at -vvv (AWX-style extravars, blank optional answers): rc {res['rc']}, "
          f"{res['seconds']} s, {res['artifact_files']} artifact files scanned")
    if res["rc"] != 0:
        problems.append("the ansible-runner deploy failed:\n" + res["tail"])
    pid = labstate.in_ct(labstate.VMID, "systemctl", "show", "-p", "MainPID", "--value", "sglang.service")
    cmdline = labstate.in_ct(labstate.VMID, "cat", f"/proc/{pid}/cmdline").split("\0")
    size = cmdline[cmdline.index("--hicache-size") + 1] if "--hicache-size" in cmdline else None
    if size != str(launch_before.get("hicache_size")):
        problems.append(f"the running --hicache-size is {size}, the plan's {launch_before.get('hicache_size')}")

    r = subprocess.run([labstate.ansible_playbook(), "-i", labstate.INVENTORY,
                        os.path.join(labstate.ROOT, "playbooks", "recover.yml"), "-e", f"recover_vmid={labstate.VMID}",
                        "--check", "-vvv"], capture_output=True, text=True, timeout=900, env=labstate.playbook_env(),
                       cwd=labstate.ROOT)
    print(f"scan: recover.yml --check -vvv: rc {r.returncode}, {len(r.stdout.splitlines())} lines")
    if r.returncode != 0:
        problems.append("recover.yml --check failed:\n" + (r.stdout + r.stderr)[-1500:])
    find(found, "recover.yml -vvv output", r.stdout + r.stderr, values)

    readable = labstate.in_ct(labstate.VMID, "sh", "-c", "for f in /proc/[0-9]*/cmdline; do tr '\\0' ' ' < $f; echo; done; "
                                                        "cat /etc/systemd/system/sglang.service /etc/sglang/launch.json")
    find(found, "the container's process list, unit or launch.json", readable, values)
    problems += [f"secret found: {f}" for f in found]
    for p in problems:
        print("scan: " + p)
    print(f"scan: {len(values)} secrets, {'none found' if not found else str(len(found)) + ' found'} in runner stdout, "
          f"artifacts, recover -vvv output and the container's readable files")
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(main())
