"""The faults kvdiag can plant into a real SGLang's radix cache (by
kvdiag.engines.sglang.plugin), by name, each tied to the real report it re-creates.

Data only, no SGLang import: the launcher checks a name, and sets the environment a fault
needs, before it starts anything. `server_env(name)` is that environment: `stale-node` lives
in SGLang's pure-Python TreeCore, which SGLang 0.5.23 selects with
SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND=python (its default, "rust", keeps the tree in
compiled code that no Python patch reaches). The plugin sets it too, so a planted server
started by hand works the same. `match-overrun` and `page-overrun` act above the tree core
(either one); `page-overrun` needs pages of more than one token, and since sglang-local asks
for --page-size 1, the plugin sets SGLang's page size to PAGE_OVERRUN_SIZE before SGLang
resolves its arguments (/server_info then reports it, and the probe plans for it). The
lifecycle faults (`event` set: dedup-no-remap, abort-publish, retract-frees-prefix) act above the tree core too and
need no environment of their own.
"""

from __future__ import annotations

from kvdiag.engines.fault import (
    BREAKS_GROUND_TRUTH,
    BREAKS_ISOLATION,
    CORRUPTS_OUTPUT,
    Fault,
    check_name,
)

FAULT_ENV = "KVDIAG_SGLANG_FAULT"  # names the fault the plugin plants; unset or empty: inert
TREE_CORE_ENV = "SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND"  # SGLang's own switch: rust | python
PAGE_OVERRUN_SIZE = 16  # the page size page-overrun runs SGLang at (the plugin sets it)


FAULTS: dict[str, Fault] = {f.name: f for f in (
    Fault(
        "stale-node", "stale tree node (use-after-free)",
        "an eviction returns live tree nodes' KV pages to the allocator and the nodes keep "
        "pointing at them, so their prefixes, matched again, read another request's K/V",
        "sglang/srt/mem_cache/unified_cache/components/full.py:FullComponent.evict_component",
        ("SGLang #38319 / PR #38355 (a radix node kept KV pages freed by retract/abort and "
         "handed out again; impossible first tokens until /flush_cache)",),
        (CORRUPTS_OUTPUT,),
        "pool pressure that evicts tree nodes while their prefixes are matched again",
        live="probe", server_env={TREE_CORE_ENV: "python"}),
    Fault(
        "salt-ignored", "isolation: extra key dropped",
        "cache_salt and extra_key are left out of the radix key, so requests with different "
        "salts share prefix pages",
        "sglang/srt/mem_cache/radix_cache.py:RadixKey.__init__",
        ("SGLang's per-request cache_salt / extra_key namespaces (RadixKey.child_key): the "
         "isolation this fault removes",),
        (BREAKS_ISOLATION, BREAKS_GROUND_TRUTH),
        "two salts on the same prompt, and a check that a salted (isolated) request reports "
        "0 cached tokens", live="isolation"),
    Fault(
        "match-overrun", "prefix match past the divergence",
        "a prefix match runs one page (one token at page size 1) past where the request parts "
        "from the tree: the request is served the K/V the tree holds there for other tokens, "
        "and reports it as cached",
        "sglang/srt/mem_cache/unified_radix_cache.py:UnifiedRadixCache._match_tree",
        ("SGLang PR #28692 (MambaRadixCache matched a limited key against a child past the "
         "key's end: page alignment missing before the lookup)",
         "SGLang PR #35635 (partial-page reuse copies matched K/V into request-private slots "
         "past the tree's match: the path this fault takes too far)"),
        (CORRUPTS_OUTPUT,),
        "pairs of prompts identical up to one token, the second sent after the first "
        "(the probe's differential phase), held against the over-hit oracle"),
    Fault(
        "page-overrun", "partial page matched whole",
        f"SGLang runs at page size {PAGE_OVERRUN_SIZE}, and a match rounds the common prefix up "
        "to the end of the page the request parts from the tree in: the rest of that page's "
        "K/V, computed for other tokens, is served and reported as cached",
        "sglang/srt/mem_cache/unified_radix_cache.py:UnifiedRadixCache._match_tree",
        ("Mooncake PR #4164 / issue #4153 (a prefix index counted SGLang's partial final "
         "block as matched: ceil(n / block) * block tokens for an n-token prompt)",
         "SGLang PR #35635 (partial-page reuse copies only the matched part of a page into a "
         "request-private page: this fault copies the whole page)"),
        (CORRUPTS_OUTPUT,),
        "pairs of prompts that part inside a page, the second sent after the first (the "
        "differential phase's slot, range and swap pairs), held against the over-hit oracle"),
    Fault(
        "dedup-no-remap", "dedup without remap (use-after-free)",
        "when a running request's KV goes into the tree and another request prefilled the same "
        "prefix at the same time, its duplicate pages are freed but its req_to_token row keeps "
        "pointing at them: its decode reads pages handed out again",
        "sglang/srt/mem_cache/unified_radix_cache.py:UnifiedRadixCache.checkpoint_into_tree",
        ("mini-sglang PR #142 (cache_req freed an unfinished request's duplicate prefix pages "
         "while its page_table still pointed at them: later decode steps read reused pages)",
         "SGLang PR #29282 (closed; UnifiedRadixCache's unfinished insert freed duplicates its "
         "follow-up match rejected, so the row and the tree disagreed on whose pages those were)"),
        (CORRUPTS_OUTPUT,),
        "several requests with one long uncached prefix and distinct suffixes prefilled in one "
        "batch (at once, under one cache_salt), decoding while new prefills take the freed pages",
        event="concurrent-prefill"),
    Fault(
        "abort-publish", "published before written (cancel mid-prefill)",
        "a request cancelled in the middle of its chunked prefill publishes its whole prompt to "
        "the tree, the part never prefilled on pages nobody wrote: the next request with that "
        "prefix is served their stale K/V as cached",
        "sglang/srt/managers/scheduler.py:Scheduler.process_pending_chunked_abort",
        ("SGLang PR #28374 (closed: aborted requests' KV, not complete or valid, inserted into "
         "the radix cache, so later requests with the same prefix reuse it and answer wrong)",
         "SGLang #38319 / PR #38355 (chunked-prefill inserts mid-prefill and a retract or abort "
         "before prefill completes left the tree holding pages it must not: corrupt prefix "
         "until /flush_cache)"),
        (CORRUPTS_OUTPUT,),
        "a prompt several prefill chunks long, cancelled by its client in mid-prefill, then the "
        "same prefix asked again (same cache_salt) and held against an isolated twin",
        event="cancel-prefill"),
    Fault(
        "retract-frees-prefix", "retraction frees the tree's prefix (use-after-free)",
        "a request retracted for memory frees as many pages as it owns, but counted from its "
        "row's start: the tree's prefix pages go back to the allocator while its nodes keep "
        "mapping them, so the next match of that prefix reads pages handed out again",
        "sglang/srt/mem_cache/common.py:release_kv_cache (from ScheduleBatch.retract_decode)",
        ("SGLang #38319 / PR #38355 (a radix node kept KV pages freed by retract/abort and "
         "handed out again; impossible first tokens until /flush_cache)",),
        (CORRUPTS_OUTPUT,),
        "decodes that outgrow the pool, so SGLang retracts requests whose prompts the tree "
        "holds, then the same prefixes matched again",
        event="preemption"),
)}


def check_fault(name: str | None) -> str | None:
    """The fault name, or None for none; an unknown name raises KvdiagError (exit 2)."""
    return check_name("SGLang", FAULTS, name)


def server_env(name: str | None) -> dict[str, str]:
    """The environment SGLang must start with for fault `name` to act ({} for none)."""
    return dict(FAULTS[check_fault(name)].server_env) if name else {}
