"""The lab's container template: Debian debootstrapped straight into a rootfs, checked, packed as a vztmpl.

Debian 13 "trixie" (PVE 9's `debian-13-standard`) is the lab's template; Debian 12 "bookworm" (PVE 8's
`debian-12-standard`) can still be built (`labctl build-template OUT --suite bookworm`).

  python3 template.py verify ROOTFS     (the check alone, on an unpacked rootfs)
Building is `labctl build-template OUT [--mirror URL]` or `labctl up`, which call build() below.

debootstrap installs the packages itself (`--include`, dependencies resolved, no apt inside the chroot),
and fails when one cannot be had, so a package can no longer be lost silently (lxc's `debian` template
printed "Apt update failed, not downloading packages" and exited 0). Before packing, the rootfs is checked
for what the roles and the simulated PVE rely on; a missing piece fails the build with its reason.
Runs with the node's /usr/bin/python3 (stdlib only); see docs/lab.md, "Container template".
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

# suite -> the file name PVE's own template of that release has (pveam available --section system, PVE 9.1:
# debian-13-standard_13.1-1_amd64.tar.zst; PVE 8: debian-12-standard_12.7-1_amd64.tar.zst)
SUITES = {"trixie": "debian-13-standard_13.1-1_amd64.tar.zst", "bookworm": "debian-12-standard_12.7-1_amd64.tar.zst"}
SUITE = "trixie"
# What PVE's debian-12/13-standard templates have that the roles and the lab use: python3 with venv and pip
# (the SGLang virtualenv, Ansible's modules), systemd as init (the unit, systemd-analyze verify),
# ifupdown (pct writes /etc/network/interfaces), sshd, procps/psmisc (ps, fuser), curl, CA certificates.
PACKAGES = ["systemd", "systemd-sysv", "python3", "python3-venv", "python3-pip", "procps", "psmisc",
            "iproute2", "ifupdown", "netbase", "curl", "ca-certificates", "openssh-server", "less"]
# (what, shell test run inside the rootfs with chroot): every one must pass before the template is packed.
CHECKS = [
    ("python3 runs, with venv, ensurepip and ssl (the SGLang virtualenv, Ansible modules)",
     "/usr/bin/python3 -c 'import venv, ensurepip, ssl, json'"),
    ("systemd is the init (/sbin/init -> systemd)",
     "test \"$(readlink -f /sbin/init)\" = /usr/lib/systemd/systemd && test -x /usr/lib/systemd/systemd"),
    ("systemctl and systemd-analyze (the SGLang unit and its validate:)",
     "test -x /usr/bin/systemctl && test -x /usr/bin/systemd-analyze"),
    ("sshd (openssh-server)", "test -x /usr/sbin/sshd"),
    ("ifupdown (pct writes /etc/network/interfaces)", "test -x /usr/sbin/ifup"),
    ("ip (iproute2)", "test -x /usr/bin/ip || test -x /usr/sbin/ip"),
    ("ps and fuser (procps, psmisc)", "test -x /usr/bin/ps && test -x /usr/bin/fuser"),
    ("curl", "test -x /usr/bin/curl"),
    ("CA certificates", "test -s /etc/ssl/certs/ca-certificates.crt"),
    ("every package asked for is installed (dpkg-query)",
     f"test \"$(dpkg-query -W -f='${{db:Status-Status}}\\n' {' '.join(PACKAGES)} 2>/dev/null | grep -c '^installed$')\" "
     f"= {len(PACKAGES)}"),
]


class BuildError(Exception):
    """A failed build: the step, the reason, the log to read and what to do."""

    def __init__(self, step: str, reason: str, log: str, fix: str):
        super().__init__(f"{step}: {reason}")
        self.step, self.reason, self.log, self.fix = step, reason, log, fix


def default_mirror() -> str:
    """INFEROPS_LAB_MIRROR, else this machine's own Debian mirror (deb822 or one-line sources), else deb.debian.org."""
    if os.environ.get("INFEROPS_LAB_MIRROR"):
        return os.environ["INFEROPS_LAB_MIRROR"]
    for path, key in (("/etc/apt/sources.list.d/debian.sources", "URIs:"), ("/etc/apt/sources.list", "deb")):
        try:
            with open(path) as f:
                for line in f:
                    parts = line.split()
                    if len(parts) > 1 and parts[0] == key and "security" not in parts[1]:
                        url = parts[1] if key == "URIs:" else next((p for p in parts[1:] if "://" in p), "")
                        if url:
                            return url
        except OSError:
            continue
    return "http://deb.debian.org/debian"


def _log_tail(log: str, want=("E:", "W: Failure", "Failed", "error")) -> str:
    try:
        with open(log, errors="replace") as f:
            lines = [ln.strip() for ln in f if ln.strip()]
    except OSError:
        return ""
    hits = [ln for ln in lines if any(ln.startswith(w) or w in ln for w in want)]
    return (hits or lines or [""])[-1]


def verify_rootfs(root: str) -> list[str]:
    """What the rootfs lacks of CHECKS (empty when it has everything)."""
    if not os.path.isfile(os.path.join(root, "bin/sh")) and not os.path.islink(os.path.join(root, "bin")):
        return ["no /bin/sh: this is not a Debian rootfs"]
    problems = []
    for what, test in CHECKS:
        r = subprocess.run(["chroot", root, "/bin/sh", "-c", test], capture_output=True, text=True,
                           env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C"})
        if r.returncode != 0:
            problems.append(what + (f" ({r.stderr.strip().splitlines()[-1]})" if r.stderr.strip() else ""))
    return problems


def _configure(root: str) -> None:
    """Leave what a PVE template leaves for `pct create` to fill in, as lxc's debian template did for LXC."""
    for name in os.listdir(os.path.join(root, "etc/ssh")):
        if name.startswith("ssh_host_"):
            os.unlink(os.path.join(root, "etc/ssh", name))
    for rel in ("etc/hostname",):
        if os.path.lexists(os.path.join(root, rel)):
            os.unlink(os.path.join(root, rel))
    with open(os.path.join(root, "etc/machine-id"), "w"):
        pass
    # In a container there is no udev (lxc's debian template masks it the same way).
    for unit in ("udev.service", "systemd-udevd.service"):
        link = os.path.join(root, "etc/systemd/system", unit)
        if not os.path.lexists(link):
            os.symlink("/dev/null", link)
    target = os.path.join(root, "etc/systemd/system/default.target")
    if os.path.lexists(target):
        os.unlink(target)
    os.symlink("/lib/systemd/system/multi-user.target", target)
    shutil.rmtree(os.path.join(root, "var/cache/apt/archives"), ignore_errors=True)
    os.makedirs(os.path.join(root, "var/cache/apt/archives/partial"), exist_ok=True)


def build(out: str, mirror: str, log: str, workdir: str, suite: str = SUITE) -> float:
    """Build OUT (a .tar.zst vztmpl) of Debian `suite`; returns the seconds it took. Raises BuildError."""
    if suite not in SUITES:
        raise BuildError("debootstrap", f"suite {suite!r} is not one the lab builds", log,
                         f"give one of {', '.join(SUITES)}")
    t0 = time.time()
    root = os.path.join(workdir, "rootfs")
    shutil.rmtree(workdir, ignore_errors=True)
    os.makedirs(workdir)
    os.makedirs(os.path.dirname(log), exist_ok=True)
    if shutil.which("debootstrap") is None:
        raise BuildError("debootstrap", "debootstrap is not installed", log,
                         "install it (apt-get install debootstrap); `labctl up` does this itself")
    cmd = ["debootstrap", "--variant=minbase", "--components=main", f"--include={','.join(PACKAGES)}",
           suite, root, mirror]
    with open(log, "w") as f:
        f.write(f"$ {' '.join(cmd)}\n")
        f.flush()
        r = subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=f, stderr=subprocess.STDOUT)
    if r.returncode != 0:
        raise BuildError("debootstrap", f"exit {r.returncode}: {_log_tail(log)}", log,
                         f"check that the mirror {mirror} serves Debian {suite} from this machine "
                         f"(curl -sI {mirror.rstrip('/')}/dists/{suite}/Release), or name another with "
                         "INFEROPS_LAB_MIRROR=URL, then run `make lab` again")
    _configure(root)
    problems = verify_rootfs(root)
    if problems:
        with open(log, "a") as f:
            f.write("rootfs check failed:\n" + "".join(f"  missing: {p}\n" for p in problems))
        raise BuildError("rootfs check", "the built rootfs lacks " + "; ".join(problems), log,
                         f"read the debootstrap output in the log; the rootfs is kept in {root} for a look. "
                         "Then run `make lab` again")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    tmp = f"{out}.tmp"
    r = subprocess.run(f"tar -C '{root}' --numeric-owner --xattrs -cf - . | zstd -q -T2 -3 -o '{tmp}' -f",
                       shell=True, capture_output=True, text=True)
    if r.returncode != 0:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise BuildError("pack", (r.stderr or r.stdout).strip() or f"exit {r.returncode}", log,
                         f"check the free space under {os.path.dirname(out)} (df -h), then run `make lab` again")
    os.replace(tmp, out)
    shutil.rmtree(workdir, ignore_errors=True)
    return time.time() - t0


def main(argv: list[str]) -> int:
    if len(argv) >= 2 and argv[0] == "verify":
        problems = verify_rootfs(argv[1])
        for p in problems:
            print(f"missing: {p}")
        return 1 if problems else 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
