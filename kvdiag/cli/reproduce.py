"""kvdiag reproduce and kvdiag verify: the trigger against guarded and faulty allocators in
the reference engine, per-round decay, and a gate with an exit code."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from kvdiag.cli.common import (
    EXIT_FAIL,
    EXIT_PASS,
    DeviceOpt,
    DtypeOpt,
    JsonOpt,
    Output,
    enable_engine_log,
    handle_errors,
)
from kvdiag.errors import KvdiagError

SuiteOpt = Annotated[str, typer.Option("--suite", help="Suite YAML file, or the name of a bundled "
                                       "suite (reproduce, smoke, weekly).")]
OutOpt = Annotated[Path | None, typer.Option("--out", help="Run directory (default: "
                                             "reports/SUITE-TIME).")]
ModelOpt = Annotated[Path | None, typer.Option("--model", help="Local HF model directory; default: "
                                               "the suite's model, else the bundled canary.")]
SpacyOpt = Annotated[str | None, typer.Option("--spacy-model", help="An installed spaCy model for "
                                              "fact-checking (default: a blank English pipeline).")]


def _progress(out: Output, total: int):
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), console=out.err, transient=True, disable=out.as_json)


def execute(suite_name: str, cases_spec: str | None, allocators: list[str] | None, model, device,
            dtype, spacy_model, out_dir, out: Output):
    """Run, write the run directory and its report; return (run_dir, summary)."""
    from kvdiag.pipeline import run_suite, total_requests
    from kvdiag.report.html import write_report
    from kvdiag.runs import Timer, command_line, new_run_dir, now_iso, write_run
    from kvdiag.suites import load_suite

    suite = load_suite(suite_name)
    cases = suite.select(cases_spec)
    if not cases:
        raise KvdiagError(f"{suite.path}: no case selected by {cases_spec!r}")
    enable_engine_log()
    timer = Timer()
    with _progress(out, total_requests(suite, cases, allocators)) as bar:
        task = bar.add_task("running", total=total_requests(suite, cases, allocators))
        run = run_suite(suite, cases, allocators=allocators, model=model, device=device, dtype=dtype,
                        spacy_model=spacy_model, progress=lambda n: bar.advance(task, n),
                        on_case=lambda name: bar.update(task, description=f"case {name}"))
    summary = run.summary | {"wall_seconds": round(timer.seconds, 2), "command": command_line(),
                             "created": now_iso()}
    run_dir = new_run_dir(out_dir, suite.name)
    write_run(run_dir, run.frame, summary)
    write_report(run_dir)
    return run_dir, summary


@handle_errors
def reproduce(
    suite: SuiteOpt = "reproduce",
    cases: Annotated[str | None, typer.Option("--cases", help="Cases to run: names separated by "
                                              "commas, 'all', or 'ablations' (default: the suite's "
                                              "default cases).")] = None,
    allocators: Annotated[str | None, typer.Option("--allocators", help="Allocators to compare, "
                                                   "comma-separated (default: the suite's, e.g. "
                                                   "buggy,guarded).")] = None,
    model: ModelOpt = None,
    device: DeviceOpt = "cpu",
    dtype: DtypeOpt = None,
    out_dir: OutOpt = None,
    spacy_model: SpacyOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Reproduce KV block-reuse corruption: the suite's sessions through the contiguous
    reference and through the paged engine under each allocator, per round.

    Prints a per-round table (reuse, leakage, BLEU-4, fact-check, foreign slots) and a
    verdict, and writes results.parquet, summary.json and report.html into the run directory.
    Exit code: 0 when every allocator expected to be clean (guarded, prefix-cache, every
    ablation) stayed flat, 1 otherwise, 2 on bad input.
    """
    out = Output(as_json)
    names = [a.strip() for a in allocators.split(",") if a.strip()] if allocators else None
    run_dir, summary = execute(suite, cases, names, model, device, dtype, spacy_model, out_dir, out)
    if as_json:
        out.json(summary)
    else:
        from kvdiag.cli.render import rounds_table, verdict_lines

        for case in summary["cases"]:
            out.out.print(rounds_table(summary, case))
        out.out.print(f"signature: {summary['signature']}")
        colour = "green" if summary["verdict"] == "pass" else "red"
        out.out.print(f"verdict: [bold {colour}]{summary['verdict'].upper()}[/]")
        for line in verdict_lines(summary):
            out.out.print(line)
        out.out.print(f"wall time {summary['wall_seconds']:.1f} s; results in {run_dir}/ "
                      f"(report.html, results.parquet, summary.json)")
    raise typer.Exit(EXIT_PASS if summary["verdict"] == "pass" else EXIT_FAIL)


@handle_errors
def verify(
    expect_guard: Annotated[bool, typer.Option("--expect-guard", help="Gate: pass only if the "
                                               "allocator logged the guard and stayed flat in "
                                               "every round.")] = False,
    expect_bug: Annotated[bool, typer.Option("--expect-bug", help="Positive control: pass only if "
                                             "the fault is detected.")] = False,
    allocator: Annotated[str, typer.Option("--allocator", help="Allocator under test.")] = "guarded",
    suite: SuiteOpt = "reproduce",
    case: Annotated[str | None, typer.Option("--case", help="Case to run (default: the suite's "
                                             "first default case).")] = None,
    model: ModelOpt = None,
    device: DeviceOpt = "cpu",
    dtype: DtypeOpt = None,
    out_dir: OutOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Gate a release on the trigger: exit 0 pass, 1 the check failed, 2 bad input.

    --expect-guard passes only if the engine printed "Using SequenceGuard for block
    allocation." and, in every round: zero foreign and unwritten slots, zero leakage,
    BLEU-4 = 100, fact-check pass rate equal to the reference's, and BRAI <= 0.05 (expected
    reuse from the guarded allocator on the same suite). --expect-bug passes only if the
    fault is detected (the positive control).
    """
    from kvdiag.pipeline import guard_logged
    from kvdiag.regress.verdicts import fault_findings, guard_gate, series
    from kvdiag.runners.reference import CONTIGUOUS
    from kvdiag.suites import load_suite

    out = Output(as_json)
    if expect_guard == expect_bug:
        raise KvdiagError("give exactly one of --expect-guard or --expect-bug")
    loaded = load_suite(suite)
    chosen = loaded.case(case) if case else (loaded.select(None) or list(loaded.cases))[0]
    names = [allocator] if allocator == "guarded" else [allocator, "guarded"]
    run_dir, summary = execute(suite, chosen.name, names, model, device, dtype, None, out_dir, out)
    rounds = [r for r in summary["rounds"] if r.get("case") == chosen.name]
    rows, reference = series(rounds, chosen.name, allocator), series(rounds, chosen.name, CONTIGUOUS)
    if expect_guard:
        gate = guard_gate(rows, reference)
        failures = list(gate.failures)
        if not guard_logged(summary["engine_log"], chosen.name, allocator):
            failures.insert(0, 'the engine did not log "Using SequenceGuard for block allocation."')
        passed = not failures
        detail = failures
    else:
        detail = fault_findings(rows, reference)
        passed = bool(detail)
    verdict = {"gate": "expect-guard" if expect_guard else "expect-bug", "allocator": allocator,
               "case": chosen.name, "passed": passed, "findings": detail, "run_dir": str(run_dir),
               "failing_rounds": sorted({int(d.split(':')[0].split()[1]) for d in detail if d.startswith('round ')})}
    if as_json:
        out.json(verdict)
    else:
        gate_name = verdict["gate"]
        if passed:
            what = "guard held in every round" if expect_guard else f"fault detected ({len(detail)} findings)"
            out.out.print(f"[bold green]PASS[/] {gate_name} --allocator {allocator}: {what}")
        else:
            what = (f"failing rounds {verdict['failing_rounds']}" if expect_guard
                    else "no corruption detected")
            out.out.print(f"[bold red]FAIL[/] {gate_name} --allocator {allocator}: {what}")
        if expect_guard and not passed:
            for line in detail[:20]:
                out.out.print(f"  {line}")
        out.out.print(f"run directory: {run_dir}")
    raise typer.Exit(EXIT_PASS if passed else EXIT_FAIL)
