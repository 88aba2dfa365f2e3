# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""pve_client: task waiting and the reads pve_lxc's own tests (tests/unit/plugins/modules/test_pve_lxc.py) do not reach."""
from __future__ import annotations

import pytest

from ansible_collections.inferops.gpu_inference.plugins.module_utils.pve import pve_client

UPID = "UPID:pve:00001234:00ABCDEF:6650F00D:vzstart:198:root@pam:"


class Failed(Exception):
    def __init__(self, msg, **extra):
        super().__init__(msg)
        self.extra = extra


def fail(msg, **extra):
    raise Failed(msg, **extra)


class Api:
    """nodes(n).tasks(upid).status.get / .log.get and nodes(n).lxc(vmid).pending.get, answered from fixed data."""

    def __init__(self, status, log=None, pending=None):
        self.status_answer = status
        self.log_answer = log
        self.pending_answer = pending

    def __getattr__(self, name):
        return Path(self, [name])


class Path:
    def __init__(self, api, parts):
        self.api, self.parts = api, parts

    def __getattr__(self, name):
        return Path(self.api, self.parts + [name])

    def __call__(self, *args):
        return Path(self.api, self.parts + [str(a) for a in args])

    def get(self, **_params):
        last = self.parts[-1]
        answer = {"status": self.api.status_answer, "log": self.api.log_answer, "pending": self.api.pending_answer}[last]
        if isinstance(answer, Exception):
            raise answer
        return answer


def client(api, **kwargs):
    return pve_client.PveClient(api, "pve", 198, {"method": "password", "user": "root@pam"}, fail, lambda _m: None, **kwargs)


@pytest.fixture(autouse=True)
def fast_clock(monkeypatch):
    now = [0.0]

    def sleep(seconds):
        now[0] += seconds

    monkeypatch.setattr(pve_client.time, "sleep", sleep)
    monkeypatch.setattr(pve_client.time, "monotonic", lambda: now[0])


def test_wait_task_times_out():
    pve = client(Api({"status": "running"}), task_timeout=3)
    with pytest.raises(Failed, match="still running after 3s") as caught:
        pve.wait_task(UPID, "starting CT 198")
    assert caught.value.extra == {"task": UPID}
    assert pve.wait_task(UPID, "starting CT 198", timeout=2, fail=False) == (False, "timeout")


def test_wait_task_rejects_an_odd_upid():
    with pytest.raises(Failed, match="unexpected task ID"):
        client(Api({"status": "stopped", "exitstatus": "OK"})).wait_task("nope", "starting CT 198")


def test_failed_task_without_a_readable_log():
    pve = client(Api({"status": "stopped", "exitstatus": "boom"}, log=RuntimeError("no log")))
    with pytest.raises(Failed) as caught:
        pve.wait_task(UPID, "starting CT 198")
    assert str(caught.value) == f"starting CT 198: task {UPID} failed with exit status 'boom'"
    assert caught.value.extra == {"task": UPID, "task_exitstatus": "boom"}
    assert pve.wait_task(UPID, "starting CT 198", fail=False) == (False, "boom")
    assert client(Api({"status": "stopped", "exitstatus": "WARNINGS: 1"})).wait_task(UPID, "x") == (True, "WARNINGS: 1")


def test_read_pending_without_the_endpoint():
    assert client(Api({}, pending=RuntimeError("501 not implemented"))).read_pending() == []
    assert client(Api({}, pending=[{"key": "dev8", "pending": "/dev/nvidia8"}])).read_pending() == ["dev8"]
