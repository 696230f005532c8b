"""kvdiag compare: two targets (an engine before and after an upgrade, or with and without a
patch) probed on the same sessions; one page with both decay curves and a verdict per target."""

from __future__ import annotations

from typing import Annotated

import typer

from kvdiag.cli.common import (
    ApiKeyOpt,
    ConcurrencyOpt,
    JsonOpt,
    NoTextOpt,
    OutOpt,
    Output,
    SessionsFormatOpt,
    SessionsOpt,
    SuiteOpt,
    TargetModelOpt,
    handle_errors,
)


@handle_errors
def compare(
    targets: Annotated[list[str], typer.Option("--target", show_default=False, help="A target to "
                                               "probe; give it twice or more: an http(s) URL (with "
                                               "--model), or vllm-local[:FAULT] / sglang-local[:FAULT] / llamacpp-local[:FAULT], "
                                               "an engine kvdiag starts and stops itself.")],
    sessions: SessionsOpt = None,
    sessions_format: SessionsFormatOpt = "auto",
    suite: SuiteOpt = "reproduce",
    case: Annotated[list[str] | None, typer.Option("--case", show_default=False, help="The suite's case whose scale (sessions, rounds) every probe replays; one. Default: the suite's first default case.")] = None,
    model: TargetModelOpt = None,
    api_key: ApiKeyOpt = None,
    concurrency: ConcurrencyOpt = 16,
    differential: Annotated[bool, typer.Option("--differential/--no-differential", help="Each probe's "
                                               "key-coverage phase (kvdiag probe --help).")] = True,
    lifecycle: Annotated[bool, typer.Option("--lifecycle/--no-lifecycle", help="Each probe's "
                                            "lifecycle phase (kvdiag probe --help).")] = True,
    require: Annotated[str | None, typer.Option("--require", show_default=False, help="Events every "
                                                "probe must reach, as kvdiag probe takes them.")] = None,
    adapter: Annotated[str | None, typer.Option("--adapter", show_default=False, help="A LoRA adapter "
                                                "every target serves, as kvdiag probe takes it "
                                                "(canary-lora for vllm-local on the canary, "
                                                "kvdiag-lora for llamacpp-local).")] = None,
    no_text: NoTextOpt = False,
    out_dir: OutOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Compare targets on the same sessions: probe each one after the other, exactly as
    `kvdiag probe` does (shared and cache-isolated runs of every round, pressure until the
    pool recycles, the over-hit oracle, the noise floor), each into its own run directory
    inside this one. Each target is judged against its own isolated twin, never against the
    other engine's numerics, so two versions that differ in their last digits can both pass.
    RUN/report.html draws every target's per-round BLEU-4 and fact-check pass rate together,
    with a verdict per target; RUN/summary.json lists them. Exit 0: every target passed; 1: a
    target failed (corruption or an over-hit); 2: none failed but one could not be judged
    (inconclusive, a dead server, an engine that did not start) or bad input.

    Example: kvdiag compare --target vllm-local --target vllm-local:stale-hash --model
    MODEL_DIR --suite natural --sessions examples/sessions.jsonl

    Example: kvdiag compare --target http://old:8000 --target http://new:8000 --model NAME
    --sessions mine.jsonl --no-text
    """
    from kvdiag.commands.compare import compare as run
    from kvdiag.commands.probe import parse_events
    from kvdiag.commands.probe_args import ProbeArgs
    from kvdiag.runners.live.phases import ProbeSettings

    out = Output(as_json)
    settings = ProbeSettings(concurrency=concurrency, differential=differential, lifecycle=lifecycle,
                             require=parse_events(require), adapter=adapter)
    args = ProbeArgs(suite=suite, case=case, model=model, api_key=api_key, settings=settings,
                     sessions=sessions, sessions_format=sessions_format, no_text=no_text)
    result = run(targets, args, out_dir=out_dir, info=out.info, warn=out.warn, progress=out.progress)
    if not as_json:
        for t in result.summary.targets:
            out.out.print(f"{t.verdict.value.upper():12} {t.target}: {t.reason}", markup=False)
    out.finish(result)
