"""kvdiag regress, kvdiag baseline update, kvdiag history: the weekly regression job."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from kvdiag.cli.common import (
    DEFAULT_HISTORY,
    EXIT_ERROR,
    ApiKeyOpt,
    CaseOpt,
    ConcurrencyOpt,
    DeviceOpt,
    DtypeOpt,
    HistoryOpt,
    JsonOpt,
    OutOpt,
    Output,
    SessionsFormatOpt,
    SessionsOpt,
    SuiteFilterOpt,
    SuiteOpt,
    TargetModelOpt,
    enable_engine_log,
    handle_errors,
)

BaselineOpt = Annotated[Path, typer.Option("--baseline", help="Baseline file (JSON; one baseline "
                                           "per engine, version, model, flags and suite).")]
DEFAULT_BASELINE = Path("reports/baselines.json")


@handle_errors
def regress(
    suite: SuiteOpt = "weekly",
    target: Annotated[str, typer.Option("--target", help="reference:ALLOCATOR (the in-process "
                                        "reference engine), vllm-local[:FAULT] (a real vLLM kvdiag "
                                        "starts, optionally with a planted fault), "
                                        "sglang-local[:FAULT] and llamacpp-local[:FAULT] (the same "
                                        "for SGLang and llama.cpp) or the URL of "
                                        "an OpenAI-compatible server.")] = "reference:guarded",
    model: TargetModelOpt = None,
    baseline: BaselineOpt = DEFAULT_BASELINE,
    history: HistoryOpt = DEFAULT_HISTORY,
    junit: Annotated[Path | None, typer.Option("--junit", help="Write JUnit XML here.")] = None,
    out_dir: OutOpt = None,
    case: CaseOpt = None,
    tolerance: Annotated[list[str] | None, typer.Option("--tolerance", show_default=False, help="Override "
                                                        "a tolerance; the format is NAME=VALUE, e.g. "
                                                        "bleu4=2 (repeatable).")] = None,
    flag: Annotated[list[str] | None, typer.Option("--flag", help="An extra baseline key flag, NAME=VALUE "
                                                   "(e.g. tp=2): what the server cannot report.")] = None,
    api_key: ApiKeyOpt = None,
    concurrency: ConcurrencyOpt = 16,
    device: DeviceOpt = "cpu",
    dtype: DtypeOpt = None,
    sessions: SessionsOpt = None,
    sessions_format: SessionsFormatOpt = "auto",
    as_json: JsonOpt = False,
) -> None:
    """Run a suite against a target, compare every metric with the baseline of the same
    engine, version, model, flags and suite under stated tolerances, append the run to the
    history, and write the HTML report (with the trend over past runs) and JUnit XML.

    Exit code: 0 pass; 1 a metric regressed or the run's own ground-truth check found
    corruption (the metrics and rounds are named); 2 the run could not be made, the
    baseline file holds baselines of this suite but none with this run's key (a key
    mismatch is reported, never compared), or the run proves nothing (inconclusive: the
    trigger was not reached, even when every metric matches its baseline; error: the
    probe's ground truth hit the cache). Without any baseline of the suite only the
    ground-truth check gates. A live server runs one case.

    Example: kvdiag regress --suite weekly --target reference:guarded --junit reports/junit.xml
    """
    from kvdiag.commands import regress as job
    from kvdiag.regress.baselines import KeyMismatch
    from kvdiag.regress.compare import Tolerances
    from kvdiag.regress.keys import parse_flags

    out = Output(as_json)
    opts = job.Options(suite=suite, target=target, model=model, cases=case, baseline=baseline,
                       history=history, junit=junit, out=out_dir,
                       tolerances=Tolerances().with_overrides(tolerance or []), device=device,
                       dtype=dtype, api_key=api_key, flags=parse_flags(flag), concurrency=concurrency,
                       sessions=sessions, sessions_format=sessions_format)
    enable_engine_log()
    try:
        out.finish(job.run(opts, info=out.info, warn=out.warn, progress=out.progress))
    except KeyMismatch as e:
        out.key_mismatch(e)
        raise typer.Exit(EXIT_ERROR) from None


baseline_app = typer.Typer(help="Regression baselines.", no_args_is_help=True)


@baseline_app.command("update")
@handle_errors
def baseline_update(
    run_dir: Annotated[Path, typer.Argument(metavar="RUN_DIR", help="A run directory made by `kvdiag regress`.")],
    baseline: BaselineOpt = DEFAULT_BASELINE,
    force: Annotated[bool, typer.Option("--force", help="Accept a run whose verdict is not pass "
                                        "(inconclusive, error or fail); recorded in the history.")] = False,
    history_path: HistoryOpt = DEFAULT_HISTORY,
    as_json: JsonOpt = False,
) -> None:
    """Make RUN_DIR the baseline of its key (engine, version, model, flags, suite), replacing
    the one stored for that key; baselines of other keys stay. Only a run that passed becomes
    a baseline (exit 2 otherwise) unless --force; every update is recorded in the history.

    Example: kvdiag baseline update reports/regress-weekly-20261130-221500
    """
    from datetime import datetime, timezone

    from kvdiag.regress import baselines as B
    from kvdiag.regress import history as H

    new, verdict = B.from_run(run_dir, force=force)
    replaced, count = B.update(baseline, new)
    H.record_baseline(history_path, {
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "baseline_file": str(baseline), "key_id": new.key.id, "run_id": new.run_id,
        "verdict": verdict.value, "forced": int(not verdict.passed),
        "reason": None if verdict.passed else f"--force: the run's verdict was {verdict.value}"})
    was = f" (replacing run {replaced.run_id})" if replaced else ""
    Output(as_json).show(
        {"baseline": str(baseline), "key_id": new.key.id, "run_id": new.run_id,
         "replaced": replaced.run_id if replaced else None, "baselines": count},
        f"{baseline}: baseline of suite {new.key.suite} key {new.key.id} is now run "
        f"{new.run_id} ({new.target}){was}; {count} baseline(s) in the file")


@handle_errors
def history(
    suite: SuiteFilterOpt = None,
    target: Annotated[str | None, typer.Option("--target", help="Only this target.")] = None,
    last: Annotated[int, typer.Option("--last", min=1, help="The last N runs.")] = 20,
    history_path: HistoryOpt = DEFAULT_HISTORY,
    as_json: JsonOpt = False,
) -> None:
    """Past regression runs, oldest first: verdict, SQDR, BRAI, cache divergence (--json adds
    the engine, version, model, baseline key and run directory).

    Example: kvdiag history --suite weekly --last 10
    """
    from kvdiag.regress import history as H
    from kvdiag.report.terminal_gates import history_records, history_table

    frame = H.runs(history_path, suite=suite, target=target, last=last)
    Output(as_json).show(history_records(frame),
                         history_table(frame, f"{history_path}: {len(frame)} run(s)"))
