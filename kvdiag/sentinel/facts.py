"""What the sentinel's ledger (kvdiag.sentinel.ledger) is told and what it tells: one
request's share of a step as the workers see it (`Scheduled`), the namespace its fingerprints
live in, and what the log keeps (`Finding`, `Counters`)."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field, fields

import numpy as np

MAX_RANGES = 8  # position ranges written per finding (the count covers all of them)


def namespace_of(*, salt: object = None, adapter: object = None, extra: object = None) -> int:
    """A fingerprint namespace for what keys K/V besides the tokens (a cache_salt, an
    adapter, an engine's other key, as SGLang's extra_key): equal tokens under another
    namespace are another prefix. Each part is tagged with what it is, so a salt equal to an
    adapter's name is still another namespace (the untagged join is vLLM #44701, the bug
    `tags-dropped` plants). None and "" are dropped; none given is namespace 0."""
    given = [f"{tag}={p}" for tag, p in (("salt", salt), ("adapter", adapter), ("extra", extra))
             if p is not None and p != ""]
    if not given:
        return 0
    digest = hashlib.blake2b("\x1f".join(given).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") or 1


@dataclass(frozen=True)
class Scheduled:
    """One request's share of one step, as the engine's workers are told it.
    tokens: the request's token ids, at least `computed + new` of them (prompt, then output)."""

    rid: str
    table: Sequence[int]
    computed: int
    new: int
    tokens: Sequence[int]
    namespace: int = 0
    context: tuple[str, ...] = ()  # the event it is in: "resumed after preemption", "chunk 2" ...


@dataclass
class Finding:
    kind: str  # foreign | unwritten | overwrite
    step: int
    request: str
    positions: list[tuple[int, int]]  # [start, end) ranges, the first MAX_RANGES
    count: int
    context_len: int  # the request's context at that step (count / context_len: the share)
    writers: list[str] = field(default_factory=list)  # whose prefix the slots held (foreign)
    context: list[str] = field(default_factory=list)  # the reader's event
    writer_context: list[str] = field(default_factory=list)  # the writers' fate

    def as_dict(self) -> dict:
        return {"type": "finding", **self.__dict__,
                "positions": [list(r) for r in self.positions]}


@dataclass
class Counters:
    steps: int = 0
    requests: int = 0  # distinct requests checked
    reads: int = 0  # slot reads checked (each request's context, every step it ran)
    writes: int = 0
    unchecked: int = 0  # request-steps skipped: fewer token ids known than positions computed
    foreign: int = 0  # positions reported, by kind
    unwritten: int = 0
    overwrite: int = 0
    zeroed: int = 0  # blocks the workers zeroed before a step (unwritten again)
    copies: int = 0  # copy-on-write block copies applied
    shifted: int = 0  # reads of cells llama.cpp's --cache-reuse moved: judged by their token, not prefix
    seconds: float = 0.0  # spent checking, in the engine's own process (the sentinel's cost)
    weighing: float = 0.0  # spent weighing attention for leakage, where the forward pass runs


def ranges(positions: np.ndarray) -> list[tuple[int, int]]:
    """Sorted positions as [start, end) runs, the first MAX_RANGES."""
    if not len(positions):
        return []
    breaks = np.flatnonzero(np.diff(positions) != 1) + 1
    starts = np.concatenate([[0], breaks])
    ends = np.concatenate([breaks, [len(positions)]])
    return [(int(positions[a]), int(positions[b - 1]) + 1)
            for a, b in zip(starts[:MAX_RANGES], ends[:MAX_RANGES])]


def merged(ledgers: Sequence, skipped: Counters) -> Counters:
    """One model's counters over its groups' ledgers: steps once, everything else summed."""
    total = Counters(steps=max((led.counters.steps for led in ledgers), default=0),
                     unchecked=skipped.unchecked)
    for led in ledgers:
        for f in fields(Counters):
            if f.name != "steps":
                setattr(total, f.name, getattr(total, f.name) + getattr(led.counters, f.name))
    return total
