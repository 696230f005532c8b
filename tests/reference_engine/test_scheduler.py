"""The scheduler alone, over a real allocator and no model: the token budget, decode before
admission, max_num_seqs, and which sequence recompute preemption picks (vLLM v1: the most
recently admitted one goes back to the front of the queue)."""

from __future__ import annotations

from reference_engine import allocators
from reference_engine.scheduler import Scheduler, SchedulerOutput
from reference_engine.sequence import Sequence, SequenceStatus

BS = 4


def _scheduler(num_blocks: int, *, budget: int = 64, max_num_seqs: int = 8) -> Scheduler:
    alloc = allocators.create("prefix-cache", num_blocks=num_blocks, block_size=BS)
    return Scheduler(alloc, max_num_seqs=max_num_seqs, max_num_batched_tokens=budget)


def _run_step(sched: Scheduler, token: int = 7) -> SchedulerOutput:
    return _apply(sched, sched.schedule(), token)


def _apply(sched: Scheduler, out: SchedulerOutput, token: int = 7) -> SchedulerOutput:
    """What LLMEngine.step does around the model: advance computed tokens, cache full
    blocks, and append one token to every sequence that samples."""
    for s in out.scheduled:
        samples = s.samples
        s.seq.num_computed_tokens += s.num_tokens
        sched.allocator.cache_full_blocks(s.seq, s.seq.num_computed_tokens)
        if samples:
            s.seq.append_token(token)
    return out


def _seq(n: int, first: int = 1) -> Sequence:
    return Sequence(list(range(first, first + n)), max_tokens=100)


def test_the_token_budget_chunks_prefill_and_is_never_exceeded():
    sched = _scheduler(64, budget=10)
    a, b = _seq(8, 1), _seq(8, 100)
    sched.add(a)
    sched.add(b)
    out = sched.schedule()
    assert [(s.seq, s.num_tokens) for s in out.scheduled] == [(a, 8), (b, 2)]
    assert [s.samples for s in out.scheduled] == [True, False]  # b is mid-prefill
    _apply(sched, out)
    out = _run_step(sched)
    # running sequences first, in admission order: a decodes one token, b finishes its prompt
    assert [(s.seq, s.num_tokens) for s in out.scheduled] == [(a, 1), (b, 6)]
    for _ in range(5):
        assert sum(s.num_tokens for s in _run_step(sched).scheduled) <= 10


def test_running_sequences_are_scheduled_before_new_admissions():
    sched = _scheduler(64, budget=9)
    a = _seq(8)
    sched.add(a)
    _run_step(sched)
    late = _seq(8, 50)
    sched.add(late)
    out = _run_step(sched)
    assert out.scheduled[0].seq is a and out.scheduled[0].num_tokens == 1
    assert out.scheduled[1].seq is late and out.scheduled[1].num_tokens == 8


def test_max_num_seqs_caps_the_running_set():
    sched = _scheduler(64, max_num_seqs=2)
    seqs = [_seq(4, 10 * i + 1) for i in range(3)]
    for s in seqs:
        sched.add(s)
    out = _run_step(sched)
    assert [s.seq for s in out.scheduled] == seqs[:2]
    assert list(sched.waiting) == [seqs[2]] and seqs[2].status is SequenceStatus.WAITING


def test_preemption_takes_the_most_recently_admitted_and_requeues_it_first():
    # 4 blocks of 4 tokens: three 4-token prompts fill three blocks; the first decode step
    # needs one new block each. The first gets the last free block, the second finds none
    # and preempts the newest running sequence (the third), which then frees its block.
    sched = _scheduler(4)
    a, b, c = _seq(4, 1), _seq(4, 20), _seq(4, 40)
    waiting = _seq(4, 60)
    for s in (a, b, c):
        sched.add(s)
    _run_step(sched)
    sched.add(waiting)
    out = sched.schedule()
    assert out.preempted == [c]
    assert [s.seq for s in out.scheduled] == [a, b]
    assert list(sched.waiting) == [c, waiting]  # the preempted one is at the front
    assert c.status is SequenceStatus.WAITING and c.block_table == [] and c.num_computed_tokens == 0
    assert c.stats.preemptions == 1 and sched.num_preemptions == 1
    assert not any(s.seq is waiting for s in out.scheduled)  # no admission in a preempting step


def test_a_sequence_that_must_preempt_itself_is_not_scheduled():
    # Two blocks: a (2 tokens) has room left in its block, b (4 tokens) has none. b's decode
    # needs a block, none is free, and b is itself the newest: b is preempted, a decodes.
    sched = _scheduler(2)
    a, b = _seq(2, 1), _seq(4, 20)
    sched.add(a)
    sched.add(b)
    _run_step(sched)
    out = sched.schedule()
    assert out.preempted == [b] and [s.seq for s in out.scheduled] == [a]
    assert sched.running == [a] and list(sched.waiting) == [b]
    assert sched.allocator.num_free_blocks == 1  # b's block went back to the pool
