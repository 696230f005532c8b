"""The fault catalog, one regression test per fault, and the guard that removes them.

The ablation matrix runs the trigger schedule (16 sessions x 12 rounds, histories jumping
4095 -> 4112, uneven turns, a pool that forces recycling) and each schedule with one
condition removed, on a small random model: the allocator dynamics do not depend on it."""

from __future__ import annotations

import math

import pytest
import torch

from kvdiag.planning.scenarios import make_schedule
from reference_engine.config import EngineConfig
from reference_engine.engine import LLMEngine
from tests.sessions_util import answer_lengths, paged_turns, reference_turns

ANSWERS = answer_lengths(16, 12)
SHORT = answer_lengths(16, 12, long_every=0)  # uniform turns need answers that fit a block


def _schedule(condition):
    return make_schedule(condition, SHORT if condition == "uniform" else ANSWERS, min_user=6)


@pytest.fixture(scope="module")
def trigger(tiny_ckpt):
    schedule = _schedule("trigger")
    return schedule, reference_turns(tiny_ckpt, schedule)


def _foreign_sessions(turns) -> int:
    return sum(any(t.stats.foreign_slots > 0 for t in ts) for ts in turns.values())


@pytest.mark.e2e  # the engine over the whole trigger: e2e tier
def test_stale_hash_reads_foreign_slots_under_the_trigger(tiny_ckpt, trigger):
    schedule, reference = trigger
    assert any(p == 4095 and q == 4112 for s in schedule.prompt_lengths for p, q in zip(s, s[1:]))
    engine, turns = paged_turns(tiny_ckpt, schedule, reference, "stale-hash", capture_attention=True)
    assert _foreign_sessions(turns) > schedule.num_sessions // 2  # most sessions
    per_round = [sum(turns[s][r].stats.foreign_slots > 0 for s in turns) for r in range(12)]
    assert per_round[-1] > per_round[2]  # it grows with the rounds
    leak = [t.stats.attention_leakage for ts in turns.values() for t in ts if t.stats.foreign_slots]
    assert leak and all(x > 0 for x in leak)
    with pytest.raises(RuntimeError, match="hash entry"):
        engine.allocator.check_integrity()  # the leftover entries the fault leaves behind


@pytest.mark.e2e  # the engine over the whole trigger: e2e tier
def test_guard_removes_the_fault_on_the_trigger(tiny_ckpt, trigger):
    schedule, reference = trigger
    checks = []
    engine, turns = paged_turns(tiny_ckpt, schedule, reference, "guarded", capture_attention=True,
                                on_step=lambda e: checks.append(e.allocator.check_integrity()))
    assert engine.allocator.guard_rejections > 0  # the stale entries were there, and caught
    for s in turns:
        assert [t.output_ids for t in turns[s]] == [t.output_ids for t in reference[s]]
        for t in turns[s]:
            assert t.stats.foreign_slots == 0 and t.stats.unwritten_slots == 0
            assert t.stats.attention_leakage == 0.0


@pytest.mark.e2e  # the engine over the whole trigger, per condition: e2e tier
@pytest.mark.parametrize("condition", [pytest.param("no-caching", marks=pytest.mark.slow),  # ~95 s
                                       pytest.param("no-jump", marks=pytest.mark.slow),  # ~30 s
                                       pytest.param("uniform", marks=pytest.mark.slow),  # ~25 s
                                       "big-pool"])
def test_removing_any_one_condition_gives_zero_foreign_slots(tiny_ckpt, condition):
    schedule = _schedule(condition)
    reference = reference_turns(tiny_ckpt, schedule)
    engine, turns = paged_turns(tiny_ckpt, schedule, reference, "stale-hash")
    assert _foreign_sessions(turns) == 0
    inner = engine.allocator
    if condition == "big-pool":
        assert inner.num_evicted == 0  # nothing cached was recycled
    elif condition != "no-caching":
        assert inner.num_evicted > 0  # recycling happened, the fault's path did not
    _, guarded = paged_turns(tiny_ckpt, schedule, reference, "guarded",
                             on_step=lambda e: e.allocator.check_integrity())
    assert all(t.stats.foreign_slots == 0 and t.stats.unwritten_slots == 0
               for ts in guarded.values() for t in ts)


def _nan_run(tiny_ckpt, allocator):
    """Fill the pool, free it, then serve new requests on recycled blocks holding NaN."""
    engine = LLMEngine(tiny_ckpt, EngineConfig(num_blocks=12, allocator=allocator,
                                               recycled_block_fill=float("nan"), capture_attention=True))
    engine.generate([[3 + i % 50 for i in range(150)]], max_tokens=20, stop_ids=())
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(2, 128, (n,), generator=g).tolist() for n in (21, 45)]
    return engine.generate(prompts, max_tokens=12, stop_ids=()), prompts


def test_stale_bytes_leaks_nan_and_guard_zeroing_removes_it(tiny_ckpt):
    from reference_engine.contiguous import ContiguousEngine

    bad, prompts = _nan_run(tiny_ckpt, "stale-bytes")
    assert sum(s.stats.nonfinite_logits for s in bad) > 0
    hit = [s for s in bad if s.stats.nonfinite_logits]
    assert hit and all(s.stats.leakage_max == 1.0 for s in hit)  # a NaN row leaked everything
    good, _ = _nan_run(tiny_ckpt, "guarded:stale-bytes")
    clean = ContiguousEngine(tiny_ckpt).generate(prompts, max_tokens=12, stop_ids=())
    assert [s.output_ids for s in good] == [s.output_ids for s in clean]
    assert all(s.stats.nonfinite_logits == 0 and s.stats.attention_leakage == 0 for s in good)
    assert [s.output_ids for s in bad] != [s.output_ids for s in clean]


def test_leakage_equals_attention_mass_on_a_planted_foreign_block(tiny_ckpt):
    engine = LLMEngine(tiny_ckpt, EngineConfig(num_blocks=64, keep_attention=True))
    other = engine.generate([[9] * 48], max_tokens=1, stop_ids=())[0]
    seq = engine.add_request([4 + i % 40 for i in range(40)], max_tokens=8, stop_ids=())
    engine.step()  # prefill: seq now owns its blocks
    victim, donor = seq.block_table[1], [b for b in range(64) if b not in seq.block_table][0]
    bs = engine.config.block_size
    # Plant: block 1 of seq (positions 16..31) now holds another prefix's K/V and provenance.
    src = engine.allocator.blocks  # keep a real written block of `other` as the donor
    donor = next(b for b in range(64) if src[b].block_hash is not None and b not in seq.block_table)
    for t in (*engine.cache.k, *engine.cache.v):
        t[victim] = t[donor]
    engine.cache.ledger[victim * bs:(victim + 1) * bs] = engine.cache.ledger[donor * bs:(donor + 1) * bs]
    engine.attention(seq).clear()
    seq.stats.leakage_sum, seq.stats.leakage_tokens = 0.0, 0
    while engine.has_unfinished():
        engine.step()
    assert other.is_finished and seq.stats.foreign_slots == bs
    assert len(engine.attention(seq)) == 7  # one per decode step after the plant
    for rec in engine.attention(seq):
        positions = torch.arange(rec["probs"].shape[-1])
        planted = (positions >= bs) & (positions < 2 * bs)
        assert rec["bad"].tolist() == planted.tolist()
    independent = [float(rec["probs"][..., 16:32].sum(-1).mean()) for rec in engine.attention(seq)]
    assert math.isclose(seq.stats.attention_leakage, sum(independent) / len(independent), rel_tol=1e-6)
    assert seq.stats.attention_leakage > 0


def test_unchained_hash_hits_a_block_computed_after_another_prefix(tiny_ckpt):
    p, q, r = [5] * 16, list(range(20, 36)), list(range(40, 56))
    for name, expect in (("unchained-hash", True), ("prefix-cache", False)):
        engine = LLMEngine(tiny_ckpt, EngineConfig(num_blocks=32, allocator=name))
        engine.generate([p + q + [7]], max_tokens=2, stop_ids=())
        # q now sits at positions 0..15 instead of 16..31: same tokens, other prefix.
        (seq,) = engine.generate([q + r + [7]], max_tokens=2, stop_ids=())
        assert (seq.stats.cached_tokens == 16) is expect
        assert (seq.stats.foreign_slots == 16) is expect


def test_salt_collision_shares_a_salted_tenants_blocks(tiny_ckpt):
    prompt = list(range(10, 60))
    for name, expect in (("salt-collision", 32), ("prefix-cache", 0)):
        engine = LLMEngine(tiny_ckpt, EngineConfig(num_blocks=32, allocator=name))
        engine.generate([prompt], max_tokens=2, stop_ids=(), lora_name="x")
        (seq,) = engine.generate([prompt], max_tokens=2, stop_ids=(), cache_salt="x")
        assert seq.stats.cached_tokens == (16 if expect else 0)
