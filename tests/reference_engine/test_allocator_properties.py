"""Property test: random allocate / append / free / lookup / cache_salt traffic against the
allocators. After every operation check_integrity() holds, no block with ref_cnt > 0 is
handed out, and no hash entry points at a block recycled since it was cached."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reference_engine import allocators
from reference_engine.allocators.base import NoFreeBlocks
from reference_engine.sequence import Sequence

BS = 4
OPS = st.lists(st.tuples(st.sampled_from(["admit", "admit", "append", "append", "free", "lookup"]),
                         st.integers(0, 2**31)), min_size=250, max_size=250)


class Shadow:
    """What the test knows independently: which blocks each live sequence holds, and which
    content (block hashes) each block holds since it was last handed out."""

    def __init__(self, alloc) -> None:
        self.alloc = alloc
        self.inner = getattr(alloc, "inner", alloc)
        self.content: dict[int, set[bytes]] = {}
        self.live: list[Sequence] = []

    def held(self) -> set[int]:
        return {b for s in self.live for b in s.block_table}

    def handed_out(self, result, before: set[int]) -> None:
        reused = set(result.new_block_ids) & before
        assert not reused, f"blocks {sorted(reused)} handed out while referenced"
        for b in result.new_block_ids:
            self.content[b] = set()  # a new owner: whatever the block held is gone

    def write(self, seq: Sequence, upto: int) -> None:
        seq.num_computed_tokens = upto
        self.alloc.cache_full_blocks(seq, upto)
        hashes = self.inner.compute_block_hashes(seq)
        for i in range(upto // BS):
            self.content.setdefault(seq.block_table[i], set()).add(hashes[i])

    def check(self) -> None:
        self.alloc.check_integrity()
        for h, b in self.inner.hash_to_block_id.items():
            assert h in self.content.get(b, set()), (
                f"hash entry {h.hex()[:8]} points at block {b}, which was recycled since and "
                "no longer holds that content")


def drive(name: str, ops) -> int:
    alloc = allocators.create(name, num_blocks=24, block_size=BS)
    shadow = Shadow(alloc)
    prefixes = [[1, 2, 3, 4, 5, 6, 7, 8], [1, 2, 3, 4, 9, 9, 9, 9], [7, 7, 7, 7]]
    for op, seed in ops:
        rng = random.Random(seed)
        if op == "admit" and len(shadow.live) < 6:
            tokens = list(rng.choice(prefixes)) + [rng.randrange(10) for _ in range(rng.randrange(1, 9))]
            salt = rng.choice([None, None, "tenant-a", "tenant-b"])
            seq = Sequence(tokens, max_tokens=8, cache_salt=salt)
            match = alloc.lookup(seq)
            if alloc.can_allocate(seq, match):
                before = shadow.held()
                shadow.handed_out(alloc.allocate(seq, match), before)
                shadow.live.append(seq)
                shadow.write(seq, seq.num_tokens)
        elif op == "append" and shadow.live:
            seq = rng.choice(shadow.live)
            seq.append_token(rng.randrange(10))
            if len(seq.block_table) * BS < seq.num_tokens:
                before = shadow.held()
                try:
                    shadow.handed_out(alloc.append_block(seq), before)
                except NoFreeBlocks:
                    seq.token_ids.pop()
                    continue
            shadow.write(seq, seq.num_tokens)
        elif op == "free" and shadow.live:
            seq = shadow.live.pop(rng.randrange(len(shadow.live)))
            alloc.free(seq)
        elif op == "lookup":
            alloc.lookup(Sequence(list(rng.choice(prefixes)) + [1], max_tokens=1))
        shadow.check()
    return len(ops)


@pytest.mark.parametrize("name", ["prefix-cache", "guarded", "guarded:unchained-hash"])
def test_allocator_invariants_hold_under_random_traffic(name):
    total = []

    @settings(max_examples=45, deadline=None, suppress_health_check=list(HealthCheck))
    @given(ops=OPS)
    def run(ops):
        total.append(drive(name, ops))

    run()
    assert sum(total) >= 10_000


def test_stale_hash_fault_breaks_the_invariant():
    """The same traffic finds the stale-hash fault: check_integrity or the shadow catch it."""
    with pytest.raises((AssertionError, RuntimeError)):
        for seed in range(200):
            rng = random.Random(seed)
            drive("stale-hash", [(rng.choice(["admit", "admit", "append", "free"]), rng.randrange(2**31))
                                 for _ in range(250)])
