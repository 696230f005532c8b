"""The plants of kvdiag's lifecycle faults in SGLang (see faults.py): each lives at one event of
a block's life (kvdiag.vocab.EVENTS), patches SGLang's classes in this process, and is called
once, by name (PLANTS), by kvdiag.engines.sglang.plugin in every SGLang process when
$KVDIAG_SGLANG_FAULT names it.

Each acts above the radix tree's core, in UnifiedRadixCache, so it acts with SGLang's default
(Rust) TreeCore as with the Python one. Only faults.py of kvdiag is imported with them: the
SGLang venv holds kvdiag with --no-deps. Patched against sglang 0.5.23.
"""

from __future__ import annotations


def plant_dedup_no_remap() -> None:
    """When a running request's KV goes into the tree (UnifiedRadixCache.checkpoint_into_tree:
    after its prefill, or a prefill chunk) and part of it is already there, because another
    request prefilled the same prefix at the same time, the tree keeps its own pages and frees
    the request's duplicates; SGLang then points the request's row of req_to_token at the
    tree's pages. Here the row keeps the request's own, freed pages (mini-sglang PR #142), so
    its later decode steps read pages the allocator hands out again:

        request's row    [own_0 .. own_(n-1)] [own_n ..]    protected: 0 -> n
        tree             [tree_0 .. tree_(n-1)]             (another request's, same tokens)
        freed            own_0 .. own_(n-1)                 duplicates, back to the allocator
        SGLang           row[0:n] = tree_0 .. tree_(n-1)
        fault            row[0:n] stays own_0 .. own_(n-1)  read until the request finishes

    Silent by construction: the row's range [0, n) is the tree's (cache_protected_len = n),
    so the request never frees those pages again, its final insert matches the tree there and
    frees nothing twice; the pool's counts stay exact (SGLang's idle leak check holds) and
    nothing is logged. A finished request's row is released at once, so only running
    requests are left reading: the fault acts only while a request decodes on pages another
    request's identical prefix made duplicates."""
    from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

    checkpoint_into_tree = UnifiedRadixCache.checkpoint_into_tree

    def checkpoint_into_tree_(self, req, *, up_to: int, **kwargs) -> None:
        if self.disable or req.finished():
            return checkpoint_into_tree(self, req, up_to=up_to, **kwargs)
        row = self.req_to_token_pool.req_to_token[req.kv.req_pool_idx]
        start = req.kv.cache_protected_len
        own = row[start:up_to].clone()  # the request's own pages, before the tree remaps them
        checkpoint_into_tree(self, req, up_to=up_to, **kwargs)
        end = min(req.kv.cache_protected_len, up_to)
        if end > start:  # FAULT: the duplicates were freed, and the row is not remapped
            row[start:end] = own[:end - start]

    UnifiedRadixCache.checkpoint_into_tree = checkpoint_into_tree_


def plant_abort_publish() -> None:
    """When a client cancels a request in the middle of its chunked prefill, SGLang drops it
    at the next scheduling step (Scheduler.process_pending_chunked_abort) and releases its row
    without publishing anything more: the tree keeps only the chunks that were computed (each
    checkpointed as it finished). Here the aborted request publishes its whole prompt first,
    the part never prefilled included (SGLang PR #28374: an aborted request's KV, not complete,
    inserted into the tree for later requests with the same prefix), on pages it takes from
    the allocator and never writes, so they hold whatever K/V they held before:

        prompt      [chunk 0][chunk 1][ .. never prefilled .. ][last]
        tree        [chunk 0][chunk 1]                               SGLang
        tree        [chunk 0][chunk 1][ fresh, unwritten pages  ]    fault
        next request with the same prefix: a hit on all of it, its K/V read as computed

    Silent by construction: the fresh pages go into the tree like any insert's, so the tree
    owns and later evicts them, and the release that follows frees what it always frees (the
    row past the protected prefix: nothing here); the pool's counts stay exact. It acts only
    when the request's row holds exactly what it was given (nothing over-allocated), the pages
    are single tokens (sglang-local's page size 1) and the pool has them, free or evictable;
    otherwise SGLang's own path runs unchanged. (A chunk still in flight under the overlap
    scheduler is published with the rest: its forward writes those pages, as it would have.)"""
    from sglang.srt.managers.scheduler import Scheduler

    process_pending_chunked_abort = Scheduler.process_pending_chunked_abort

    def process_pending_chunked_abort_(self) -> None:
        req = self._pending_chunked_abort_req
        if req is not None and req is self.chunked_req and req.kv.holds_kv:
            _publish_unwritten(self.tree_cache, req)
        return process_pending_chunked_abort(self)

    Scheduler.process_pending_chunked_abort = process_pending_chunked_abort_


def plant_retract_frees_prefix() -> None:
    """When SGLang retracts a decoding request for memory (ScheduleBatch.retract_decode ->
    release_req -> release_kv_cache), it frees the request's own pages, [cache_protected_len,
    owned): the protected prefix below is the tree's. Here it frees as many pages counted
    from the row's start instead, so the tree's prefix pages go back to the allocator while
    its nodes keep mapping them, and the request's own pages are never freed:

        row        [tree_0 .. tree_(p-1)] [own_0 .. own_(n-1)]    protected p, owned p + n
        SGLang     frees own_0 .. own_(n-1)
        fault      frees tree_0 .. tree_(min(n, p)-1), keeps own_0 .. own_(min(n, p)-1)
        next match of that prefix (the request itself, resumed, or another session): pages the
        allocator has handed out again since, read as its K/V

    Silent by construction: as many pages are freed as SGLang frees, so the pool's counts
    stay exact (the tree's pages, freed again when the tree evicts them, balance the ones
    never freed), and nothing is logged. It acts only on a retraction (release_req has no
    other caller) of a request with a protected prefix: in 0.5.23 every prefill is
    checkpointed into the tree, so every retracted request has one (SGLang #38319: a radix
    node kept KV pages freed by a retract and handed out again)."""
    from sglang.srt.managers import schedule_batch

    release_kv_cache = schedule_batch.release_kv_cache

    def release_kv_cache_(req, tree_cache, *, checkpoint: bool):
        if not checkpoint and req.kv.holds_kv and not getattr(tree_cache, "disable", True):
            protected, owned = req.kv.cache_protected_len, req.owned_kv_len()
            n = min(protected, owned - protected)
            if n > 0:  # FAULT: the range freed starts at the row's start, not at the prefix's end
                row = tree_cache.req_to_token_pool.req_to_token[req.kv.req_pool_idx]
                row[protected:protected + n] = row[:n].clone()
        return release_kv_cache(req, tree_cache, checkpoint=checkpoint)

    schedule_batch.release_kv_cache = release_kv_cache_


def _publish_unwritten(cache, req) -> None:
    """abort-publish: insert `req`'s prompt up to its last token into the tree, on fresh pages
    past what it computed."""
    if getattr(cache, "disable", True) or not hasattr(cache, "checkpoint_into_tree"):
        return
    done, end = req.kv.kv_committed_len, len(req.origin_input_ids) - 1
    allocator = cache.token_to_kv_pool_allocator
    need = end - done
    if (req.kv.kv_allocated_len != done or req.kv.cache_protected_len > done or need <= 0
            or allocator.page_size != 1
            or need > allocator.available_size() + cache.full_evictable_size()):
        return
    from sglang.srt.mem_cache.allocation import alloc_token_slots

    fresh = alloc_token_slots(cache, need)  # evicts unlocked tree pages first, as SGLang does
    row = cache.req_to_token_pool.req_to_token[req.kv.req_pool_idx]
    row[done:end] = fresh.to(row.dtype)  # FAULT: pages never written stand for the rest
    cache.checkpoint_into_tree(req, up_to=end)


PLANTS = {
    "dedup-no-remap": plant_dedup_no_remap,
    "abort-publish": plant_abort_publish,
    "retract-frees-prefix": plant_retract_frees_prefix,
}
