"""The engine behind the HTTP server: one thread owns the LLMEngine and steps it while
requests are in flight; asyncio callers submit requests and await tokens. Concurrent
requests are batched by the engine's scheduler, as in any continuous-batching server.
A request whose caller goes away (its stream is aborted, or the awaiting task cancelled)
is dropped from the engine at the next step boundary and its KV blocks freed."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import queue
import threading
from dataclasses import dataclass, field

import torch

from reference_engine.engine import LLMEngine
from reference_engine.sequence import Sequence


@dataclass
class TokenEvent:
    token_id: int
    logprob: float | None = None
    top: list[tuple[int, float]] = field(default_factory=list)  # (token id, logprob), best first


@dataclass
class _Submission:
    prompt_ids: list[int]
    max_tokens: int
    cache_salt: str | None
    logprobs: int | None  # top-k to return per token, None: none
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue  # TokenEvent ..., then the finished Sequence
    seq: Sequence | None = None
    sent: int = 0
    aborted: bool = False  # set on the event loop; the engine thread drops the request
    lora_name: str | None = None  # the adapter the request names (a hash key only)
    ignore_eos: bool = False  # no stop token ends it: it decodes all max_tokens
    request_id: str | None = None  # the response's id, given to the engine's Sequence as its tag


def trim_heap() -> None:
    """Hand freed heap pages back to the OS. glibc keeps what a burst freed in its arenas
    (one per thread), so without this an idle server keeps its peak RSS; a no-op off glibc."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


class RequestAborted(Exception):
    """The request was aborted before it finished (its client went away)."""


class RequestStream:
    """Async iterator over one request's TokenEvents, then its finished Sequence. abort(),
    or cancelling the task that awaits the next item, aborts the request in the engine;
    the iterator then raises RequestAborted."""

    def __init__(self, core: AsyncEngine, sub: _Submission) -> None:
        self._core, self._sub, self.done = core, sub, False

    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self):
        if self.done and self._sub.events.empty():
            raise StopAsyncIteration
        try:
            item = await self._sub.events.get()
        except asyncio.CancelledError:
            self.abort()
            raise
        if isinstance(item, BaseException):
            self.done = True
            raise item
        if isinstance(item, Sequence):
            self.done = True
        return item

    def abort(self) -> None:
        """Drop the request unless it already finished (idempotent; event loop only)."""
        if self.done:
            return
        self.done = True
        self._core.abort(self._sub)


class AsyncEngine:
    def __init__(self, engine: LLMEngine) -> None:
        self.engine = engine
        self._inbox: queue.Queue[_Submission] = queue.Queue()
        self._aborts: queue.Queue[_Submission] = queue.Queue()
        self.num_aborted = 0  # requests dropped before they finished (kvdiag_requests_aborted_total)
        self._active: dict[Sequence, _Submission] = {}
        self._wake = threading.Event()
        self._stop = False
        self.foreign_slots_total = 0  # over finished requests (kvdiag_foreign_slots_total)
        self._trim_when_idle = False  # work was done since the heap was last trimmed
        self.lock = threading.Lock()  # guards reads of engine counters from other threads
        self._thread = threading.Thread(target=self._run, name="engine-loop", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop = True
        self._wake.set()
        self._thread.join(timeout=5)

    def submit(self, prompt_ids: list[int], max_tokens: int, cache_salt: str | None,
               logprobs: int | None, lora_name: str | None = None,
               ignore_eos: bool = False, request_id: str | None = None) -> RequestStream:
        """Validate now (raises on bad input, before any response starts), queue the request,
        and return its RequestStream. Call on the event loop."""
        self.engine.validate(prompt_ids, max_tokens, cache_salt)
        sub = _Submission(prompt_ids, max_tokens, cache_salt, logprobs, asyncio.get_running_loop(),
                          asyncio.Queue(), lora_name=lora_name, ignore_eos=ignore_eos,
                          request_id=request_id)
        self._inbox.put(sub)
        self._wake.set()
        return RequestStream(self, sub)

    def abort(self, sub: _Submission) -> None:
        sub.aborted = True
        sub.events.put_nowait(RequestAborted("the request was aborted"))
        self._aborts.put(sub)
        self._wake.set()

    # --- the engine thread -------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop:
            self._wake.clear()  # before draining: a submit or abort after this wakes the wait
            self._drain_inbox()
            self._drain_aborts()
            if not self.engine.has_unfinished():
                if self._trim_when_idle:
                    self._trim_when_idle = False
                    trim_heap()
                self._wake.wait(timeout=0.5)
                continue
            self._trim_when_idle = True
            try:
                with self.lock:
                    finished = self.engine.step()
            except Exception as e:  # a bug: fail every in-flight request, keep serving
                for sub in list(self._active.values()):
                    sub.loop.call_soon_threadsafe(sub.events.put_nowait, e)
                self._active.clear()
                self.engine.scheduler.waiting.clear()
                self.engine.scheduler.running.clear()
                self.engine.seq_states.clear()
                continue
            self._publish(finished)

    def _drain_inbox(self) -> None:
        for sub in _drained(self._inbox):
            if sub.aborted:  # gone before it reached the engine
                self.num_aborted += 1
                continue
            try:
                with self.lock:
                    sub.seq = self.engine.add_request(sub.prompt_ids, sub.max_tokens,
                                                      cache_salt=sub.cache_salt,
                                                      lora_name=sub.lora_name, tag=sub.request_id,
                                                      stop_ids=() if sub.ignore_eos else None)
            except Exception as e:
                sub.loop.call_soon_threadsafe(sub.events.put_nowait, e)
                continue
            self._active[sub.seq] = sub

    def _drain_aborts(self) -> None:
        for sub in _drained(self._aborts):
            if sub.seq is not None and self._active.pop(sub.seq, None) is not None:
                with self.lock:
                    self.engine.abort_request(sub.seq)
                self.num_aborted += 1

    def _publish(self, finished: list[Sequence]) -> None:
        logits = self.engine.runner.last_logits
        for seq, sub in list(self._active.items()):
            new = seq.output_ids[sub.sent:]
            for i, token in enumerate(new):
                event = TokenEvent(token)
                if sub.logprobs is not None and i == len(new) - 1 and seq in logits:
                    lp = torch.log_softmax(logits[seq].float(), -1)
                    event.logprob = float(lp[token])
                    k = max(1, sub.logprobs)
                    values, ids = lp.topk(k)
                    event.top = list(zip(ids.tolist(), values.tolist(), strict=True))
                sub.loop.call_soon_threadsafe(sub.events.put_nowait, event)
            sub.sent = len(seq.output_ids)
        for seq in finished:
            sub = self._active.pop(seq, None)
            if sub is not None:
                self.foreign_slots_total += seq.stats.foreign_slots
                sub.loop.call_soon_threadsafe(sub.events.put_nowait, seq)


def _drained(q: queue.Queue):
    """What `q` holds now, without waiting."""
    while True:
        try:
            yield q.get_nowait()
        except queue.Empty:
            return
