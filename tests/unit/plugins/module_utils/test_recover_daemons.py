# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

from ansible_collections.inferops.gpu_inference.plugins.module_utils import recover_daemons as rd


def proc(pid, comm, gpus, vmid=None, cgroup=None):
    return {"pid": pid, "comm": comm, "starttime": pid * 10, "vmid": vmid, "gpu_fds": gpus,
            "cgroup": cgroup or {"": "/user.slice"}}


def test_unit_from_cgroup_v2_and_v1():
    assert rd.unit_of({"": "/system.slice/nvidia-persistenced.service"}) == "nvidia-persistenced.service"
    assert rd.unit_of({"name=systemd": "/system.slice/nvidia-persistenced.service", "memory": "/"}) == \
        "nvidia-persistenced.service"
    assert rd.unit_of({"": "/user.slice/user-0.slice/session-3.scope"}) is None
    assert rd.unit_of({}) is None


def test_cmdline():
    assert rd.parse_cmdline(b"/usr/bin/nvidia-persistenced\0--user\0nvidia-persistenced\0") == [
        "/usr/bin/nvidia-persistenced", "--user", "nvidia-persistenced"]
    assert rd.parse_cmdline(b"") == []


def test_host_persistenced_is_a_daemon_everything_else_a_client():
    holders = [proc(10, "nvidia-persiste", list(range(8)), cgroup={"": "/system.slice/nvidia-persistenced.service"}),
               proc(20, "nv-hostengine", [0, 1]),
               proc(30, "nvidia-persiste", [0], vmid=129),      # same name inside a container: a client
               proc(40, "python3", [5])]                        # holds no GPU we reset
    split = rd.split_host_holders(holders, [0, 1], stop_daemons=True)
    assert [(d["pid"], d["unit"], d["gpus"]) for d in split["daemons"]] == [
        (10, "nvidia-persistenced.service", list(range(8)))]
    assert [(c["pid"], c["held"]) for c in split["clients"]] == [(20, [0, 1]), (30, [0])]


def test_without_stop_daemons_persistenced_blocks_like_any_client():
    split = rd.split_host_holders([proc(10, "nvidia-persiste", [0, 1])], [0], stop_daemons=False)
    assert split["daemons"] == [] and [c["pid"] for c in split["clients"]] == [10]


def test_describe_says_how_it_comes_back():
    assert rd.describe({"name": "nvidia-persistenced", "pid": 7, "unit": "nvidia-persistenced.service"}) == \
        "nvidia-persistenced (pid 7), started again through systemd unit nvidia-persistenced.service"
    assert rd.describe({"name": "nvidia-persistenced", "pid": 7, "unit": None,
                        "argv": ["/usr/bin/nvidia-persistenced"]}).endswith("own command line /usr/bin/nvidia-persistenced")
