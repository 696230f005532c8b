"""Continuous batching: every step computes one token for each decoding sequence plus prefill
chunks of waiting or partially prefilled ones, within a token budget (vLLM v1's mixed batch).

Admission allocates blocks for every known token of a request (its prompt, plus tokens it had
generated before a preemption) after a prefix-cache lookup. A decoding sequence that needs a
new block and finds none preempts the most recently admitted running sequence (recompute
preemption: its blocks are freed, still cached, and it waits at the front of the queue).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from reference_engine.allocators.base import AllocateResult, BlockAllocator, NoFreeBlocks
from reference_engine.sequence import Sequence, SequenceStatus
from reference_engine.util import cdiv


@dataclass
class ScheduledSeq:
    seq: Sequence
    num_tokens: int  # tokens to compute this step, from seq.num_computed_tokens on

    @property
    def samples(self) -> bool:
        return self.seq.num_computed_tokens + self.num_tokens == self.seq.num_tokens


@dataclass
class SchedulerOutput:
    scheduled: list[ScheduledSeq] = field(default_factory=list)
    new_blocks: list[AllocateResult] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)


class Scheduler:
    def __init__(self, allocator: BlockAllocator, *, max_num_seqs: int,
                 max_num_batched_tokens: int, long_prefill_token_threshold: int | None = None) -> None:
        self.allocator = allocator
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.per_request = long_prefill_token_threshold or max_num_batched_tokens
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        # vLLM's counters: prefix-cache queries and hits in tokens, preemptions
        self.prefix_cache_queries = 0
        self.prefix_cache_hits = 0
        self.num_preemptions = 0

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.max_num_batched_tokens
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            n = min(seq.num_tokens - seq.num_computed_tokens, budget, self.per_request)
            if not self._reserve(seq, seq.num_computed_tokens + n, out):
                continue  # seq itself was preempted; running[i] is now the next one
            out.scheduled.append(ScheduledSeq(seq, n))
            budget -= n
            i += 1
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs and not out.preempted:
            seq = self.waiting[0]
            match = self.allocator.lookup(seq)
            if not self.allocator.can_allocate(seq, match):
                break  # first come, first served: wait for blocks
            self.waiting.popleft()
            out.new_blocks.append(self.allocator.allocate(seq, match))
            seq.num_computed_tokens = match.num_cached_tokens
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            self.prefix_cache_queries += seq.num_tokens
            self.prefix_cache_hits += match.num_cached_tokens
            if seq.first_admission:
                seq.first_admission = False
                seq.stats.cached_tokens = match.num_cached_tokens
                seq.stats.blocks_hit = len(match.block_ids)
                seq.stats.blocks_needed = cdiv(seq.num_prompt_tokens, self.allocator.block_size)
            seq.stats.blocks_allocated += len(out.new_blocks[-1].new_block_ids)
            n = min(seq.num_tokens - seq.num_computed_tokens, budget, self.per_request)
            out.scheduled.append(ScheduledSeq(seq, n))
            budget -= n
        return out

    def _reserve(self, seq: Sequence, num_tokens: int, out: SchedulerOutput) -> bool:
        """Make seq's block table cover num_tokens, preempting from the back if needed.
        Returns False if seq itself had to be preempted."""
        bs = self.allocator.block_size
        while len(seq.block_table) * bs < num_tokens:
            try:
                out.new_blocks.append(self.allocator.append_block(seq))
                seq.stats.blocks_allocated += 1
            except NoFreeBlocks:
                victim = self.running[-1]
                self._preempt(victim, out)
                if victim is seq:
                    return False
        return True

    def _preempt(self, seq: Sequence, out: SchedulerOutput) -> None:
        self.running.remove(seq)
        self.allocator.free(seq)
        seq.reset_for_recompute()
        self.waiting.appendleft(seq)
        self.num_preemptions += 1
        out.preempted.append(seq)

    def abort(self, seq: Sequence) -> None:
        """Drop an unfinished seq, waiting or running, and free its blocks (the client went
        away). Its full blocks stay in the prefix cache, as after a normal finish."""
        if seq in self.running:
            self.running.remove(seq)
            self.allocator.free(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)  # a waiting seq holds no blocks (preemption freed them)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = "abort"

    def finish(self, seq: Sequence, reason: str) -> None:
        self.running.remove(seq)
        self.allocator.free(seq)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
