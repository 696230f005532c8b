"""OpenAI-compatible HTTP server over the reference engine (FastAPI): /v1/models,
/v1/completions, /v1/chat/completions (plain and SSE streaming), /tokenize, /detokenize
in vLLM's shapes, /health, and /metrics with vLLM's metric names plus kvdiag's."""

from __future__ import annotations

import asyncio
import json
import time
import uuid

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException

from reference_engine.async_engine import AsyncEngine, RequestAborted, RequestStream
from reference_engine.engine import LLMEngine
from reference_engine.errors import EngineError
from reference_engine.http_guard import HttpGuard
from reference_engine.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    TokenizeRequest,
)
from reference_engine.server_inputs import encode_chat, encode_text, off_loop, parse_body

SMALL_BODY = 1 << 16  # bodies up to this size are parsed on the event loop, larger ones off it


def error(status: int, message: str, kind: str = "invalid_request_error", param: str | None = None):
    return JSONResponse(status_code=status, content={"error": {
        "message": message, "type": kind, "param": param, "code": status}})


def default_max_body_bytes(max_model_len: int) -> int:
    """1 MiB, or 32 bytes per token of max_model_len if that is more (a prompt sent as
    token ids takes about 7 bytes a token, as text with JSON escapes rarely more than 24)."""
    return max(1 << 20, 32 * max_model_len)


def create_app(engine: LLMEngine, model_name: str, *, max_body_bytes: int | None = None,
               api_key: str | None = None) -> FastAPI:
    """The server's app. Bodies over max_body_bytes get 413 (default:
    default_max_body_bytes); with api_key set, all but /health and /metrics need
    `Authorization: Bearer api_key`."""
    app = FastAPI(title="kvdiag reference engine", version="0.1.0")
    limit = max_body_bytes or default_max_body_bytes(engine.max_model_len)
    app.add_middleware(HttpGuard, max_body_bytes=limit, api_key=api_key)
    core = AsyncEngine(engine)
    tok = engine.tokenizer
    app.state.core = core
    metrics = _Metrics(core, model_name)
    body_schemas = _openapi_bodies(app)

    @app.on_event("shutdown")
    def _shutdown() -> None:
        core.close()

    @app.exception_handler(RequestValidationError)
    async def _invalid(_request: Request, exc: RequestValidationError):
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(x) for x in first.get("loc", ()) if x != "body")
        message = first.get("msg", "invalid request")
        if first.get("type") == "json_invalid":
            detail = message.removeprefix("Invalid JSON: ")
            message, where = f"the request body is not valid JSON ({detail})", ""
        return error(400, f"{where}: {message}" if where else message, param=where or None)

    @app.exception_handler(HTTPException)
    async def _http(_request: Request, exc: HTTPException):
        kind = "NotFoundError" if exc.status_code == 404 else "invalid_request_error"
        return error(exc.status_code, str(exc.detail), kind=kind)

    @app.exception_handler(EngineError)
    async def _engine_error(_request: Request, exc: EngineError):
        return error(400, str(exc))

    @app.exception_handler(RequestAborted)
    async def _aborted(_request: Request, _exc: RequestAborted):
        return error(499, "the client closed the request", kind="client_closed_request")

    @app.exception_handler(Exception)
    async def _bug(_request: Request, exc: Exception):
        return error(500, f"internal error: {type(exc).__name__}", kind="internal_server_error")

    def check_model(name: str | None):
        if name is not None and name != model_name:
            return error(404, f"The model `{name}` does not exist.", kind="NotFoundError", param="model")
        return None

    async def parse(request: Request, model):
        body = await request.body()
        return parse_body(model, body) if len(body) <= SMALL_BODY else await off_loop(parse_body, model, body)

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200)

    @app.get("/v1/models")
    def models():
        return {"object": "list", "data": [{
            "id": model_name, "object": "model", "created": int(time.time()), "owned_by": "kvdiag",
            "root": str(engine.checkpoint.path.name), "max_model_len": engine.max_model_len}]}

    @app.post("/tokenize", openapi_extra=body_schemas(TokenizeRequest))
    async def tokenize(request: Request):
        req = await parse(request, TokenizeRequest)
        if (bad := check_model(req.model)) is not None:
            return bad
        if (req.prompt is None) == (req.messages is None):
            return error(400, "give exactly one of prompt or messages")
        # no max_model_len cut-off here: /tokenize counts; 4x the limit bounds the work
        cap = 4 * engine.max_model_len
        if req.messages is not None:
            ids = await off_loop(encode_chat, tok, [m.model_dump() for m in req.messages],
                                 req.add_generation_prompt, cap)
        else:
            ids = await off_loop(encode_text, tok, req.prompt, cap, req.add_special_tokens)
        return {"count": len(ids), "max_model_len": engine.max_model_len, "tokens": ids, "token_strs": None}

    @app.post("/detokenize", openapi_extra=body_schemas(DetokenizeRequest))
    async def detokenize(request: Request):
        req = await parse(request, DetokenizeRequest)
        if (bad := check_model(req.model)) is not None:
            return bad
        if any(not 0 <= t < engine.checkpoint.config.vocab_size for t in req.tokens):
            return error(400, "a token id is outside the vocabulary", param="tokens")
        return {"prompt": await off_loop(tok.decode, req.tokens)}

    @app.post("/reset_prefix_cache")
    def reset_prefix_cache():
        with core.lock:
            busy = engine.has_unfinished()
            done = not busy and engine.allocator.reset_prefix_cache()
        if not done:
            return error(409, "requests are in flight: the prefix cache cannot be reset now",
                         kind="conflict")
        return Response(status_code=200)

    @app.get("/metrics")
    def prometheus():
        return PlainTextResponse(metrics.render(), media_type="text/plain; version=0.0.4")

    @app.post("/v1/completions", openapi_extra=body_schemas(CompletionRequest))
    async def completions(request: Request):
        req = await parse(request, CompletionRequest)
        if (bad := check_model(req.model)) is not None:
            return bad
        ids = (list(req.prompt) if isinstance(req.prompt, list)
               else await off_loop(encode_text, tok, req.prompt, engine.max_model_len))
        stream = core.submit(ids, req.max_tokens or 16, req.cache_salt, req.logprobs)
        rid = f"cmpl-{uuid.uuid4().hex}"
        if req.stream:
            return _sse(_completion_chunks(rid, model_name, stream, tok, req.logprobs), stream)
        return await _unless_disconnected(
            request, stream, _completion(rid, model_name, stream, tok, req.logprobs, len(ids)))

    @app.post("/v1/chat/completions", openapi_extra=body_schemas(ChatCompletionRequest))
    async def chat(request: Request):
        req = await parse(request, ChatCompletionRequest)
        if (bad := check_model(req.model)) is not None:
            return bad
        ids = await off_loop(encode_chat, tok, [m.model_dump() for m in req.messages],
                             req.add_generation_prompt, engine.max_model_len)
        top = (req.top_logprobs or 0) if req.logprobs else None
        limit = req.max_completion_tokens or req.max_tokens or engine.max_model_len - len(ids)
        stream = core.submit(ids, max(1, limit), req.cache_salt, top)
        rid = f"chatcmpl-{uuid.uuid4().hex}"
        if req.stream:
            return _sse(_chat_chunks(rid, model_name, stream, tok, top), stream)
        return await _unless_disconnected(
            request, stream, _chat(rid, model_name, stream, tok, top, len(ids)))

    return app


def _openapi_bodies(app: FastAPI):
    """Handlers read their bodies themselves (to parse strictly and off the event loop), so
    FastAPI cannot see the request models: declare them in the OpenAPI schema by hand."""
    components: dict = {}
    base = app.openapi

    def openapi() -> dict:
        if app.openapi_schema is None:
            schema = base()
            schema.setdefault("components", {}).setdefault("schemas", {}).update(components)
        return app.openapi_schema

    def body(model) -> dict:
        schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
        components.update(schema.pop("$defs", {}))
        components[model.__name__] = schema
        return {"requestBody": {"required": True, "content": {"application/json": {
            "schema": {"$ref": f"#/components/schemas/{model.__name__}"}}}}}

    app.openapi = openapi
    return body


async def _unless_disconnected(request: Request, stream: RequestStream, work):
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


def _sse(chunks, stream: RequestStream):
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


async def _completion(rid, model, stream, tok, logprobs, n_prompt):
    events, seq = await _collect(stream)
    lp = None
    if logprobs is not None:
        lp = {"tokens": [_token_str(tok, e.token_id) for e in events],
              "token_logprobs": [e.logprob for e in events], "token_ids": [e.token_id for e in events],
              "top_logprobs": [{_token_str(tok, t): v for t, v in e.top} for e in events]}
    return {"id": rid, "object": "text_completion", "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "text": _text(tok, seq), "logprobs": lp,
                         "finish_reason": seq.finish_reason}], "usage": _usage(seq, n_prompt)}


async def _chat(rid, model, stream, tok, top, n_prompt):
    events, seq = await _collect(stream)
    lp = {"content": [_chat_logprob(tok, e) for e in events]} if top is not None else None
    return {"id": rid, "object": "chat.completion", "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": _text(tok, seq)},
                         "logprobs": lp, "finish_reason": seq.finish_reason}],
            "usage": _usage(seq, n_prompt)}


async def _completion_chunks(rid, model, stream, tok, logprobs):
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


async def _chat_chunks(rid, model, stream, tok, top):
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


class _Metrics:
    """vLLM's metric names (so dashboards built for vLLM work) plus kvdiag's own."""

    def __init__(self, core: AsyncEngine, model_name: str) -> None:
        self.core, self.labels = core, {"model_name": model_name}

    def render(self) -> str:
        from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

        eng = self.core.engine
        with self.core.lock:
            values = {
                "vllm:prefix_cache_queries": (Counter, "Prefix cache queries, in tokens.", eng.scheduler.prefix_cache_queries),
                "vllm:prefix_cache_hits": (Counter, "Prefix cache hits, in tokens.", eng.scheduler.prefix_cache_hits),
                "vllm:num_preemptions": (Counter, "Cumulative number of preemptions.", eng.scheduler.num_preemptions),
                "kvdiag_guard_rejections": (Counter, "Stale cache entries the SequenceGuard dropped.", eng.allocator.guard_rejections),
                "kvdiag_foreign_slots": (Counter, "KV slots read whose writer's prefix differs from the reader's.", self.core.foreign_slots_total),
                "kvdiag_requests_aborted": (Counter, "Requests dropped before they finished (client gone).", self.core.num_aborted),
                "vllm:kv_cache_usage_perc": (Gauge, "KV-cache usage. 1 means 100 percent usage.", eng.allocator.usage()),
                "vllm:num_requests_running": (Gauge, "Requests in the running batch.", len(eng.scheduler.running)),
                "vllm:num_requests_waiting": (Gauge, "Requests waiting to be scheduled.", len(eng.scheduler.waiting)),
            }
        registry = CollectorRegistry()
        # vLLM's info gauge: the probe plans its jump and pressure from the real block size and pool
        info = {"block_size": str(eng.allocator.block_size), "num_gpu_blocks": str(eng.allocator.num_blocks),
                "enable_prefix_caching": str(eng.config.enable_prefix_caching)}
        Gauge("vllm:cache_config_info", "Information of the LLMEngine CacheConfig.", list(info),
              registry=registry).labels(**info).set(1)
        for name, (kind, doc, value) in values.items():
            metric = kind(name, doc, list(self.labels), registry=registry)
            child = metric.labels(**self.labels)
            if kind is Counter:
                child.inc(value)
            else:
                child.set(value)
        return generate_latest(registry).decode()
