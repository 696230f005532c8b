"""The lifecycle phase: traffic that drives a block through the events of its life on
purpose (kvdiag.vocab.EVENTS), sized from what the server reports, each request later
checked against a cache-isolated twin. The first family of bugs (key coverage) is the
differential phase's; this one is a correct key over the wrong bytes, at one event:

    group        what is sent                                         the events it drives
    warm         short requests, each under a salt of its own; they   (their blocks are freed
                 finish, and their blocks stay cached and free          and cached)
    flood        long prompts overcommitting the pool, decoding       preemption, recycle,
                 past their last block (ignore_eos)                     backlog
    return       the warm prompts extended, sent while the flood      backlog (a lookup made
                 waits: returning sessions whose cached blocks the       while admission fails)
                 flood is recycling
    revisit      the warm and returning prompts again, after the      recycle (a prefix whose
                 flood: prefixes whose blocks were recycled               blocks were recycled,
                                                                         asked again)
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
from dataclasses import dataclass

from kvdiag.runners.live.endpoint import Endpoint
from kvdiag.runners.live.store import RoundStore
from reference_engine.util import cdiv

LIFE, LIFE_ISOLATED = "life", "life-isolated"
OVERCOMMIT = 1.25  # the flood's prompts hold this many pools' worth of tokens
MAX_FLOOD = 48  # at most this many flood requests: a pool that needs more is not flooded
MAX_PROMPT = 8192  # no lifecycle prompt is longer (prefill on a CPU costs)
ANSWER = 16  # tokens every non-flood request generates
COPY_DELAYS = (0.005, 0.01, 0.015, 0.02, 0.03)  # seconds between a chunked prefill's copies


@dataclass(frozen=True)
class LifeRequest:
    """One request of the phase: `ids` under salt `<run salt>-<salt>`, in `group`."""

    j: int
    group: str
    ids: tuple[int, ...]
    max_tokens: int
    salt: str
    ignore_eos: bool = False


@dataclass(frozen=True)
class LifePlan:
    requests: tuple[LifeRequest, ...]
    skipped: dict  # group -> why it is not sent on this server
    sizing: dict  # the figures the plan was sized from

    def group(self, name: str) -> list[LifeRequest]:
        return [q for q in self.requests if q.group == name]


def plan_lifecycle(material: list[int], block_size: int, num_blocks: int | None,
                   max_model_len: int | None, chunk: int | None, concurrency: int) -> LifePlan:
    """The phase's requests for a server with this pool, context and prefill chunk. Pure: a
    resumed probe plans the same requests. `material`: token ids (the suite's prompts)."""
    longest = min(MAX_PROMPT, (max_model_len or MAX_PROMPT) - 4 * block_size - ANSWER)
    requests: list[LifeRequest] = []
    skipped: dict[str, str] = {}
    cut = _Cutter(material)

    def add(group: str, ids, max_tokens: int = ANSWER, salt: str | None = None, eos: bool = False):
        requests.append(LifeRequest(len(requests), group, tuple(ids), max_tokens,
                                    salt or f"{group}-{len(requests)}", eos))

    warm = [cut.take(min(longest, 12 * block_size) - 3 * k) for k in range(max(4, concurrency // 2))]
    for ids in warm:
        add("warm", ids, 8)
    pool_tokens = num_blocks * block_size if num_blocks else None
    flood = 0
    if pool_tokens is None:
        skipped["flood"] = "the server's pool is unknown (no vllm:cache_config_info or /server_info)"
    else:
        length = min(longest * 2 // 3, max(8 * block_size, cdiv(int(OVERCOMMIT * pool_tokens), concurrency)))
        flood = cdiv(int(OVERCOMMIT * pool_tokens), length)
        if flood > MAX_FLOOD:
            skipped["flood"] = (f"the pool ({num_blocks} blocks of {block_size}) needs {flood} "
                                f"prompts of {length} tokens to overcommit (at most {MAX_FLOOD})")
            flood = 0
        # the admitted prompts leave less than one prompt's blocks free; the pool holds about
        # pool/length of them, so each decoding 2 * length^2 / pool tokens outgrows that twice
        # over, and the server must preempt
        decode = min(longest - length, max(4 * block_size, cdiv(2 * length * length, pool_tokens)))
        for _ in range(flood):
            add("flood", cut.take(length), decode, eos=True)
    for q in [q for q in requests if q.group == "warm"]:
        add("return", q.ids + tuple(cut.take(block_size + 5)), salt=q.salt)
    for q in [q for q in requests if q.group in ("warm", "return")]:
        add("revisit", q.ids, salt=q.salt)
    # two bursts, each small enough to be admitted as one batch: one with the flood (queued
    # behind it), one behind the chunk group's long prefill (beside one of its chunks)
    for burst in ("dedup-flood", "dedup-chunk"):
        prefix = cut.take(min(longest, 4 * block_size + 3))
        for _ in range(4):
            add("dedup", prefix + cut.take(5), 8 * block_size, salt=burst, eos=True)
    want = min(longest, 8 * chunk + block_size // 2) if chunk else longest
    if chunk and want <= 2 * chunk:  # a copy must be able to arrive with two chunks to go
        skipped["chunk"] = (f"the server's prefill chunk ({chunk} tokens) is over half the "
                            f"longest prompt its context allows here ({longest})")
    else:
        ids = cut.take(want)
        for _ in range(1 + len(COPY_DELAYS)):  # the first streamed as traffic, its copies judged
            add("chunk", ids, salt="chunk")
    for when in ("prefill", "decode"):
        for _ in range(2):
            add(f"cancel-{when}", cut.take(min(longest, 96 * block_size)))
    return LifePlan(tuple(requests), skipped, {"pool_tokens": pool_tokens, "flood_requests": flood,
                                               "longest_prompt": longest, "prefill_chunk": chunk})


class _Cutter:
    """Consecutive windows of the material, wrapping around, each shifted by one token from
    the last so no two windows are equal."""

    def __init__(self, material: list[int]) -> None:
        self.material, self.at = material or [1], 0

    def take(self, n: int) -> list[int]:
        n = max(1, n)
        out = [self.material[(self.at + i) % len(self.material)] for i in range(n)]
        self.at = (self.at + n + 1) % len(self.material)
        return out


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
    sampler = _Sampler(endpoint)
    task = asyncio.create_task(sampler.run())
    try:
        flood = asyncio.gather(*(one(q) for q in life.group("flood")),
                               *(one(q) for q in life.group("dedup") if q.salt == "dedup-flood"))
        await asyncio.sleep(0.5 if life.group("flood") else 0.0)  # the flood is admitted first
        observed["return_sent_waiting"] = sampler.latest_waiting
        await asyncio.gather(flood, *(one(q) for q in life.group("return")))
    finally:
        sampler.stop = True
        await task
    observed["sampled"] = sampler.summary()
    await asyncio.gather(*(one(q) for q in life.group("revisit")))
    await _chunked(life.group("chunk"), [q for q in life.group("dedup") if q.salt == "dedup-chunk"],
                   one, endpoint, run_salt, observed)
    for q in life.group("cancel-prefill") + life.group("cancel-decode"):
        if (LIFE, q.j, 0) in store.done:
            continue
        seen = await endpoint.stream_and_close(list(q.ids), 0 if q.group == "cancel-prefill" else 4,
                                               cache_salt=f"{run_salt}-{q.salt}")
        observed.setdefault("cancels", []).append({"j": q.j, "group": q.group} | seen)
        await one(q, cancelled_tokens=seen["tokens_seen"])


async def _chunked(requests: list[LifeRequest], dedup: list[LifeRequest], one, endpoint: Endpoint,
                   run_salt: str, observed: dict) -> None:
    """The first request streamed (traffic only: its first token's arrival is when its prefill
    ended); the dedup burst queued behind it, so the server admits it as one batch beside one
    of its chunks; its copies sent COPY_DELAYS apart after it, each answered and judged."""
    if not requests:
        await asyncio.gather(*(one(q) for q in dedup))
        return
    first, followers = requests[0], requests[1:]
    lead = asyncio.create_task(endpoint.stream_and_close(list(first.ids), None,
                                                         cache_salt=f"{run_salt}-{first.salt}"))
    await asyncio.sleep(0.002)
    tasks, sent = [asyncio.create_task(one(q)) for q in dedup], []
    for delay, q in zip(COPY_DELAYS, followers):
        await asyncio.sleep(delay)
        sent.append(time.time())
        tasks.append(asyncio.create_task(one(q)))
    seen = await lead
    await asyncio.gather(*tasks)
    observed["chunk"] = seen | {"followers_sent": sent}


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


WAITING = ("vllm:num_requests_waiting", "sglang:num_queue_reqs")


def _waiting(sample: dict) -> float | None:
    found = [sample[name] for name in WAITING if name in sample]
    return sum(found) if found else None


async def lifecycle_isolated(endpoint: Endpoint, life: LifePlan, store: RoundStore, concurrency: int,
                             tick: Callable[[], None]) -> None:
    """The twin of every answered lifecycle request: its ids under a fresh salt."""
    import uuid

    sem = asyncio.Semaphore(concurrency)

    async def one(q: LifeRequest) -> None:
        async with sem:
            res = await endpoint.complete(list(q.ids), q.max_tokens, cache_salt=f"kvdiag-{uuid.uuid4().hex}",
                                          ignore_eos=q.ignore_eos)
        store.add(LIFE_ISOLATED, q.j, 0, res, group=q.group)
        tick()

    await asyncio.gather(*(one(q) for q in life.requests
                           if (LIFE, q.j, 0) in store.done and (LIFE_ISOLATED, q.j, 0) not in store.done))


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
