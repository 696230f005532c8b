"""Block allocators, registered by name so the engine takes one by name.

    prefix-cache      correct, in the manner of vLLM v1's BlockPool
    stale-hash/buggy  recycled block keeps its old hash entry on the jump path (faults.py)
    stale-bytes       recycled blocks not cleared + multiplicative mask (vLLM #35138)
    unchained-hash    block hash without its parent hash
    partial-hash      block hash without the block's last token (an off-by-one)
    key-omits[:A[-B]] block hash without slots A..B of each block (slot 0 without an argument):
                      the family partial-hash is one member of (any slot, any range)
    salt-collision    cache_salt and LoRA name folded into one untagged key
    ref-undercount    a hit on a block in use takes no reference: freed under its other reader
                      (lifecycle.py: use-after-free at an early free)
    publish-early     prompt blocks published at allocation, before they are written
                      (lifecycle.py: published before written, at a chunked prefill)
    guarded           SequenceGuard (guard.py, this project's design) around stale-hash
    guarded:NAME      SequenceGuard around any registered allocator but a guarded one

One table names every allocator and the class that implements it (ALLOCATORS, plus
ALIASES): `canonical_name` and `available` import no implementation (and so no torch or
numpy), so a suite's allocator names are validated instantly; `create` imports the class.
"""

from __future__ import annotations

import importlib

from reference_engine.errors import UnknownAllocatorError

# name -> "module:class" under reference_engine.allocators
ALLOCATORS: dict[str, str] = {
    "prefix-cache": "prefix_cache:PrefixCacheAllocator",
    "stale-hash": "faults:StaleHashAllocator",
    "stale-bytes": "faults:StaleBytesAllocator",
    "unchained-hash": "faults:UnchainedHashAllocator",
    "partial-hash": "faults:PartialHashAllocator",
    "salt-collision": "faults:SaltCollisionAllocator",
    "key-omits": "faults:KeyOmitsAllocator",
    "ref-undercount": "lifecycle:RefUndercountAllocator",
    "publish-early": "lifecycle:PublishEarlyAllocator",
    "guarded": "guard:guarded",
}
# allocators that take an optional argument after a colon (key-omits:3-5); the others take none
ARGUMENTS: dict[str, str] = {"key-omits": "the slots its key leaves out: A or A-B (0-based)"}
ALIASES: dict[str, str] = {"buggy": "stale-hash"}
GUARD_PREFIX = "guarded:"


def _is_guarded(name: str) -> bool:
    return name == "guarded" or name.startswith(GUARD_PREFIX)


def canonical_name(name: str) -> str:
    """The registered name behind `name` (aliases resolved); UnknownAllocatorError otherwise.
    Imports no implementation."""
    if name.startswith(GUARD_PREFIX):
        inner = canonical_name(name[len(GUARD_PREFIX):])
        if _is_guarded(inner):
            raise UnknownAllocatorError(f"unknown allocator {name!r}: {inner!r} is already guarded")
        return GUARD_PREFIX + inner
    base, colon, arg = name.partition(":")
    if base in ARGUMENTS:
        if colon:
            slot_range(arg)  # checked now, before any work
        return name
    name = ALIASES.get(name, name)
    if name not in ALLOCATORS:
        raise UnknownAllocatorError(
            f"unknown allocator {name!r} (known: {', '.join(available())}, or guarded:NAME)"
        )
    return name


def slot_range(arg: str) -> tuple[int, int]:
    """key-omits' argument: A or A-B, 0 <= A <= B."""
    first, _, last = arg.partition("-")
    try:
        a, b = int(first), int(last or first)
    except ValueError:
        raise UnknownAllocatorError(f"key-omits:{arg}: expected A or A-B, slot numbers") from None
    if not 0 <= a <= b:
        raise UnknownAllocatorError(f"key-omits:{arg}: expected 0 <= A <= B")
    return a, b


def available() -> list[str]:
    """Every registered name, then every alias. Imports no implementation."""
    return sorted(ALLOCATORS) + sorted(ALIASES)


def create(name: str, num_blocks: int, block_size: int, enable_caching: bool = True):
    """A new allocator by (canonical or alias) name; `guarded:NAME` wraps NAME in a SequenceGuard."""
    name = canonical_name(name)
    if name.startswith(GUARD_PREFIX):
        from reference_engine.allocators.guard import SequenceGuard

        inner = create(name[len(GUARD_PREFIX):], num_blocks, block_size, enable_caching)
        return SequenceGuard(inner)
    base, _, arg = name.partition(":")
    module, attr = ALLOCATORS[base].split(":")
    factory = getattr(importlib.import_module(f"{__name__}.{module}"), attr)
    if base in ARGUMENTS:
        return factory(num_blocks, block_size, enable_caching, slots=slot_range(arg or "0"))
    return factory(num_blocks, block_size, enable_caching)
