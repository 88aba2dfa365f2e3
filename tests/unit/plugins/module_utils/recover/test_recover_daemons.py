# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Rung 5 stops a host daemon only when its systemd unit, which root controls, vouches for it; a process that
only calls itself nvidia-persistenced is a client."""
from __future__ import annotations

import os
import stat

import pytest

from ansible_collections.inferops.gpu_inference.plugins.module_utils.recover import recover_daemons as rd

UNIT = "nvidia-persistenced.service"
CG = "/system.slice/nvidia-persistenced.service"
# What systemd 252 (Debian 12, PVE 8) prints for NVIDIA's unit template (Type=forking, --user).
SHOW = """Id=nvidia-persistenced.service
LoadState=loaded
ActiveState=active
MainPID=1234
ControlGroup=/system.slice/nvidia-persistenced.service
FragmentPath=/lib/systemd/system/nvidia-persistenced.service
DropInPaths=
ExecStart={ path=/usr/bin/nvidia-persistenced ; argv[]=/usr/bin/nvidia-persistenced --user nvidia-persistenced ; \
ignore_errors=no ; start_time=[Fri 2026-12-04 22:47:01 UTC] ; stop_time=[n/a] ; pid=1233 ; code=exited ; status=0 }
User=
"""


def fake_fs(owners=None, modes=None):
    """lstat over a fake tree: every path root-owned 0755 (files 0644) unless said otherwise."""
    owners, modes = owners or {}, modes or {}

    def lstat(path):
        mode = modes.get(path, 0o644 if "." in os.path.basename(path) or path.endswith("persistenced") else 0o755)
        kind = stat.S_IFREG if "." in os.path.basename(path) or path.endswith("persistenced") else stat.S_IFDIR
        return os.stat_result((kind | mode, 0, 0, 1, owners.get(path, 0), 0, 0, 0, 0, 0))
    return lstat


def same(path):
    return path


def facts(show=SHOW, **fs):
    return rd.unit_facts(UNIT, show, stat_fn=fake_fs(**fs), resolve=same,
                         uid_of_user={"nvidia-persistenced": 117}.get)


def holder(pid=1234, comm="nvidia-persiste", gpus=(0, 1, 2, 3), vmid=None, cgroup=None, starttime=77):
    return {"pid": pid, "comm": comm, "starttime": starttime, "vmid": vmid, "gpu_fds": list(gpus),
            "cgroup": cgroup if cgroup is not None else {"name=systemd": CG, "": CG}}


def test_only_the_known_units_are_asked_about():
    assert rd.show_args(UNIT)[0] == "show" and rd.show_args(UNIT)[-1] == UNIT
    with pytest.raises(ValueError):
        rd.show_args("systemd-reboot.service")


def test_show_and_exec_start_are_read_as_systemd_prints_them():
    show = rd.parse_show(SHOW)
    assert show["MainPID"] == "1234" and show["DropInPaths"] == ""
    assert rd.parse_exec_start(show["ExecStart"]) == [
        {"path": "/usr/bin/nvidia-persistenced", "argv": ["/usr/bin/nvidia-persistenced", "--user", "nvidia-persistenced"]}]
    assert rd.unit_user({}, [{"argv": ["x", "--user=nvpd"]}]) == "nvpd"
    assert rd.unit_user({"User": "daemon"}, []) == "daemon"
    assert rd.unit_user({}, [{"argv": ["x", "--verbose"]}]) is None


def test_a_path_is_roots_only_when_every_step_up_to_slash_is():
    lstat = fake_fs(owners={"/home/eve/unit.service": 1000}, modes={"/srv/shared": 0o777, "/opt/g": 0o775})
    assert rd.untrusted_path("/lib/systemd/system/x.service", lstat, same) is None
    assert "owned by uid 1000" in rd.untrusted_path("/home/eve/unit.service", lstat, same)
    assert "/srv/shared is writable by group and others" in rd.untrusted_path("/srv/shared/bin/x.d", lstat, same)
    assert "/opt/g is writable by its group" in rd.untrusted_path("/opt/g/nvidia-persistenced", lstat, same)
    assert "not an absolute path" in rd.untrusted_path("bin/x", lstat, same)


def test_a_root_owned_unit_vouches_for_its_main_process():
    f = facts()
    assert f["problems"] == [] and f["main_pid"] == 1234 and f["allowed_uids"] == [0, 117]
    daemon, why = rd.judge_holder(holder(), {UNIT: f}, real_uid=117)
    assert why == "" and daemon == {"name": "nvidia-persistenced", "unit": UNIT, "pid": 1234, "starttime": 77,
                                    "gpus": [0, 1, 2, 3], "gpu_minors": [0, 1, 2, 3]}
    # The scan's holders carry GPU indexes in gpu_fds and the device minors they hold in gpu_fd_minors.
    assert rd.judge_holder(dict(holder(gpus=[1]), gpu_fd_minors=[5]), {UNIT: f}, 0)[0]["gpu_minors"] == [5]
    # Its name does not matter: the unit does.
    assert rd.judge_holder(holder(comm="python3"), {UNIT: f}, real_uid=0)[0] is not None
    assert "through that unit" in rd.describe(daemon)


def test_a_process_that_only_calls_itself_persistenced_is_a_client():
    f = facts()
    impostor = holder(pid=4242, cgroup={"name=systemd": "/user.slice/user-1000.slice/session-3.scope"})
    daemon, why = rd.judge_holder(impostor, {UNIT: f}, real_uid=65534)
    assert daemon is None and why == "not the main process of a host daemon's unit (%s's is 1234)" % UNIT
    split = rd.split_host_holders([impostor, holder()], [0], True, {UNIT: f}, {4242: 65534, 1234: 0}.get)
    assert [d["pid"] for d in split["daemons"]] == [1234]
    assert [(c["pid"], c["held"]) for c in split["clients"]] == [(4242, [0])]
    assert split["clients"][0]["why"].startswith("not the main process")


@pytest.mark.parametrize("change, uid, reason", [
    (dict(owners={"/lib/systemd/system/nvidia-persistenced.service": 1000}), 0,
     "unit file: /lib/systemd/system/nvidia-persistenced.service is owned by uid 1000"),
    (dict(modes={"/usr/bin/nvidia-persistenced": 0o777}), 0, "ExecStart binary: /usr/bin/nvidia-persistenced is writable"),
    (dict(owners={"/usr/bin": 1000}), 0, "ExecStart binary: /usr/bin is owned by uid 1000"),
    ({}, 1000, "its real uid is 1000, not root or %s's user nvidia-persistenced" % UNIT),
    ({}, None, "its real uid is unknown"),
])
def test_the_main_process_of_a_unit_root_does_not_control_is_a_client(change, uid, reason):
    daemon, why = rd.judge_holder(holder(), {UNIT: facts(**change)}, real_uid=uid)
    assert daemon is None and why.startswith("main process of %s, but " % UNIT) and reason in why


@pytest.mark.parametrize("show_change, reason", [
    (("FragmentPath=/lib/systemd/system/nvidia-persistenced.service", "FragmentPath=/home/eve/.config/x.service"),
     "is not under /etc/systemd/system or /lib/systemd/system or /usr/lib/systemd/system"),
    (("DropInPaths=", "DropInPaths=/run/user/1000/x.service.d/o.conf"), "drop-in /run/user/1000/x.service.d/o.conf"),
    (("LoadState=loaded", "LoadState=not-found"), "is not loaded (LoadState=not-found)"),
    (("ActiveState=active", "ActiveState=deactivating"), "is deactivating, not active"),
    (("ControlGroup=/system.slice/nvidia-persistenced.service", "ControlGroup="), "not %s's (none)" % UNIT),
    (("--user nvidia-persistenced", "--user ghost"), "as user 'ghost', who does not exist"),
])
def test_a_unit_that_cannot_vouch_makes_its_main_process_a_client(show_change, reason):
    owners = {"/run/user/1000/x.service.d/o.conf": 1000, "/run/user/1000": 1000, "/run/user/1000/x.service.d": 1000}
    f = facts(SHOW.replace(*show_change), owners=owners)
    daemon, why = rd.judge_holder(holder(), {UNIT: f}, real_uid=0)
    assert daemon is None and reason in why


def test_the_kernel_must_put_it_in_the_units_cgroup():
    f = facts()
    # cgroup v1/hybrid: systemd's hierarchy is name=systemd, whatever the unified line says; v2 alone: "".
    assert rd.judge_holder(holder(cgroup={"name=systemd": CG, "": "/"}), {UNIT: f}, 0)[0] is not None
    assert rd.judge_holder(holder(cgroup={"": CG}), {UNIT: f}, 0)[0] is not None
    daemon, why = rd.judge_holder(holder(cgroup={"name=systemd": "/", "": CG}), {UNIT: f}, 0)
    assert daemon is None and "the kernel puts it in cgroup /, not" in why


def test_a_container_process_is_never_a_host_daemon():
    daemon, why = rd.judge_holder(holder(vmid=129), {UNIT: facts()}, 0)
    assert daemon is None and why == "a process of CT 129"


def test_without_stop_daemons_every_holder_is_a_client():
    split = rd.split_host_holders([holder()], [0], False, {}, lambda pid: 0)
    assert split["daemons"] == [] and "stop_host_daemons is false" in split["clients"][0]["why"]


def test_a_holder_of_no_wanted_gpu_is_ignored():
    assert rd.split_host_holders([holder(gpus=[5])], [0], True, {UNIT: facts()}, lambda pid: 0) == {
        "daemons": [], "clients": []}


def test_the_stop_is_checked_against_systemd_again():
    daemon = rd.judge_holder(holder(), {UNIT: facts()}, 0)[0]
    assert rd.still_main(daemon, facts(), alive=True) is None
    assert "no longer pid 1234 (now 99)" in rd.still_main(daemon, facts(SHOW.replace("MainPID=1234", "MainPID=99")), True)
    assert "no longer pid 1234" in rd.still_main(daemon, facts(), alive=False)  # same PID, another start time
    assert "owned by uid 1000" in rd.still_main(daemon, facts(owners={"/usr/bin/nvidia-persistenced": 1000}), True)


def test_restarted_means_a_new_main_process_holding_the_gpus():
    daemon = rd.judge_holder(holder(), {UNIT: facts()}, 0)[0]
    new = facts(SHOW.replace("MainPID=1234", "MainPID=2000"))
    assert rd.restarted(daemon, new, [0, 1, 2, 3, 4]) == (True, "")
    assert rd.restarted(daemon, new, [0, 1])[1] == "%s's main process 2000 does not hold /dev/nvidia2,3" % UNIT
    assert not rd.restarted(daemon, facts(), [0, 1, 2, 3])[0]
    assert "inactive with no main process" in rd.restarted(
        daemon, facts(SHOW.replace("MainPID=1234", "MainPID=0").replace("=active", "=inactive")), None)[1]


def test_real_uid_from_status():
    assert rd.parse_real_uid("Name:\tx\nUid:\t65534\t0\t0\t0\nGid:\t0\n") == 65534
    assert rd.parse_real_uid("") is None
