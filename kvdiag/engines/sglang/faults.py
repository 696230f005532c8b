"""The faults kvdiag can plant into a real SGLang's radix cache (by
kvdiag.engines.sglang.plugin), by name, each tied to the real report it re-creates.

Data only, no SGLang import: the launcher checks a name, and sets the environment a fault
needs, before it starts anything. `server_env(name)` is that environment: `stale-node` lives
in SGLang's pure-Python TreeCore, which SGLang 0.5.23 selects with
SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND=python (its default, "rust", keeps the tree in
compiled code that no Python patch reaches). The plugin sets it too, so a planted server
started by hand works the same.
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
)}


def check_fault(name: str | None) -> str | None:
    """The fault name, or None for none; an unknown name raises KvdiagError (exit 2)."""
    return check_name("SGLang", FAULTS, name)


def server_env(name: str | None) -> dict[str, str]:
    """The environment SGLang must start with for fault `name` to act ({} for none)."""
    return dict(FAULTS[check_fault(name)].server_env) if name else {}
