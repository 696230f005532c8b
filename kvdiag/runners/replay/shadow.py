"""The shadow content map of a model-free replay: a block manager that never touches K/V
bytes (vLLM's KVCacheManager, or ours driven without a model) still decides which slots
each request reads, so we keep, per slot, the fingerprint of the token prefix whose K/V
its last writer would have stored there (reference_engine.kv_cache's provenance ledger).

    ledger: [num_blocks * block_size] int64, UNWRITTEN after allocation
    tenant: [num_blocks] int64, the cache_salt (tenant_of) of the block's last writer

Each step writes every scheduled request's new positions, then checks every scheduled
request's whole context against its own prefix fingerprints (writes first: the K/V of a
step is stored, layer by layer, before any attention of that step reads it).
"""

from __future__ import annotations

import hashlib
import zlib
from dataclasses import dataclass

import numpy as np

from reference_engine.provenance import UNWRITTEN, Fingerprints


def namespace(lora: str | None, epoch: int = 0) -> int:
    """The fingerprint namespace of K/V written under adapter `lora` (None: the base model)
    after `epoch` weight updates (prefix-cache resets): 0 for the base model's first."""
    if not lora and not epoch:
        return 0
    return int.from_bytes(hashlib.sha256(f"{lora or ''}|{epoch}".encode()).digest()[:8], "big")


def tenant_of(cache_salt: str | None) -> int:
    return 0 if cache_salt is None else zlib.crc32(cache_salt.encode()) + 1


@dataclass
class ReadLog:
    """A request's reads over its whole life: which context positions it ever read from a
    foreign or an unwritten slot (each position counted once, as the engine counts)."""

    foreign_seen: np.ndarray | None = None
    unwritten_seen: np.ndarray | None = None
    first_foreign_step: int | None = None

    @staticmethod
    def _merge(seen: np.ndarray | None, mask: np.ndarray) -> np.ndarray:
        if seen is None or len(seen) < len(mask):
            grown = np.zeros(max(len(mask), 2 * (0 if seen is None else len(seen))), dtype=bool)
            if seen is not None:
                grown[:len(seen)] = seen
            seen = grown
        seen[:len(mask)] |= mask
        return seen

    def add(self, foreign: np.ndarray, unwritten: np.ndarray, step: int) -> tuple[int, int]:
        """OR this step's masks in; return (foreign positions, unwritten positions) so far."""
        if foreign.any():
            self.foreign_seen = self._merge(self.foreign_seen, foreign)
            if self.first_foreign_step is None:
                self.first_foreign_step = step
        if unwritten.any():
            self.unwritten_seen = self._merge(self.unwritten_seen, unwritten)
        return (0 if self.foreign_seen is None else int(self.foreign_seen.sum()),
                0 if self.unwritten_seen is None else int(self.unwritten_seen.sum()))


@dataclass
class StepItem:
    """One scheduled request's share of a step: its block table, the positions it computes
    [start, start + num_tokens), and its own prefix fingerprints."""

    block_table: list[int]
    start: int
    num_tokens: int
    fingerprints: Fingerprints
    log: ReadLog
    stats: object  # RequestStats: foreign_slots / unwritten_slots are set here
    tenant: int = 0  # tenant_of(the request's cache_salt)


class ShadowCache:
    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.block_size = block_size
        self.ledger = np.zeros(num_blocks * block_size, dtype=np.int64)
        self._offsets = np.arange(block_size, dtype=np.int64)
        self.recycled_blocks = 0  # full blocks handed out again: the recycling the trigger needs
        self.tenant = np.zeros(num_blocks, dtype=np.int64)

    def allocate(self, block_ids) -> None:
        """Blocks handed out for new K/V: nobody has written them yet."""
        if len(block_ids):
            ids = np.asarray(block_ids, dtype=np.int64)
            self.recycled_blocks += int((self.ledger[(ids + 1) * self.block_size - 1] != UNWRITTEN).sum())
            self.ledger[(ids[:, None] * self.block_size + self._offsets).ravel()] = UNWRITTEN

    def slots(self, block_table: list[int], start: int, end: int) -> np.ndarray:
        bs = self.block_size
        pos = np.arange(start, end, dtype=np.int64)
        return np.asarray(block_table, dtype=np.int64)[pos // bs] * bs + pos % bs

    def step(self, items: list[StepItem], step: int) -> None:
        for it in items:
            end = it.start + it.num_tokens
            slots = self.slots(it.block_table, it.start, end)
            self.ledger[slots] = it.fingerprints.values(it.start, end)
            self.tenant[slots // self.block_size] = it.tenant
        for it in items:
            ctx = it.start + it.num_tokens
            got = self.ledger[self.slots(it.block_table, 0, ctx)]
            unwritten = got == UNWRITTEN
            foreign = (got != it.fingerprints.values(0, ctx)) & ~unwritten
            it.stats.foreign_slots, it.stats.unwritten_slots = it.log.add(foreign, unwritten, step)

    def cross_tenant(self, block_ids: list[int], tenant: int) -> int:
        """How many of these cache hits a request of `tenant` got on blocks another tenant
        (another cache_salt) wrote: each one a leak across salts."""
        if not len(block_ids):
            return 0
        return int((self.tenant[np.asarray(block_ids, dtype=np.int64)] != tenant).sum())

    def holds(self, block_id: int, fingerprint: int) -> bool:
        """Whether the block's last slot holds K/V written after exactly this prefix."""
        return int(self.ledger[(block_id + 1) * self.block_size - 1]) == fingerprint

    def written(self, block_id: int) -> bool:
        return int(self.ledger[(block_id + 1) * self.block_size - 1]) != UNWRITTEN
