"""The faults kvdiag can plant into a real vLLM (by kvdiag.engines.vllm.plugin), by name.
No vLLM import here: the launcher checks names before it starts anything."""

from __future__ import annotations

from kvdiag.errors import KvdiagError

FAULT_ENV = "KVDIAG_VLLM_FAULT"  # names the fault the plugin plants; unset or empty: inert

FAULTS = {
    "stale-hash": "a recycled block's old hash entry is not evicted "
                  "(BlockPool._maybe_evict_cached_block), so the stale entry stays hittable",
    "salt-ignored": "cache_salt is left out of the block hash "
                    "(kv_cache_utils.generate_block_hash_extra_keys), so salts share blocks",
}


def check_fault(name: str | None) -> str | None:
    """The fault name, or None for none; an unknown name raises KvdiagError (exit 2)."""
    if not name:
        return None
    if name not in FAULTS:
        raise KvdiagError(f"unknown vLLM fault {name!r} (known: {', '.join(FAULTS)})")
    return name
