"""Unit tests of the measured overheads offered to the next plan (plugins/module_utils/sizing/overhead_offer.py), from verify's
measurement (sglang_deploy.verify) through the report to the next request's note (sglang_request.request)."""

from __future__ import annotations

import json

import pytest

from ansible_collections.inferops.gpu_inference.plugins.module_utils.sizing import overhead_offer as oo
from ansible_collections.inferops.gpu_inference.plugins.module_utils.deploy import sglang_deploy as d
from ansible_collections.inferops.gpu_inference.plugins.module_utils.deploy import sglang_request as r

GIB = 2**30
GB = 10**9


def report(per_rank=3 * GIB, frontend=5 * GIB, ranks=8, ok=True):
    return {"reported_at": "2026-12-05T02:30:00Z", "sglang_version": "0.5.9",
            "verify": {"ok": ok, "ranks_seen": ranks,
                       "overhead_seen": {"per_rank_bytes": per_rank, "frontend_bytes": frontend}}}


def test_offered_bytes_adds_a_quarter_and_rounds_up_to_a_gib():
    assert oo.offered_bytes(0) == GIB
    assert oo.offered_bytes(3 * GIB) == 4 * GIB  # 3.75 GiB
    assert oo.offered_bytes(4 * GIB) == 5 * GIB
    assert oo.offered_bytes(4 * GIB + 1) == 6 * GIB  # 5.0000...1 GiB


def test_verify_reports_the_offer_it_measured():
    launch = {"expected_running": {}, "ranks": 2, "bounds": {"planned_pinned_bytes": 2 * 10 * GB, "ceiling_bytes": 100 * GB},
              "plan": {"overhead_bytes": 24 * GIB}}
    measure = {"rank_count": 2, "ranks_held_bytes": 2 * 10 * GB + 2 * 3 * GIB, "unit_held_bytes": 2 * 10 * GB + 2 * 3 * GIB + 2 * GIB}
    v = d.verify(launch, None, measure, 1, 0.10)
    seen = v["overhead_seen"]
    assert seen["per_rank_bytes"] == 3 * GIB and seen["frontend_bytes"] == 2 * GIB
    assert seen["offer"] == {"rank_overhead_bytes": 4 * GIB, "frontend_overhead_bytes": 3 * GIB}
    assert "sglang_server_hicache_policy: {rank_overhead_bytes: 4294967296, frontend_overhead_bytes: 3221225472}" in seen["offer_text"]
    assert "not applied unless set" in seen["offer_text"]


def test_no_ranks_measured_offers_nothing():
    assert oo.offer(0, 0, 0) == {"settings": {}, "text": "no ranks were measured: nothing to offer"}


@pytest.mark.parametrize("record", [
    None, "", "   ", "not json", "[1, 2]", json.dumps(report(ok=False)), json.dumps(report(ranks=0)),
    json.dumps(report(per_rank=-1)), json.dumps(report(per_rank=True)), json.dumps(report(frontend=2**50)),
    json.dumps(report(per_rank="3")), {"verify": "x"}, {"verify": {"ok": True, "ranks_seen": 8, "overhead_seen": []}},
])
def test_no_offer_from_a_missing_failed_or_malformed_record(record):
    assert oo.recorded_offer(record) is None
    assert oo.offer_note(record, {}, "ct129") is None


def test_the_next_plan_offers_what_the_last_verify_measured():
    note = oo.offer_note(json.dumps(report()), {}, "ct129")
    assert note.startswith("measured overheads, offered and not applied: ct129's last deploy (2026-12-05T02:30:00Z), "
                           "SGLang 0.5.9, measured 3.00 GiB per rank (8 ranks) and a front-end of 5.00 GiB")
    assert "sglang_server_hicache_policy: {rank_overhead_bytes: 4294967296, frontend_overhead_bytes: 7516192768}" in note
    assert "In effect: rank_overhead_bytes 8.00 GiB (the default), frontend_overhead_bytes 8.00 GiB (the default)." in note
    # Already set as offered: nothing to say. Set otherwise: said, with what is in effect.
    assert oo.offer_note(report(), {"rank_overhead_bytes": 4 * GIB, "frontend_overhead_bytes": "7516192768"}, "ct129") is None
    assert "rank_overhead_bytes 2.00 GiB, " in oo.offer_note(report(), {"rank_overhead_bytes": 2 * GIB}, "ct129")


def test_the_request_carries_the_offer_as_a_note_and_plans_unchanged():
    settings = {"version": "0.5.9", "tp_size": 8, "model_path": "/models/kimi", "inventory_hostname": "ct129",
                "host": "127.0.0.1"}
    plain = r.request(settings)
    offered = r.request(dict(settings, last_report=json.dumps(report())))
    assert offered["plan_base"] == plain["plan_base"]  # offered, never applied
    assert [n for n in offered["notes"] if n not in plain["notes"]] == [oo.offer_note(report(), {}, "ct129")]
