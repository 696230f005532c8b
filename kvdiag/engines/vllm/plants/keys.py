"""The key-coverage, isolation and reset faults of catalog.py (a block's key, or the lookup,
gets something wrong), and double-free: one function per fault, each returning undo()."""

from __future__ import annotations

from collections.abc import Callable

from kvdiag.engines.vllm.plants.patching import (
    Undo,
    both,
    rehash_shared,
    swap_attr,
    wrap_extra_keys,
    wrap_hash,
)

# weak-hash: with b bits, n distinct blocks hold ~n²/2^(b+1) colliding pairs (44 at n=300,
# 4,400 at n=3,000 for b=10), and a new prompt's first uncached block falsely hits with
# probability ~(cached blocks)/2^b. 10 bits makes collisions certain in any run of a
# hundred or more distinct blocks, a short live run included. Measured on the smoke audit
# (~1.5k distinct blocks): 10 bits -> 181 of 192 requests read foreign slots, from round
# 1; 16 bits -> 87; 20 bits -> 2 (rounds 11-12). weak_hash(bits=16) is the subtler fault.
WEAK_HASH_BITS = 10


def stale_hash() -> Undo:
    """Recycling resets the block's hash metadata, so the block can be cached again under
    its new content, but leaves the old hash -> block entries in the map."""
    from vllm.v1.core.block_pool import BlockPool

    def _maybe_evict_cached_block(self, block) -> bool:
        if self.metrics_collector:
            self.metrics_collector.on_block_evicted(block)
        had_hash = block.block_hash is not None or block.block_id in self.cached_block_hashes_by_block
        self.cached_block_hashes_by_block.pop(block.block_id, None)
        block.reset_hash()  # FAULT: cached_block_hash_to_block keeps the stale entries
        return had_hash
    return swap_attr(BlockPool, "_maybe_evict_cached_block", _maybe_evict_cached_block)


def salt_ignored() -> Undo:
    """("cache_salt", salt) dropped from the first block's extra keys."""
    return wrap_extra_keys(lambda keys: tuple(
        k for k in keys if not (isinstance(k, tuple) and k[:1] == ("cache_salt",))))


def double_free() -> Undo:
    """A request freeing a block that other running requests still hold (ref_cnt > 1)
    drops every reference: the block joins the free queue (ref_cnt 0, still hashed, in
    the LRU order vLLM gives cached blocks) while it stays in their block tables, and the
    pool recycles it under them (or under its own holder, whose table then lists it twice).

    vLLM's invariant "in the free queue <=> ref_cnt == 0" is kept, so get_new_blocks'
    `ref_cnt == 0` assertion and touch()'s queue removal never fire: a holder's later free
    of a block already at ref_cnt 0 is skipped, and a block listed twice in one free is
    released once (without that, a live server crashed in get_new_blocks: the block went
    back to the queue at ref_cnt -1), and a recycled block its new holder hashes while an old
    holder still hashes it overwrites the old hash (patching.rehash_shared: without it the
    lifecycle phase's flood crashed vLLM on cache_full_blocks' assertion)."""
    from vllm.v1.core.block_pool import BlockPool

    original = BlockPool.free_blocks

    def free_blocks(self, ordered_blocks) -> None:
        kept, seen = [], set()
        for block in ordered_blocks:
            if block.is_null or getattr(block, "pool", None) not in (None, self):
                kept.append(block)  # untouched: vLLM's own handling
            elif block.ref_cnt == 0 or id(block) in seen:
                continue  # already released under this holder by the fault
            else:
                seen.add(id(block))
                block.ref_cnt = 1  # FAULT: the decrement below frees it for every holder
                kept.append(block)
        original(self, kept)
    return both(swap_attr(BlockPool, "free_blocks", free_blocks), rehash_shared())


def weak_hash(bits: int = WEAK_HASH_BITS) -> Undo:
    """Every block hash keeps only its low `bits` bits (BlockHash bytes, ceil(bits/8)
    long); the chain goes on from the truncated parent."""
    if not 1 <= bits <= 64:
        raise ValueError(f"weak-hash bits must be 1..64, not {bits}")
    mask, width = (1 << bits) - 1, (bits + 7) // 8

    def edit(original, hash_fn, parent, tokens, extra_keys):
        full = original(hash_fn, parent, tokens, extra_keys)
        return type(full)((int.from_bytes(full, "big") & mask).to_bytes(width, "big"))  # FAULT
    return wrap_hash(edit)


def _hash_without(slots: Callable[[int], range]) -> Undo:
    """Every block's hash leaves out the tokens at the offsets slots(block length) gives,
    in every block of the chain (offsets past the block's end leave nothing out):

        block    [t0 t1 t2 ... t15]      slots(16) = range(4, 12)
        hashed   [t0 t1 t2 t3 t12 .. t15] + parent + extra keys
    """
    def edit(original, hash_fn, parent, tokens, extra_keys):
        left_out = slots(len(tokens))
        kept = [t for i, t in enumerate(tokens) if i not in left_out]  # FAULT
        return original(hash_fn, parent, kept, extra_keys)
    return wrap_hash(edit)


def partial_hash(uncovered: int = 1) -> Undo:
    """The hash of a block covers all its tokens but the last `uncovered` (block offsets
    block_size - uncovered .. block_size - 1), in every block of the chain."""
    if uncovered < 1:
        raise ValueError(f"partial-hash must leave out at least one token, not {uncovered}")
    return _hash_without(lambda n: range(max(0, n - uncovered), n))


def slot_omitted(slot: int = 0) -> Undo:
    """The hash of a block leaves out the token at block offset `slot`, in every block."""
    if slot < 0:
        raise ValueError(f"slot-omitted needs a slot offset >= 0, not {slot}")
    return _hash_without(lambda n: range(slot, slot + 1))


def range_omitted(first: int = 2, last: int = 5) -> Undo:
    """The hash of a block leaves out the tokens at block offsets first..last (inclusive),
    in every block."""
    if not 0 <= first <= last:
        raise ValueError(f"range-omitted needs 0 <= first <= last, not {first}-{last}")
    return _hash_without(lambda n: range(first, last + 1))


def parent_ignored() -> Undo:
    """Every block is hashed as if it were the first (vLLM's NONE_HASH for its parent): its
    tokens and extra keys only, so the same block content hits after any prefix."""
    def edit(original, hash_fn, parent, tokens, extra_keys):
        return original(hash_fn, None, tokens, extra_keys)  # FAULT: the chain is cut
    return wrap_hash(edit)


def lora_ignored() -> Undo:
    """("lora", name, path) dropped from every block's extra keys."""
    return wrap_extra_keys(lambda keys: tuple(
        k for k in keys if not (isinstance(k, tuple) and k[:1] == ("lora",))))


def reset_noop() -> Undo:
    """reset_prefix_cache (the HTTP endpoint -> EngineCore -> Scheduler -> KVCacheManager
    -> coordinator -> BlockPool) answers True and logs success; no hash entry is dropped."""
    import vllm.v1.core.block_pool as block_pool

    def reset_prefix_cache(self) -> bool:
        block_pool.logger.info("Successfully reset prefix cache")
        return True  # FAULT: every cached block stays hittable
    return swap_attr(block_pool.BlockPool, "reset_prefix_cache", reset_prefix_cache)


def tags_dropped() -> Undo:
    """Extra keys flattened to the untagged shapes vLLM used before #44706: a LoRA key to
    its name, a cache_salt key to the salt, ("mm", id, offset) to (id, offset), a prompt
    embeds key to its digest. A salt equal to an adapter's name then gives that adapter's
    first-block hash (the salt keys only the first block; the LoRA name keys every block)."""
    def untag(key):
        if not isinstance(key, tuple) or not key:
            return key
        return key[1:] if key[0] == "mm" else key[1]  # FAULT: the domain tag is gone
    return wrap_extra_keys(lambda keys: tuple(untag(k) for k in keys))


def prompt_logprobs_cached() -> Undo:
    """A request asking for prompt logprobs reads the prefix cache (vLLM skips it for them):
    the model runner computes logprobs from num_computed_tokens on, so positions served
    from the cache are never filled. LogprobsTensors.empty_cpu is zero-filled so those
    positions read token 0, logprob 0.0 instead of uninitialized memory, which could decode
    as out-of-vocabulary ids and fail loudly in the detokenizer."""
    import torch
    from vllm.v1.outputs import LogprobsTensors
    from vllm.v1.request import Request

    original = Request.get_skip_reading_prefix_cache

    def get_skip_reading_prefix_cache(self) -> bool:
        params = self.sampling_params
        if params is not None and (params.prompt_logprobs is not None
                                   or getattr(params, "prompt_logprob_token_ids", None) is not None):
            return False  # FAULT: read the cache all the same
        return original(self)

    def empty_cpu(num_positions: int, num_tokens_per_position: int):
        shape = (num_positions, num_tokens_per_position)
        return LogprobsTensors(logprob_token_ids=torch.zeros(shape, dtype=torch.int32),
                               logprobs=torch.zeros(shape, dtype=torch.float32),
                               selected_token_ranks=torch.zeros(num_positions, dtype=torch.int32))
    return both(swap_attr(Request, "get_skip_reading_prefix_cache", get_skip_reading_prefix_cache),
                 swap_attr(LogprobsTensors, "empty_cpu", staticmethod(empty_cpu)))


