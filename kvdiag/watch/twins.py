"""Sampled twins: a small share of real requests, re-sent in the background as a pair that
differs only in its namespace.

    shared replay   the client's own prompt fields, in the client's namespace: it reads
                    whatever the upstream's prefix cache holds for that prompt now
    isolated twin   the same, under a fresh cache_salt (or cache_prompt false): computed
                    from nothing cached, the ground truth
    floor pair      every FLOOR_EVERY-th sample, a second isolated twin: how far two
                    uncached runs of one prompt differ (batch-dependent numerics)

All three are greedy, MAX_TOKENS tokens, with TOP_K logprobs. The client's own request and
answer are never changed (the proxy adds nothing to them): a sample costs the upstream three
short requests at most, a prompt prefill each, and the shared replay mostly hits the cache.
A shared replay that reported no cached tokens reached nothing and is not judged."""

from __future__ import annotations

import asyncio
import json
import math
import random
import time
import uuid
from collections import deque
from dataclasses import dataclass

import httpx

from kvdiag.errors import KvdiagError
from kvdiag.runners.live.compare import divergence, margin_at, topk_distance
from kvdiag.runners.live.endpoint import ChatResult, Endpoint
from kvdiag.verdicts.watch import twin_departed
from kvdiag.watch.exchange import Exchange

MAX_TOKENS, TOP_K, FLOOR_EVERY, FLOOR_KEPT = 8, 5, 4, 200


@dataclass(frozen=True)
class Twin:
    """One judged sample: `label` match | numerics | corruption | contaminated (the isolated
    twin reported cached tokens: no ground truth, so the pair is not judged); `reached`: the
    shared replay hit the cache (else it proves nothing and is not counted)."""

    request_id: str
    namespace: tuple
    rounds: int
    reached: bool
    label: str
    margin: float
    distance: float | None
    at: float  # when it was judged
    done: float = 0.0  # when the client's request ended (the proxy relayed its last byte)


class Sampler:
    """Which completed requests get twins: each with probability `rate`, and never more than
    `budget` per second (a token bucket of one second's worth)."""

    def __init__(self, rate: float, budget: float, seed: int | None = None) -> None:
        self.rate, self.budget = rate, budget
        self.rng = random.Random(seed)
        self.tokens, self.last = budget, time.monotonic()

    def take(self) -> bool:
        if self.rate <= 0 or self.rng.random() >= self.rate:
            return False
        now = time.monotonic()
        self.tokens = min(self.budget, self.tokens + (now - self.last) * self.budget)
        self.last = now
        if self.tokens < 1:
            return False
        self.tokens -= 1
        return True


def _row(r: ChatResult) -> dict:
    return {"tokens": r.tokens, "top": r.top, "logprobs": r.logprobs}


class Twins:
    """Sends the pairs and keeps the floor. `isolation`: `salt` (cache_salt, vLLM and kvdiag
    serve) or `cache_prompt` (llama.cpp's per-request switch)."""

    def __init__(self, endpoint: Endpoint, isolation: str = "salt", concurrency: int = 2) -> None:
        self.endpoint, self.isolation = endpoint, isolation
        self.gate = asyncio.Semaphore(concurrency)
        self.floor_margins: deque[float] = deque(maxlen=FLOOR_KEPT)
        self.floor_distances: deque[float] = deque(maxlen=FLOOR_KEPT)
        self.samples = self.floor_pairs = self.errors = 0
        self.extra_prompt_tokens = 0  # what the twins cost the upstream, in prompt tokens

    async def _send(self, ex: Exchange, isolated: bool) -> ChatResult:
        body = dict(ex.prompt) | {"model": ex.model, "max_tokens": MAX_TOKENS,
                                  "temperature": 0.0, "stream": False}
        if ex.namespace[2] is not None:
            body["lora"] = json.loads(ex.namespace[2])
        if ex.path.endswith("chat/completions"):
            body |= {"logprobs": True, "top_logprobs": TOP_K}
        else:
            body["logprobs"] = TOP_K
        salt = ex.namespace[1]
        if isolated and self.isolation == "salt":
            salt = f"kvdiag-watch-{uuid.uuid4().hex}"
        elif isolated:
            body["cache_prompt"] = False
        result = await self.endpoint.generate(ex.path, body, salt, ex.auth)
        self.extra_prompt_tokens += result.prompt_tokens
        return result

    async def judge(self, ex: Exchange) -> Twin | None:
        """The sample's pair, judged against the floor; None when the upstream refused it."""
        async with self.gate:
            self.samples += 1
            try:
                shared = await self._send(ex, isolated=False)
                iso = await self._send(ex, isolated=True)
                if self.samples % FLOOR_EVERY == 1:
                    self._floor(_row(iso), _row(await self._send(ex, isolated=True)))
            except (KvdiagError, httpx.HTTPError, KeyError, IndexError, TypeError, ValueError):
                self.errors += 1
                return None
        if iso.cached_tokens:  # the switch that isolates it did not: no ground truth here
            return Twin(ex.request_id, ex.namespace, ex.rounds, False, "contaminated",
                        float("nan"), None, time.time(), ex.done)
        a, b = _row(iso), _row(shared)
        i = divergence(a["tokens"], b["tokens"])
        margin = float("nan") if i is None else margin_at(a, b["tokens"], i)
        distance = topk_distance(a, b)
        label = twin_departed(margin, distance, list(self.floor_margins), list(self.floor_distances))
        return Twin(ex.request_id, ex.namespace, ex.rounds, bool(shared.cached_tokens), label,
                    margin, distance, time.time(), ex.done)

    def _floor(self, a: dict, b: dict) -> None:
        self.floor_pairs += 1
        i = divergence(a["tokens"], b["tokens"])
        if i is not None:
            m = margin_at(a, b["tokens"], i)
            self.floor_margins.append(m if math.isfinite(m) else 0.0)
        d = topk_distance(a, b)
        if d is not None:
            self.floor_distances.append(d)
