"""The sentinel held against the reference engine's own ledger, on the reported trigger: fed
only what the scheduler hands the forward pass, it finds bad reads in exactly the sequences
the engine's exact ledger does, under each fault, and none under the healthy allocators."""

from __future__ import annotations

import pytest

from kvdiag.planning.scenarios import make_schedule
from kvdiag.sentinel.reference import ReferenceSentinel, request_name
from tests.sessions_util import answer_lengths, paged_turns, reference_turns


@pytest.fixture(scope="module")
def trigger(tiny_ckpt):
    schedule = make_schedule("trigger", answer_lengths(16, 12), min_user=6)
    return schedule, reference_turns(tiny_ckpt, schedule)


@pytest.mark.e2e  # the engine over the whole trigger: e2e tier
@pytest.mark.parametrize("allocator", ["stale-hash", "guarded"])
def test_the_sentinel_agrees_with_the_engines_ledger(tiny_ckpt, trigger, allocator):
    schedule, reference = trigger
    found, sentinels = [], []
    _, turns = paged_turns(tiny_ckpt, schedule, reference, allocator,
                           on_engine=lambda e: sentinels.append(ReferenceSentinel(e, report=found.append)),
                           long_prefill_token_threshold=512)
    engine_bad = {request_name(t): t.stats.foreign_slots + t.stats.unwritten_slots
                  for ts in turns.values() for t in ts}
    sentinel_bad = {}
    for f in found:
        if f.kind != "overwrite":
            sentinel_bad[f.request] = sentinel_bad.get(f.request, 0) + f.count
    assert sentinels[0].ledger.counters.reads > 0
    assert {r for r, n in engine_bad.items() if n} == set(sentinel_bad)
    for r, n in sentinel_bad.items():
        assert 0 < n <= engine_bad[r]  # a recycled block that held the same prefix is no bad read
    if allocator == "guarded":
        assert found == []
    else:
        assert sentinel_bad
