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
resolves its arguments (/server_info then reports it, and the probe plans for it).
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
)}


def check_fault(name: str | None) -> str | None:
    """The fault name, or None for none; an unknown name raises KvdiagError (exit 2)."""
    return check_name("SGLang", FAULTS, name)


def server_env(name: str | None) -> dict[str, str]:
    """The environment SGLang must start with for fault `name` to act ({} for none)."""
    return dict(FAULTS[check_fault(name)].server_env) if name else {}
