"""The allocator contract: a registry that names allocators without importing them (or
torch), a guard that wraps only a prefix-caching allocator, and allocators that leave the
backend's caches alone."""

from __future__ import annotations

import subprocess
import sys

import pytest

from reference_engine import allocators
from reference_engine.allocators.base import MatchResult, NoFreeBlocks, PrefixCachingAllocator
from reference_engine.errors import UnknownAllocatorError
from reference_engine.sequence import Sequence

pytestmark = pytest.mark.e2e  # starts a server, a CLI subprocess or a browser


def test_registry_validates_names_without_importing_torch():
    code = (
        "import sys\n"
        "from reference_engine import allocators\n"
        "names = allocators.available()\n"
        "for n in names + ['guarded:' + n for n in names if not n.startswith('guarded')]:\n"
        "    allocators.canonical_name(n)\n"
        "try:\n"
        "    allocators.canonical_name('nosuch')\n"
        "except Exception as e:\n"
        "    print(type(e).__name__)\n"
        "print(len(names), 'torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    error, last = out.stdout.splitlines()
    assert error == "UnknownAllocatorError"
    count, torch_loaded = last.split()
    assert int(count) >= 7 and torch_loaded == "False"


def test_every_listed_name_creates_the_allocator_it_names():
    for name in allocators.available():
        alloc = allocators.create(name, num_blocks=8, block_size=4)
        assert alloc.name == allocators.canonical_name(name)
        assert alloc.num_blocks == 8 and alloc.num_free_blocks == 8
        alloc.check_integrity()

def test_one_table_names_every_allocator_class():
    """Every concrete allocator class in the package is reachable by the one name table."""
    import importlib
    import inspect
    import pkgutil

    from reference_engine.allocators.base import BlockAllocator

    named = {type(allocators.create(n, 8, 4)) for n in allocators.ALLOCATORS}
    for mod in pkgutil.iter_modules(allocators.__path__):
        module = importlib.import_module(f"reference_engine.allocators.{mod.name}")
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if issubclass(cls, BlockAllocator) and not inspect.isabstract(cls) \
                    and cls.__module__ == module.__name__:
                assert cls in named, f"{cls.__name__} is not in allocators.ALLOCATORS"


def test_guard_refuses_an_allocator_without_a_prefix_cache_table():
    from reference_engine.allocators.guard import SequenceGuard

    guarded = allocators.create("guarded", num_blocks=8, block_size=4)
    with pytest.raises(TypeError, match="SequenceGuard is not one"):
        SequenceGuard(guarded)
    assert isinstance(guarded.inner, PrefixCachingAllocator)
    with pytest.raises(UnknownAllocatorError, match="already guarded"):
        allocators.canonical_name("guarded:guarded")
    with pytest.raises(UnknownAllocatorError, match="already guarded"):
        allocators.create("guarded:guarded:buggy", num_blocks=8, block_size=4)


def test_refused_allocate_changes_nothing_in_the_stale_hash_allocator():
    alloc = allocators.create("stale-hash", num_blocks=4, block_size=4)
    first = Sequence([1, 2, 3, 4, 5, 6], max_tokens=1)
    alloc.allocate(first, alloc.lookup(first))
    first.num_computed_tokens = 6
    alloc.cache_full_blocks(first, 6)
    alloc.free(first)  # stopped mid-block: its tail is remembered
    tails = set(alloc.partial_tails)
    assert tails
    big = Sequence([1, 2, 3, 4] + list(range(10, 30)), max_tokens=1)  # continues it, too big
    match = alloc.lookup(big)
    assert match.block_ids and not alloc.can_allocate(big, match)
    free_before = list(alloc.free_block_ids)
    with pytest.raises(NoFreeBlocks):
        alloc.allocate(big, match)
    assert alloc.partial_tails == tails and list(alloc.free_block_ids) == free_before
    assert big.block_table == []


def test_a_sequence_keeps_tokens_table_and_counters_only():
    """nano-vllm's rule: the attention backend's per-sequence state lives in the backend,
    keyed by seq_id, and no allocator hangs anything of its own on a sequence."""
    seq = Sequence(list(range(1, 10)), max_tokens=1)
    fields = set(vars(seq))
    assert not fields & {"slot_cache", "foreign_seen", "unwritten_seen", "attention"}
    for name in allocators.ALLOCATORS:
        alloc = allocators.create(name, num_blocks=8, block_size=4)
        alloc.allocate(seq, MatchResult([], 0))
        alloc.cache_full_blocks(seq, seq.num_tokens)
        alloc.free(seq)
        assert set(vars(seq)) == fields, name
