"""Model-free replays of a trace: the sessions' closed loop (think times, continuous
batching, preemption) drives a block manager, the contiguous reference's tokens are
teacher-forced, and a shadow content map checks every slot each request reads.

`AllocatorReplay` runs one of our allocators under reference_engine's own Scheduler, so it
makes exactly the block-manager calls the paged engine makes; vllm_replay.py drives vLLM's
KVCacheManager the way vLLM's scheduler does. Both yield the runners' per-round Record.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from kvdiag.runners.records import Record
from kvdiag.runners.replay.shadow import ReadLog, ShadowCache, StepItem
from kvdiag.runners.replay.trace import Trace, TraceRequest
from reference_engine.util import cdiv


@dataclass
class ReplayResult:
    target: str
    allocator: str
    records: list[Record]
    steps: int
    seconds: float
    turns: dict = field(repr=False, default_factory=dict)  # session -> finished requests
    stats: dict = field(default_factory=dict)  # manager-specific figures (hit rates, ...)
    violations: list[str] = field(default_factory=list)  # invariant breaches, first ones


def trace_index(trace: Trace) -> dict[tuple[str, int], TraceRequest]:
    """(session, 0-based round) -> request, the key run_sessions' tags carry."""
    return {(r.session, r.round - 1): r for r in trace.requests}


def drive(trace: Trace, engine, on_step: Callable[[], None] | None = None) -> dict:
    """Run every session of the trace to its end on a replay engine (add_request / step /
    has_unfinished, as reference_engine.sessions.run_sessions expects)."""
    from reference_engine.sessions import run_sessions

    by_session = trace.by_session()
    keys = list(by_session)

    def next_prompt(s, r, _turns):
        rounds = by_session[s]
        return rounds[r].prompt_ids if r < len(rounds) else None

    def think(s, r):
        rounds = by_session[s]
        return rounds[r].think_steps if r < len(rounds) else 0

    return run_sessions(engine, keys, next_prompt,
                        max_tokens=lambda s, r: len(by_session[s][r].output_ids),
                        think_steps=think, on_step=on_step)


class AllocatorReplay:
    """One of our allocators (by registry name) under the reference engine's Scheduler,
    without a model: the same admissions, chunks, appends, preemptions and frees as
    LLMEngine.step, with the shadow map in place of the K/V tensors."""

    def __init__(self, trace: Trace, allocator, *, check: bool = True,
                 cache_at_schedule: bool = False) -> None:
        """allocator: a registry name, or a BlockAllocator instance. cache_at_schedule:
        register full blocks when their slots are scheduled, before the step computes them
        (as vLLM's allocate_slots does), instead of after (as LLMEngine.step does)."""
        from reference_engine import allocators
        from reference_engine.scheduler import Scheduler

        cfg = trace.config
        self.allocator = (allocators.create(allocator, cfg.num_blocks, cfg.block_size,
                                            cfg.enable_prefix_caching)
                          if isinstance(allocator, str) else allocator)
        self.cache_at_schedule = cache_at_schedule
        self.scheduler = Scheduler(self.allocator, max_num_seqs=cfg.max_num_seqs,
                                   max_num_batched_tokens=cfg.max_num_batched_tokens)
        self.index = trace_index(trace)
        self.shadow = ShadowCache(cfg.num_blocks, cfg.block_size) if check else None
        self.num_steps = 0
        self.teacher: dict[int, list[int]] = {}  # seq_id -> the reference's tokens, fed in order
        self.reads: dict[int, ReadLog] = {}  # seq_id -> what the shadow map saw it read

    def add_request(self, prompt_ids, max_tokens, tag=None, session=None, **_):
        from reference_engine.sequence import Sequence

        req = self.index[(tag.session, tag.round)]
        seq = Sequence(list(prompt_ids), max_tokens, frozenset(), req.cache_salt, None, tag)
        self.teacher[seq.seq_id], self.reads[seq.seq_id] = req.output_ids, ReadLog()
        self.scheduler.add(seq)
        return seq

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    def step(self) -> list:
        from reference_engine.errors import PoolTooSmallError

        out = self.scheduler.schedule()
        self.num_steps += 1
        if self.shadow is not None:
            for new in out.new_blocks:
                self.shadow.allocate(new.new_block_ids)
        if not out.scheduled:
            if self.scheduler.has_unfinished() and not out.preempted:
                raise PoolTooSmallError("no request can be scheduled: the pool is too small")
            return []
        if self.cache_at_schedule:
            for s in out.scheduled:
                self.allocator.cache_full_blocks(s.seq, s.seq.num_computed_tokens + s.num_tokens)
        if self.shadow is not None:
            self.shadow.step([StepItem(s.seq.block_table, s.seq.num_computed_tokens, s.num_tokens,
                                       s.seq.fingerprints, self.reads[s.seq.seq_id], s.seq.stats)
                              for s in out.scheduled], self.num_steps)
        finished = []
        for s in out.scheduled:
            seq, samples = s.seq, s.samples
            seq.num_computed_tokens += s.num_tokens
            self.allocator.cache_full_blocks(seq, seq.num_computed_tokens)
            if not samples:
                continue
            teacher = self.teacher[seq.seq_id]
            seq.append_token(teacher[len(seq.output_ids)])
            if len(seq.output_ids) == len(teacher):
                self.scheduler.finish(seq, "stop")
                finished.append(seq)
        return finished


def records(trace: Trace, turns: dict, *, target: str, allocator: str,
            cached_tokens: Callable | None = None) -> list[Record]:
    """One Record per request. Teacher-forced: the output is the reference's by construction,
    so BLEU-4 and fact-checks equal the reference's; what the replay measures is which
    slots each request read (foreign_slots, unwritten_slots) and the prefix-cache hits."""
    out = []
    bs = trace.config.block_size
    for session, rounds in trace.by_session().items():
        for i, req in enumerate(rounds):
            st = turns[session][i].stats
            hit_tokens = cached_tokens(turns[session][i]) if cached_tokens else st.cached_tokens
            out.append(Record(
                case=trace.config.case, target=target, allocator=allocator, session=session,
                round=req.round, kind=req.kind, prompt_tokens=len(req.prompt_ids),
                cached_tokens=hit_tokens, blocks_needed=cdiv(len(req.prompt_ids), bs),
                blocks_hit=hit_tokens // bs, foreign_slots=st.foreign_slots,
                unwritten_slots=st.unwritten_slots, guard_rejections=st.guard_rejections,
                preemptions=st.preemptions, output_text=req.output_text,
                reference_text=req.output_text, expected_text=req.expected_text,
                output_token_ids=list(req.output_ids), reference_token_ids=list(req.output_ids),
                first_divergence=None, fact_check_pass=req.fact_check_pass,
                fact_check_reason=req.fact_check_reason))
    return out


def replay_allocator(trace: Trace, allocator: str = "prefix-cache", *,
                     check: bool = True) -> ReplayResult:
    """The trace through one of our allocators; rows target "replay:<allocator>"."""
    engine = AllocatorReplay(trace, allocator, check=check)
    t0 = time.perf_counter()
    turns = drive(trace, engine)
    seconds = time.perf_counter() - t0
    violations = []
    try:
        engine.allocator.check_integrity()
    except RuntimeError as e:
        violations.append(f"end of run: {e}")
    sched = engine.scheduler
    stats = {"prefix_cache_queries": sched.prefix_cache_queries,
             "prefix_cache_hits": sched.prefix_cache_hits,
             "preemptions": sched.num_preemptions,
             "guard_rejections": engine.allocator.guard_rejections}
    target = f"replay:{allocator}"
    return ReplayResult(target, allocator, records(trace, turns, target=target, allocator=allocator),
                        engine.num_steps, seconds, turns, stats, violations)
