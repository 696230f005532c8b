"""Block reuse rate and BRAI (block reuse anomaly index).

block_reuse_rate = blocks served from the prefix cache / blocks the prompts need, summed
over a group of requests (a round, a case). BRAI = |block_reuse_rate - expected|, where
`expected` is the rate of the guarded baseline on the same suite and case: an allocator
that hits far more (stale hashes) or far less (cache broken) than the guard is suspect.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import TYPE_CHECKING

from kvdiag.metrics.base import Metric, register

if TYPE_CHECKING:
    from pandas import DataFrame



def block_reuse_rate(blocks_hit: Iterable[int], blocks_needed: Iterable[int]) -> float:
    """sum(blocks_hit) / sum(blocks_needed); 0.0 when no prompt needed a full block.

    A prompt shorter than one block needs no block that could be cached, so there is
    nothing to reuse: the rate is 0, not undefined.
    """
    hit, needed = sum(int(h) for h in blocks_hit), sum(int(n) for n in blocks_needed)
    if hit < 0 or needed < 0 or hit > needed:
        raise ValueError(f"blocks_hit={hit} must lie in [0, blocks_needed={needed}]")
    return hit / needed if needed else 0.0


def brai(rate: float, expected: float | None) -> float:
    """|rate - expected|; NaN when no expected rate is known."""
    if expected is None or math.isnan(expected) or math.isnan(rate):
        return math.nan
    return abs(rate - expected)


@register
class BlockReuseRate(Metric):
    name = "block_reuse_rate"
    columns = ("blocks_hit", "blocks_needed")

    def compute(self, rows: DataFrame) -> float:
        return block_reuse_rate(rows["blocks_hit"], rows["blocks_needed"])
