"""16 sessions x 12 rounds through the paged engine with prefix caching, under a pool that
forces recycling and preemption, against the contiguous reference mode."""

import dataclasses

import pytest

from kvdiag.planning.scenarios import make_schedule
from tests.sessions_util import answer_lengths, paged_turns, reference_turns


@pytest.mark.slow  # over 30 s on 2 cores
def test_paged_sessions_equal_contiguous_reference(tiny_ckpt):
    answers = answer_lengths(16, 12, long_every=3, long=48)  # long answers: decode needs blocks
    schedule = make_schedule("trigger", answers, min_user=6)
    schedule = dataclasses.replace(schedule, num_blocks=450)  # far below the sessions' footprint
    assert schedule.footprint(11) > 2 * schedule.num_blocks
    assert any(p == 4095 and q >= 4096 for s in schedule.prompt_lengths for p, q in zip(s, s[1:]))
    reference = reference_turns(tiny_ckpt, schedule)
    checks = []
    engine, turns = paged_turns(tiny_ckpt, schedule, reference, "prefix-cache",
                                on_step=lambda e: checks.append(e.allocator.check_integrity()))
    assert len(checks) > 100
    for s in range(16):
        assert [t.output_ids for t in turns[s]] == [t.output_ids for t in reference[s]], f"session {s}"
    assert engine.scheduler.num_preemptions > 0
    assert engine.allocator.num_evicted > 0  # cached blocks really were recycled
    for r in range(1, 12):
        prompt = sum(turns[s][r].stats.prompt_tokens for s in range(16))
        cached = sum(turns[s][r].stats.cached_tokens for s in range(16))
        assert cached > 0.5 * prompt, f"round {r + 1}: {cached}/{prompt} tokens cached"
    assert all(t.stats.foreign_slots == 0 and t.stats.unwritten_slots == 0
               for s in range(16) for t in turns[s])
