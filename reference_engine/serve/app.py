"""OpenAI-compatible HTTP server over the reference engine (FastAPI): /v1/models,
/v1/completions, /v1/chat/completions (plain and SSE streaming), /tokenize, /detokenize
in vLLM's shapes, /health, and /metrics with vLLM's metric names plus kvdiag's.

Hostile input: bodies are size-limited and key-checked (http_guard), parsed strictly and
tokenized off the event loop (server_inputs); every input fault is an OpenAI-shaped 4xx.
A request whose client disconnects is aborted and its KV blocks freed (server_responses)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from starlette.exceptions import HTTPException

from reference_engine.config import EngineConfig
from reference_engine.engine import LLMEngine
from reference_engine.errors import EngineError
from reference_engine.serve.async_engine import AsyncEngine, RequestAborted
from reference_engine.serve.inputs import encode_chat, encode_text, off_loop, parse_body
from reference_engine.serve.limits import HttpGuard
from reference_engine.serve.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    TokenizeRequest,
)
from reference_engine.serve.responses import (
    chat_chunks,
    chat_completion,
    completion,
    completion_chunks,
    sse,
    unless_disconnected,
)

SMALL_BODY = 1 << 16  # bodies up to this size are parsed on the event loop, larger ones off it


def error(status: int, message: str, kind: str = "invalid_request_error", param: str | None = None):
    return JSONResponse(status_code=status, content={"error": {
        "message": message, "type": kind, "param": param, "code": status}})


def default_max_body_bytes(max_model_len: int) -> int:
    """1 MiB, or 32 bytes per token of max_model_len if that is more (a prompt sent as
    token ids takes about 7 bytes a token, as text with JSON escapes rarely more than 24)."""
    return max(1 << 20, 32 * max_model_len)


def create_app(engine: LLMEngine, model_name: str, *, max_body_bytes: int | None = None,
               api_key: str | None = None, lora_modules: tuple[str, ...] = ()) -> FastAPI:
    """The server's app. Bodies over max_body_bytes get 413 (default:
    default_max_body_bytes); with api_key set, all but /health and /metrics need
    `Authorization: Bearer api_key`. `lora_modules`: adapter names a request may give as
    its model, as with vLLM's --lora-modules. The engine has no adapter weights: the name
    only enters the request's block hashes (what the salt-collision fault mixes up)."""
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
        if name is not None and name != model_name and name not in lora_modules:
            return error(404, f"The model `{name}` does not exist.", kind="NotFoundError", param="model")
        return None

    def adapter(name: str | None) -> str | None:
        return name if name in lora_modules else None

    async def parse(request: Request, model):
        body = await request.body()
        return parse_body(model, body) if len(body) <= SMALL_BODY else await off_loop(parse_body, model, body)

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200)

    @app.get("/v1/models")
    def models():
        now = int(time.time())
        return {"object": "list", "data": [{
            "id": model_name, "object": "model", "created": now, "owned_by": "kvdiag",
            "root": str(engine.checkpoint.path.name), "max_model_len": engine.max_model_len}] + [{
            "id": name, "object": "model", "created": now, "owned_by": "kvdiag", "root": name,
            "parent": model_name, "max_model_len": engine.max_model_len} for name in lora_modules]}

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
        stream = core.submit(ids, req.max_tokens or 16, req.cache_salt, req.logprobs, adapter(req.model))
        rid = f"cmpl-{uuid.uuid4().hex}"
        if req.stream:
            return sse(completion_chunks(rid, model_name, stream, tok, req.logprobs), stream)
        return await unless_disconnected(
            request, stream, completion(rid, model_name, stream, tok, req.logprobs, len(ids)))

    @app.post("/v1/chat/completions", openapi_extra=body_schemas(ChatCompletionRequest))
    async def chat(request: Request):
        req = await parse(request, ChatCompletionRequest)
        if (bad := check_model(req.model)) is not None:
            return bad
        ids = await off_loop(encode_chat, tok, [m.model_dump() for m in req.messages],
                             req.add_generation_prompt, engine.max_model_len)
        top = (req.top_logprobs or 0) if req.logprobs else None
        limit = req.max_completion_tokens or req.max_tokens or engine.max_model_len - len(ids)
        stream = core.submit(ids, max(1, limit), req.cache_salt, top, adapter(req.model))
        rid = f"chatcmpl-{uuid.uuid4().hex}"
        if req.stream:
            return sse(chat_chunks(rid, model_name, stream, tok, top), stream)
        return await unless_disconnected(
            request, stream, chat_completion(rid, model_name, stream, tok, top, len(ids)))

    return app


def serve(model: str | Path, config: EngineConfig, *, host: str = "127.0.0.1", port: int = 8000,
          served_model_name: str | None = None, max_body_bytes: int | None = None,
          api_key: str | None = None, lora_modules: tuple[str, ...] = (),
          announce: Callable[[str], None] = print) -> None:
    """Load `model` into an engine and serve it with uvicorn until interrupted, as
    `served_model_name` (default: the directory's name); `announce` is told where."""
    import uvicorn

    name = served_model_name or Path(model).name
    app = create_app(LLMEngine(Path(model), config), name, max_body_bytes=max_body_bytes,
                     api_key=api_key or None, lora_modules=tuple(lora_modules))
    auth = ", API key required" if api_key else ""  # never the key itself
    announce(f"serving {name} ({config.allocator}) on http://{host}:{port}{auth}")
    uvicorn.run(app, host=host, port=port, log_level="warning")


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
                "kvdiag_evicted_blocks": (Counter, "Cached blocks recycled for new K/V (their cached content discarded).", eng.allocator.num_evicted),
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
