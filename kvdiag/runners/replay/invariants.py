"""Invariants of vLLM's BlockPool, checked after every replayed step. vLLM has no
check_integrity(); these are this project's, modelled on the invariants reference_engine's
allocators check (prefix_cache.py) but not the same code nor the same list: the checks of
ref counts against running requests and of the shadow map exist only here, and the
allocators' generation check has no counterpart in vLLM's state. Applied to vLLM's state:

- free + used == total (block 0, vLLM's null block, aside); no negative ref count
- every block's ref_cnt equals the number of running requests whose block table holds it
- the free queue holds exactly the blocks at ref_cnt 0
- every hash entry points at a block that still carries that hash
- every hash entry points at a block whose content (shadow map) is the prefix the hash
  names: the stale-entry class (nano-vllm's "fix cache hit", `_maybe_evict_cached_block`)

Each breach is reported once (the first step it is seen), with the request that last wrote
the block; `count` is the number of distinct breaches.
"""

from __future__ import annotations

from collections import Counter

from reference_engine.util import cdiv


class Invariants:
    MAX_MESSAGES = 50

    def __init__(self, pool, shadow) -> None:
        from vllm.v1.core.kv_cache_utils import get_block_hash

        self.pool, self.shadow = pool, shadow
        self._raw_hash = get_block_hash  # BlockHashWithGroupId -> the chained block hash
        self.messages: list[str] = []
        self.count = 0
        self.hash_fp: dict[bytes, int] = {}  # block hash -> fingerprint of the prefix it names
        self.writer: dict[int, str] = {}  # block id -> label of the request that last wrote it
        self._seen: set = set()

    def add(self, step: int, message: str, key=None) -> None:
        key = key if key is not None else message
        if key in self._seen:
            return
        self._seen.add(key)
        self.count += 1
        if len(self.messages) < self.MAX_MESSAGES:
            self.messages.append(f"step {step}: {message}")

    # --- what the audit learns as the replay runs -----------------------------------------
    def wrote(self, table: list[int], start: int, num_tokens: int, label: str) -> None:
        bs = self.shadow.block_size
        for b in table[start // bs:cdiv(start + num_tokens, bs)]:
            self.writer[b] = label

    def learn_hashes(self, turn) -> None:
        """Remember, for each new full-block hash of the request, the fingerprint of the
        prefix it names (its last position's)."""
        hashes, bs = turn.request.block_hashes, self.shadow.block_size
        values = turn.fingerprints.values()
        for i in range(turn.hashed_blocks, min(len(hashes), len(values) // bs)):
            self.hash_fp.setdefault(bytes(hashes[i]), int(values[(i + 1) * bs - 1]))
            turn.hashed_blocks = i + 1

    def forget(self) -> None:
        """After a prefix-cache reset: every hash -> prefix learned so far named K/V of the
        old weights; what the hashes name from now on is learned anew."""
        self.hash_fp.clear()

    # --- the checks ------------------------------------------------------------------
    def check(self, step: int, tables: list[list[int]]) -> None:
        """tables: the block table of every running request."""
        pool = self.pool
        held = Counter()
        for table in tables:
            held.update(table)
        num_free = 0
        for blk in pool.blocks:
            if blk.is_null:
                continue
            if blk.ref_cnt < 0:
                self.add(step, f"block {blk.block_id} has ref_cnt {blk.ref_cnt}", ("neg", blk.block_id))
            if blk.ref_cnt != held.get(blk.block_id, 0):
                self.add(step, f"block {blk.block_id}: ref_cnt {blk.ref_cnt} but "
                         f"{held.get(blk.block_id, 0)} running request(s) hold it",
                         ("ref", blk.block_id, blk.ref_cnt))
            num_free += blk.ref_cnt == 0
        queued = pool.free_block_queue.num_free_blocks
        if queued != num_free:
            self.add(step, f"free queue holds {queued} blocks, {num_free} have ref_cnt 0 "
                     f"(total {len(pool.blocks) - 1})", ("free", queued, num_free))
        extra = getattr(pool, "cached_block_hashes_by_block", {})  # 0.33: more hashes a block
        for key, value in pool.cached_block_hash_to_block._cache.items():
            for blk in (value.values() if isinstance(value, dict) else (value,)):
                self._check_entry(step, key, blk, extra)

    def _check_entry(self, step: int, key, blk, extra) -> None:
        raw = bytes(self._raw_hash(key))
        if blk.block_hash != key and key not in extra.get(blk.block_id, ()):
            self.add(step, f"hash entry {raw.hex()[:12]} points at block {blk.block_id}, which no "
                     f"longer carries that hash", ("carry", raw, blk.block_id))
        fp = self.hash_fp.get(raw)
        if fp is not None and self.shadow.written(blk.block_id) and not self.shadow.holds(blk.block_id, fp):
            self.add(step, f"hash entry {raw.hex()[:12]} points at block {blk.block_id}, which "
                     f"holds other content (last written by {self.writer.get(blk.block_id, '?')})",
                     ("content", raw, blk.block_id))


def assertion_site(error: AssertionError) -> str:
    """Where in vLLM an assertion fired: "function (file:line)"."""
    where = error.__traceback__
    while where.tb_next is not None:
        where = where.tb_next
    code = where.tb_frame.f_code
    return f"{code.co_name} ({code.co_filename.rsplit('/', 1)[-1]}:{where.tb_lineno})"
