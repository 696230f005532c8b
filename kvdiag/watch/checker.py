"""The checks beside the traffic. The proxy only queues events (a request sent, a request done,
a cache reset) and returns; one task here takes them in order, in batches:

    1. tokenize every `sent` prompt of the batch at the upstream (kvdiag.watch.tokens), concurrently,
       or here with --tokenizer
    2. apply the batch in order: sent -> index.sent; done -> bound, judged; reset -> clear
    3. hand sampled completions to the twins, which run on their own (kvdiag.watch.twins)

The bound is sound only if the proxy sees every request the upstream serves in the namespace
(all its replicas' traffic goes through this one proxy). Two things the proxy cannot see
make it `warming`, when a hit above the bound is a `warmup`, never a finding: what the
upstream cached before the proxy started, and what the proxy lost (a prompt it could not
tokenize, a full queue, a forgotten index). Warm-up lasts until the upstream has computed
`pool_tokens` new tokens (its pool turned over once; prompt minus cached plus generated, as
reported) and at least `warmup` seconds have passed."""

from __future__ import annotations

import asyncio
import math
import time

import httpx

from kvdiag.runners.live.oracle import HitRule, Sent
from kvdiag.verdicts.live import over_hit
from kvdiag.verdicts.watch import over_hit_kind
from kvdiag.watch.exchange import Exchange
from kvdiag.watch.index import PrefixIndex
from kvdiag.watch.log import WatchLog
from kvdiag.watch.metrics import WatchMetrics
from kvdiag.watch.stats import Windows, namespace_label
from kvdiag.watch.tokens import PROTOCOLS, LocalTokenizer, prompt_ids
from kvdiag.watch.twins import Sampler, Twin, Twins

QUEUE, BATCH, TOKENIZE_CONCURRENCY = 100_000, 256, 8


class Checker:
    def __init__(self, tokenizer: httpx.AsyncClient, index: PrefixIndex, twins: Twins | None,
                 sampler: Sampler, log: WatchLog, metrics: WatchMetrics, *,
                 window: float = 300.0, warmup: float = 600.0, pool_tokens: int = 0,
                 rule: HitRule = HitRule(1, False), shape: str = "openai",
                 local: LocalTokenizer | None = None) -> None:
        self.tokenizer, self.index, self.twins, self.sampler = tokenizer, index, twins, sampler
        self.local = local  # --tokenizer: ids made here, the upstream asked nothing
        self.log, self.metrics, self.rule, self.shape = log, metrics, rule, shape
        self.warmup, self.pool_tokens = warmup, pool_tokens
        self.queue: asyncio.Queue = asyncio.Queue(QUEUE)
        self.windows = Windows(window, time.time())
        self.tasks: set[asyncio.Task] = set()
        self.dropped = 0
        self._rewarm(time.time())

    # --- what the proxy calls (never blocks) ----------------------------------------------
    def event(self, kind: str, item) -> None:
        try:
            self.queue.put_nowait((kind, item))
        except asyncio.QueueFull:
            self.dropped += 1
            self._rewarm(time.time())  # a lost `sent` could explain any later hit

    # --- warm-up ---------------------------------------------------------------------------
    def _rewarm(self, now: float) -> None:
        self.warm_from, self.computed = now, 0
        self.metrics.gauges["warming"].set(1)

    @property
    def warming(self) -> bool:
        done = (time.time() - self.warm_from >= self.warmup and self.computed >= self.pool_tokens)
        self.metrics.gauges["warming"].set(0 if done else 1)
        return not done

    # --- the loop --------------------------------------------------------------------------
    async def run(self) -> None:
        while True:
            try:
                batch = [await asyncio.wait_for(self.queue.get(), timeout=1.0)]
            except asyncio.TimeoutError:
                self.tick(time.time())  # windows close on time, traffic or not
                continue
            while len(batch) < BATCH and not self.queue.empty():
                batch.append(self.queue.get_nowait())
            ids = await self._tokenize([ex for kind, ex in batch if kind == "sent"])
            for kind, item in batch:
                self._apply(kind, item, ids)
            self.tick(time.time())

    def tick(self, now: float) -> None:
        if self.windows.due(now):
            record = self.windows.roll(now)
            self.metrics.window(record["all"])
            self.log.write(record)

    async def _tokenize(self, exchanges: list[Exchange]) -> dict[int, tuple[int, ...] | None]:
        if self.local is not None:  # in a thread: the relay's event loop is never held
            found = await asyncio.to_thread(lambda: [self.local.ids(ex) for ex in exchanges])
            return {ex.seq: f for ex, f in zip(exchanges, found)}
        gate = asyncio.Semaphore(TOKENIZE_CONCURRENCY)

        async def one(ex: Exchange):
            async with gate:
                return await prompt_ids(self.tokenizer, ex, self.shape)

        found = await asyncio.gather(*(one(ex) for ex in exchanges))
        return {ex.seq: f for ex, f in zip(exchanges, found)}

    def _apply(self, kind: str, item, ids: dict) -> None:
        if kind == "reset":
            self.index.clear()
            return
        ex: Exchange = item
        if kind == "sent" and not PROTOCOLS[self.shape].namespaces:  # one model, no cache_salt:
            ex.namespace = (None, None, ex.namespace[2])  # its cache is shared whatever they say
        if kind == "sent":
            found = ids.get(ex.seq)
            if found is None:  # a prompt the index cannot hold: what it caches is unknown
                self._rewarm(time.time())
                return
            req = Sent(key=ex.seq, namespace=ex.namespace, ids=found, sent=ex.sent, done=0.0,
                       cached=None, out=None)
            self.index.sent(req)
            return
        self._done(ex, self.index.inflight.get(ex.seq))  # None: never indexed

    def _done(self, ex: Exchange, req: Sent | None) -> None:
        overflowed = self.index.overflowed
        bound = None if req is None else self.index.done(req, ex.completion_tokens)
        if self.index.overflowed != overflowed:
            self._rewarm(time.time())
        if not ex.complete:
            ex.prompt, ex.auth = {}, None
            return  # cut off, refused or failed: the client got the upstream's own answer
        total, space = self.windows.tally(ex.namespace)
        self.metrics.requests.inc()
        for t in (total, space):
            t.requests += 1
            t.prompt_tokens += ex.prompt_tokens or 0
            t.cached_tokens += ex.cached or 0
        self.computed += max(0, (ex.prompt_tokens or 0) - (ex.cached or 0)) + (ex.completion_tokens or 0)
        why = self._judge(ex, req, bound)
        for t in (total, space):
            if why == "ok":
                t.judged += 1
            elif why in ("over_hit", "warmup"):
                t.judged += why == "over_hit"
                setattr(t, why + "s", getattr(t, why + "s") + 1)
            else:
                t.unreported += why == "unreported"
                t.unjudged += why != "unreported"
        if self.twins is not None and self.sampler.take():
            task = asyncio.get_running_loop().create_task(self._twin(ex))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)
        else:
            ex.prompt, ex.auth = {}, None  # the only copies are dropped here

    def _judge(self, ex: Exchange, req: Sent | None, bound: int | None) -> str:
        if ex.cached is None:
            self.metrics.unjudged.labels("unreported").inc()
            return "unreported"
        if req is None or ex.prompt_tokens != len(req.ids):
            self.metrics.unjudged.labels("ids").inc()  # not tokenized as the server did
            return "ids"
        bound = self.rule.bound(bound, len(req.ids))
        over = over_hit(ex.cached, bound)  # (the forgotten prefixes are hashed only then)
        kind = over_hit_kind(ex.cached, bound, self.warming,
                             over and self.index.explained(req, ex.cached))
        if kind == "unjudged":
            self.metrics.unjudged.labels("forgotten").inc()
            return kind
        self.metrics.judged.inc()
        if kind != "ok":
            self.metrics.over_hits.inc(kind == "over_hit")
            self.log.write({"type": "finding", "kind": kind, "time": ex.done,
                            "lag": round(time.time() - ex.done, 3), "request": ex.request_id,
                            "namespace": namespace_label(ex.namespace),
                            "prompt_tokens": len(req.ids), "cached": ex.cached, "bound": bound})
        return kind

    async def _twin(self, ex: Exchange) -> None:
        twin = await self.twins.judge(ex)
        ex.prompt, ex.auth = {}, None
        if twin is not None:
            self.record_twin(twin)

    def record_twin(self, twin: Twin) -> None:
        total, space = self.windows.tally(twin.namespace)
        self.metrics.twins.inc()
        for t in (total, space):
            t.twins += 1
            t.contaminated += twin.label == "contaminated"
            if twin.reached:
                t.reached += 1
                t.by_round[twin.rounds] += 1
                t.departures += twin.label == "corruption"
                t.numerics += twin.label == "numerics"
                t.departed_by_round[twin.rounds] += twin.label == "corruption"
        if twin.reached:
            self.metrics.reached.inc()
        if twin.reached and twin.label == "corruption":
            self.metrics.departures.inc()
            done = twin.done or twin.at
            self.log.write({"type": "finding", "kind": "departure", "time": done,
                            "lag": round(twin.at - done, 3), "request": twin.request_id,
                            "round": twin.rounds,
                            "namespace": namespace_label(twin.namespace),
                            "margin": _finite(twin.margin), "distance": twin.distance})


def _finite(x: float) -> float | None:
    return x if isinstance(x, float) and math.isfinite(x) else None
