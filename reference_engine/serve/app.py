"""OpenAI-compatible HTTP server over the reference engine (FastAPI): /v1/models,
/v1/completions, /v1/chat/completions (plain and SSE streaming), /tokenize, /detokenize
in vLLM's shapes, /health, and /metrics with vLLM's metric names plus kvdiag's (routes.py,
metrics.py).

Hostile input: bodies are size-limited and key-checked (limits.py), parsed strictly and
tokenized off the event loop (inputs.py); every input fault is an OpenAI-shaped 4xx. A
request whose client disconnects is aborted and its KV blocks freed (responses.py)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException

from reference_engine.config import EngineConfig
from reference_engine.engine import LLMEngine
from reference_engine.errors import EngineError
from reference_engine.serve.async_engine import AsyncEngine, RequestAborted
from reference_engine.serve.limits import HttpGuard
from reference_engine.serve.metrics import Metrics
from reference_engine.serve.routes import COMPONENTS, Served, UnknownModel, error, router


def default_max_body_bytes(max_model_len: int) -> int:
    """1 MiB, or 32 bytes per token of max_model_len if that is more (a prompt sent as
    token ids takes about 7 bytes a token, as text with JSON escapes rarely more than 24)."""
    return max(1 << 20, 32 * max_model_len)


async def _invalid(_request: Request, exc: RequestValidationError):
    first = exc.errors()[0] if exc.errors() else {}
    where = ".".join(str(x) for x in first.get("loc", ()) if x != "body")
    message = first.get("msg", "invalid request")
    if first.get("type") == "json_invalid":
        detail = message.removeprefix("Invalid JSON: ")
        message, where = f"the request body is not valid JSON ({detail})", ""
    return error(400, f"{where}: {message}" if where else message, param=where or None)


async def _http(_request: Request, exc: HTTPException):
    kind = "NotFoundError" if exc.status_code == 404 else "invalid_request_error"
    return error(exc.status_code, str(exc.detail), kind=kind)


async def _engine_error(_request: Request, exc: EngineError):
    return error(400, str(exc))


async def _aborted(_request: Request, _exc: RequestAborted):
    return error(499, "the client closed the request", kind="client_closed_request")


async def _unknown_model(_request: Request, exc: UnknownModel):
    return exc.response


async def _bug(_request: Request, exc: Exception):
    return error(500, f"internal error: {type(exc).__name__}", kind="internal_server_error")


HANDLERS = {RequestValidationError: _invalid, HTTPException: _http, EngineError: _engine_error,
            RequestAborted: _aborted, UnknownModel: _unknown_model, Exception: _bug}


def create_app(engine: LLMEngine, model_name: str, *, max_body_bytes: int | None = None,
               api_key: str | None = None, lora_modules: tuple[str, ...] = ()) -> FastAPI:
    """The server's app. Bodies over max_body_bytes get 413 (default:
    default_max_body_bytes); with api_key set, all but /health and /metrics need
    `Authorization: Bearer api_key`. `lora_modules`: adapter names a request may give as
    its model, as with vLLM's --lora-modules. The engine has no adapter weights: the name
    only enters the request's block hashes (what the salt-collision fault mixes up)."""
    app = FastAPI(title="kvdiag reference engine", version="0.1.0")
    app.add_middleware(HttpGuard, max_body_bytes=max_body_bytes or default_max_body_bytes(
        engine.max_model_len), api_key=api_key)
    core = AsyncEngine(engine)
    app.state.core = core
    app.state.served = Served(core, model_name, tuple(lora_modules), Metrics(core, model_name))
    app.router.add_event_handler("shutdown", core.close)
    for kind, handler in HANDLERS.items():
        app.add_exception_handler(kind, handler)
    app.include_router(router)
    base = app.openapi

    def openapi() -> dict:  # the request models the handlers parse themselves (routes.body)
        if app.openapi_schema is None:
            base().setdefault("components", {}).setdefault("schemas", {}).update(COMPONENTS)
        return app.openapi_schema

    app.openapi = openapi
    return app


def serve(model: str | Path, config: EngineConfig, *, host: str = "127.0.0.1", port: int = 8000,
          served_model_name: str | None = None, max_body_bytes: int | None = None,
          api_key: str | None = None, lora_modules: tuple[str, ...] = (),
          announce: Callable[[str], None] = print,
          watch: Callable[[LLMEngine], object] | None = None) -> None:
    """Load `model` into an engine and serve it with uvicorn until interrupted, as
    `served_model_name` (default: the directory's name); `announce` is told where; `watch`
    is handed the engine before it serves (kvdiag's sentinel attaches itself)."""
    import uvicorn

    name = served_model_name or Path(model).name
    engine = LLMEngine(Path(model), config)
    if watch is not None:
        watch(engine)
    app = create_app(engine, name, max_body_bytes=max_body_bytes,
                     api_key=api_key or None, lora_modules=tuple(lora_modules))
    auth = ", API key required" if api_key else ""  # never the key itself
    announce(f"serving {name} ({config.allocator}) on http://{host}:{port}{auth}")
    uvicorn.run(app, host=host, port=port, log_level="warning")
