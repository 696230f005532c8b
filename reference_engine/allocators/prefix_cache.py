"""The correct allocator: a block pool with prefix caching in the manner of vLLM v1
(`vllm/v1/core/block_pool.py`).

State, all of it:
    blocks            list[Block]         ref_cnt, block_hash, generation per physical block
    hash_to_block_id  dict[bytes, int]    prefix cache: chained block hash -> block id
    free_block_ids    OrderedDict          LRU free queue; the front is recycled first
    used_block_ids    set[int]            blocks with ref_cnt > 0
    entry_generation  dict[bytes, tuple]  hash -> (block id, its generation) when cached;
                                          used only by check_integrity
    num_recycled, num_evicted   int       counters (blocks handed out again; of those, cached)

A freed block keeps its hash and stays hittable until it is recycled; recycling first drops
its hash entry (vLLM's `_maybe_evict_cached_block`). Leaving that entry behind is the
stale-hash fault (faults.py).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from reference_engine.allocators.base import (
    AllocateResult,
    MatchResult,
    NoFreeBlocks,
    PrefixCachingAllocator,
)
from reference_engine.errors import IntegrityError
from reference_engine.sequence import Sequence
from reference_engine.util import cdiv


@dataclass
class Block:
    block_id: int
    ref_cnt: int = 0
    block_hash: bytes | None = None
    ever_used: bool = False
    generation: int = 0  # times handed out for new K/V (the vocabulary's generation)


class PrefixCacheAllocator(PrefixCachingAllocator):
    name = "prefix-cache"

    def __init__(self, num_blocks: int, block_size: int, enable_caching: bool = True) -> None:
        super().__init__(num_blocks, block_size, enable_caching)
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.hash_to_block_id: dict[bytes, int] = {}
        self.free_block_ids: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self.used_block_ids: set[int] = set()
        self.entry_generation: dict[bytes, tuple[int, int]] = {}
        self.num_recycled = 0  # blocks handed out again after an earlier owner
        self._num_evicted = 0  # of those, blocks whose cached content was discarded

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_block_ids)

    @property
    def num_evicted(self) -> int:
        return self._num_evicted

    # --- lookup ------------------------------------------------------------------------
    def lookup(self, seq: Sequence) -> MatchResult:
        if not self.enable_caching:
            return MatchResult([], 0)
        # At least one token must be computed to produce logits, so never hit the last one.
        max_blocks = (seq.num_tokens - 1) // self.block_size
        hashes = self.compute_block_hashes(seq)
        hit: list[int] = []
        for h in hashes[:max_blocks]:
            block_id = self.hash_to_block_id.get(h)
            if block_id is None:
                break
            hit.append(block_id)
        return MatchResult(hit, len(hit) * self.block_size)

    # --- allocation --------------------------------------------------------------------
    def num_new_blocks(self, seq: Sequence, match: MatchResult) -> int:
        return cdiv(seq.num_tokens, self.block_size) - len(match.block_ids)

    def can_allocate(self, seq: Sequence, match: MatchResult) -> bool:
        # Touching a hit block that sits in the free queue takes it out of the queue.
        free_hits = sum(1 for b in match.block_ids if self.blocks[b].ref_cnt == 0)
        return self.num_new_blocks(seq, match) <= self.num_free_blocks - free_hits

    def allocate(self, seq: Sequence, match: MatchResult) -> AllocateResult:
        if not self.can_allocate(seq, match):
            raise NoFreeBlocks
        self.touch(match.block_ids)
        new = self.get_new_blocks(self.num_new_blocks(seq, match))
        seq.block_table = list(match.block_ids) + new.new_block_ids
        seq.num_cached_blocks = len(match.block_ids)
        return new

    def append_block(self, seq: Sequence) -> AllocateResult:
        if not self.free_block_ids:
            raise NoFreeBlocks
        new = self.get_new_blocks(1)
        seq.block_table.extend(new.new_block_ids)
        return new

    def touch(self, block_ids: list[int]) -> None:
        for b in block_ids:
            block = self.blocks[b]
            if block.ref_cnt == 0:
                del self.free_block_ids[b]
                self.used_block_ids.add(b)
            block.ref_cnt += 1

    def pop_free_block(self) -> Block:
        block_id, _ = self.free_block_ids.popitem(last=False)
        block = self.blocks[block_id]
        block.ref_cnt = 1
        block.generation += 1
        self.used_block_ids.add(block_id)
        return block

    def get_new_blocks(self, n: int) -> AllocateResult:
        new, recycled = [], []
        for _ in range(n):
            block = self.pop_free_block()
            if block.block_hash is not None:
                self._num_evicted += 1
            self.evict_cached_block(block)
            if block.ever_used:
                recycled.append(block.block_id)
                self.num_recycled += 1
            block.ever_used = True
            new.append(block.block_id)
        return AllocateResult(new, recycled)

    def evict_cached_block(self, block: Block) -> None:
        """Drop a recycled block's hash entry (vLLM: `_maybe_evict_cached_block`)."""
        if block.block_hash is not None:
            if self.hash_to_block_id.get(block.block_hash) == block.block_id:
                del self.hash_to_block_id[block.block_hash]
                self.entry_generation.pop(block.block_hash, None)
            block.block_hash = None

    def reset_prefix_cache(self) -> bool:
        """Forget every cached block (vLLM's reset_prefix_cache); refused while any block is
        in use, since running requests still hold their blocks."""
        if self.used_block_ids:
            return False
        for block in self.blocks:
            block.block_hash = None
        self.hash_to_block_id.clear()
        self.entry_generation.clear()
        return True

    def cached_block_id(self, block_hash: bytes) -> int | None:
        return self.hash_to_block_id.get(block_hash)

    def block_generation(self, block_id: int) -> int:
        return self.blocks[block_id].generation

    def drop_hash(self, block_hash: bytes) -> None:
        """Remove one hash entry (the guard's purge of an entry it proved stale)."""
        self.entry_generation.pop(block_hash, None)
        block_id = self.hash_to_block_id.pop(block_hash, None)
        if block_id is not None and self.blocks[block_id].block_hash == block_hash:
            self.blocks[block_id].block_hash = None

    # --- caching and freeing -----------------------------------------------------------
    def cache_full_blocks(self, seq: Sequence, num_tokens: int) -> None:
        num_full = min(num_tokens, seq.num_tokens) // self.block_size
        if not self.enable_caching or num_full <= seq.num_cached_blocks:
            seq.num_cached_blocks = max(seq.num_cached_blocks, num_full)
            return
        hashes = self.compute_block_hashes(seq)
        for i in range(seq.num_cached_blocks, num_full):
            block = self.blocks[seq.block_table[i]]
            # A block whose content another block already holds stays uncached (vLLM would
            # register both under one hash; a hit then takes either).
            if block.block_hash is None and hashes[i] not in self.hash_to_block_id:
                block.block_hash = hashes[i]
                self.hash_to_block_id[hashes[i]] = block.block_id
                self.entry_generation[hashes[i]] = (block.block_id, block.generation)
        seq.num_cached_blocks = num_full

    def free(self, seq: Sequence) -> None:
        # Reverse order: the tail of a sequence is the least likely to be shared, so it is
        # recycled first.
        for b in reversed(seq.block_table):
            block = self.blocks[b]
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                self.used_block_ids.discard(b)
                self.free_block_ids[b] = None
        seq.block_table = []

    # --- invariants --------------------------------------------------------------------
    def check_integrity(self) -> None:
        """Raise IntegrityError at the first broken invariant: a stale hash entry (its block
        was handed out again since the entry was made), free + used != total, a negative
        ref count, the free queue disagreeing with ref counts, an entry whose block holds
        other content. The stale-entry check runs first: it is the fault this project hunts."""
        for h, block_id in self.hash_to_block_id.items():
            made = self.entry_generation.get(h)
            now = self.blocks[block_id].generation
            # made[0] != block_id: a subclass re-pointed the entry itself; the content
            # check below still covers it
            if made is not None and made[0] == block_id and made[1] != now:
                raise IntegrityError(
                    f"stale hash entry {h.hex()[:12]}: block {block_id} was cached at generation "
                    f"{made[1]} and has been handed out again since (now generation {now})"
                )
        n_free, n_used = len(self.free_block_ids), len(self.used_block_ids)
        if n_free + n_used != self.num_blocks:
            raise IntegrityError(f"free {n_free} + used {n_used} != total {self.num_blocks}")
        for block in self.blocks:
            if block.ref_cnt < 0:
                raise IntegrityError(f"block {block.block_id} has ref_cnt {block.ref_cnt}")
            if (block.ref_cnt == 0) != (block.block_id in self.free_block_ids):
                raise IntegrityError(
                    f"block {block.block_id}: ref_cnt {block.ref_cnt} but "
                    f"{'in' if block.block_id in self.free_block_ids else 'not in'} the free queue"
                )
        for h, block_id in self.hash_to_block_id.items():
            if self.blocks[block_id].block_hash != h:
                raise IntegrityError(
                    f"hash entry {h.hex()[:12]} points at block {block_id}, which now holds "
                    f"{'no cached content' if self.blocks[block_id].block_hash is None else 'other content'}"
                )
