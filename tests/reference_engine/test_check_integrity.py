"""EngineConfig.check_integrity: the allocator's invariants checked after every scheduling
step. Clean for the correct and the guarded allocator on a trigger-shaped run (smaller than
the reproduce case: 8 sessions x 8 rounds jumping across 512); the stale-hash fault raises
at its first stale entry, naming the block and its generations."""

from __future__ import annotations

import re

import pytest

from kvdiag.planning.scenarios import make_schedule
from reference_engine.config import EngineConfig
from tests.sessions_util import answer_lengths, paged_turns, reference_turns


@pytest.fixture(scope="module")
def small_trigger(tiny_ckpt):
    schedule = make_schedule("trigger", answer_lengths(8, 8), min_user=6, shared_prefix=256,
                             boundary=512, start_range=(400, 500))
    return schedule, reference_turns(tiny_ckpt, schedule)


@pytest.mark.slow
@pytest.mark.parametrize("allocator", ["prefix-cache", "guarded"])
def test_check_integrity_runs_clean_for_correct_allocators(tiny_ckpt, small_trigger, allocator):
    schedule, reference = small_trigger
    engine, turns = paged_turns(tiny_ckpt, schedule, reference, allocator, check_integrity=True)
    assert engine.config.check_integrity
    assert all(t.is_finished for ts in turns.values() for t in ts)
    if allocator == "guarded":
        assert engine.allocator.guard_rejections > 0  # the fault was there; the check stayed clean


@pytest.mark.slow
def test_check_integrity_raises_at_the_first_stale_entry(tiny_ckpt, small_trigger):
    schedule, reference = small_trigger
    with pytest.raises(RuntimeError, match=r"stale hash entry") as e:
        paged_turns(tiny_ckpt, schedule, reference, "stale-hash", check_integrity=True)
    m = re.search(r"block (\d+) was cached at generation (\d+) .* \(now generation (\d+)\)", str(e.value))
    assert m and int(m[3]) > int(m[2])
    # the same run without the flag completes: the check, not the fault, stopped it
    engine, _ = paged_turns(tiny_ckpt, schedule, reference, "stale-hash", check_integrity=False)
    with pytest.raises(RuntimeError, match="stale hash entry"):
        engine.allocator.check_integrity()


def test_the_flag_is_off_unless_given(monkeypatch):
    monkeypatch.setenv("KVDIAG_CHECK_INTEGRITY", "1")  # no environment variable turns it on
    assert not EngineConfig().check_integrity
    assert EngineConfig(check_integrity=True).check_integrity
