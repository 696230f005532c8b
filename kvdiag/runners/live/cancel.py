"""A streamed request its client cancels: closed after some tokens (or before the first), and,
where the server aborts by a client-given id, aborted through that API at a set time. How
the lifecycle phase reaches the cancel-prefill and cancel-decode events."""

from __future__ import annotations

import asyncio
import time
import uuid

from kvdiag.engines import routes
from kvdiag.errors import EndpointError
from kvdiag.runners.live.endpoint import Endpoint


async def stream_and_close(endpoint: Endpoint, token_ids: list[int], after: int | None, *,
                           cache_salt: str | None = None, max_tokens: int = 64,
                           abort_after: float | None = None, id_slot: int | None = None) -> dict:
    """A streamed completion the client closes after `after` generated tokens (0: before
    the first; None: read to the end): the server sees a client go away mid-prefill or
    mid-decode. With `abort_after` on a server that has an abort API (SGLang's POST
    /abort_request, by the request's rid), the request is also aborted that many seconds
    after it was sent unless a token came first: SGLang notices a gone client only when it
    polls (once a second at best), by when a short prefill has ended. Returns when it was
    sent, its first token came (None: none before the close) and it was closed, how many
    tokens came, and when the server was asked to abort it (None: it was not)."""
    rid = f"kvdiag-{uuid.uuid4().hex}" if abort_after is not None and endpoint.abort_api else None
    body = {"model": endpoint.model, "prompt": list(token_ids), "max_tokens": max_tokens,
            "temperature": 0.0, "stream": True}
    if cache_salt:
        endpoint.protocol.namespace(body, cache_salt)
    endpoint.protocol.pin_reuse(body, endpoint.reuse_chunk)
    body |= {"rid": rid} if rid else {}
    if id_slot is not None:  # the slot it must run on, where the server has slots (llama.cpp)
        endpoint.protocol.pin_slot(body, id_slot)
    sent, state = time.time(), {"first": None, "seen": 0, "aborted": None}

    async def abort() -> None:
        await asyncio.sleep(abort_after)
        if state["first"] is None:
            state["aborted"] = time.time()
            await endpoint._async("POST", routes.ABORT, json={"rid": rid})

    killer = asyncio.create_task(abort()) if rid else None
    try:
        async with endpoint.client.stream("POST", "/v1/completions", json=body) as r:
            if r.status_code != 200:
                raise EndpointError(f"streamed completion answered HTTP {r.status_code}")
            if after != 0 or killer:
                async for line in r.aiter_lines():
                    if state["aborted"] is not None:
                        break  # what follows the abort is its notice, not a token
                    if not line.startswith("data:") or line.strip() == "data: [DONE]":
                        continue
                    state["seen"] += 1
                    state["first"] = state["first"] or time.time()
                    if after is not None and state["seen"] >= after:
                        break
    finally:
        if killer:
            if state["first"] is not None:
                killer.cancel()
            await asyncio.gather(killer, return_exceptions=True)
    return {"sent": sent, "first_token": state["first"], "closed": time.time(),
            "tokens_seen": state["seen"], "aborted": state["aborted"]}


async def cancel_request(endpoint: Endpoint, q, observed: dict, decode_after: int, **options) -> dict:
    """Lifecycle request `q` (a LifeRequest) streamed and cancelled as its group says: closed
    before its first token (cancel-prefill) or after `decode_after` tokens (cancel-decode);
    `options` go to stream_and_close. Recorded in observed["cancels"], as events.py reads it;
    the caller then sends `q` again, answered and judged."""
    after = 0 if q.group == "cancel-prefill" else decode_after
    seen = await stream_and_close(endpoint, list(q.ids), after, **options)
    observed.setdefault("cancels", []).append({"j": q.j, "group": q.group} | seen)
    return seen
