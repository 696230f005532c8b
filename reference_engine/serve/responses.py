"""OpenAI response bodies for the reference server (completions and chat, whole or as SSE
chunks), and the two ways a request is aborted when its client goes away: a watcher for
plain responses, and an SSE response that aborts its request however it ends."""

from __future__ import annotations

import asyncio
import json
import time

from fastapi import Request
from fastapi.responses import StreamingResponse

from reference_engine.errors import EngineError
from reference_engine.serve.async_engine import RequestAborted, RequestStream


async def unless_disconnected(request: Request, stream: RequestStream, work):
    """Await work (which reads stream); if the client disconnects first, abort the request
    (its blocks are freed at the engine's next step boundary) and answer 499."""
    task = asyncio.ensure_future(work)

    async def disconnected() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    watch = asyncio.ensure_future(disconnected())
    try:
        await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
    if not task.done():
        stream.abort()
        task.cancel()
        raise RequestAborted("the client disconnected")
    return task.result()


class _AbortingStream(StreamingResponse):
    """An SSE response that aborts its request however it ends: stream done (a no-op),
    client disconnect (Starlette cancels the response) or an error."""

    def __init__(self, content, request_stream: RequestStream) -> None:
        super().__init__(content, media_type="text/event-stream")
        self.request_stream = request_stream

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.request_stream.abort()


def sse(chunks, stream: RequestStream):
    async def body():
        try:
            async for chunk in chunks:
                yield f"data: {json.dumps(chunk)}\n\n"
        except EngineError as e:
            yield f"data: {json.dumps({'error': {'message': str(e), 'type': 'invalid_request_error', 'code': 400}})}\n\n"
        yield "data: [DONE]\n\n"

    return _AbortingStream(body(), stream)


def _usage(seq, prompt_tokens: int) -> dict:
    n = len(seq.output_ids)
    return {"prompt_tokens": prompt_tokens, "completion_tokens": n, "total_tokens": prompt_tokens + n,
            "prompt_tokens_details": {"cached_tokens": seq.stats.cached_tokens}}


def _token_str(tok, token_id: int) -> str:
    return tok.decode([token_id], skip_special_tokens=False)


def _chat_logprob(tok, event) -> dict:
    s = _token_str(tok, event.token_id)
    return {"token": s, "logprob": event.logprob, "bytes": list(s.encode()),
            "top_logprobs": [{"token": _token_str(tok, t), "logprob": lp, "bytes": list(_token_str(tok, t).encode())}
                             for t, lp in event.top]}


async def _collect(stream):
    events, seq = [], None
    async for item in stream:
        if hasattr(item, "token_id"):
            events.append(item)
        else:
            seq = item
    return events, seq


def _text(tok, seq) -> str:
    return tok.decode(seq.output_ids)


async def completion(rid, model, stream, tok, logprobs, n_prompt):
    events, seq = await _collect(stream)
    lp = None
    if logprobs is not None:
        lp = {"tokens": [_token_str(tok, e.token_id) for e in events],
              "token_logprobs": [e.logprob for e in events], "token_ids": [e.token_id for e in events],
              "top_logprobs": [{_token_str(tok, t): v for t, v in e.top} for e in events]}
    return {"id": rid, "object": "text_completion", "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "text": _text(tok, seq), "logprobs": lp,
                         "finish_reason": seq.finish_reason}], "usage": _usage(seq, n_prompt)}


async def chat_completion(rid, model, stream, tok, top, n_prompt):
    events, seq = await _collect(stream)
    lp = {"content": [_chat_logprob(tok, e) for e in events]} if top is not None else None
    return {"id": rid, "object": "chat.completion", "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": _text(tok, seq)},
                         "logprobs": lp, "finish_reason": seq.finish_reason}],
            "usage": _usage(seq, n_prompt)}


async def completion_chunks(rid, model, stream, tok, logprobs, usage_of=None):
    """`usage_of`: the prompt's length, when the client asked for stream_options.include_usage."""
    async for item in stream:
        base = {"id": rid, "object": "text_completion", "created": int(time.time()), "model": model}
        if hasattr(item, "token_id"):
            text = tok.decode([item.token_id])
            lp = ({"tokens": [_token_str(tok, item.token_id)], "token_logprobs": [item.logprob]}
                  if logprobs is not None else None)
            yield base | {"choices": [{"index": 0, "text": text, "logprobs": lp, "finish_reason": None}]}
        else:
            yield base | {"choices": [{"index": 0, "text": "", "logprobs": None,
                                       "finish_reason": item.finish_reason}]}
            if usage_of is not None:
                yield base | {"choices": [], "usage": _usage(item, usage_of)}


async def chat_chunks(rid, model, stream, tok, top, usage_of=None):
    first = True
    async for item in stream:
        base = {"id": rid, "object": "chat.completion.chunk", "created": int(time.time()), "model": model}
        if hasattr(item, "token_id"):
            delta = {"content": tok.decode([item.token_id])}
            if first:
                delta["role"], first = "assistant", False
            lp = {"content": [_chat_logprob(tok, item)]} if top is not None else None
            yield base | {"choices": [{"index": 0, "delta": delta, "logprobs": lp, "finish_reason": None}]}
        else:
            yield base | {"choices": [{"index": 0, "delta": {}, "logprobs": None,
                                       "finish_reason": item.finish_reason}]}
            if usage_of is not None:
                yield base | {"choices": [], "usage": _usage(item, usage_of)}
