"""Operations that run as tasks (create, start, stop, shutdown, reboot, destroy). Each takes the Task first.

Part of the simulated PVE node (tests/lab/pve/__init__.py).
"""
from __future__ import annotations

import contextlib
import os
import re
import shutil
import stat
import subprocess

from pve import ctconfig, ctoptions, ctstate, lxcconf, pvecluster, pvenode, pvetasks


def template_path(volid: str) -> str:
    m = re.fullmatch(r"([a-zA-Z0-9\-_.]+):vztmpl/([^/]+)", volid)
    if not m or m.group(1) not in pvenode.STORAGES:
        raise pvenode.param_error({"ostemplate": f"unable to parse volume ID '{volid}'"})
    return f"{pvenode.TMPL_DIR}/{m.group(2)}"


def check_storage_for_ct(sid: str) -> None:
    """create_vm's `$check_and_activate_storage` (pve-storage storage_check_enabled, the rootdir content)."""
    if sid not in pvenode.STORAGES:
        raise pvenode.PVEError(f"storage '{sid}' does not exist")
    if "rootdir" not in pvenode.STORAGES[sid]["content"].split(","):
        raise pvenode.param_error({"storage": f"storage '{sid}' does not support container directories"})


def rootfs_volume(vmid: int, spec: str) -> str:
    """`<storage>:<size in GiB>` allocates vm-<vmid>-disk-0 (recorded, no size limit enforced: docs/lab.md)."""
    d = ctoptions.parse_prop_string(spec, "volume")
    vol = d.get("volume", "")
    storage, _, size = vol.partition(":")
    if re.fullmatch(r"\d+(\.\d+)?", size):
        check_storage_for_ct(storage)
        name = f"{vmid}/vm-{vmid}-disk-0.raw" if pvenode.STORAGES[storage]["type"] == "dir" else f"vm-{vmid}-disk-0"
        d["volume"] = f"{storage}:{name}"
        d["size"] = f"{size}G"
    elif storage not in pvenode.STORAGES and vol.partition(":")[1]:
        raise pvenode.PVEError(f"storage '{storage}' does not exist")
    return ",".join([d.pop("volume")] + [f"{k}={v}" for k, v in d.items()])


def _extract_template(task: pvetasks.Task, tmpl: str, root: str, unpriv: bool) -> None:
    os.makedirs(root, exist_ok=True)
    task.say(f"extracting archive '{tmpl}'")
    r = subprocess.run(f"zstd -dc '{tmpl}' | tar -C '{root}' --numeric-owner --xattrs -xf -", shell=True,
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise pvenode.PVEError(f"unable to extract template: {r.stderr.strip()}")
    task.say(f"Total bytes read: {os.path.getsize(tmpl)}")
    if unpriv:  # shift the ownership into the CT's idmap (PVE extracts with lxc-usernsexec)
        for dirpath, dirnames, filenames in os.walk(root):
            for name in [dirpath] + [os.path.join(dirpath, n) for n in dirnames + filenames]:
                st = os.lstat(name)
                if st.st_uid < lxcconf.IDMAP_BASE:
                    mode = stat.S_IMODE(st.st_mode)
                    os.lchown(name, st.st_uid + lxcconf.IDMAP_BASE, st.st_gid + lxcconf.IDMAP_BASE)
                    if not stat.S_ISLNK(st.st_mode) and mode & 0o6000:
                        os.chmod(name, mode)  # chown clears setuid/setgid bits


def do_create(task: pvetasks.Task, vmid: int, params: dict, tmpl: str) -> None:
    vmid = int(vmid)
    conf = ctconfig.load_config(vmid)
    unpriv = conf.get("unprivileged") == "1"
    root = lxcconf.rootfs_dir(vmid)
    try:
        if os.path.exists(f"{pvenode.LXC_DIR}/{vmid}"):
            shutil.rmtree(f"{pvenode.LXC_DIR}/{vmid}")
        _extract_template(task, tmpl, root, unpriv)
        hostname = conf.get("hostname", f"CT{vmid}")
        task.say("Creating SSH host key 'ssh_host_ed25519_key' - this may take some time ...")
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"root@{hostname}", "-f",
                        f"{root}/etc/ssh/ssh_host_ed25519_key"], check=True, capture_output=True)
        for suffix in ("", ".pub"):
            lxcconf._chown_ct(f"{root}/etc/ssh/ssh_host_ed25519_key{suffix}", unpriv)
        with open(f"{root}/etc/machine-id", "w") as f:
            f.write(os.urandom(16).hex() + "\n")
        if params.get("ssh-public-keys"):
            os.makedirs(f"{root}/root/.ssh", mode=0o700, exist_ok=True)
            with open(f"{root}/root/.ssh/authorized_keys", "w") as f:
                f.write(params["ssh-public-keys"].rstrip("\n") + "\n")
            for p in (f"{root}/root/.ssh", f"{root}/root/.ssh/authorized_keys"):
                lxcconf._chown_ct(p, unpriv)
        if params.get("password"):
            subprocess.run(["chpasswd", "-R", root], input=f"root:{params['password']}\n", text=True,
                           check=True, capture_output=True)
        lxcconf.setup_ct_files(vmid, conf)
        with ctconfig.config_lock(vmid):
            conf = ctconfig.load_config(vmid)
            conf.pop("lock", None)
            ctconfig.write_config(vmid, conf)
    except Exception:
        # PVE removes the config of a failed create
        with contextlib.suppress(OSError):
            os.unlink(pvenode.conf_path(vmid))
        pvecluster.write_vmlist()
        shutil.rmtree(f"{pvenode.LXC_DIR}/{vmid}", ignore_errors=True)
        raise
    if params.get("start") in ("1", 1, True, "true"):
        do_start(task, vmid, False)


def cleanup_cgroups(vmid: int) -> None:
    """Removes empty cgroups a stopped or failed CT left behind (with fixed cgroup dirs, LXC refuses to
    start when lxc.monitor/<vmid> still exists)."""
    base = "/sys/fs/cgroup"
    for hier in os.listdir(base):
        for top in (f"lxc/{vmid}", f"lxc.monitor/{vmid}", f"lxc.pivot/{vmid}"):
            root = os.path.join(base, hier, top)
            if not os.path.isdir(root) or os.path.islink(os.path.join(base, hier)):
                continue
            for dirpath, _dirs, _files in sorted(os.walk(root), key=lambda e: -e[0].count("/")):
                with contextlib.suppress(OSError):
                    os.rmdir(dirpath)


def _start_container(task: pvetasks.Task, vmid: int, conf: dict) -> None:
    cleanup_cgroups(vmid)
    lxcconf.write_lxc_config(vmid, conf)  # dies "Could not get mode or device ID of ..." like the prestart hook
    lxcconf.setup_ct_files(vmid, conf)
    os.makedirs("/var/log/lxc", exist_ok=True)
    r = subprocess.run(["lxc-start", "-n", str(vmid), "-d", "-o", f"/var/log/lxc/{vmid}.log", "-l", "INFO"],
                       capture_output=True, text=True)
    ok = r.returncode == 0 and subprocess.run(["lxc-wait", "-n", str(vmid), "-s", "RUNNING", "-t", "15"],
                                              capture_output=True).returncode == 0
    if not ok:
        for line in (r.stderr or "").splitlines():
            task.say(line)
        raise pvenode.PVEError(f"startup for container '{vmid}' failed")


def do_start(task: pvetasks.Task, vmid: int, skiplock: bool) -> None:
    vmid = int(vmid)
    with ctconfig.config_lock(vmid):
        conf = ctconfig.load_config(vmid)
        if not skiplock:
            ctconfig.check_lock(conf)
        if ctstate.is_running(vmid):
            raise pvenode.PVEError(f"CT {vmid} already running")
        try:
            _start_container(task, vmid, conf)
        except pvenode.PVEError as e:
            if e.msg.startswith("Could not get mode"):
                task.say(f"{e.msg}")
                raise pvenode.PVEError(f"startup for container '{vmid}' failed") from None
            raise


def _lxc_stop(vmid: int, args: list[str]) -> int:
    return subprocess.run(["lxc-stop", "-n", str(vmid)] + args, capture_output=True).returncode


def stop_outcome(vmid: int, cmd: list[str], rc: int, still_running: bool) -> tuple[list[str], str | None]:
    """PVE::LXC::vm_stop after `lxc-stop`: a failed command is a warning in the task log (run_command's
    `command '...' failed: exit code N`); a container still running afterwards fails the task with
    `container did not stop`. Returns (log lines, error or None)."""
    log = []
    if rc != 0:
        log.append(f"command '{' '.join(cmd)}' failed: exit code {rc}")
    return log, ("container did not stop" if still_running else None)


def do_stop(task: pvetasks.Task, vmid: int, skiplock: bool) -> None:
    vmid = int(vmid)
    with ctconfig.config_lock(vmid):
        conf = ctconfig.load_config(vmid)
        # vm_stop's worker: a `mounted` lock does not block a stop
        if not skiplock and conf.get("lock") != "mounted":
            ctconfig.check_lock(conf)
    if not ctstate.is_running(vmid):
        raise pvenode.PVEError(f"CT {vmid} not running")
    cmd = ["lxc-stop", "-n", str(vmid), "--kill"]
    rc = _lxc_stop(vmid, ["--kill"])
    # PVE waits for the monitor to close the command socket; the lab waits up to 30 s for STOPPED.
    subprocess.run(["lxc-wait", "-n", str(vmid), "-s", "STOPPED", "-t", "30"], capture_output=True)
    # A CT whose init is gone but whose namespace cannot end (a task in D state) is STOPPING, not
    # STOPPED: PVE's vm_stop would still see the monitor's socket open. Anything but STOPPED is a failure.
    log, error = stop_outcome(vmid, cmd, rc, ctstate.lxc_raw_state(vmid) != "STOPPED")
    for line in log:
        task.say(line)
    if error:
        raise pvenode.PVEError(error)


def do_shutdown(task: pvetasks.Task, vmid: int, timeout: int, force: bool) -> None:
    vmid = int(vmid)
    with ctconfig.config_lock(vmid):
        ctconfig.check_lock(ctconfig.load_config(vmid))
    if not ctstate.is_running(vmid):
        raise pvenode.PVEError(f"CT {vmid} not running")
    args = ["--timeout", str(int(timeout))]
    if not force:
        args.append("--nokill")
    _lxc_stop(vmid, args)
    if ctstate.is_running(vmid):
        if force:
            _lxc_stop(vmid, ["--kill"])
        else:
            raise pvenode.PVEError("container did not stop")


def do_reboot(task: pvetasks.Task, vmid: int, timeout: int | None) -> None:
    vmid = int(vmid)
    with ctconfig.config_lock(vmid):
        ctconfig.check_lock(ctconfig.load_config(vmid))
    if not ctstate.is_running(vmid):
        raise pvenode.PVEError(f"CT {vmid} not running")
    _lxc_stop(vmid, ["--timeout", str(int(timeout or 60))])
    if ctstate.is_running(vmid):
        _lxc_stop(vmid, ["--kill"])
    do_start(task, vmid, False)


def do_destroy(task: pvetasks.Task, vmid: int, purge: bool, force: bool) -> None:
    vmid = int(vmid)
    with ctconfig.config_lock(vmid):
        conf = ctconfig.load_config(vmid)
        ctconfig.check_lock(conf)
        if conf.get("protection") == "1":
            raise pvenode.PVEError("can't remove CT - protection mode enabled")
        if ctstate.is_running(vmid):
            if not force:
                raise pvenode.PVEError(f"CT {vmid} is running - destroy failed")
            _lxc_stop(vmid, ["--kill"])
        task.say(f"destroying CT {vmid}")
        subprocess.run(["lxc-destroy", "-n", str(vmid)], capture_output=True)
        shutil.rmtree(f"{pvenode.LXC_DIR}/{vmid}", ignore_errors=True)
        os.unlink(pvenode.conf_path(vmid))
        pvecluster.write_vmlist()


TASK_FUNCS = {"create": do_create, "start": do_start, "stop": do_stop, "shutdown": do_shutdown,
              "reboot": do_reboot, "destroy": do_destroy}
