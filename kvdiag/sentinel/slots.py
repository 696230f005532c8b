"""The writer of every KV slot of one engine's pool, shared by the ledgers of its KV cache
groups (kvdiag.sentinel.ledger): a hybrid model's groups share one pool and one set of
tensors, so a slot's last writer is one fact whichever group reads it."""

from __future__ import annotations

import numpy as np


class Slots:
    """The writer of every KV slot of one pool: a fingerprint and a request number per slot
    (grown on demand), shared by the ledgers of a model's KV cache groups."""

    def __init__(self) -> None:
        self.fp = np.zeros(1 << 16, dtype=np.int64)
        self.writer = np.full(1 << 16, -1, dtype=np.int64)  # index into names
        self.names: list[str] = []  # request number -> rid (about 100 bytes a request)
        self.numbers: dict[str, int] = {}
        self.fate: dict[int, str] = {}  # request number -> cancelled / finished

    def grow(self, size: int) -> None:
        if size > len(self.fp):
            n = max(size, 2 * len(self.fp))
            self.fp = np.concatenate([self.fp, np.zeros(n - len(self.fp), np.int64)])
            self.writer = np.concatenate([self.writer, np.full(n - len(self.writer), -1, np.int64)])


def stamp_of(group: int) -> int:
    """What a group's fingerprints are xor-ed with in the shared store (0 for group 0)."""
    return 0 if group == 0 else (0x9E3779B97F4A7C15 * group) & 0x7FFF_FFFF_FFFF_FFFF
