# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

import json
import os

import pytest

from ansible_collections.inferops.gpu_inference.plugins.module_utils.recover import recover_baseline as rb

ROWS = [{"index": 0, "uuid": "GPU-0", "memory_used_mib": 3}, {"index": 1, "uuid": "GPU-1", "memory_used_mib": 0},
        {"index": 4, "uuid": "GPU-4", "memory_used_mib": 515}]
HOST = {"mem_total_bytes": 100, "mem_available_bytes": 90, "shmem_bytes": 1, "mlocked_bytes": 0, "cached_bytes": 5}


def build(gpus, rows=None, apps=(), idle=16):
    return rb.build(129, gpus, ROWS if rows is None else rows, list(apps), HOST, 14336, "2026-12-01T07:00:00Z", idle)


def test_idle_gpus_are_recorded_with_their_idle_figure():
    rec = build([1, 0])
    assert rec["gpus"] == [{"index": 0, "uuid": "GPU-0", "memory_used_mib": 3},
                           {"index": 1, "uuid": "GPU-1", "memory_used_mib": 0}]
    assert rec["host"] == {"mem_total_bytes": 100, "mem_available_bytes": 90, "shmem_bytes": 1, "mlocked_bytes": 0}
    assert rec["vmid"] == 129 and rec["format"] == rb.FORMAT and rec["container_memory_mib"] == 14336


def test_another_containers_app_on_a_shared_gpu_is_taken_off():
    # The bystander's 512 MiB on GPU 4: what is left (3 MiB) is GPU 4's idle figure for CT 129.
    rec = build([4], apps=[{"pid": 7, "process_name": "bystander-gpu", "used_memory_mib": 512, "gpu_uuid": "GPU-4",
                           "owner": 130}])
    assert rec["gpus"] == [{"index": 4, "uuid": "GPU-4", "memory_used_mib": 3}]


@pytest.mark.parametrize("gpus,rows,apps,why", [
    ([4], ROWS, [], "GPU 4 uses 515 MiB with no process of its own (idle is at most 16 MiB)"),
    ([0], ROWS, [{"pid": 9, "process_name": "sglang::scheduler_TP0", "used_memory_mib": 3, "gpu_uuid": "GPU-0",
                  "owner": 129}], "GPU 0 has compute app(s) 9/sglang::scheduler_TP0 (CT 129)"),
    ([0], ROWS, [{"pid": 9, "process_name": "x", "used_memory_mib": 3, "gpu_uuid": "GPU-0", "owner": "gone"}],
     "GPU 0 has compute app(s) 9/x (gone)"),
    ([0], [dict(ROWS[0], memory_used_mib=None)], [], "GPU 0 has no memory.used figure"),
    ([5], ROWS, [], "GPU 5 is not reported by nvidia-smi"),
])
def test_leftovers_are_never_recorded_as_idle(gpus, rows, apps, why):
    with pytest.raises(rb.BaselineError) as exc:
        build(gpus, rows, apps)
    assert why in str(exc.value) and "recover.yml -e recover_vmid=129" in str(exc.value)


def test_written_and_read_by_the_same_code(tmp_path):
    rec = build([0, 1])
    where = rb.write(str(tmp_path / "baseline"), rec)
    assert where == str(tmp_path / "baseline" / "129.json") and oct(os.stat(where).st_mode & 0o777) == "0o644"
    assert rb.load(str(tmp_path / "baseline"), 129) == (where, rec, None)
    assert rb.gpus_of(rec) == [0, 1] and rb.gpus_of(None) is None
    assert rb.load(str(tmp_path), 130) == (str(tmp_path / "130.json"), None, None)
    (tmp_path / "131.json").write_text("[1]")
    assert "not a JSON object" in rb.load(str(tmp_path), 131)[2]
    (tmp_path / "132.json").write_text("{")
    assert "unreadable baseline" in rb.load(str(tmp_path), 132)[2]
    assert json.loads(open(where).read())["gpus"][0]["index"] == 0
