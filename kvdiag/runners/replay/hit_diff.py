"""Why our prefix-cache allocator and vLLM's BlockPool hit different numbers of blocks on
the same trace: each known difference of policy is aligned in turn, and what remains is
counted, until nothing does.

    timing       vLLM registers a full block's hash when allocate_slots schedules its
                 tokens, before the forward pass, so a request admitted later in the same
                 step already hits it; reference_engine registers after the step computed
                 it. Aligned by replaying vLLM with delay_cache_blocks + cache_blocks after
                 the step (what our engine does).
    free order   vLLM 0.33's free_blocks puts blocks without a hash at the front of the free
                 queue (reused first) and hashed ones at the tail; ours (and vLLM 0.17)
                 append every freed block to the tail, tail of the table first.
    duplicates   a block computed again under a hash that is already cached: vLLM registers
                 it too (hash -> {block_id: block}; the first one is served, the next takes
                 over when it is evicted, and a hashed copy is freed to the tail); ours keeps
                 one block per hash and leaves the copy uncached.

The aligned variants below exist only to prove this accounting; they change nothing in
reference_engine's allocators.
"""

from __future__ import annotations

from dataclasses import dataclass

from reference_engine.allocators.prefix_cache import Block, PrefixCacheAllocator


class VllmPolicyAllocator(PrefixCacheAllocator):
    """Our allocator with vLLM's free order and/or duplicate registration."""

    name = "prefix-cache(vllm-policies)"

    def __init__(self, num_blocks: int, block_size: int, enable_caching: bool = True, *,
                 free_order: bool = True, duplicates: bool = True) -> None:
        super().__init__(num_blocks, block_size, enable_caching)
        self.vllm_free_order, self.vllm_duplicates = free_order, duplicates
        self.copies: dict[bytes, list[int]] = {}  # hash -> later blocks holding the same

    def cache_full_blocks(self, seq, num_tokens: int) -> None:
        start = seq.num_cached_blocks
        super().cache_full_blocks(seq, num_tokens)
        if not self.vllm_duplicates or not self.enable_caching:
            return
        for i in range(start, seq.num_cached_blocks):
            block = self.blocks[seq.block_table[i]]
            h = seq.block_hashes[i]
            if block.block_hash is None and self.hash_to_block_id.get(h) != block.block_id:
                block.block_hash = h  # cached as a copy, as vLLM's BlockHashToBlockMap would
                self.copies.setdefault(h, []).append(block.block_id)

    def evict_cached_block(self, block: Block) -> None:
        h = block.block_hash
        if h is not None and self.hash_to_block_id.get(h) != block.block_id:
            copies = self.copies.get(h, [])
            if block.block_id in copies:
                copies.remove(block.block_id)
            block.block_hash = None
            return
        super().evict_cached_block(block)
        if h is not None and self.copies.get(h):
            self.hash_to_block_id[h] = self.copies[h].pop(0)  # the next copy takes over

    def free(self, seq) -> None:
        if not self.vllm_free_order:
            return super().free(seq)
        first = []
        for b in reversed(seq.block_table):
            block = self.blocks[b]
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                self.used_block_ids.discard(b)
                if block.block_hash is None:
                    first.append(b)
                else:
                    self.free_block_ids[b] = None
        for b in reversed(first):  # prepend, keeping their order at the front
            self.free_block_ids[b] = None
            self.free_block_ids.move_to_end(b, last=False)
        seq.block_table = []


@dataclass
class Stage:
    label: str
    differing: list[tuple[str, int, int, int]]  # (session, round, ours, vllm) blocks hit
    ours_blocks_hit: int
    vllm_blocks_hit: int


def hits(result) -> dict[tuple[str, int], int]:
    return {(r.session, r.round): r.blocks_hit for r in result.records}


def compare(ours: dict, theirs: dict) -> list[tuple[str, int, int, int]]:
    return [(s, r, ours[(s, r)], theirs[(s, r)]) for (s, r) in ours if ours[(s, r)] != theirs[(s, r)]]


def explain(trace, api=None) -> list[Stage]:
    """Hit counts of ours vs vLLM, then with each policy difference aligned in turn."""
    from kvdiag.runners.replay.drive import AllocatorReplay, drive, records
    from kvdiag.runners.replay.vllm import replay_vllm
    from kvdiag.runners.replay.vllm_api import load

    api = api or load()
    cfg = trace.config

    def ours(allocator) -> dict:
        engine = AllocatorReplay(trace, allocator, check=False)
        return hits_of(records(trace, drive(trace, engine), target="replay", allocator="x"))

    def hits_of(rows) -> dict:
        return {(r.session, r.round): r.blocks_hit for r in rows}

    def make(**kw):
        return VllmPolicyAllocator(cfg.num_blocks, cfg.block_size, cfg.enable_prefix_caching, **kw)

    vllm_native = hits(replay_vllm(trace, api=api, check=False))
    vllm_late = hits(replay_vllm(trace, api=api, check=False, cache_after_compute=True))
    order_033 = api.series != "0.17"  # 0.17 frees in the same order as ours
    steps = [("ours vs vLLM", "prefix-cache", vllm_native),
             ("registration timing aligned (vLLM caches after compute)", "prefix-cache", vllm_late),
             ("+ vLLM's free order" if order_033 else "+ free order (already the same in 0.17)",
              make(free_order=order_033, duplicates=False), vllm_late),
             ("+ vLLM's duplicate registration", make(free_order=order_033, duplicates=True),
              vllm_late)]
    stages = []
    for label, allocator, theirs in steps:
        mine = ours(allocator)
        stages.append(Stage(label, compare(mine, theirs), sum(mine.values()), sum(theirs.values())))
    return stages
