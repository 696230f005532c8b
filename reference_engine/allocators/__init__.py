"""Block allocators, registered by name so the engine takes one by name.

    prefix-cache      correct, in the manner of vLLM v1's BlockPool
    stale-hash/buggy  recycled block keeps its old hash entry on the jump path (faults.py)
    stale-bytes       recycled blocks not cleared + multiplicative mask (vLLM #35138)
    unchained-hash    block hash without its parent hash
    salt-collision    cache_salt and LoRA name folded into one untagged key
    guarded           SequenceGuard (guard.py, this project's design) around stale-hash
    guarded:NAME      SequenceGuard around any registered allocator but a guarded one

The names are known here, statically: `canonical_name` and `available` import no
implementation (and so no torch or numpy), so a suite's allocator names are validated
instantly. An implementation module is imported by the first `create` that needs it; its
`@register` decorators then fill the factory table.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from reference_engine.errors import UnknownAllocatorError

# name -> module (under reference_engine.allocators) whose @register defines it
_BUILTINS: dict[str, str] = {
    "prefix-cache": "prefix_cache",
    "stale-hash": "faults",
    "stale-bytes": "faults",
    "unchained-hash": "faults",
    "salt-collision": "faults",
    "guarded": "guard",
}
_ALIASES: dict[str, str] = {"buggy": "stale-hash"}
GUARD_PREFIX = "guarded:"

_REGISTRY: dict[str, Callable] = {}  # name -> factory(num_blocks, block_size, enable_caching)


def register(name: str, aliases: tuple[str, ...] = ()):
    """Class or function decorator: make `name` (and its aliases) create this allocator."""

    def wrap(factory):
        _REGISTRY[name] = factory
        for a in aliases:
            _ALIASES[a] = name
        return factory

    return wrap


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
    name = _ALIASES.get(name, name)
    if name not in _BUILTINS and name not in _REGISTRY:
        raise UnknownAllocatorError(
            f"unknown allocator {name!r} (known: {', '.join(available())}, or guarded:NAME)"
        )
    return name


def available() -> list[str]:
    """Every registered name, then every alias. Imports no implementation."""
    return sorted(set(_BUILTINS) | set(_REGISTRY)) + sorted(_ALIASES)


def create(name: str, num_blocks: int, block_size: int, enable_caching: bool = True):
    """A new allocator by (canonical or alias) name; `guarded:NAME` wraps NAME in a SequenceGuard."""
    name = canonical_name(name)
    if name.startswith(GUARD_PREFIX):
        from reference_engine.allocators.guard import SequenceGuard

        inner = create(name[len(GUARD_PREFIX):], num_blocks, block_size, enable_caching)
        return SequenceGuard(inner)
    if name not in _REGISTRY:
        importlib.import_module(f"{__name__}.{_BUILTINS[name]}")
    return _REGISTRY[name](num_blocks, block_size, enable_caching)
