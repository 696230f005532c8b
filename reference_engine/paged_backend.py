"""The paged attention backend of one step: slot mapping, block-table gathers, and the
provenance check of every slot each sequence reads (foreign / unwritten), plus attention
leakage when capture is on. Built once per step, used by every layer."""

from __future__ import annotations

import numpy as np
import torch

from reference_engine.attention import decode_attention, prefill_attention
from reference_engine.kv_cache import PagedKVCache
from reference_engine.provenance import UNWRITTEN
from reference_engine.scheduler import ScheduledSeq
from reference_engine.util import cdiv


class _Item:
    """One sequence's share of the step, with the slots it reads and their provenance."""

    __slots__ = ("sched", "state", "row0", "start", "ctx", "slots", "bad", "np_slots", "np_bad",
                 "leak", "probs")

    def __init__(self, sched: ScheduledSeq, row0: int, state: SeqState) -> None:
        self.sched, self.state, self.row0 = sched, state, row0
        self.start = sched.seq.num_computed_tokens
        self.ctx = self.start + sched.num_tokens
        self.slots = self.bad = self.np_slots = self.np_bad = None  # set by the provenance check
        self.leak: list[torch.Tensor] = []  # per layer: attention mass on bad slots, [H]
        self.probs: list[torch.Tensor] = []


class SeqState:
    """What the backend keeps about one sequence across steps; the engine holds these in a
    dict keyed by seq_id and drops an entry when its sequence finishes.
        table, slots: the block table the slot list was computed from, and every slot of
            that table in position order (recomputed whenever the table differs: grown,
            emptied, or replaced after a preemption; whoever changes a block table need not
            know this cache exists, and comparing two int lists costs far less than
            rebuilding)
        foreign, unwritten: bool per context position, ever read with a foreign / unwritten
            provenance (allocated on the first such read)
        attention: per sampled token, when the engine keeps probabilities (tests, small runs)"""

    __slots__ = ("table", "slots", "foreign", "unwritten", "attention")

    def __init__(self) -> None:
        self.table: list[int] | None = None
        self.slots: np.ndarray | None = None
        self.foreign: np.ndarray | None = None
        self.unwritten: np.ndarray | None = None
        self.attention: list[dict] = []

    def slots_of(self, block_table: list[int], bs: int) -> np.ndarray:
        if self.table != block_table:
            table = np.asarray(block_table, dtype=np.int64)
            self.table, self.slots = list(block_table), (table[:, None] * bs + np.arange(bs)).ravel()
        return self.slots


def _track(seen: np.ndarray | None, ctx: int, mask: np.ndarray) -> np.ndarray:
    """OR `mask` into a per-position record, growing it (doubling) as the context grows."""
    if seen is None or len(seen) < ctx:
        grown = np.zeros(max(ctx, 2 * (0 if seen is None else len(seen))), dtype=bool)
        if seen is not None:
            grown[:len(seen)] = seen
        seen = grown
    seen[:ctx] |= mask
    return seen


class PagedBackend:
    def __init__(self, cache: PagedKVCache, batch: list[ScheduledSeq], states: dict[int, SeqState],
                 *, mode: str, scale: float, capture: bool, keep: bool, device) -> None:
        self.cache, self.mode, self.scale, self.capture, self.keep = cache, mode, scale, capture, keep
        bs = cache.block_size
        self.items, new_slots, row = [], [], 0
        for s in batch:
            item = _Item(s, row, states.setdefault(s.seq.seq_id, SeqState()))
            row += s.num_tokens
            slots = item.state.slots_of(s.seq.block_table, bs)[item.start:item.ctx]
            cache.record(slots, s.seq.fingerprints.values(item.start, item.ctx))
            new_slots.append(slots)
            self.items.append(item)
        self.slot_mapping = torch.from_numpy(np.concatenate(new_slots)).to(device)
        self._check_provenance(bs)  # after every write of the step is recorded
        self.decode = [it for it in self.items if it.sched.num_tokens == 1]
        self.prefill = [it for it in self.items if it.sched.num_tokens > 1]
        if self.decode:
            self._build_decode(device)
        for it in self.prefill:
            it.slots = torch.from_numpy(it.np_slots).to(device)
            if capture:
                it.bad = torch.from_numpy(it.np_bad).to(device)

    def _check_provenance(self, bs: int) -> None:
        """Compare the ledger of every slot each sequence reads with its own fingerprints, for
        the whole step at once; per-sequence work only where something does not match."""
        # additive: the kernel never touches the unwritten tail; multiply: whole blocks
        additive = self.mode == "additive"
        for it in self.items:
            it.np_slots = it.state.slots[:it.ctx if additive else cdiv(it.ctx, bs) * bs]
        got = self.cache.ledger[np.concatenate([it.np_slots[:it.ctx] for it in self.items])]
        expected = np.concatenate([it.sched.seq.fingerprints.values(0, it.ctx) for it in self.items])
        mismatch = got != expected  # fingerprints are never UNWRITTEN, so this covers both
        if not (mismatch.any() or self.capture):
            return
        end = 0
        for it in self.items:
            start, end = end, end + it.ctx
            bad = mismatch[start:end]
            if bad.any():
                stats, state = it.sched.seq.stats, it.state
                unwritten = got[start:end] == UNWRITTEN
                if (bad & ~unwritten).any():
                    state.foreign = _track(state.foreign, it.ctx, bad & ~unwritten)
                    stats.foreign_slots = int(state.foreign.sum())
                if unwritten.any():
                    state.unwritten = _track(state.unwritten, it.ctx, unwritten)
                    stats.unwritten_slots = int(state.unwritten.sum())
            if self.capture:  # tail slots (multiply mode) are not ours either
                it.np_bad = np.ones(len(it.np_slots), dtype=bool)
                it.np_bad[:it.ctx] = bad

    def _build_decode(self, device) -> None:
        items, null = self.decode, self.cache.null_block * self.cache.block_size
        width = max(len(it.np_slots) for it in items)
        idx = np.full((len(items), width), null, dtype=np.int64)
        valid = np.zeros((len(items), width), dtype=bool)
        bad = np.zeros((len(items), width), dtype=bool) if self.capture else None
        for b, it in enumerate(items):
            idx[b, :len(it.np_slots)] = it.np_slots
            valid[b, :it.ctx] = True
            if bad is not None:
                bad[b, :len(it.np_bad)] = it.np_bad
        self.dec_idx = torch.from_numpy(idx.ravel()).to(device)
        self.dec_shape = (len(items), width)
        self.dec_valid = torch.from_numpy(valid).to(device)
        self.dec_bad = None if bad is None else torch.from_numpy(bad).to(device)
        self.dec_rows = torch.tensor([it.row0 for it in items], device=device)

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        self.cache.write(layer, self.slot_mapping, k, v)
        fk, fv = self.cache.flat_k(layer), self.cache.flat_v(layer)
        out = torch.empty_like(q)
        if self.decode:
            shape = (*self.dec_shape, *fk.shape[1:])
            kg = fk.index_select(0, self.dec_idx).view(shape)
            vg = fv.index_select(0, self.dec_idx).view(shape)
            o, probs = decode_attention(q[self.dec_rows], kg, vg, self.dec_valid, self.mode,
                                        self.scale, self.capture)
            out[self.dec_rows] = o
            if self.capture:  # multiply mode returns probs even when not capturing
                self._capture(self.decode, probs, self.dec_bad)
        for it in self.prefill:
            r0, r1 = it.row0, it.row0 + it.sched.num_tokens
            o, p_last = prefill_attention(q[r0:r1], fk.index_select(0, it.slots),
                                          fv.index_select(0, it.slots), it.start, it.ctx,
                                          self.mode, self.scale,
                                          self.capture and it.sched.samples)
            out[r0:r1] = o
            if p_last is not None:
                self._capture([it], p_last[None], it.bad[None])
        return out

    def _capture(self, items: list[_Item], probs: torch.Tensor, bad: torch.Tensor) -> None:
        """probs: [B, H, L]; bad: [B, L]. A head whose row holds NaN leaked everything."""
        mass = (probs * bad[:, None, :]).sum(-1)
        mass = torch.where(torch.isfinite(probs).all(-1), mass, torch.ones_like(mass))
        for b, it in enumerate(items):
            it.leak.append(mass[b].cpu())
            if self.keep:
                it.probs.append(probs[b, :, : len(it.np_slots)].cpu())

    def record_leakage(self) -> None:
        """Fold this step's per-layer, per-head masses into each sampling sequence's stats."""
        for it in self.items:
            if not it.leak:
                continue
            seq = it.sched.seq
            m = torch.stack(it.leak)  # [layers, H]
            seq.stats.leakage_sum += float(m.mean())
            seq.stats.leakage_max = max(seq.stats.leakage_max, float(m.max()))
            seq.stats.leakage_tokens += 1
            if self.keep:  # probs [layers, H, slots read]; bad/slots per slot read
                it.state.attention.append({"probs": torch.stack(it.probs), "bad": it.np_bad,
                                      "slots": it.np_slots, "ctx": it.ctx})
