"""kvdiag reproduce and kvdiag verify: the trigger against guarded and faulty allocators in
the reference engine, per-round decay, and a gate with an exit code."""

from __future__ import annotations

from typing import Annotated

import typer

from kvdiag.cli.common import (
    AllocatorOpt,
    CaseOpt,
    EngineRun,
    JsonOpt,
    OneCaseOpt,
    Output,
    SuiteOpt,
    enable_engine_log,
    handle_errors,
    option_groups,
)

SpacyOpt = Annotated[str | None, typer.Option(
    "--spacy-model", show_default=False, help="An installed spaCy model for fact-checking. "
    "Default: a blank English pipeline.")]
AllocatorsOpt = Annotated[list[str] | None, typer.Option(
    "--allocator", show_default=False, help="Allocators to compare, repeated or comma-separated: "
    "prefix-cache, stale-hash/buggy, stale-bytes, unchained-hash, salt-collision, guarded, "
    "guarded:NAME, vllm. Default: the suite's, e.g. buggy,guarded.")]
HiddenList = Annotated[str | None, typer.Option(hidden=True)]


@handle_errors
@option_groups
def reproduce(
    suite: SuiteOpt = "reproduce",
    case: CaseOpt = None,
    allocator: AllocatorsOpt = None,
    spacy_model: SpacyOpt = None,
    engine: EngineRun = EngineRun(),
    as_json: JsonOpt = False,
    cases: HiddenList = None,
    allocators: HiddenList = None,
) -> None:
    """Reproduce KV block-reuse corruption: the suite's sessions through the contiguous
    reference and through the paged engine under each allocator, per round.

    Prints a table per round (reuse, leakage, BLEU-4, fact-check, foreign slots) and a verdict;
    writes results.parquet, summary.json and report.html into a new run directory. Exit code:
    0 every allocator expected clean (guarded, prefix-cache, ablations) stayed flat and every
    faulty one showed its corruption; 1 a clean one did not stay flat; 2 bad input, or the
    trigger was not reproduced (a faulty allocator showed nothing: the run proves nothing).

    Example: kvdiag reproduce --case trigger --allocator buggy,guarded
    """
    from kvdiag.commands.reproduce import reproduce as run

    out = Output(as_json)
    enable_engine_log()
    out.finish(run(suite, (case or []) + ([cases] if cases else []),
                   (allocator or []) + ([allocators] if allocators else []),
                   spacy_model=spacy_model, progress=out.progress, **engine.pipeline_args()))


@handle_errors
@option_groups
def verify(
    expect_guard: Annotated[bool, typer.Option("--expect-guard", help="Gate: pass only if the guard "
                                               "was logged and held in every round.")] = False,
    expect_bug: Annotated[bool, typer.Option("--expect-bug", help="Positive control: pass only if "
                                             "the fault is detected.")] = False,
    allocator: AllocatorOpt = "guarded",
    suite: SuiteOpt = "reproduce",
    case: OneCaseOpt = None,
    engine: EngineRun = EngineRun(),
    as_json: JsonOpt = False,
) -> None:
    """Gate a release on the trigger: exit 0 pass, 1 the check failed, 2 bad input.

    --expect-guard passes only if the engine printed "Using SequenceGuard for block
    allocation." and, in every round: zero foreign and unwritten slots, zero leakage,
    BLEU-4 = 100, fact-check pass rate equal to the reference's, and BRAI <= 0.05 (expected
    reuse from the guarded allocator on the same suite). --expect-bug passes only if the
    fault is detected (the positive control).

    Example: kvdiag verify --expect-guard --allocator guarded --suite smoke
    """
    from kvdiag.commands.verify import verify as run

    out = Output(as_json)
    enable_engine_log()
    out.finish(run(allocator, expect_guard, expect_bug, suite, case, progress=out.progress,
                   **engine.pipeline_args()))
