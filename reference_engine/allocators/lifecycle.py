"""Lifecycle faults: the block key is right, the bytes under it are not, at one event of a
block's life. Each is a small subclass of the correct allocator, like faults.py's.

    ref-undercount   a hit on a block another request holds takes no reference, so the first
                     holder to finish frees it under the other, and it is recycled while still
                     read (use-after-free: vLLM #42571's free queue counting a block twice,
                     kekzl/imp's churn test)
    publish-early    a request's prompt blocks are published under their hashes when they are
                     allocated, before their K/V is written, so a same-prefix request admitted
                     while the first is still in chunked prefill reads unwritten slots
                     (published before written: atlas #692, vLLM PR #37164)

Neither breaks an invariant check_integrity() reads: the fault is silent.
"""

from __future__ import annotations

from reference_engine.allocators.prefix_cache import PrefixCacheAllocator
from reference_engine.sequence import Sequence


class RefUndercountAllocator(PrefixCacheAllocator):
    name = "ref-undercount"

    def touch(self, block_ids: list[int]) -> None:
        for b in block_ids:
            block = self.blocks[b]
            if block.ref_cnt == 0:  # a free cached block is taken as it should be
                del self.free_block_ids[b]
                self.used_block_ids.add(b)
                block.ref_cnt = 1
            # a block in use: the second reader is not counted

    def free(self, seq: Sequence) -> None:
        for b in reversed(seq.block_table):
            block = self.blocks[b]
            if block.ref_cnt == 0:  # freed already, under this reader
                continue
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                self.used_block_ids.discard(b)
                self.free_block_ids[b] = None
        seq.block_table = []


class PublishEarlyAllocator(PrefixCacheAllocator):
    name = "publish-early"

    def allocate(self, seq: Sequence, match):
        new = super().allocate(seq, match)
        # the whole prompt's full blocks become hittable now, before any chunk is computed
        self.cache_full_blocks(seq, seq.num_tokens - 1)
        return new
