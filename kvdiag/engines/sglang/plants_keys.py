"""The plants of kvdiag's key-coverage and isolation faults in SGLang's radix cache (see
faults.py): each patches SGLang's classes in this process, and kvdiag.engines.sglang.plugin
calls it once, by name (PLANTS), in every SGLang process when $KVDIAG_SGLANG_FAULT names it.

Only faults.py of kvdiag is imported: the SGLang venv holds kvdiag with --no-deps.
Patched against sglang 0.5.23.
"""

from __future__ import annotations

import collections
import os

from kvdiag.engines.sglang.faults import TREE_CORE_ENV

# a stale node's own pages (those it frees when evicted), beside the pages it reads (value)
_OWNED = "kvdiag_owned_value"


def plant_salt_ignored() -> None:
    """Every radix key is built without its namespaces: RadixKey.child_key then keys the tree
    by tokens alone, so a request under a new salt matches pages cached under another."""
    from sglang.srt.mem_cache.radix_cache import RadixKey

    init = RadixKey.__init__

    def __init__(self, token_ids, extra_key=None, is_bigram=False, limit=None, cache_salt=None):
        init(self, token_ids, None, is_bigram, limit, None)  # FAULT: namespaces dropped

    RadixKey.__init__ = __init__


def plant_stale_node() -> None:
    """When the tree evicts a leaf, the pages returned to the allocator are, as many as the
    leaf had, those of other live nodes (the most recently inserted ones no request holds),
    and those nodes keep pointing at them: the pages are handed out again at once, and each
    node's prefix, matched again, reads another request's K/V (SGLang #38319). Silent by
    construction: each such node books the evicted leaf's pages as its own and frees those
    when evicted in turn, so the pool's counts stay exact (SGLang's idle leak check, on by
    default, still holds), no page is freed twice and nothing crashes. Only SGLang's opt-in
    SGLANG_CHECK_KV_PAGE_INVARIANTS could see a reader's page in the free pool."""
    import torch
    from sglang.srt.mem_cache.unified_cache.components.base import EvictLayer
    from sglang.srt.mem_cache.unified_cache.components.full import FullComponent
    from sglang.srt.mem_cache.unified_cache.unified_tree_core import UnifiedTreeCore

    if os.environ.get(TREE_CORE_ENV) != "python":
        raise ValueError(f"kvdiag: stale-node lives in SGLang's Python TreeCore; "
                         f"{TREE_CORE_ENV}={os.environ.get(TREE_CORE_ENV)!r}, needs 'python'")
    recent = collections.deque(maxlen=64)  # nodes that inserts created, newest last
    add_new_node = UnifiedTreeCore._add_new_node
    evict_component = FullComponent.evict_component
    split = FullComponent.redistribute_on_node_split

    def _add_new_node(self, *args, **kwargs):
        node = add_new_node(self, *args, **kwargs)
        recent.append(node)
        return node

    def may_go_stale(core, node, evicted) -> bool:
        cd = node.component_data[FullComponent.component_type]
        return (node is not evicted and core._node_arena.get(node.id) is node
                and cd.value is not None and cd.lock_ref == 0 and _OWNED not in cd.metadata)

    def go_stale(component, evicted, frees: list) -> None:
        core, page = component.tree_core, component.tree_core.page_size
        leaf = frees[-1]  # the evicted leaf's pages, queued for the allocator
        returned, taken = [], 0
        for node in [n for n in reversed(recent) if may_go_stale(core, n, evicted)]:
            if len(leaf) - taken < page:
                break
            cd = node.component_data[component.component_type]
            n = min(len(leaf) - taken, len(cd.value)) // page * page
            if n == 0:
                continue
            # FAULT: the live node's pages go back and it keeps reading them; it books the
            # leaf's pages as its own instead
            returned.append(cd.value[:n])
            cd.metadata[_OWNED] = torch.cat([leaf[taken:taken + n], cd.value[n:]])
            taken += n
        if taken:
            frees[-1] = torch.cat([*returned, leaf[taken:]])

    def evict_component_(self, node, device_frees, host_frees, cache_actions,
                         target=EvictLayer.DEVICE):
        cd = node.component_data[self.component_type]
        if EvictLayer.DEVICE not in target or cd.value is None:
            return evict_component(self, node, device_frees, host_frees, cache_actions, target)
        owned = cd.metadata.pop(_OWNED, None)
        if owned is not None:  # a stale node frees the pages it owns, not those it reads
            read, cd.value = cd.value, owned
            try:
                return evict_component(self, node, device_frees, host_frees, cache_actions, target)
            finally:
                cd.value = read
        result = evict_component(self, node, device_frees, host_frees, cache_actions, target)
        go_stale(self, node, device_frees[self.component_type])
        return result

    def redistribute_on_node_split(self, new_parent, child):
        owned = child.component_data[self.component_type].metadata.pop(_OWNED, None)
        split(self, new_parent, child)
        if owned is not None:  # split the owned pages where the value was split
            k = len(new_parent.key)
            new_parent.component_data[self.component_type].metadata[_OWNED] = owned[:k].clone()
            child.component_data[self.component_type].metadata[_OWNED] = owned[k:].clone()

    UnifiedTreeCore._add_new_node = _add_new_node
    FullComponent.evict_component = evict_component_
    FullComponent.redistribute_on_node_split = redistribute_on_node_split


def plant_overrun(pick, tokens: bool = False) -> None:
    """A request's prefix match runs one page past where the tree's and the request's tokens
    part: it is served the matched path plus the K/V of a page the tree holds there (a
    child's, keyed by other tokens), and reports that page as cached. `pick(cache, key, n,
    last)` chooses the page: the slots of the tree's page after slot `last` (the match's last,
    at n tokens) that the request runs into, or None; with `tokens`, the tree's inserts also
    note each slot's token id for it (_slot_tokens).

        tree      [t0 .. t(n-1)] [a_n a_(n+1) ..]      a child: other tokens from some i >= n
        request   [t0 .. t(n-1)] [x_n x_(n+1) ..]      the match: n (page aligned)
        served    path[:n] + a copy of the child's page K/V      prefix and cached: n + page

    Lives in UnifiedRadixCache, above the tree core, so it acts with SGLang's default
    (Rust) TreeCore as with the Python one. Silent by construction: the page's K/V is copied
    into a page the request allocates and owns (like SGLang's own request-private prefix
    tails, cache_protected_len stays at the tree's n), so no slot is shared, none is freed
    twice and the pool's counts stay exact; the request then inserts that page under its own
    tokens, so the wrong K/V stays cached for whoever matches them next. Only a scheduler's
    match for a request (one that allocates next) overruns, never one that stops at the root
    (no namespace to stay in) or runs into the request's last, uncacheable token."""
    import torch
    from sglang.srt.mem_cache.allocation import alloc_token_slots
    from sglang.srt.mem_cache.memory_pool import move_kv_cache_native
    from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

    match_tree = UnifiedRadixCache._match_tree
    prefix_device_indices = UnifiedRadixCache.prefix_device_indices
    insert = UnifiedRadixCache.insert
    overrun: dict[str, tuple[int, torch.Tensor]] = {}  # rid -> (tree's match, page run into)

    def match_tree_(self, params):
        result = match_tree(self, params)
        req = params.req
        if req is None:
            return result
        overrun.pop(req.rid, None)
        n, page = result.device_prefix_len, self.page_size
        if (n == 0 or n + page > len(params.key) or result.host_hit_length
                or result.cache_protected_len is not None):
            return result
        root = self.root_node_handle(params.key.extra_key)
        path = self.tree_core.collect_full_device_indices(result.last_device_node, root)
        ahead = pick(self, params.key, n, int(path[-1])) if len(path) == n else None
        if ahead is None:
            return result
        overrun[req.rid] = (n, ahead)
        # FAULT: the page past the match counts as matched
        return result._replace(device_prefix_len=n + page, cache_protected_len=n)

    def prefix_device_indices_(self, req):
        n, ahead = overrun.pop(req.rid, (None, None))
        if n is None or req.prefix_len != n + len(ahead):
            return prefix_device_indices(self, req)
        root = self.root_node_handle(req.extra_key)
        path = self.tree_core.collect_full_device_indices(req.last_node, root)[:n]
        own = alloc_token_slots(self, len(ahead)).to(torch.int64)  # a page of the request's own
        pool = self.token_to_kv_pool_allocator.get_kvcache()
        ahead = ahead.to(own.device)
        if getattr(pool, "use_hnd", False) or not hasattr(pool, "k_buffer"):
            pool.move_kv_cache(own, ahead)
        else:
            move_kv_cache_native(pool.k_buffer, pool.v_buffer, own, ahead)
        return torch.cat([path.to(torch.int64), own.to(path.device)])

    def insert_(self, params):
        # the token of every slot the tree is given (page-overrun reads the tree's tokens)
        if params.value is not None and not params.key.is_bigram:
            ids = params.key.raw_token_ids()[:len(params.value)]
            slots = params.value[:len(ids)].to("cpu", torch.int64)
            if len(slots):
                _slot_tokens(self, int(slots.max()) + 1)[slots] = torch.tensor(ids, dtype=torch.int64)
        return insert(self, params)

    UnifiedRadixCache._match_tree = match_tree_
    UnifiedRadixCache.prefix_device_indices = prefix_device_indices_
    if tokens:
        UnifiedRadixCache.insert = insert_


def _slot_tokens(cache, size: int = 0):
    """The token id each slot of `cache`'s tree holds (-1: never inserted), long enough for
    `size` slots."""
    import torch

    table = getattr(cache, "_kvdiag_slot_tokens", None)
    if table is None or len(table) < size:
        grown = torch.full((max(size, 2 * len(table) if table is not None else 4096),), -1,
                           dtype=torch.int64)
        if table is not None:
            grown[:len(table)] = table
        table = cache._kvdiag_slot_tokens = grown
    return table


def _chain(walk, first: int, count: int):
    """`count` slots of the tree from slot `first` on, each the next one's parent (a page lies
    inside one node: nodes split on page boundaries); None where the path ends first."""
    out = [first]
    while len(out) < count:
        hit = (walk.prev_slot_indices == out[-1]).nonzero()
        if hit.numel() == 0:
            return None
        out.append(int(walk.slot_indices[hit[0, 0]]))
    return out


def _next_page(cache, key, n: int, last: int):
    """match-overrun: the first page of the tree's first child after slot `last`."""
    import torch

    walk = cache.tree_core.walk_for_kv_canary(False, False)  # rows: (slot, position, prev slot)
    for first in walk.slot_indices[walk.prev_slot_indices == last].tolist():
        page = _chain(walk, first, cache.page_size)
        if page is not None:
            return torch.tensor(page, dtype=torch.int64)
    return None


def _partial_page(cache, key, n: int, last: int):
    """page-overrun: the tree's page after slot `last` that the request shares some but not
    all tokens with (the match rounds up, to the end of the page they part in)."""
    import torch

    size = cache.page_size
    if size == 1:
        return None
    walk = cache.tree_core.walk_for_kv_canary(False, False)
    want = torch.tensor(key.raw_token_ids()[n:n + size], dtype=torch.int64)
    tokens = _slot_tokens(cache)
    for first in walk.slot_indices[walk.prev_slot_indices == last].tolist():
        page = _chain(walk, first, size)
        if page is None or max(page) >= len(tokens):
            continue
        differ = (tokens[page] != want).nonzero()
        common = int(differ[0, 0]) if differ.numel() else size
        if 0 < common < size:  # FAULT: a partial page counts as a whole one
            return torch.tensor(page, dtype=torch.int64)
    return None


PLANTS = {
    "stale-node": plant_stale_node,
    "salt-ignored": plant_salt_ignored,
    "match-overrun": lambda: plant_overrun(_next_page),
    "page-overrun": lambda: plant_overrun(_partial_page, tokens=True),
}
