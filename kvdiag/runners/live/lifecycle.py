"""The lifecycle phase: traffic that drives a block through the events of its life on
purpose (kvdiag.vocab.EVENTS), sized from what the server reports, each request later
checked against a cache-isolated twin. The first family of bugs (key coverage) is the
differential phase's; this one is a correct key over the wrong bytes, at one event:

    group        what is sent                                         the events it drives
    warm         short requests, each under a salt of its own; they   (their blocks are freed
                 finish, and their blocks stay cached and free          and cached)
    flood        long prompts overcommitting the pool, decoding       preemption, recycle,
                 past their last block (ignore_eos)                     backlog
    reflood      the flood's prompts under fresh salts, alone, only   preemption
                 where the server counted no preemption in the first
    return       the warm prompts extended, sent while the flood      backlog (a lookup made
                 waits: returning sessions whose cached blocks the       while admission fails)
                 flood is recycling
    follow       each flood prompt extended, sent while the flood     backlog, preemption (a
                 runs: lookups that hit blocks held by running           lookup over blocks in
                 decodes, which preemption may free and recycle           flux)
                 before the follower is admitted
    revisit      the warm, returning and flood prompts again, after   recycle, preemption (what
                 the flood: prefixes whose blocks were recycled, and     the events left behind
                 blocks that preempted and resumed requests wrote         under a correct key)
    dedup        one uncached prefix with distinct tails, all sent    concurrent-prefill
                 at the same instant under one salt, queued behind
                 the chunk group's long prefill
    chunk        a prompt longer than the prefill chunk, and copies   chunked-prefill
                 of it sent while it is still in prefill
    cancel       a long prompt cancelled before its first token, or   cancel-prefill,
                 after a few, then the same prompt again                cancel-decode

Token ids are cut from the suite's own prompts (any model's vocabulary) and sent through
/v1/completions. Every request of a group but the cancelled ones is answered and stored
(phase LIFE); its twin (LIFE_ISOLATED: the same ids under a fresh salt) runs with the
isolated phase. What each event's evidence is, and whether it was reached, is events.py's.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from kvdiag.runners.live.cancel import cancel_request, stream_and_close
from kvdiag.runners.live.endpoint import Endpoint
from kvdiag.runners.live.events import PREEMPTIONS, delta
from kvdiag.runners.live.identity import every_server
from kvdiag.runners.live.lifeplan import (
    CANCEL_PREFILLS,
    COPY_DELAYS,
    LIFE,
    LIFE_ISOLATED,
    LifePlan,
    LifeRequest,
)
from kvdiag.runners.live.store import RoundStore

REVISIT_BATCH = 4  # revisits in flight at once


async def lifecycle_phase(endpoint: Endpoint, life: LifePlan, store: RoundStore, run_salt: str,
                          tick: Callable[[], None], observed: dict) -> None:
    """Send the plan's groups in order, each request stored as (LIFE, j, 0); `observed`
    collects what the traffic itself saw (the queue and preemption counters sampled while the
    flood ran, when each cancel was closed, whether followers arrived during a prefill)."""
    sem = asyncio.Semaphore(256)

    async def one(q: LifeRequest, **extra) -> None:
        if (LIFE, q.j, 0) in store.done:
            return
        async with sem:
            res = await endpoint.complete(list(q.ids), q.max_tokens, cache_salt=f"{run_salt}-{q.salt}",
                                          ignore_eos=q.ignore_eos)
        store.add(LIFE, q.j, 0, res, group=q.group, salt=q.salt, **extra)
        tick()

    await asyncio.gather(*(one(q) for q in life.group("warm")))
    before = await asyncio.to_thread(endpoint.metrics)
    sampler = _Sampler(endpoint)
    task = asyncio.create_task(sampler.run())
    try:
        flood = asyncio.gather(*(one(q) for q in life.group("flood")),
                               *(one(q) for q in life.group("dedup") if q.salt == "dedup-flood"))
        await asyncio.sleep(0.5 if life.group("flood") else 0.0)  # the flood is admitted first
        observed["return_sent_waiting"] = sampler.latest_waiting
        await asyncio.gather(flood, *(one(q) for q in life.group("return") + life.group("follow")))
        # On 2 CPU cores vLLM's API server sometimes hands a flood to its engine so staggered
        # that the first requests finish before the last are admitted: nothing is preempted
        # (2 probes of 5 even with each flood request decoding half its prompt). Sent again
        # alone, with nothing else in the engine, it preempted in every trial by hand.
        after = await asyncio.to_thread(endpoint.metrics)
        if life.group("reflood") and delta(PREEMPTIONS, before, after) == 0:  # None: no counter
            observed["reflood"] = len(life.group("reflood"))
            await asyncio.gather(*(one(q) for q in life.group("reflood")))
    finally:
        sampler.stop = True
        await task
    observed["sampled"] = sampler.summary()
    await _revisit(life.group("revisit"), store, one)
    await _chunked(life.group("chunk"), [q for q in life.group("dedup") if q.salt == "dedup-chunk"],
                   one, endpoint, run_salt, observed)
    prefill = _prefill_seconds(observed.get("chunk"), life)
    for k, q in enumerate(life.group("cancel-prefill") + life.group("cancel-decode")):
        if (LIFE, q.j, 0) in store.done:
            continue
        # where the server aborts by rid, the k-th cancel-prefill lands k+1 eighths of the way
        # through its prefill, timed by the chunk group's lead (per token; that prefill shared
        # its steps with the dedup burst, so it takes about twice this one's)
        abort_after = (None if q.group != "cancel-prefill" or prefill is None else
                       prefill * len(q.ids) * (k + 1) / (CANCEL_PREFILLS + 2))
        seen = await cancel_request(endpoint, q, observed, 4, cache_salt=f"{run_salt}-{q.salt}",
                                    abort_after=abort_after)
        await one(q, cancelled_tokens=seen["tokens_seen"])


async def _revisit(revisits: list[LifeRequest], store: RoundStore, one) -> None:
    """The revisits, the prefix whose request finished last first, a few at a time: a revisit
    that misses allocates a whole prompt's blocks and evicts the least recently freed, so
    sent at once they evict each other's prefixes before they are read. The last to finish
    are the ones an event held longest (preempted and resumed, or queued behind the flood)."""
    def finished(q: LifeRequest) -> float:
        return (store.done.get((LIFE, q.of, 0)) or {}).get("done") or 0.0

    ordered = sorted(revisits, key=finished, reverse=True)
    for k in range(0, len(ordered), REVISIT_BATCH):
        await asyncio.gather(*(one(q) for q in ordered[k:k + REVISIT_BATCH]))


async def _chunked(requests: list[LifeRequest], dedup: list[LifeRequest], one, endpoint: Endpoint,
                   run_salt: str, observed: dict) -> None:
    """The first request streamed (traffic only: its first token's arrival is when its prefill
    ended); its copies sent COPY_DELAYS apart after it, the first at once, each answered and
    judged; the dedup burst beside the first copy, so the server admits it as one batch
    beside one of the lead's chunks. The copies go first because the lead's prefill is short
    (tens of ms for the canary on a CPU): sent after the burst, behind its sends, on a loaded
    2-core machine 0 of 5 copies went out before the lead's first token in 4 runs of 4; first,
    at least 1 did in 3 of 3."""
    if not requests:
        await asyncio.gather(*(one(q) for q in dedup))
        return
    first, followers = requests[0], requests[1:]
    lead = asyncio.create_task(stream_and_close(endpoint, list(first.ids), None,
                                                cache_salt=f"{run_salt}-{first.salt}"))
    tasks, sent = [], []
    for k, (delay, q) in enumerate(zip(COPY_DELAYS, followers)):
        await asyncio.sleep(delay)
        sent.append(time.time())
        tasks.append(asyncio.create_task(one(q)))
        if k == 0:
            tasks += [asyncio.create_task(one(q)) for q in dedup]
    seen = await lead
    await asyncio.gather(*tasks)
    observed["chunk"] = seen | {"followers_sent": sent}


def _prefill_seconds(chunk: dict | None, life: LifePlan) -> float | None:
    """Seconds a prompt token took to prefill in the chunk group's lead (sent to its first
    token, over its length), or None where it was not measured."""
    lead = life.group("chunk")
    if not chunk or not lead or chunk.get("first_token") is None:
        return None
    return max(0.0, chunk["first_token"] - chunk["sent"]) / len(lead[0].ids)


class _Sampler:
    """Polls /metrics every 0.2 s: the most requests seen waiting, and the counters."""

    def __init__(self, endpoint: Endpoint) -> None:
        self.endpoint, self.stop, self.samples = endpoint, False, []

    async def run(self) -> None:
        while not self.stop:
            self.samples.append(await asyncio.to_thread(self.endpoint.metrics))
            await asyncio.sleep(0.2)

    @property
    def latest_waiting(self) -> float | None:
        return _waiting(self.samples[-1]) if self.samples else None

    def summary(self) -> dict:
        waits = [w for w in map(_waiting, self.samples) if w is not None]
        return {"samples": len(self.samples), "max_waiting": max(waits) if waits else None}


WAITING = every_server("waiting")


def _waiting(sample: dict) -> float | None:
    found = [sample[name] for name in WAITING if name in sample]
    return sum(found) if found else None


async def lifecycle_isolated(endpoint: Endpoint, life: LifePlan, store: RoundStore, concurrency: int,
                             tick: Callable[[], None]) -> None:
    """The twin of every answered lifecycle request: its ids under a fresh salt."""

    sem = asyncio.Semaphore(concurrency)

    async def one(q: LifeRequest) -> None:
        async with sem:
            res = await endpoint.complete(list(q.ids), q.max_tokens, isolated=True,
                                          ignore_eos=q.ignore_eos)
        store.add(LIFE_ISOLATED, q.j, 0, res, group=q.group)
        tick()

    await asyncio.gather(*(one(q) for q in life.requests if q.twinned
                           and (LIFE, q.j, 0) in store.done and (LIFE_ISOLATED, q.j, 0) not in store.done))


def server_limits(endpoint: Endpoint, chunk: int | None = None) -> tuple[int | None, int | None]:
    """(the served model's context, the server's prefill chunk): /v1/models' max_model_len
    (else SGLang's context_length), and `chunk` (the user's), else SGLang's
    chunked_prefill_size, else the reference server's max_num_batched_tokens label; None
    where the server does not say (vLLM does not report its chunk)."""
    info = endpoint.server_info
    context = endpoint.model_entry().get("max_model_len") or info.get("context_length")
    chunk = chunk or info.get("chunked_prefill_size") or endpoint.cache_config().get("max_num_batched_tokens")
    return _positive(context), _positive(chunk)


def _positive(v) -> int | None:
    try:
        return int(v) if int(v) > 0 else None
    except (TypeError, ValueError):
        return None
