"""kvdiag serve: the reference engine behind an OpenAI-compatible API."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from kvdiag.cli.common import (
    DEFAULT_MODEL,
    AllocatorOpt,
    DeviceOpt,
    DtypeOpt,
    ModelOpt,
    Output,
    enable_engine_log,
    handle_errors,
)


@handle_errors
def serve(
    model: ModelOpt = DEFAULT_MODEL,
    allocator: AllocatorOpt = "guarded",
    host: Annotated[str, typer.Option("--host", help="Address to bind.")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", min=0, max=65535, help="Port to bind.")] = 8000,
    served_model_name: Annotated[str | None, typer.Option(
        "--served-model-name", help="Model name clients send (default: the directory's name).")] = None,
    num_blocks: Annotated[int | None, typer.Option("--num-blocks", min=1, help="KV blocks in the pool "
                                                   "(default: room for max-num-seqs full requests).")] = None,
    max_num_seqs: Annotated[int, typer.Option("--max-num-seqs", min=1, help="Requests batched at once.")] = 32,
    max_num_batched_tokens: Annotated[int, typer.Option(
        "--max-num-batched-tokens", min=16, help="Tokens computed per step; a longer prompt is "
        "prefilled in chunks of this many (chunked prefill).")] = 8192,
    long_prefill_token_threshold: Annotated[int | None, typer.Option(
        "--long-prefill-token-threshold", min=1, show_default=False, help="At most this many of one "
        "request's prompt tokens per step (as vLLM's), so other requests are admitted beside a "
        "long prefill.")] = None,
    max_model_len: Annotated[int | None, typer.Option("--max-model-len", min=16, help="Longest "
                                                      "prompt + completion (default: 8704).")] = 8704,
    no_prefix_caching: Annotated[bool, typer.Option("--no-prefix-caching", help="Switch the prefix cache off.")] = False,
    recycled_block_fill: Annotated[float | None, typer.Option(
        "--recycled-block-fill", help="Fill recycled blocks with this value before the allocator "
        "sees them (nan models vLLM #35138's other tenant).")] = None,
    device: DeviceOpt = "cpu",
    dtype: DtypeOpt = None,
    max_body_bytes: Annotated[int | None, typer.Option(
        "--max-body-bytes", min=1, help="Largest request body; a larger one gets 413 "
        "(default: 1 MiB, or 32 bytes per token of --max-model-len if that is more).")] = None,
    api_key: Annotated[str | None, typer.Option(
        "--api-key", envvar="KVDIAG_API_KEY", show_default=False, help="Require 'Authorization: "
        "Bearer KEY' (401 otherwise) on all but /health and /metrics, which stay open. Prefer the "
        "environment variable: a command line is visible to other users.")] = None,
    lora_modules: Annotated[list[str] | None, typer.Option(
        "--lora-modules", show_default=False, help="An adapter name requests may give as their "
        "model, as in vLLM (repeatable). No adapter weights are loaded: the name enters the "
        "request's block hashes only.")] = None,
    sentinel: Annotated[Path | None, typer.Option(
        "--sentinel", show_default=False, help="Write the sentinel's file here: every KV read "
        "checked against the writer of its slot, as inside vLLM (docs/sentinel.md).")] = None,
) -> None:
    """Serve the reference engine over an OpenAI-compatible API (FastAPI + uvicorn).

    Endpoints: /v1/models, /v1/completions, /v1/chat/completions (plain and SSE streaming,
    logprobs, cache_salt), /tokenize, /detokenize, /reset_prefix_cache, /health, /metrics
    (vLLM's metric names plus kvdiag_guard_rejections_total, kvdiag_foreign_slots_total and
    kvdiag_requests_aborted_total). A request whose client disconnects is aborted and its KV
    blocks freed. With --api-key, /health and /metrics stay open; all else needs the key.

    Example: kvdiag serve --allocator guarded --port 8000
    """
    from reference_engine.config import EngineConfig
    from reference_engine.serve.app import serve as run_server

    watch = None
    if sentinel is not None:
        from kvdiag.errors import KvdiagError
        from kvdiag.sentinel.log import check_writable
        from kvdiag.sentinel.reference import ReferenceSentinel

        try:
            check_writable(sentinel)  # before the model loads
        except OSError as e:
            raise KvdiagError(f"--sentinel {sentinel}: {e.strerror or e}") from None

        def watch(engine):
            return ReferenceSentinel(engine, sentinel)
    enable_engine_log()
    config = EngineConfig(allocator=allocator, num_blocks=num_blocks, max_num_seqs=max_num_seqs,
                          max_num_batched_tokens=max_num_batched_tokens,
                          long_prefill_token_threshold=long_prefill_token_threshold,
                          max_model_len=max_model_len, enable_prefix_caching=not no_prefix_caching,
                          device=device, dtype=dtype, recycled_block_fill=recycled_block_fill)
    run_server(model, config, host=host, port=port, served_model_name=served_model_name,
               max_body_bytes=max_body_bytes, api_key=api_key, lora_modules=tuple(lora_modules or ()),
               announce=Output().info, watch=watch)
