"""How a plant patches the vLLM of this process and puts it back: every plant is built from
these, so every plant's undo() restores exactly what it replaced, and undoing one that was
patched over since raises RuntimeError."""

from __future__ import annotations

import sys
from collections.abc import Callable

from kvdiag.engines.patching import Undo, both, swap_attr

__all__ = ["Undo", "both", "swap_attr", "swap_function", "wrap_extra_keys", "wrap_hash",
           "rehash_shared"]


def swap_function(module, name: str, new) -> Undo:
    """Replace a module-level function in its module and in every module that imported it
    by name (`from ... import name`); undo also reaches modules imported since."""
    old = getattr(module, name)

    def holders(fn):
        found = []
        for m in list(sys.modules.values()):
            try:
                if vars(m).get(name) is fn:
                    found.append(m)
            except TypeError:  # None, or an object without __dict__
                continue
        return found

    for m in holders(old):
        setattr(m, name, new)

    def undo() -> None:
        if getattr(module, name) is not new:
            raise RuntimeError(f"kvdiag: {module.__name__}.{name} was patched again since; "
                               "undo plants in reverse order")
        for m in holders(new):
            setattr(m, name, old)
    return undo


def wrap_extra_keys(edit: Callable[[tuple], tuple]) -> Undo:
    """generate_block_hash_extra_keys with `edit` applied to the keys it returns."""
    import vllm.v1.core.kv_cache_utils as utils

    original = utils.generate_block_hash_extra_keys

    def generate_block_hash_extra_keys(request, start_token_idx, end_token_idx, start_mm_idx):
        keys, next_mm = original(request, start_token_idx, end_token_idx, start_mm_idx)
        if keys:
            keys = edit(keys)
        return keys or None, next_mm
    return swap_function(utils, "generate_block_hash_extra_keys", generate_block_hash_extra_keys)


def wrap_hash(edit: Callable) -> Undo:
    """hash_block_tokens replaced by edit(original, hash_fn, parent, tokens, extra_keys).
    vLLM's request block hasher looks the name up at call time, so requests (and a running
    engine's hasher) made before the plant hash with it too."""
    import vllm.v1.core.kv_cache_utils as utils

    original = utils.hash_block_tokens

    def hash_block_tokens(hash_function, parent_block_hash, curr_block_token_ids, extra_keys=None):
        return edit(original, hash_function, parent_block_hash, curr_block_token_ids, extra_keys)
    return swap_function(utils, "hash_block_tokens", hash_block_tokens)




def rehash_shared() -> Undo:
    """BlockPool.cache_full_blocks over a block another holder has already hashed at the same
    or a later position: the old hash is dropped first, as an engine without vLLM's
    partial->full assertion would overwrite it. Only a use-after-free fault makes such a block
    (two requests writing one block); with this, vLLM serves the wrong answers silently instead
    of dying on the assertion, which is what the fault's real reports describe."""
    from vllm.v1.core.block_pool import BlockPool

    original = BlockPool.cache_full_blocks

    def cache_full_blocks(self, request, blocks, num_cached_blocks, num_full_blocks, block_size,
                          *args, **kwargs):
        for i in range(num_cached_blocks, min(num_full_blocks, len(blocks))):
            blk = blocks[i]
            held = getattr(blk, "block_hash_num_tokens", None)
            if not blk.is_null and blk.block_hash is not None and (held is None or held >= (i + 1) * block_size):
                self._remove_cached_block_hashes(blk)  # FAULT: the other holder's hash overwritten
        return original(self, request, blocks, num_cached_blocks, num_full_blocks, block_size,
                        *args, **kwargs)
    return swap_attr(BlockPool, "cache_full_blocks", cache_full_blocks)
