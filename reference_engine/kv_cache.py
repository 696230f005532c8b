"""Physical K/V storage, the slot mapping, and the provenance ledger.

Physical layout, per layer (one extra "null" block at the end is always zero and is never
handed out; padded gathers point at it):

    k[layer]: [num_blocks + 1, block_size, num_kv_heads, head_dim]

A slot is `block_id * block_size + offset`. Token i of a sequence lives at

    slot(i) = block_table[i // block_size] * block_size + i % block_size

    block_table = [7, 2, 9]       block_size = 4, 10 tokens
    positions     0 1 2 3 | 4 5 6 7 | 8 9 . .
    slots        28 ... 31| 8 ... 11|36 37 38 39   <- 38, 39: allocated, unwritten

The provenance ledger keeps, per slot, the fingerprint of the token prefix whose K/V the
writer stored there (UNWRITTEN after allocation). A reader whose own prefix fingerprint at
that position differs has read a foreign slot.
"""

from __future__ import annotations

import numpy as np
import torch

from reference_engine.provenance import UNWRITTEN


class PagedKVCache:
    """K/V tensors of every layer plus the provenance ledger, on one device."""

    def __init__(self, *, num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int,
                 head_dim: int, dtype: torch.dtype, device: str) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.null_block = num_blocks  # the extra block: zero, never allocated
        shape = (num_blocks + 1, block_size, num_kv_heads, head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        # Ledger on the CPU: it is bookkeeping, read with numpy indices.
        self.ledger = np.zeros((num_blocks + 1) * block_size, dtype=np.int64)

    def flat_k(self, layer: int) -> torch.Tensor:
        return self.k[layer].view(-1, *self.k[layer].shape[2:])  # [slots, kvh, d]

    def flat_v(self, layer: int) -> torch.Tensor:
        return self.v[layer].view(-1, *self.v[layer].shape[2:])

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """k, v: [N, kvh, d] for the N tokens of this step; slots: [N]."""
        self.flat_k(layer).index_copy_(0, slots, k)
        self.flat_v(layer).index_copy_(0, slots, v)

    def prepare_new_blocks(self, block_ids: list[int], recycled: list[int], zero: bool,
                           recycled_fill: float | None) -> None:
        """A block handed out for new K/V: mark its slots unwritten; a recycled block first
        takes `recycled_fill` (another tenant's bytes), then zero if the allocator asks."""
        if not block_ids:
            return
        bs = self.block_size
        for b in block_ids:
            self.ledger[b * bs:(b + 1) * bs] = UNWRITTEN
        if recycled and recycled_fill is not None:
            idx = torch.tensor(recycled, device=self.k[0].device)
            for t in (*self.k, *self.v):
                t.index_fill_(0, idx, recycled_fill)
        if zero:
            idx = torch.tensor(block_ids, device=self.k[0].device)
            for t in (*self.k, *self.v):
                t.index_fill_(0, idx, 0.0)

    def record(self, slots: np.ndarray, fingerprints: np.ndarray) -> None:
        self.ledger[slots] = fingerprints
