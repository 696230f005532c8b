"""The lifecycle faults of catalog.py: each block's key is right, but the bytes behind it are
not, because the fault lives at one event of the block's life (catalog's `event`:
kvdiag.vocab.EVENTS). One function per fault, each returning undo().

Each keeps vLLM's own invariants (a block in the free queue <=> ref_cnt == 0, no negative
ref_cnt, no block freed twice into the queue), so vLLM's assertions never fire and nothing
unusual is logged: requests get wrong answers, and that is all.
"""

from __future__ import annotations

import functools
import inspect

from kvdiag.engines.vllm.plants.patching import Undo, both, rehash_shared, swap_attr


def published_before_written() -> Undo:
    """A request in chunked prefill gets slots for its whole prompt at its first chunk, and
    every full block of the prompt is published (its hash made hittable) at once, before the
    forward passes of the later chunks have written it. A same-prefix request admitted while
    the first is still in prefill hits blocks that hold zeros or a recycled block's bytes.

        prompt  [b0 b1 b2 b3 b4 b5]     chunk 1 computes b0 b1, step t
        healthy hashes b0 b1 at t, b2 b3 at t+1, ...
        FAULT   hashes b0 .. b5 at t: a request admitted at t+1 reads b4 b5 unwritten
    """
    from vllm.v1.core.kv_cache_manager import KVCacheManager

    original = KVCacheManager.allocate_slots
    signature = inspect.signature(original)

    @functools.wraps(original)  # its signature: the replay checks the one it calls
    def allocate_slots(self, *args, **kwargs):
        bound = signature.bind(self, *args, **kwargs)
        given = bound.arguments
        request = given["request"]
        done = (request.num_computed_tokens + given.get("num_new_computed_tokens", 0)
                + given.get("num_external_computed_tokens", 0) + given["num_new_tokens"])
        ahead = request.num_prompt_tokens - done  # prompt tokens later chunks will compute
        if ahead <= 0 or given.get("delay_cache_blocks") or not self.enable_caching:
            return original(self, *args, **kwargs)
        # slots for the whole prompt now (vLLM's lookahead slots: the worker gets their ids)
        given["num_lookahead_tokens"] = given.get("num_lookahead_tokens", 0) + ahead
        new = original(*bound.args, **bound.kwargs)
        if new is not None:
            self.cache_blocks(request, request.num_prompt_tokens)  # FAULT: published unwritten
        return new
    return swap_attr(KVCacheManager, "allocate_slots", allocate_slots)


def preempt_stale_progress() -> Undo:
    """Preemption frees the request's blocks, as vLLM does, but keeps its progress
    (num_computed_tokens). On resume the scheduler skips the prefix lookup (it looks up only
    for requests at 0 computed tokens), allocates fresh blocks for every position and computes
    only the tokens past the stale progress: the request attends to K/V that is gone (a fresh
    block's zeros, or another request's bytes), and those blocks are published as computed."""
    from vllm.v1.core.sched.scheduler import Scheduler

    original = Scheduler._preempt_request

    def _preempt_request(self, request, timestamp, *args, **kwargs) -> None:
        progress = request.num_computed_tokens
        original(self, request, timestamp, *args, **kwargs)
        # FAULT: progress kept; at least one token is left to compute, so the resumed step
        # schedules one (vLLM refuses a step of 0 new tokens)
        request.num_computed_tokens = max(0, min(progress, request.num_tokens - 1))
    return swap_attr(Scheduler, "_preempt_request", _preempt_request)


def stale_lookup() -> Undo:
    """A waiting request's prefix lookup (get_computed_blocks) is kept when its admission
    fails (allocate_slots finds no room) and handed back on every later step until it is
    admitted, though in between the pool may have evicted those cached blocks and handed them
    to other requests. Admission then adopts (touches) blocks that now hold other K/V, or that
    running requests are writing. Dropped once the request is admitted or freed."""
    from vllm.v1.core.kv_cache_manager import KVCacheManager

    lookup, allocate, free = (KVCacheManager.get_computed_blocks, KVCacheManager.allocate_slots,
                              KVCacheManager.free)

    def kept(manager) -> dict:
        return manager.__dict__.setdefault("_kvdiag_stale_lookups", {})

    @functools.wraps(lookup)
    def get_computed_blocks(self, request):
        lookups = kept(self)
        if request.request_id in lookups:
            return lookups[request.request_id]  # FAULT: an earlier step's result
        result = lookup(self, request)
        if result[1] > 0:
            lookups[request.request_id] = result
        return result

    @functools.wraps(allocate)
    def allocate_slots(self, request, *args, **kwargs):
        new = allocate(self, request, *args, **kwargs)
        if new is not None:
            kept(self).pop(request.request_id, None)
        return new

    def free_request(self, request) -> None:
        kept(self).pop(request.request_id, None)
        free(self, request)
    return both(swap_attr(KVCacheManager, "get_computed_blocks", get_computed_blocks),
                swap_attr(KVCacheManager, "allocate_slots", allocate_slots),
                swap_attr(KVCacheManager, "free", free_request))


def ref_undercount() -> Undo:
    """A cache hit on a block that another request holds takes no reference (touch() skips
    ref_cnt > 0; a hit on a free cached block still takes it off the free queue with its one
    reference). When the holder finishes, the block's count reaches 0 and it joins the free
    queue while the reader still maps it; the pool then recycles it under the reader.

    vLLM's invariants are kept as double-free keeps them: a later free of a block already at
    ref_cnt 0 is skipped, and a block a request lists twice (the pool handed the reader its
    own mapped block) is released once, and two holders hashing one block overwrite each
    other (patching.rehash_shared)."""
    from vllm.v1.core.block_pool import BlockPool

    touch, free_blocks = BlockPool.touch, BlockPool.free_blocks

    def touch_blocks(self, blocks) -> None:
        touch(self, [b for b in blocks if b.is_null or b.ref_cnt == 0])  # FAULT: held ones skipped

    def release(self, ordered_blocks) -> None:
        kept, seen = [], set()
        for block in ordered_blocks:
            if block.is_null or getattr(block, "pool", None) not in (None, self):
                kept.append(block)
            elif block.ref_cnt > 0 and id(block) not in seen:
                seen.add(id(block))
                kept.append(block)
        free_blocks(self, kept)
    return both(swap_attr(BlockPool, "touch", touch_blocks),
                swap_attr(BlockPool, "free_blocks", release), rehash_shared())


def cow_dropped() -> Undo:
    """A hit that ends inside a block (vLLM's --prefix-match-unit beside a Mamba group) gets a
    block of its own to write the rest of that block in, and the scheduler orders the copy
    of the shared block into it (kv_cache_block_copies); the order is dropped from the step
    the workers run. The scheduler keeps its own fencing (the copies' blocks are freed when
    the step completes, as they are), so vLLM's bookkeeping stays whole: the new block just
    holds no prefix, zeros or a recycled block's bytes where the shared tokens' K/V (and the
    Mamba state) should be."""
    from vllm.v1.core.sched.scheduler import Scheduler

    schedule = Scheduler.schedule

    def schedule_without_copies(self, *args, **kwargs):
        output = schedule(self, *args, **kwargs)
        output.kv_cache_block_copies = None  # FAULT: the workers never copy
        return output
    return swap_attr(Scheduler, "schedule", schedule_without_copies)


PLANTS = {
    "published-before-written": published_before_written,
    "preempt-stale-progress": preempt_stale_progress,
    "stale-lookup": stale_lookup,
    "ref-undercount": ref_undercount,
    "cow-dropped": cow_dropped,
}
