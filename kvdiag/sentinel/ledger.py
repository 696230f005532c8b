"""The sentinel's ledger: which prefix wrote every KV slot of a live engine, checked on every
read. Engine-agnostic; an adapter (engines/vllm/sentinel.py, reference.py) turns one step into
`Scheduled` items, each what the workers are told about one request (its block table, the
positions already computed, those this step computes) plus the request's own token ids.

The ledger then does what a forward pass does, writes first, then reads:

    write  the slots of positions [computed, computed + new) take the fingerprint of the
           request's prefix at each position (reference_engine.provenance). A write into a
           block another live request maps, over a position that request has computed with
           another prefix, is an `overwrite` finding.
    read   the slots of positions [0, computed + new) are compared with the request's own
           fingerprints: another prefix's is `foreign`; a slot no forward pass wrote since
           the server started (or since the engine reported its prefix cache reset, or the
           workers zeroed it) is `unwritten`.

    table [7, 2]  block_size 4   computed 5, new 1 (a decode step)
    positions  0 1 2 3 | 4 5       slot(i) = table[i // 4] * 4 + i % 4
    slots     28 .. 31 | 8 9       write slot 9 (position 5), then read slots 28..31, 8, 9

It never reads the engine's block hashes, its pool or its free lists: those are the code
under test. What it trusts: that the workers write where the scheduler told them to.

A position is reported once per request (the first step it read it wrong); counters say how
much was checked, so a sentinel that saw nothing is told apart from one that found nothing.

A model with more than one KV cache group (vLLM's hybrid models: sliding-window layers beside
full attention) gets a ledger per group over one `Slots` store, as its groups share one pool
and one set of tensors (a block is one group's at a time, and holds that group's layers' K/V):

    full     = Ledger(16, report, slots=store, group=0)
    sliding  = Ledger(16, report, slots=store, group=1, window=32)

A group's writes are stamped with its number, so a block read in one group where another
group last wrote it is foreign. A sliding-window group reads only the window of the positions
a step computes ([computed - window + 1, end)): the blocks before it are freed by design (a
null block or a stale id in the table), and no write into them is judged.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np

from kvdiag.sentinel.facts import Counters, Finding, Scheduled, ranges
from kvdiag.sentinel.slots import Slots, stamp_of
from reference_engine.provenance import UNWRITTEN, Fingerprints

RESET = "written before a prefix-cache reset"  # the writer's fate in an unwritten read's finding


class _Request:
    __slots__ = ("number", "fps", "table", "slots", "where", "computed", "reported")

    def __init__(self, number: int) -> None:
        self.number = number
        self.fps: Fingerprints | None = None
        self.table: list[int] = []
        self.slots = np.empty(0, dtype=np.int64)
        self.where: dict[int, int] = {}  # block id -> its index in the table
        self.computed = 0  # positions whose K/V this request has written or hit
        self.reported: np.ndarray | None = None  # bool per position, already in a finding


class Ledger:
    """The writer of every slot, and the check of every read. `report(finding)` is called for
    each finding as it is made. `overwrites`: also check writes into blocks other live
    requests map (an engine that remaps a running request's table to other slots, as SGLang
    does when it frees a request's duplicate of a cached prefix, passes False: there a
    write into a slot the request no longer reads is no harm, and only reads are judged).
    `slots`, `group`, `window`: one KV cache group of several (above); a window turns the
    overwrite check off."""

    def __init__(self, block_size: int, report=lambda finding: None, overwrites: bool = True,
                 slots: Slots | None = None, group: int = 0, window: int | None = None) -> None:
        self.block_size = block_size
        self.report = report
        self.overwrites = overwrites and not window
        self.window = window
        self.stamp = stamp_of(group)
        self.counters = Counters()
        self.resets = 0  # prefix-cache resets followed (reset())
        self.store = slots if slots is not None else Slots()
        self.names, self.numbers, self.fate = self.store.names, self.store.numbers, self.store.fate
        self.live: dict[str, _Request] = {}
        self.holders: dict[int, set[str]] = {}  # block id -> live requests that map it
        self.bad_now: dict[str, np.ndarray] = {}  # rid -> positions this step read wrong (all)

    # --- lifecycle of requests ------------------------------------------------------------
    def _request(self, rid: str) -> _Request:
        req = self.live.get(rid)
        if req is None:  # new, or back after it left (SGLang's overlapped last step)
            number = self.numbers.get(rid)
            if number is None:
                number = self.numbers[rid] = len(self.names)
                self.names.append(rid)
                self.counters.requests += 1  # by the group that saw it first
            req = self.live[rid] = _Request(number)
        return req

    def finish(self, rid: str, cancelled: bool = False) -> None:
        """The request left the engine (its blocks are the pool's again)."""
        req = self.live.pop(rid, None)
        if req is None:
            return
        self._map(rid, req, [])
        self.fate[req.number] = "cancelled" if cancelled else "finished"

    def preempt(self, rid: str) -> None:
        """The request lost its blocks and waits to compute again: it maps nothing, has
        computed nothing, and keeps what was reported."""
        req = self.live.get(rid)
        if req is not None:
            self._map(rid, req, [])
            req.computed = 0

    def table_of(self, rid: str) -> list[int]:
        req = self.live.get(rid)
        return list(req.table) if req is not None else []

    def zero(self, block: int) -> None:
        """The workers zero `block` before the forward pass: its slots hold nobody's K/V."""
        bs = self.block_size
        self._grow((block + 1) * bs)
        self.store.fp[block * bs:(block + 1) * bs] = UNWRITTEN
        self.store.writer[block * bs:(block + 1) * bs] = -1
        self.counters.zeroed += 1

    def reset(self) -> None:
        """The engine reports its prefix cache reset, which it does only with no block in use
        (vLLM, SGLang and the reference engine refuse otherwise): K/V written before it may
        never be served again, so every slot of this ledger's store reads as `unwritten`
        until written anew. Its writer is kept: an unwritten read of a slot that has one was
        written before a reset (a fresh or zeroed slot has none). The ledger may still count
        as live a request whose finish only the next step tells; nothing of it is kept."""
        self.store.fp[:] = UNWRITTEN
        self.resets += 1  # not a Counters field: llama.cpp's C++ sentinel writes those, and has none

    def copy(self, src: int, dst: int) -> None:
        """Copy-on-write: the workers copy block `src` into `dst` before the forward pass."""
        bs = self.block_size
        self._grow((max(src, dst) + 1) * bs)
        for a in (self.store.fp, self.store.writer):
            a[dst * bs:(dst + 1) * bs] = a[src * bs:(src + 1) * bs]
        self.counters.copies += 1

    def _map(self, rid: str, req: _Request, table: Sequence[int]) -> None:
        """Point the request at `table`, keeping block -> holders in step. A table that only
        grew (a decode step, the next prefill chunk) costs only its new blocks."""
        table = list(table)
        n = len(req.table)
        if table == req.table:
            return
        bs = self.block_size
        if len(table) > n and table[:n] == req.table:
            added = table[n:]
            for i, b in enumerate(added, n):
                self.holders.setdefault(b, set()).add(rid)
                req.where[b] = i
            tail = (np.asarray(added, dtype=np.int64)[:, None] * bs + np.arange(bs)).ravel()
            req.slots = np.concatenate([req.slots, tail])
            req.table = table
            self._grow(int(tail.max()) + 1)
            return
        old, new = set(req.table), set(table)
        for b in old - new:
            held = self.holders.get(b)
            if held is not None:
                held.discard(rid)
                if not held:
                    del self.holders[b]
        for b in new - old:
            self.holders.setdefault(b, set()).add(rid)
        req.table = table
        req.where = {b: i for i, b in enumerate(table)}
        req.slots = (np.asarray(table, dtype=np.int64)[:, None] * bs + np.arange(bs)).ravel()
        self._grow(int(req.slots.max()) + 1 if len(req.slots) else 0)

    def _grow(self, size: int) -> None:
        self.store.grow(size)

    # --- one step -------------------------------------------------------------------------
    def step(self, items: list[Scheduled]) -> None:
        """One scheduling step: every item's writes, then every item's reads."""
        t0 = time.perf_counter()
        try:
            self._step(items)
        finally:
            self.counters.seconds += time.perf_counter() - t0

    def _step(self, items: list[Scheduled]) -> None:
        self.counters.steps += 1
        self.bad_now = {}
        ready = []
        for item in items:
            req = self._request(item.rid)
            end = item.computed + item.new
            if len(item.tokens) < end or len(item.table) * self.block_size < end:
                self.counters.unchecked += 1
                self._map(item.rid, req, item.table)
                continue
            self._map(item.rid, req, item.table)
            self._extend(req, item, end)
            ready.append((item, req, end))
        for item, req, end in ready:
            self._write(item, req, end)
        for item, req, end in ready:
            self._read(item, req, end)

    def _extend(self, req: _Request, item: Scheduled, end: int) -> None:
        if req.fps is None:
            req.fps = Fingerprints(list(item.tokens[:end]), item.namespace)
        for i in range(len(req.fps), end):
            req.fps.append(int(item.tokens[i]))

    def _write(self, item: Scheduled, req: _Request, end: int) -> None:
        start = item.computed
        if end <= start:
            return
        slots, values = req.slots[start:end], req.fps.values(start, end)
        if self.overwrites:
            self._check_overwrite(item, slots, values)
        self.store.fp[slots] = values ^ self.stamp if self.stamp else values
        self.store.writer[slots] = req.number
        req.computed = end
        self.counters.writes += end - start

    def _check_overwrite(self, item: Scheduled, slots: np.ndarray, values: np.ndarray) -> None:
        """Another live request maps a block this write lands in, at a position it has
        already computed, with another prefix there: its K/V is gone under it. One finding
        per request overwritten."""
        bs = self.block_size
        blocks = slots // bs
        hit: dict[str, list[np.ndarray]] = {}
        for b in np.unique(blocks).tolist():
            for other in self.holders.get(b, ()):
                if other == item.rid:
                    continue
                o = self.live[other]
                here = blocks == b
                pos = o.where[b] * bs + (slots[here] % bs)
                done = pos < min(o.computed, len(o.fps) if o.fps is not None else 0)
                if not done.any():
                    continue
                differs = o.fps.values()[pos[done]] != values[here][done]
                if differs.any():
                    hit.setdefault(other, []).append(pos[done][differs])
        for other, parts in hit.items():
            self._found("overwrite", other, np.sort(np.concatenate(parts)), self.live[other].computed,
                        [item.rid], item.context, [self._fate(self.live[item.rid].number)])

    def _read(self, item: Scheduled, req: _Request, end: int) -> None:
        # a window reads what the step's first query sees and after; full attention all of it
        start = max(0, item.computed - self.window + 1) if self.window else 0
        got = self.store.fp[req.slots[start:end]]
        self.counters.reads += end - start
        want = req.fps.values(start, end)
        bad = got != (want ^ self.stamp if self.stamp else want)  # fingerprints are never UNWRITTEN
        if not bad.any():
            return
        self.bad_now[item.rid] = start + np.flatnonzero(bad)  # for attention leakage (leakage.py)
        if req.reported is None or len(req.reported) < end:
            grown = np.zeros(max(end, 2 * (0 if req.reported is None else len(req.reported))), bool)
            if req.reported is not None:
                grown[:len(req.reported)] = req.reported
            req.reported = grown
        bad &= ~req.reported[start:end]
        if not bad.any():
            return
        req.reported[start:end] |= bad
        unwritten = bad & (got == UNWRITTEN)
        foreign = bad & ~unwritten
        if unwritten.any():  # never written, zeroed, or written before a reset (its writer named)
            pos = start + np.flatnonzero(unwritten)
            numbers = [n for n in dict.fromkeys(self.store.writer[req.slots[pos]].tolist()) if n >= 0][:3]
            self._found("unwritten", item.rid, pos, end, [self.names[n] for n in numbers],
                        item.context, [RESET] * len(numbers))
        if foreign.any():
            pos = start + np.flatnonzero(foreign)
            numbers = list(dict.fromkeys(self.store.writer[req.slots[pos]].tolist()))[:3]
            self._found("foreign", item.rid, pos, end, [self.names[n] for n in numbers if n >= 0],
                        item.context, [self._fate(n) for n in numbers if n >= 0])

    def _fate(self, number: int) -> str:
        return self.fate.get(number, "live")

    def _found(self, kind: str, rid: str, positions: np.ndarray, context_len: int,
               writers: list[str], context: tuple[str, ...], writer_context: list[str]) -> None:
        setattr(self.counters, kind, getattr(self.counters, kind) + len(positions))
        self.report(Finding(kind, self.counters.steps, rid, ranges(positions), len(positions),
                            context_len, writers, list(context), writer_context))
