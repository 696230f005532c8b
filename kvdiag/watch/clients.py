"""Ordinary chat clients, not the probe: to check a watch end to end (tests, and
benchmarks/watch_cost.py) with traffic shaped like a product's. Every conversation opens with
the same system prompt and document, asks questions of uneven length round after round, and
keeps the replies in its history; some turns quote part of the document back; a share of the
clients stream (asking for usage, as a client that wants its token counts does). Nothing here
knows about caches or faults."""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import dataclass, field

import httpx

WORDS = ["river", "stone", "market", "lantern", "copper", "orchard", "harbor", "ledger", "signal", "meadow", "garden", "winter", "engine", "bridge", "candle", "forest", "silver", "valley", "thunder", "archive", "compass", "harvest", "island", "mirror", "needle", "ocean", "pepper", "quartz", "saddle", "timber", "velvet"]


@dataclass
class Traffic:
    requests: int = 0
    streamed: int = 0
    failed: int = 0
    latencies: list[float] = field(default_factory=list)  # seconds per request, to the last byte
    errors: dict[str, int] = field(default_factory=dict)  # failed requests by what failed


def _words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


async def _ask(client: httpx.AsyncClient, body: dict, traffic: Traffic) -> str | None:
    start = time.perf_counter()
    try:
        if not body.get("stream"):
            r = await client.post("/v1/chat/completions", json=body)
            r.raise_for_status()
            text = r.json()["choices"][0]["message"]["content"] or ""
        else:
            parts = []
            async with client.stream("POST", "/v1/chat/completions", json=body) as r:
                r.raise_for_status()
                async for line in r.aiter_lines():
                    if line.startswith("data: ") and line != "data: [DONE]":
                        chunk = json.loads(line[6:])
                        for choice in chunk.get("choices") or []:
                            parts.append((choice.get("delta") or {}).get("content") or "")
            text = "".join(parts)
            traffic.streamed += 1
    except (httpx.HTTPError, ValueError, KeyError, IndexError) as e:
        traffic.failed += 1
        what = f"HTTP {e.response.status_code}" if isinstance(e, httpx.HTTPStatusError) else type(e).__name__
        traffic.errors[what] = traffic.errors.get(what, 0) + 1
        return None
    traffic.requests += 1
    traffic.latencies.append(time.perf_counter() - start)
    return text


async def run_clients(base_url: str, model: str, *, clients: int = 8, rounds: int = 6,
                      document_words: int = 120, max_tokens: int = 12, stream_share: float = 0.5,
                      seed: int = 0, concurrency: int | None = None,
                      quote_share: float = 0.3, tenants: int = 0) -> Traffic:
    """`clients` conversations of `rounds` turns each, all at once (or `concurrency` at a time).
    `tenants` > 0: client k sends cache_salt "tenant-{k % tenants}" (a multi-tenant service
    that keeps its tenants' caches apart by salt)."""
    rng = random.Random(seed)
    document = _words(rng, document_words)
    traffic = Traffic()
    gate = asyncio.Semaphore(concurrency or clients)
    limits = httpx.Limits(max_connections=max(clients, 8))
    async with httpx.AsyncClient(base_url=base_url, timeout=300, limits=limits) as client:

        async def conversation(k: int) -> None:
            own = random.Random(seed * 1000 + k)
            stream = k < round(clients * stream_share)
            messages = [{"role": "system", "content": f"You answer questions about this "
                         f"document. {document}"}]  # one product's prompt: every client's
            for _ in range(rounds):
                if own.random() < quote_share:  # a user who pastes part of the document back
                    words = document.split()
                    start = own.randrange(len(words) // 2)
                    ask = f"About this: {' '.join(words[start:start + len(words) // 2])}"
                else:
                    ask = _words(own, own.choice((3, 9, 27, 61)))
                messages.append({"role": "user", "content": ask})
                body = {"model": model, "messages": messages, "max_tokens": max_tokens,
                        "temperature": 0.0, "stream": stream}
                if tenants:
                    body["cache_salt"] = f"tenant-{k % tenants}"
                if stream:
                    body["stream_options"] = {"include_usage": True}
                async with gate:
                    reply = await _ask(client, body, traffic)
                if reply is None:
                    return
                messages = messages + [{"role": "assistant", "content": reply}]

        await asyncio.gather(*(conversation(k) for k in range(clients)))
    return traffic
