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
    NoTextOpt,
    OneCaseOpt,
    OutOpt,
    Output,
    ResumeOpt,
    SessionsFormatOpt,
    SessionsOpt,
    StyleOpt,
    SuiteOpt,
    TargetModelOpt,
    handle_errors,
    help_panels,
)


@handle_errors
@help_panels(
    Target=("base_url", "target", "model", "api_key", "engine_args", "block_size", "num_blocks",
            "prefill_chunk", "count_with"),
    Traffic=("suite", "case", "style", "sessions", "sessions_format", "concurrency", "think_scale",
             "adapter", "twins", "spread"),
    Phases=("differential", "differential_only", "lifecycle", "require", "isolation",
            "floor_sessions"),
    Judging=("numerics_margin", "sentinel"),
    Output=("no_text", "resume", "out_dir", "as_json"))
def probe(
    base_url: BaseUrlOpt = None,
    model: TargetModelOpt = None,
    target: Annotated[str | None, typer.Option("--target", show_default=False, help="Instead of "
                                               "--base-url: vllm-local[:FAULT], sglang-local[:FAULT] or "
                                               "llamacpp-local[:FAULT], a real vLLM, SGLang or "
                                               "llama-server that kvdiag starts and stops (`make "
                                               "vllm-cpu-env`, `make sglang-cpu-env`, `make "
                                               "llamacpp-env`), optionally with a fault planted "
                                               "(`kvdiag detect --list`); llamacpp-local serves a GGUF "
                                               "(--model FILE.gguf; default SmolLM2 from `make "
                                               "real-model`).")] = None,
    suite: SuiteOpt = "reproduce",
    case: OneCaseOpt = None,
    style: StyleOpt = None,
    api_key: ApiKeyOpt = None,
    concurrency: ConcurrencyOpt = 16,
    think_scale: Annotated[float, typer.Option("--think-scale", min=0.0, help="Seconds per think step "
                                               "between a session's turns.")] = 0.02,
    numerics_margin: Annotated[float, typer.Option("--numerics-margin", min=0.0, help="Nats: a divergence "
                                                   "at a smaller margin counts as numerics, a larger one "
                                                   "as corruption; two isolated runs of one request that "
                                                   "part at a larger one make the ground truth unstable "
                                                   "(error).")] = 1.0,
    floor_sessions: Annotated[int, typer.Option("--floor-sessions", min=1, help="Sessions whose isolated "
                                                "rounds are repeated to measure the noise floor.")] = 4,
    count_with: Annotated[str, typer.Option("--count-with", help="How to count prompt tokens while "
                                            "planning: tokenize (vLLM's /tokenize; falls back to usage "
                                            "on 404) or usage (usage.prompt_tokens of 1-token requests).")] = "tokenize",
    block_size: BlockSizeOpt = None,
    num_blocks: Annotated[int | None, typer.Option("--num-blocks", min=1, show_default=False, help="The "
                                                   "server's KV pool in blocks, likewise (sizes the "
                                                   "pressure that makes it recycle).")] = None,
    adapter: Annotated[str | None, typer.Option("--adapter", show_default=False, help="A LoRA adapter "
                                                "the server serves: rounds alternate between the base "
                                                "model and it, each judged against an isolated twin of "
                                                "its own model (reaches an adapter missing from the "
                                                "block hash). A target kvdiag starts makes its own: "
                                                "canary-lora (vllm-local on the canary), kvdiag-lora "
                                                "(llamacpp-local, from the GGUF).")] = None,
    isolation: Annotated[str, typer.Option("--isolation", help="How isolated runs are made: auto "
                                           "(a fresh cache_salt each where the server takes it), salt "
                                           "(required), or reset (POST /reset_prefix_cache before each, "
                                           "one at a time).")] = "auto",
    twins: Annotated[bool, typer.Option("--twins/--no-twins", help="Send each shared request with a "
                                        "one-token twin that frees their shared blocks early (reaches "
                                        "blocks freed while still read).")] = True,
    spread: Annotated[bool, typer.Option("--spread/--no-spread", help="Cut each session's system prompt "
                                         "so that sessions diverge at every slot offset of a block "
                                         "(reaches block hashes that leave part of a block out).")] = True,
    differential: Annotated[bool, typer.Option("--differential/--no-differential", help="First send "
                                               "pairs of short requests identical but for one part of a "
                                               "block's key (each slot offset, a range, token order, the "
                                               "parent chain, salt, adapter, a cache reset), each checked "
                                               "by the over-hit oracle and against its isolated twin.")] = True,
    differential_only: Annotated[bool, typer.Option("--differential-only", help="Only the differential "
                                                    "phase: a quick key-coverage check of a production "
                                                    "server (seconds; no recycling needed).")] = False,
    lifecycle: Annotated[bool, typer.Option("--lifecycle/--no-lifecycle", help="Drive every event of a "
                                            "block's life on purpose (preemption, cancellation mid-prefill "
                                            "and mid-decode, chunked prefill, an admission backlog, "
                                            "concurrent same-prefix prefills), sized from the server's "
                                            "pool, each answer checked against its isolated twin.")] = True,
    require: Annotated[str | None, typer.Option("--require", show_default=False, help="Events the run "
                                                "must reach, comma-separated (recycle, early-free, "
                                                "preemption, cancel-prefill, cancel-decode, "
                                                "chunked-prefill, backlog, concurrent-prefill; on "
                                                "llama.cpp ram-cache, slot-restore, slot-erase; or all: "
                                                "every row of the run's table): a run that misses one "
                                                "is inconclusive (exit 2).")] = None,
    prefill_chunk: Annotated[int | None, typer.Option("--prefill-chunk", min=1, show_default=False,
                                                      help="The server's prefill chunk in tokens "
                                                      "(vLLM's --max-num-batched-tokens) where it does "
                                                      "not report it (SGLang does).")] = None,
    sentinel: Annotated[str | None, typer.Option("--sentinel", show_default=False, help="The file a "
                                                 "sentinel inside the server writes (kvdiag's "
                                                 "plugin, docs/sentinel.md): every foreign or "
                                                 "unwritten KV read it saw during the run fails it. "
                                                 "On by default for vllm-local and sglang-local targets "
                                                 "and llama.cpp's faults and fixes (in the run "
                                                 "directory); 'on' turns it on for the stock "
                                                 "llamacpp-local (a build of its own, the stock tree "
                                                 "and the sentinel's patch), 'off' off. For a "
                                                 "server on another machine, the URL its plugin "
                                                 "serves the file at (KVDIAG_SENTINEL_ADDR).")] = None,
    engine_args: Annotated[list[str] | None, typer.Option(
        "--engine-arg", show_default=False, help="A flag for the server a local target starts, "
        "appended to its command line (repeat it; a flag and its value as one string: "
        "--engine-arg='-np 2'); the configuration row the run measures, kept in summary.json "
        "(server.engine_args). Local targets only.")] = None,
    sessions: SessionsOpt = None,
    sessions_format: SessionsFormatOpt = "auto",
    no_text: NoTextOpt = False,
    resume: ResumeOpt = None,
    out_dir: OutOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Probe a live server: every round twice, sharing the cache and isolated with a fresh
    cache_salt; classify each divergence as numerics or corruption against a measured noise
    floor. The plan follows the server's own block size and pool, and adds pressure sessions
    until freed blocks are recycled. Every request's reported cached tokens are held against the
    most the requests sent before it could have cached for it (the over-hit oracle). Every
    isolated request must report 0 cached tokens. Exit 0: no corruption and no over-hit, with
    recycling observed and a proved, stable ground truth; 1: corruption or an over-hit found
    (named); 2: the run could not be made (server down, bad suite, an adapter it does not serve),
    the server never recycled a block (inconclusive: the trigger was not reached), or the ground
    truth is unsound (error: isolated requests hit the cache, reported no count, or two of them
    disagreed decisively).

    Example: kvdiag probe --base-url http://127.0.0.1:8000 --model canary --suite smoke

    Example: kvdiag probe --target vllm-local:stale-hash --suite smoke
    """
    from kvdiag.commands.probe import parse_events
    from kvdiag.commands.probe import probe as run
    from kvdiag.commands.probe_args import ProbeArgs
    from kvdiag.runners.live.phases import ProbeSettings

    out = Output(as_json)
    settings = ProbeSettings(concurrency=concurrency, think_scale=think_scale, block_size=block_size,
                             floor_sessions=floor_sessions, numerics_margin=numerics_margin,
                             num_blocks=num_blocks, adapter=adapter, isolation=isolation,
                             twins=twins, spread=spread, differential=differential or differential_only,
                             differential_only=differential_only, lifecycle=lifecycle,
                             require=parse_events(require), prefill_chunk=prefill_chunk)
    args = ProbeArgs(suite=suite, case=case, style=style, sessions=sessions,
                     sessions_format=sessions_format, base_url=base_url, target=target, model=model,
                     api_key=api_key, settings=settings, count_with=count_with, sentinel=sentinel,
                     engine_args=tuple(engine_args or ()), no_text=no_text, out_dir=out_dir,
                     resume=resume)
    out.finish(run(args, info=out.info, warn=out.warn, progress=out.progress))
