"""The server's routes, at module level: each reads what it serves from the app's state (a
Served: the engine, its asyncio front, the tokenizer, the served names and the metrics).
Bodies are parsed by the handlers themselves (strictly, and off the event loop when large),
so their request models are declared in the OpenAPI schema by hand (`body`)."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from reference_engine.serve.async_engine import AsyncEngine
from reference_engine.serve.inputs import encode_chat, encode_text, off_loop, parse_body
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
COMPONENTS: dict = {}  # the request models' schemas, merged into the app's OpenAPI schema
router = APIRouter()


def error(status: int, message: str, kind: str = "invalid_request_error", param: str | None = None):
    return JSONResponse(status_code=status, content={"error": {
        "message": message, "type": kind, "param": param, "code": status}})


def body(model) -> dict:
    """openapi_extra declaring `model` as a route's JSON body."""
    schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
    COMPONENTS.update(schema.pop("$defs", {}))
    COMPONENTS[model.__name__] = schema
    return {"requestBody": {"required": True, "content": {"application/json": {
        "schema": {"$ref": f"#/components/schemas/{model.__name__}"}}}}}


@dataclass
class Served:
    """What the routes serve. `lora_modules`: adapter names a request may give as its model
    (the engine has no adapter weights: the name only enters the block hashes)."""

    core: AsyncEngine
    model_name: str
    lora_modules: tuple[str, ...]
    metrics: object  # reference_engine.serve.metrics.Metrics

    @property
    def engine(self):
        return self.core.engine

    @property
    def tok(self):
        return self.core.engine.tokenizer

    def check_model(self, name: str | None) -> None:
        if name is not None and name != self.model_name and name not in self.lora_modules:
            raise UnknownModel(name)

    def adapter(self, name: str | None) -> str | None:
        return name if name in self.lora_modules else None


class UnknownModel(Exception):
    """A request named a model the server does not serve (404, as vLLM answers)."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.response = error(404, f"The model `{name}` does not exist.", kind="NotFoundError",
                              param="model")


def request_id(request: Request) -> str:
    """The client's X-Request-Id where it sent one (as vLLM takes it), else a fresh one."""
    return request.headers.get("x-request-id") or uuid.uuid4().hex


def served(request: Request) -> Served:
    return request.app.state.served


async def accept(request: Request, model) -> tuple[Served, object]:
    """The server's state and the request's body validated against `model`, for a model the
    server serves: RequestValidationError (400) or UnknownModel (404) otherwise."""
    s = served(request)
    req = await parse(request, model)
    s.check_model(req.model)
    return s, req


async def parse(request: Request, model):
    data = await request.body()
    return parse_body(model, data) if len(data) <= SMALL_BODY else await off_loop(parse_body, model, data)


@router.get("/health")
async def health() -> Response:
    return Response(status_code=200)


@router.get("/v1/models")
def models(request: Request):
    s, now = served(request), int(time.time())
    length = s.engine.max_model_len
    return {"object": "list", "data": [{
        "id": s.model_name, "object": "model", "created": now, "owned_by": "kvdiag",
        "root": str(s.engine.checkpoint.path.name), "max_model_len": length}] + [{
        "id": name, "object": "model", "created": now, "owned_by": "kvdiag", "root": name,
        "parent": s.model_name, "max_model_len": length} for name in s.lora_modules]}


@router.post("/tokenize", openapi_extra=body(TokenizeRequest))
async def tokenize(request: Request):
    s, req = await accept(request, TokenizeRequest)
    if (req.prompt is None) == (req.messages is None):
        return error(400, "give exactly one of prompt or messages")
    cap = 4 * s.engine.max_model_len  # no max_model_len cut-off: /tokenize counts; 4x bounds the work
    if req.messages is not None:
        ids = await off_loop(encode_chat, s.tok, [m.model_dump() for m in req.messages],
                             req.add_generation_prompt, cap)
    else:
        ids = await off_loop(encode_text, s.tok, req.prompt, cap, req.add_special_tokens)
    return {"count": len(ids), "max_model_len": s.engine.max_model_len, "tokens": ids, "token_strs": None}


@router.post("/detokenize", openapi_extra=body(DetokenizeRequest))
async def detokenize(request: Request):
    s, req = await accept(request, DetokenizeRequest)
    if any(not 0 <= t < s.engine.checkpoint.config.vocab_size for t in req.tokens):
        return error(400, "a token id is outside the vocabulary", param="tokens")
    return {"prompt": await off_loop(s.tok.decode, req.tokens)}


@router.post("/reset_prefix_cache")
def reset_prefix_cache(request: Request):
    s = served(request)
    with s.core.lock:
        done = s.engine.reset_prefix_cache()
    if not done:
        return error(409, "requests are in flight: the prefix cache cannot be reset now", kind="conflict")
    return Response(status_code=200)


@router.get("/metrics")
def prometheus(request: Request):
    return PlainTextResponse(served(request).metrics.render(), media_type="text/plain; version=0.0.4")


def _usage_of(req, ids: list[int]) -> int | None:
    """The prompt's length when a streaming client asked for its usage, else None."""
    return len(ids) if req.stream_options is not None and req.stream_options.include_usage else None


@router.post("/v1/completions", openapi_extra=body(CompletionRequest))
async def completions(request: Request):
    s, req = await accept(request, CompletionRequest)
    ids = (list(req.prompt) if isinstance(req.prompt, list)
           else await off_loop(encode_text, s.tok, req.prompt, s.engine.max_model_len))
    rid = f"cmpl-{request_id(request)}"
    stream = s.core.submit(ids, req.max_tokens or 16, req.cache_salt, req.logprobs, s.adapter(req.model),
                           req.ignore_eos, rid)
    if req.stream:
        return sse(completion_chunks(rid, s.model_name, stream, s.tok, req.logprobs,
                                     _usage_of(req, ids)), stream)
    return await unless_disconnected(
        request, stream, completion(rid, s.model_name, stream, s.tok, req.logprobs, len(ids)))


@router.post("/v1/chat/completions", openapi_extra=body(ChatCompletionRequest))
async def chat(request: Request):
    s, req = await accept(request, ChatCompletionRequest)
    ids = await off_loop(encode_chat, s.tok, [m.model_dump() for m in req.messages],
                         req.add_generation_prompt, s.engine.max_model_len)
    top = (req.top_logprobs or 0) if req.logprobs else None
    limit = req.max_completion_tokens or req.max_tokens or s.engine.max_model_len - len(ids)
    rid = f"chatcmpl-{request_id(request)}"
    stream = s.core.submit(ids, max(1, limit), req.cache_salt, top, s.adapter(req.model),
                           req.ignore_eos, rid)
    if req.stream:
        return sse(chat_chunks(rid, s.model_name, stream, s.tok, top, _usage_of(req, ids)), stream)
    return await unless_disconnected(
        request, stream, chat_completion(rid, s.model_name, stream, s.tok, top, len(ids)))
