"""SequenceGuard: generation stamps on blocks, checked on every cache hit and recycle.

This guard is kvdiag's own design, not vLLM code: vLLM has no "SequenceGuard". vLLM keeps
its prefix cache correct by evicting a block's hash entry when the block is recycled, and
(0.17.1, PR #35219) by zeroing newly allocated blocks. The guard is a belt over both:

- every allocation of a block bumps its generation (the inner allocator's own counter,
  `block_generation`: there is one generation per block, not two that could disagree);
- every hash entry and block-table entry records the generation it was made under;
- when a block is recycled, every hash entry recorded under its old generation is dropped
  (one the inner allocator failed to evict counts as a guard rejection);
- a cache hit whose recorded generation no longer matches is dropped and recomputed
  (also a rejection);
- newly allocated blocks are zeroed.

Free keeps the block's generation: a freed block still holds its K/V and must stay hittable
until it is recycled, so only recycling changes the stamp. (Resetting the stamp on free, as
the original report words it, would make every freed block a miss and switch prefix caching
off for multi-turn sessions.)

The guard wraps a PrefixCachingAllocator: it reads single hash entries
(`cached_block_id`) and drops the ones it proves stale (`drop_hash`). It refuses any other
inner allocator with a TypeError, and a guard cannot wrap a guard.

State, all of it (besides `inner`, whose state, block generations included, is its own):
    entry_generation    dict[bytes, (int, int)]    hash -> (block, generation) when cached
    block_entries       dict[int, set[bytes]]      block -> hashes recorded on it
    table_generations   dict[int, (Sequence, list[int])]  seq id -> its block table's
                                                   generations when last allocated
    guard_rejections    int                        stale entries caught
"""

from __future__ import annotations

from collections import defaultdict

from reference_engine.allocators.base import (
    AllocateResult,
    BlockAllocator,
    MatchResult,
    PrefixCachingAllocator,
)
from reference_engine.allocators.faults import StaleHashAllocator
from reference_engine.errors import IntegrityError
from reference_engine.sequence import Sequence


class SequenceGuard(BlockAllocator):
    guarded = True
    zero_new_blocks = True

    def __init__(self, inner: PrefixCachingAllocator, name: str | None = None) -> None:
        if not isinstance(inner, PrefixCachingAllocator):
            raise TypeError(
                f"SequenceGuard wraps a PrefixCachingAllocator (cached_block_id, drop_hash); "
                f"{type(inner).__name__} is not one"
            )
        super().__init__(inner.num_blocks, inner.block_size, inner.enable_caching)
        self.inner = inner
        self.name = name or f"guarded:{inner.name}"
        self.attention_mask = inner.attention_mask
        self.entry_generation: dict[bytes, tuple[int, int]] = {}  # hash -> (block, generation)
        self.block_entries: dict[int, set[bytes]] = defaultdict(set)  # block -> hashes on it
        self.table_generations: dict[int, tuple[Sequence, list[int]]] = {}

    @property
    def num_free_blocks(self) -> int:
        return self.inner.num_free_blocks

    @property
    def num_evicted(self) -> int:
        return self.inner.num_evicted

    def lookup(self, seq: Sequence) -> MatchResult:
        match = self.inner.lookup(seq)
        for i, block_id in enumerate(match.block_ids):
            h = seq.block_hashes[i]
            if self.entry_generation.get(h) != (block_id, self.inner.block_generation(block_id)):
                self._reject(h, seq)  # stale: drop it, recompute from here
                return MatchResult(match.block_ids[:i], i * self.block_size)
        return match

    def can_allocate(self, seq: Sequence, match: MatchResult) -> bool:
        return self.inner.can_allocate(seq, match)

    def allocate(self, seq: Sequence, match: MatchResult) -> AllocateResult:
        return self._stamp(seq, self.inner.allocate(seq, match))

    def append_block(self, seq: Sequence) -> AllocateResult:
        return self._stamp(seq, self.inner.append_block(seq))

    def cache_full_blocks(self, seq: Sequence, num_tokens: int) -> None:
        start = seq.num_cached_blocks
        self.inner.cache_full_blocks(seq, num_tokens)
        if not self.enable_caching:
            return
        for i in range(start, seq.num_cached_blocks):
            h, block_id = seq.block_hashes[i], seq.block_table[i]
            if self.inner.cached_block_id(h) == block_id and h not in self.entry_generation:
                self.entry_generation[h] = (block_id, self.inner.block_generation(block_id))
                self.block_entries[block_id].add(h)

    def free(self, seq: Sequence) -> None:
        self.inner.free(seq)
        self.table_generations.pop(seq.seq_id, None)

    def reset_prefix_cache(self) -> bool:
        if not self.inner.reset_prefix_cache():
            return False
        self.entry_generation.clear()
        self.block_entries.clear()
        return True

    def _stamp(self, seq: Sequence, result: AllocateResult) -> AllocateResult:
        for block_id in result.new_block_ids:
            for h in self.block_entries.pop(block_id, ()):  # recycled: old entries are stale
                self.entry_generation.pop(h, None)
                if self.inner.cached_block_id(h) == block_id:
                    self._reject(h, seq)
        gens = [self.inner.block_generation(b) for b in seq.block_table]
        self.table_generations[seq.seq_id] = (seq, gens)
        return result

    def _reject(self, h: bytes, seq: Sequence) -> None:
        self.inner.drop_hash(h)
        entry = self.entry_generation.pop(h, None)
        if entry is not None:
            self.block_entries[entry[0]].discard(h)
        self.guard_rejections += 1
        seq.stats.guard_rejections += 1

    def check_integrity(self) -> None:
        self.inner.check_integrity()
        for h, (block_id, gen) in self.entry_generation.items():
            now = self.inner.cached_block_id(h)
            if gen != self.inner.block_generation(block_id) or now != block_id:
                raise IntegrityError(
                    f"hash entry {h.hex()[:12]} recorded block {block_id} at generation {gen}; "
                    f"block is at generation {self.inner.block_generation(block_id)}, table says {now}"
                )
        for seq, gens in self.table_generations.values():
            now = [self.inner.block_generation(b) for b in seq.block_table]
            if seq.block_table and now != gens:
                bad = next(i for i, (a, b) in enumerate(zip(gens, now)) if a != b)
                raise IntegrityError(
                    f"sequence {seq.seq_id}: block-table entry {bad} (block {seq.block_table[bad]}) "
                    f"recorded generation {gens[bad]}, block is at {now[bad]}"
                )


def guarded(num_blocks: int, block_size: int, enable_caching: bool = True) -> SequenceGuard:
    """SequenceGuard around the stale-hash allocator: the fault is there, the guard stops it."""
    return SequenceGuard(StaleHashAllocator(num_blocks, block_size, enable_caching), name="guarded")
