"""The contract every block allocator keeps. The scheduler talks to allocators only through
this interface, so it never knows which one it runs (correct, faulty or guarded)."""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from array import array
from typing import ClassVar, NamedTuple

from reference_engine.sequence import Sequence


class MatchResult(NamedTuple):
    """The longest cached prefix of a sequence: its blocks and how many tokens they hold."""

    block_ids: list[int]
    num_cached_tokens: int


class AllocateResult(NamedTuple):
    """Blocks handed out for new K/V; `recycled` are those that had an owner before."""

    new_block_ids: list[int]
    recycled: list[int]


class NoFreeBlocks(Exception):
    """Raised by allocate/append_block when the pool cannot serve the request right now."""


def block_hash(parent: bytes | None, token_ids, extra_keys: tuple) -> bytes:
    """sha256 over the parent hash, the block's token ids and its extra keys."""
    h = hashlib.sha256(parent or b"\0")
    h.update(array("q", token_ids).tobytes())
    if extra_keys:
        h.update(repr(extra_keys).encode())
    return h.digest()


class BlockAllocator(ABC):
    """A pool of `num_blocks` KV blocks shared by all running sequences.

    Contract:
    - `lookup(seq)` returns the longest run of leading full blocks of `seq.token_ids` that the
      prefix cache holds (never all tokens: at least one is left to compute). It takes no
      reference: only `allocate` does.
    - `allocate(seq, match)` takes a reference on every matched block and gives `seq` new blocks
      for the rest of its tokens, setting `seq.block_table`; it raises NoFreeBlocks, changing
      nothing (neither the pool nor any bookkeeping of its own), when the pool cannot serve it.
    - `append_block(seq)` gives a decoding sequence one more block.
    - `cache_full_blocks(seq, num_tokens)` registers the blocks that the first `num_tokens`
      tokens fill (K/V written) under their chained hashes.
    - `free(seq)` drops the sequence's references; blocks at zero references stay cached (and
      hittable) until recycled, tail blocks first.
    - `check_integrity()` raises IntegrityError (a RuntimeError), with the numbers, if an invariant is broken.

    An allocator touches only its own state and a sequence's block fields (`block_table`,
    `block_hashes`, `num_cached_blocks`); caches the backend derives from a block table are
    the backend's to invalidate.

    Two class attributes describe how the engine treats this allocator's blocks:
    `zero_new_blocks` (new K/V blocks are zeroed before use) and `attention_mask`
    ("additive": unwritten slots are never read; "multiply": the kernel reads whole blocks
    and multiplies probabilities by the mask, as in vLLM issue #35138).
    """

    name: ClassVar[str] = "base"
    zero_new_blocks: ClassVar[bool] = True
    attention_mask: ClassVar[str] = "additive"
    guarded: ClassVar[bool] = False

    def __init__(self, num_blocks: int, block_size: int, enable_caching: bool = True) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.guard_rejections = 0  # stale entries a guard caught (0 for unguarded allocators)

    # --- hashing -----------------------------------------------------------------------
    def extra_keys(self, seq: Sequence, block_index: int) -> tuple:
        """cache_salt goes into the first block only (as in vLLM); the LoRA name into all."""
        keys: tuple = ()
        if block_index == 0 and seq.cache_salt is not None:
            keys += (("salt", seq.cache_salt),)
        if seq.lora_name is not None:
            keys += (("lora", seq.lora_name),)
        return keys

    def hash_block(self, parent: bytes | None, token_ids, extra_keys: tuple) -> bytes:
        return block_hash(parent, token_ids, extra_keys)

    def compute_block_hashes(self, seq: Sequence) -> list[bytes]:
        """Extend `seq.block_hashes` to every full block of its tokens."""
        bs, hashes = self.block_size, seq.block_hashes
        for i in range(len(hashes), seq.num_tokens // bs):
            parent = hashes[i - 1] if i else None
            hashes.append(self.hash_block(parent, seq.token_ids[i * bs:(i + 1) * bs],
                                          self.extra_keys(seq, i)))
        return hashes

    # --- the interface -----------------------------------------------------------------
    @property
    @abstractmethod
    def num_free_blocks(self) -> int: ...

    @abstractmethod
    def lookup(self, seq: Sequence) -> MatchResult: ...

    @abstractmethod
    def can_allocate(self, seq: Sequence, match: MatchResult) -> bool: ...

    @abstractmethod
    def allocate(self, seq: Sequence, match: MatchResult) -> AllocateResult: ...

    @abstractmethod
    def append_block(self, seq: Sequence) -> AllocateResult: ...

    @abstractmethod
    def cache_full_blocks(self, seq: Sequence, num_tokens: int) -> None: ...

    @abstractmethod
    def free(self, seq: Sequence) -> None: ...

    @abstractmethod
    def check_integrity(self) -> None: ...

    def reset_prefix_cache(self) -> bool:
        """Forget every cached block; False when the allocator cannot right now."""
        return False

    @property
    def num_evicted(self) -> int:
        """Cached blocks recycled so far (their cached content discarded): the recycling the
        trigger needs. 0 for an allocator without a prefix cache."""
        return 0

    def usage(self) -> float:
        """Fraction of blocks held by running sequences (vLLM's kv_cache_usage_perc)."""
        return 1.0 - self.num_free_blocks / self.num_blocks


class PrefixCachingAllocator(BlockAllocator):
    """An allocator whose prefix cache is a table of chained block hash -> block id that a
    wrapper (the SequenceGuard) can audit entry by entry:

    - `cached_block_id(block_hash)` returns the block the table serves for that hash, or
      None; it takes no reference and changes nothing.
    - `drop_hash(block_hash)` removes that entry (nothing if absent), so later lookups miss
      it; the block's K/V and references are untouched.
    - `block_generation(block_id)` counts the times the block was handed out for new K/V:
      the one generation counter, which the guard reads rather than keeping its own.
    """

    @abstractmethod
    def cached_block_id(self, block_hash: bytes) -> int | None: ...

    @abstractmethod
    def drop_hash(self, block_hash: bytes) -> None: ...

    @abstractmethod
    def block_generation(self, block_id: int) -> int: ...
