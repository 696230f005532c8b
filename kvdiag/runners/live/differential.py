"""The differential phase: pairs of requests identical but for one part of a block's key, each
checked by the over-hit oracle (oracle.py) and by a short greedy answer against its
cache-isolated twin. A prefix cache is correct only if a block's key covers everything its
K/V depends on; each pair leaves exactly one of those parts different:

    family      what differs from a request sent before it            a key without it ...
    slot        one token, at each slot offset 0..B-1 of a block       ... serves the block
    range       a run of tokens inside a block                         ... serves the block
    order       two tokens of a block swapped                          ... (order-blind) too
    parent      the same aligned blocks after the first permuted,      ... serves them at the
                repeated one block later, or spliced after another         wrong position
                request's first block
    namespace   the same tokens under another cache_salt, under the    ... serves another
                adapter (and new tokens under the adapter, then the        tenant's K/V
                base model), and after a cache reset

The prompts are token ids cut from the suite's own prompts (so any model's vocabulary), sent
as /v1/completions with ids: no chat template stands between a pair. vLLM's lookup stops at
the first missing block, so every pair keeps its first block a legitimate hit where the part
under test lies further on, and the parent pairs make every block of the request findable by
content. The requests go one at a time, so the oracle's bound is exact.

         block 0          block 1 (slot o differs)   block 2 ...
    A    [a0 .. a15]      [a16 .. a31]               [a32 ..] tail
    S_o  [a0 .. a15]      [a16 .. x .. a31]          [a32 ..] tail      bound 16 + o < 32
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass

from kvdiag.runners.live.endpoint import Endpoint
from kvdiag.runners.live.store import RoundStore

DIFF, DIFF_ISOLATED = "diff", "diff-isolated"
BLOCKS = 4  # the base request: 4 full blocks and half a block


@dataclass(frozen=True)
class Pair:
    """One request of the phase: `ids` sent under `salt` (None: the phase's own) and `model`
    (None: the endpoint's), after a cache reset where `reset`."""

    name: str
    family: str
    ids: tuple[int, ...]
    salt: str | None = None
    model: str | None = None
    reset: bool = False


def _other(material: list[int], avoid: int, seed: int) -> int:
    """A token of the material that is not `avoid` (the substitute at one slot)."""
    for step in range(1, len(material)):
        t = material[(seed * 7919 + step) % len(material)]
        if t != avoid:
            return t
    return avoid + 1


def pairs(material: list[int], block: int, adapter: str | None) -> list[Pair]:
    """Every request of the phase, in order. `material`: token ids, at least
    2 * (BLOCKS + 1) blocks long (the suite's longest prompt)."""
    b = block
    length = BLOCKS * b + b // 2
    a = tuple(material[:length])
    c = tuple(material[length:2 * length])  # other content, for splices
    out = [Pair("base", "base", a), Pair("other", "base", c)]

    def sub(ids: tuple[int, ...], where: list[int], seed: int) -> tuple[int, ...]:
        x = list(ids)
        for i in where:
            x[i] = _other(material, x[i], seed + i)
        return tuple(x)

    out += [Pair(f"slot {o}", "slot", sub(a, [b + o], o)) for o in range(b)]
    out += [Pair("range head", "range", sub(a, list(range(2 * b, 2 * b + b // 2)), 1)),
            Pair("range tail", "range", sub(a, list(range(2 * b + b // 2, 3 * b)), 2)),
            Pair("range middle", "range", sub(a, list(range(2 * b + b // 4, 2 * b + 3 * b // 4)), 3))]
    i, j = 2 * b + 1, 3 * b - 2
    if a[i] != a[j]:
        swapped = list(a)
        swapped[i], swapped[j] = a[j], a[i]
        out.append(Pair("swap", "order", tuple(swapped)))
    blocks = [a[k * b:(k + 1) * b] for k in range(BLOCKS)]
    tail = a[BLOCKS * b:]
    # block 0 stays: it carries the salt (vLLM keys it into the first block only)
    out += [Pair("permuted", "parent", sum([blocks[0], blocks[2], blocks[1], *blocks[3:]], ()) + tail),
            Pair("repeated", "parent", blocks[0] + a),
            Pair("spliced", "parent", a[:b] + c[b:])]
    out.append(Pair("other salt", "namespace", a, salt=f"kvdiag-diff-{uuid.uuid4().hex[:12]}"))
    if adapter is not None:
        out.append(Pair("adapter", "namespace", a, model=adapter))
        # the other way: tokens no base request sent, under the adapter first, then under the
        # base model, which must not read the adapter's K/V (llama.cpp b11434 does, to a request
        # that names no adapter after one that did on its slot)
        fresh = sub(c, [0], 0)
        out += [Pair("adapter first", "namespace", fresh, model=adapter),
                Pair("base after adapter", "namespace", fresh)]
    out.append(Pair("after reset", "namespace", a, reset=True))
    return out


async def differential_phase(endpoint: Endpoint, material: list[int], block: int, store: RoundStore,
                             *, adapter: str | None, max_tokens: int, top_logprobs: int,
                             resets: list[float], skipped: list[str],
                             tick: Callable[[], None], namespaces: bool = True) -> None:
    """Send every pair, one at a time, each followed by its cache-isolated twin (a fresh
    salt); each row keeps its ids, salt, model and name for the oracle and the judge. A
    successful reset's time goes into `resets`; a server without a working reset (vLLM
    serves /reset_prefix_cache only with VLLM_SERVER_DEV_MODE=1) skips that pair, named in
    `skipped`. An engine without namespaces (`namespaces` False: llama.cpp keys its cache by
    tokens only) skips the other-salt pair, named too: there the same tokens may hit."""
    import time

    salt = f"kvdiag-diff-{uuid.uuid4().hex[:12]}"
    for i, p in enumerate(pairs(material, block, adapter)):
        if (DIFF, i, 0) in store.done:
            tick()
            continue
        if p.salt is not None and not namespaces:
            skipped.append(f"{p.name}: the server keys its cache by tokens only (no cache_salt)")
            tick()
            continue
        if p.reset:
            if not endpoint.reset_prefix_cache():
                skipped.append(f"{p.name}: the server has no working /reset_prefix_cache")
                tick()
                continue
            resets.append(time.time())
        meta = {"ids": list(p.ids), "name": p.name, "family": p.family, "model": p.model}
        res = await endpoint.complete(list(p.ids), max_tokens, cache_salt=p.salt or salt,
                                      top_logprobs=top_logprobs, model=p.model)
        store.add(DIFF, i, 0, res, salt=p.salt or salt, **meta)
        iso = await endpoint.complete(list(p.ids), max_tokens, isolated=True,
                                      top_logprobs=top_logprobs, model=p.model)
        store.add(DIFF_ISOLATED, i, 0, iso, **meta)
        tick()


