"""Block allocators, registered by name so the engine takes one by name.

    prefix-cache      correct, in the manner of vLLM v1's BlockPool
    stale-hash/buggy  recycled block keeps its old hash entry on the jump path (faults.py)
    stale-bytes       recycled blocks not cleared + multiplicative mask (vLLM #35138)
    unchained-hash    block hash without its parent hash
    salt-collision    cache_salt and LoRA name folded into one untagged key
    guarded           SequenceGuard (guard.py, this project's design) around stale-hash
    guarded:NAME      SequenceGuard around any registered allocator
"""

from __future__ import annotations

from collections.abc import Callable

from reference_engine.errors import UnknownAllocatorError

_REGISTRY: dict[str, Callable] = {}
_ALIASES: dict[str, str] = {}


def register(name: str, aliases: tuple[str, ...] = ()):
    def wrap(factory):
        _REGISTRY[name] = factory
        for a in aliases:
            _ALIASES[a] = name
        return factory

    return wrap


def _load_builtins() -> None:
    from reference_engine.allocators import faults, guard, prefix_cache  # noqa: F401


def canonical_name(name: str) -> str:
    _load_builtins()
    if name.startswith("guarded:"):
        return "guarded:" + canonical_name(name.split(":", 1)[1])
    name = _ALIASES.get(name, name)
    if name not in _REGISTRY:
        raise UnknownAllocatorError(
            f"unknown allocator {name!r} (known: {', '.join(available())}, or guarded:NAME)"
        )
    return name


def available() -> list[str]:
    _load_builtins()
    return sorted(_REGISTRY) + sorted(_ALIASES)


def create(name: str, num_blocks: int, block_size: int, enable_caching: bool = True):
    name = canonical_name(name)
    if name.startswith("guarded:"):
        from reference_engine.allocators.guard import SequenceGuard

        inner = create(name.split(":", 1)[1], num_blocks, block_size, enable_caching)
        return SequenceGuard(inner)
    return _REGISTRY[name](num_blocks, block_size, enable_caching)
