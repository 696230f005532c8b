"""The vLLM lifecycle plants (engines/vllm/plants/lifecycle.py) in the model-free replay: each
event driven by a small hand-made trace through vLLM's own KVCacheManager, the fault planted
in-process; the shadow content map sees the planted replay read slots nobody wrote (or
another prefix wrote), and the same trace unplanted reads none. A plant that stops acting
fails its test.

    event            trace                                                   fault
    chunked-prefill  a 20-block prompt prefilled 16 tokens a step (vLLM's     published-before-written
                     long_prefill_token_threshold), 3 same-prefix requests
                     admitted beside it
    preemption       4 long decodes against 24 blocks                          preempt-stale-progress
    early-free       a holder and a reader of one prefix, the holder done      ref-undercount
                     first, then decodes that recycle the freed blocks
    backlog          a returning session waits for admission while decodes     stale-lookup
                     fill the pool and evict its cached prefix

Run in the vLLM venv (skipped where vLLM is not importable):

    .venv-vllm/bin/python -m pytest tests/kvdiag/runners/replay/test_vllm_lifecycle.py
"""

from __future__ import annotations

import random

import pytest

from kvdiag.runners.replay.trace import Trace, TraceConfig, TraceRequest
from tests.kvdiag.runners.replay.test_vllm_audit import needs_vllm

BS = 16
pytestmark = needs_vllm


def _ids(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(3, 120) for _ in range(n)]


def _trace(case: str, sessions: dict, num_blocks: int) -> Trace:
    """sessions: name -> [(prompt ids, output ids, think steps before the round)]."""
    reqs = [TraceRequest(s, r, prompt, out, think_steps=think)
            for s, rounds in sessions.items() for r, (prompt, out, think) in enumerate(rounds, 1)]
    return Trace(TraceConfig("lifecycle", case, BS, num_blocks, max_num_seqs=8,
                             max_num_batched_tokens=64), reqs)


def chunked_prefill() -> Trace:
    rng = random.Random(0)
    long = _ids(rng, 20 * BS)
    sessions = {"first": [(long, _ids(rng, 4), 0)]}
    sessions |= {f"same{i}": [(long[:-BS] + _ids(rng, BS), _ids(rng, 4), 0)] for i in range(3)}
    return _trace("chunked-prefill", sessions, 200)


def preemption() -> Trace:
    rng = random.Random(1)
    return _trace("preemption", {f"long{i}": [(_ids(rng, 2 * BS), _ids(rng, 150), 0)]
                                 for i in range(4)}, 24)


def early_free() -> Trace:
    rng = random.Random(2)
    prefix = _ids(rng, 4 * BS)
    sessions = {"holder": [(prefix, _ids(rng, 4), 0)],
                "reader": [(prefix + _ids(rng, BS), _ids(rng, 120), 0)]}
    sessions |= {f"pressure{i}": [(_ids(rng, 2 * BS), _ids(rng, 60), 6)] for i in range(3)}
    return _trace("early-free", sessions, 20)


def backlog() -> Trace:
    rng = random.Random(3)
    prefix, answer = _ids(rng, 4 * BS), _ids(rng, 2)
    sessions = {"returning": [(prefix, answer, 0), (prefix + answer + _ids(rng, BS), _ids(rng, 8), 6)]}
    sessions |= {f"long{i}": [(_ids(rng, 2 * BS), _ids(rng, 120), 2)] for i in range(3)}
    return _trace("backlog", sessions, 24)


# fault -> (its event's trace, replay options)
CASES = {"published-before-written": (chunked_prefill, {"long_prefill_token_threshold": BS}),
         "preempt-stale-progress": (preemption, {}),
         "ref-undercount": (early_free, {}),
         "stale-lookup": (backlog, {})}


def _replay(trace: Trace, fault: str | None, **options):
    from kvdiag.engines.vllm.plants import plant
    from kvdiag.runners.replay.vllm import replay_vllm

    undo = plant(fault) if fault else None
    try:
        return replay_vllm(trace, **options)
    finally:
        if undo:
            undo()


def _bad(result) -> list[str]:
    """Requests that read a slot no one wrote, or one another prefix wrote."""
    return [f"{r.session} round {r.round}" for r in result.records if r.foreign_slots or r.unwritten_slots]


@pytest.mark.parametrize("fault", list(CASES))
def test_the_event_unplanted_reads_only_what_was_written(fault):
    make, options = CASES[fault]
    result = _replay(make(), None, **options)
    assert _bad(result) == [] and result.violations == [], (result.violations, _bad(result))


@pytest.mark.parametrize("fault", list(CASES))
def test_a_lifecycle_plant_acts_in_the_replay(fault):
    make, options = CASES[fault]
    result = _replay(make(), fault, **options)
    assert _bad(result), f"{fault}: no request read a wrong slot: the plant is inert in the replay"


def test_the_events_are_reached():
    """What each trace drives, as vLLM's own allocator reports it (healthy)."""
    assert _replay(preemption(), None).stats["preemptions"] > 0
    assert _replay(early_free(), None).stats["prefix_cache_hits"] > 0
    assert _replay(backlog(), None).stats["prefix_cache_hits"] > 0
    chunked = _replay(chunked_prefill(), None, long_prefill_token_threshold=BS)
    assert chunked.stats["prefix_cache_hits"] > 0  # the same-prefix requests came in mid-prefill


def test_ref_undercount_breaks_the_pool_invariant():
    """The audit's own invariant sees what the fault does: a block two requests map, with one
    reference."""
    result = _replay(early_free(), "ref-undercount")
    assert any("ref_cnt" in v for v in result.violations), result.violations


def test_preemption_goes_through_vllms_own_scheduler_code():
    """The replay preempts through vLLM's Scheduler._preempt_request, so a scheduler plant acts
    there: planting then undoing leaves the replay as it was."""
    before = _replay(preemption(), None)
    _replay(preemption(), "preempt-stale-progress")
    after = _replay(preemption(), None)
    assert before.stats["preemptions"] == after.stats["preemptions"] > 0
    assert _bad(after) == []
