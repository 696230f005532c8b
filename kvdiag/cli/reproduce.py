"""kvdiag reproduce and kvdiag verify: the trigger against guarded and faulty allocators in
the reference engine, per-round decay, and a gate with an exit code."""

from __future__ import annotations

import os
from typing import Annotated

import typer

from kvdiag.cli.common import (
    AllocatorOpt,
    CaseOpt,
    CheckIntegrityOpt,
    DeviceOpt,
    DtypeOpt,
    JsonOpt,
    ModelOpt,
    NoCacheOpt,
    OneCaseOpt,
    OutOpt,
    Output,
    SuiteOpt,
    check_allocators,
    enable_engine_log,
    handle_errors,
    load_cases,
    names,
)
from kvdiag.errors import KvdiagError

SpacyOpt = Annotated[str | None, typer.Option("--spacy-model", show_default=False, help="An installed "
                                              "spaCy model for fact-checking. Default: a blank English "
                                              "pipeline.")]
AllocatorsOpt = Annotated[list[str] | None, typer.Option(
    "--allocator", show_default=False, help="Allocator to compare; repeat it or separate names by "
    "commas (prefix-cache, stale-hash/buggy, stale-bytes, unchained-hash, salt-collision, guarded, "
    "guarded:NAME, vllm). Default: the suite's, e.g. buggy,guarded.")]
HiddenList = Annotated[str | None, typer.Option(hidden=True)]


def run(kind: str, suite: str, cases, allocators, model, device, dtype, spacy_model, out_dir,
        out: Output, check_integrity: bool = False, amend=None, no_cache: bool = False):
    """Validate everything, run the suite, `amend` the result (verify's gate), finish the
    run directory: a RunResult."""
    from kvdiag.lifecycle import finish_run
    from kvdiag.pipeline import run_suite, total_requests
    from kvdiag.runs import RunDir, Timer

    timer = Timer()
    check_allocators([a for a in allocators or [] if a != "vllm"])
    loaded, chosen = load_cases(suite, cases)
    if model is not None and not model.is_dir():
        raise KvdiagError(f"--model {model}: not a model directory")
    run_dir = RunDir.begin(out_dir, loaded.name)
    if check_integrity:
        os.environ["KVDIAG_CHECK_INTEGRITY"] = "1"
    enable_engine_log()
    with out.progress("running", total_requests(loaded, chosen, allocators)) as update:
        result = run_suite(loaded, chosen, allocators=allocators, model=model, device=device,
                           dtype=dtype, spacy_model=spacy_model, kind=kind, use_cache=not no_cache,
                           progress=lambda n: update(advance=n),
                           on_case=lambda name: update(description=f"case {name}"))
    if amend is not None:
        amend(result)
    return finish_run(result, run_dir, timer)


@handle_errors
def reproduce(
    suite: SuiteOpt = "reproduce",
    case: CaseOpt = None,
    allocator: AllocatorsOpt = None,
    model: ModelOpt = None,
    device: DeviceOpt = "cpu",
    dtype: DtypeOpt = None,
    out_dir: OutOpt = None,
    spacy_model: SpacyOpt = None,
    check_integrity: CheckIntegrityOpt = False,
    no_reference_cache: NoCacheOpt = False,
    as_json: JsonOpt = False,
    cases: HiddenList = None,
    allocators: HiddenList = None,
) -> None:
    """Reproduce KV block-reuse corruption: the suite's sessions through the contiguous
    reference and through the paged engine under each allocator, per round.

    Prints a per-round table (reuse, leakage, BLEU-4, fact-check, foreign slots) and a
    verdict, and writes results.parquet, summary.json and report.html into a new run
    directory. Exit code: 0 every allocator expected clean (guarded, prefix-cache, every
    ablation) stayed flat and every faulty one showed its corruption; 1 a clean allocator
    did not stay flat; 2 bad input, or the trigger was not reproduced (a faulty allocator
    showed nothing: the run proves nothing).

    Example: kvdiag reproduce --case trigger --allocator buggy,guarded
    """
    out = Output(as_json)
    chosen = names((case or []) + ([cases] if cases else []))
    result = run("reproduce", suite, chosen, names((allocator or []) + ([allocators] if allocators else [])),
                 model, device, dtype, spacy_model, out_dir, out, check_integrity,
                 no_cache=no_reference_cache)
    out.finish(result)


@handle_errors
def verify(
    expect_guard: Annotated[bool, typer.Option("--expect-guard", help="Gate: pass only if the "
                                               "allocator logged the guard and stayed flat in "
                                               "every round.")] = False,
    expect_bug: Annotated[bool, typer.Option("--expect-bug", help="Positive control: pass only if "
                                             "the fault is detected.")] = False,
    allocator: AllocatorOpt = "guarded",
    suite: SuiteOpt = "reproduce",
    case: OneCaseOpt = None,
    model: ModelOpt = None,
    device: DeviceOpt = "cpu",
    dtype: DtypeOpt = None,
    out_dir: OutOpt = None,
    check_integrity: CheckIntegrityOpt = False,
    no_reference_cache: NoCacheOpt = False,
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
    from kvdiag.verdicts import gate_verdict

    out = Output(as_json)
    if expect_guard == expect_bug:
        raise KvdiagError("give exactly one of --expect-guard or --expect-bug")
    check_allocators([allocator])
    _, (chosen,) = load_cases(suite, case, one=True)
    pair = [allocator] if allocator == "guarded" else [allocator, "guarded"]

    def amend(result) -> None:  # verify's own verdict is the run's, in summary.json too
        gate = gate_verdict(result.summary, result.extra["engine_log"], chosen.name, allocator,
                            expect_guard)
        result.summary |= {"gate": gate, "run_verdict": result.summary["verdict"],
                           "verdict": "pass" if gate["passed"] else "fail"}

    out.finish(run("verify", suite, [chosen.name], pair, model, device, dtype, None, out_dir, out,
                   check_integrity, amend, no_reference_cache))
