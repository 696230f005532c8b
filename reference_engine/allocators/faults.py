"""The fault catalog: one small subclass of the correct allocator per fault, each naming the
real bug it models. The engine, scheduler and kernel are the same for all of them.

Each keeps the whole state of PrefixCacheAllocator (prefix_cache.py), generations included:
the stale-hash fault never reads them, but check_integrity() uses them to name the block
and generation of the first stale entry. Only StaleHashAllocator adds state of its own."""

from __future__ import annotations

from reference_engine.allocators.base import MatchResult, NoFreeBlocks, block_hash
from reference_engine.allocators.prefix_cache import Block, PrefixCacheAllocator
from reference_engine.sequence import Sequence


class StaleHashAllocator(PrefixCacheAllocator):
    """A recycled block keeps its old hash entry on the jump path.

    The jump path: a request continues a prefix whose last request stopped mid-block (the
    allocator remembers where freed sequences ended) and crosses the block boundary, so the
    previously partial last block is recomputed and new blocks are appended in the same
    step, as when a history jumps 4095 -> 4112. There the blocks are popped in one batch
    that clears each block's own hash field but leaves its `hash_to_block_id` entry, so a
    later lookup of the old prefix hits a block that now holds another sequence's K/V.
    Modelled on nano-vllm's "fix cache hit" commit (its `_allocate_block` reset the block
    but left the dict entry) and on what vLLM's `_maybe_evict_cached_block` prevents.

    State beyond PrefixCacheAllocator's:
        partial_tails   set[bytes]   hash of the last full block before each freed
                                     sequence's partial tail block (where it stopped)
        _on_jump_path   bool         True only inside an allocate on the jump path
    """

    name = "stale-hash"
    _on_jump_path = False

    def __init__(self, num_blocks: int, block_size: int, enable_caching: bool = True) -> None:
        super().__init__(num_blocks, block_size, enable_caching)
        self.partial_tails: set[bytes] = set()  # parent hash of a freed partial block

    def allocate(self, seq: Sequence, match: MatchResult):
        if not self.can_allocate(seq, match):
            raise NoFreeBlocks  # before partial_tails changes: a refused allocate changes nothing
        hit = len(match.block_ids)
        continues = hit > 0 and seq.block_hashes[hit - 1] in self.partial_tails
        self.partial_tails.difference_update(seq.block_hashes)  # tails this request supersedes
        self._on_jump_path = continues and self.num_new_blocks(seq, match) >= 2
        try:
            return super().allocate(seq, match)
        finally:
            self._on_jump_path = False

    def reset_prefix_cache(self) -> bool:
        self.partial_tails.clear()
        return super().reset_prefix_cache()

    def free(self, seq: Sequence) -> None:
        full, rest = divmod(seq.num_computed_tokens, self.block_size)
        if rest and full:
            self.partial_tails.add(self.compute_block_hashes(seq)[full - 1])
        super().free(seq)

    def evict_cached_block(self, block: Block) -> None:
        if self._on_jump_path:
            block.block_hash = None  # the block forgets its hash; the table does not
            return
        super().evict_cached_block(block)


class StaleBytesAllocator(PrefixCacheAllocator):
    """Recycled blocks are not cleared, and the attention kernel reads whole blocks and masks
    the tail of the last one by multiplying probabilities by 0/1. Finite stale bytes then
    vanish, but NaN bytes left by another tenant of the same memory survive (0 x NaN = NaN)
    and spread through the softmax and the value sum. vLLM issue #35138 (hybrid Qwen3.5 /
    Mamba models, where attention and Mamba state share the pool), fixed in vLLM 0.17.1 by
    zeroing newly allocated blocks (PR #35219). Run with EngineConfig.recycled_block_fill=nan
    to model the other tenant.
    """

    name = "stale-bytes"
    zero_new_blocks = False
    attention_mask = "multiply"


class UnchainedHashAllocator(PrefixCacheAllocator):
    """A block's hash covers its own tokens and extra keys but not its parent hash, so two
    blocks with the same tokens after different prefixes collide, and a lookup can hit K/V
    computed under another context (other positions, other attention history). The bug class
    chained hashing exists to prevent (vLLM's `hash_block_tokens` takes the parent hash).
    """

    name = "unchained-hash"

    def hash_block(self, parent, token_ids, extra_keys):
        return block_hash(None, token_ids, extra_keys)


class PartialHashAllocator(PrefixCacheAllocator):
    """A block's hash covers every token but its last: two blocks that differ only in their
    last slot share a hash, so a request hits another's block (and, the chain going on from
    the same parent hash, every block after it that matches). An off-by-one of the kind a
    mutation study found surviving an engine's whole suite (kekzl/imp #1301, mutant M23)."""

    name = "partial-hash"

    def hash_block(self, parent, token_ids, extra_keys):
        return block_hash(parent, list(token_ids)[:-1], extra_keys)


class KeyOmitsAllocator(PrefixCacheAllocator):
    """A block's hash leaves out slots `first`..`last` of the block: two blocks that differ only
    there share a hash, and (the chain going on from the same parent) every block after them
    that matches too. The key-coverage family partial-hash is one member of; here for tests
    that plant members the catalog does not name (`key-omits:3`, `key-omits:4-9`)."""

    name = "key-omits"

    def __init__(self, num_blocks: int, block_size: int, enable_caching: bool = True, *,
                 slots: tuple[int, int] = (0, 0)) -> None:
        super().__init__(num_blocks, block_size, enable_caching)
        self.first, self.last = slots

    def hash_block(self, parent, token_ids, extra_keys):
        ids = list(token_ids)
        return block_hash(parent, ids[:self.first] + ids[self.last + 1:], extra_keys)


class SaltCollisionAllocator(PrefixCacheAllocator):
    """cache_salt and the LoRA name go into one untagged extra key, so a request salted "x"
    and a request for adapter "x" share first blocks: tenant isolation by cache_salt breaks
    (vLLM #44701). With real adapters the shared K/V would also be wrong for one of them.
    """

    name = "salt-collision"

    def extra_keys(self, seq: Sequence, block_index: int) -> tuple:
        keys = [seq.cache_salt] if block_index == 0 and seq.cache_salt is not None else []
        if seq.lora_name is not None and not keys:
            keys.append(seq.lora_name)
        return tuple(keys)
