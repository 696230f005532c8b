"""kvdiag regress, kvdiag baseline update, kvdiag history: the weekly regression job."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from kvdiag.cli.common import (
    EXIT_ERROR,
    ApiKeyOpt,
    CaseOpt,
    DeviceOpt,
    DtypeOpt,
    HistoryOpt,
    JsonOpt,
    OutOpt,
    Output,
    SuiteOpt,
    enable_engine_log,
    handle_errors,
    load_cases,
    names,
)

BaselineOpt = Annotated[Path, typer.Option("--baseline", help="Baseline file (JSON; one baseline "
                                           "per engine, version, model, flags and suite).")]
DEFAULT_BASELINE, DEFAULT_HISTORY = Path("reports/baselines.json"), Path("reports/history.sqlite")


def _pairs(values: list[str] | None, option: str) -> dict:
    out = {}
    for v in values or []:
        name, sep, value = v.partition("=")
        if not sep or not name.strip():
            raise ValueError(f"{option} {v!r}: expected NAME=VALUE")
        out[name.strip()] = value.strip()
    return out


@handle_errors
def regress(
    suite: SuiteOpt = "weekly",
    target: Annotated[str, typer.Option("--target", help="reference:ALLOCATOR (the in-process "
                                        "reference engine), vllm-local[:FAULT] (a real vLLM kvdiag "
                                        "starts, optionally with a planted fault: stale-hash, "
                                        "salt-ignored) or the URL of an OpenAI-compatible server.")] = "reference:guarded",
    model: Annotated[str | None, typer.Option("--model", help="reference: a local model directory "
                                              "(default: the suite's, else the canary); URL: the "
                                              "served model name (required).")] = None,
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
    concurrency: Annotated[int, typer.Option("--concurrency", min=1, help="URL targets: requests in flight.")] = 16,
    device: DeviceOpt = "cpu",
    dtype: DtypeOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Run a suite against a target, compare every metric with the baseline of the same
    engine, version, model, flags and suite under stated tolerances, append the run to the
    history, and write the HTML report (with the trend over past runs) and JUnit XML.

    Exit code: 0 pass; 1 a metric regressed or the run's own ground-truth check found
    corruption (the metrics and rounds are named); 2 the run could not be made, or the
    baseline file holds baselines of this suite but none with this run's key (a key
    mismatch is reported, never compared). Without any baseline of the suite only the
    ground-truth check gates. A live server runs one case.

    Example: kvdiag regress --suite weekly --target reference:guarded --junit reports/junit.xml
    """
    from kvdiag.paths import CANARY
    from kvdiag.regress import job
    from kvdiag.regress.compare import Tolerances
    from kvdiag.targets import live, parse_target

    out = Output(as_json)
    opts = job.Options(suite=suite, target=target, model=model, cases=",".join(names(case) or []) or None,
                       baseline=baseline, history=history, junit=junit, out=out_dir,
                       tolerances=Tolerances().with_overrides(tolerance or []), device=device,
                       dtype=dtype, api_key=api_key, flags=_pairs(flag, "--flag"),
                       concurrency=concurrency)
    spec = parse_target(target)
    if not spec.is_vllm_local:
        raise typer.Exit(_regress(out, opts, baseline))
    import tempfile

    loaded, (chosen,) = load_cases(suite, case, one=True)
    model_dir = Path(model or loaded.model or CANARY)
    logs = Path(tempfile.mkdtemp(prefix="kvdiag-vllm-"))
    out.info(f"starting vLLM for {spec.spec} (log: {logs / 'vllm.log'}) ...")
    with live(spec, loaded, chosen, model_dir, logs) as (started, served):
        opts.live_url, opts.model, opts.cases = started.url, served, chosen.name
        opts.attach = [logs / "vllm.log"]
        code = _regress(out, opts, baseline)
    raise typer.Exit(code)


def _regress(out: Output, opts, baseline: Path) -> int:
    """prepare, execute, render; the exit code."""
    from kvdiag.regress import job
    from kvdiag.regress.baselines import KeyMismatch

    try:
        prepared = job.prepare(opts)
    except KeyMismatch as e:
        _mismatch(out, e, opts)
        return EXIT_ERROR
    if prepared.baseline is None:
        out.warn(f"{baseline}: no baseline of suite {prepared.suite.name}; only the run's own "
                 "ground-truth check gates (record one with `kvdiag baseline update RUN_DIR`)")
    enable_engine_log()
    with prepared.run, out.progress(f"regress {prepared.target.spec}") as update:
        result = job.execute(prepared, opts, progress=update)
    if not result.summary.get("cold_cache", True):
        out.warn(f"{opts.target} refused POST /reset_prefix_cache: the run began on a warm cache, so "
                 "BRAI was not compared with the baseline")
    if out.as_json:
        out.json({"verdict": result.verdict, "run_dir": str(result.run_dir),
                  "cold_cache": result.summary.get("cold_cache"), **result.summary["regress"]})
    else:
        out.result(result)
    return result.exit_code


def _mismatch(out: Output, e, opts) -> None:
    if opts.junit is not None:
        from kvdiag.regress.junit import junit_xml, write_junit

        write_junit(opts.junit, junit_xml(e.key.suite, opts.target, [], error=str(e),
                                          properties={"key_id": e.key.id, "baseline_key_id": e.nearest.id}))
    if out.as_json:
        out.json({"verdict": "error", "error": "key mismatch", "differences": e.differences,
                  "key": e.key.as_dict(), "baseline_key": e.nearest.as_dict()})
    out.error(f"{e.path}: the baseline of suite {e.key.suite} has another key; nothing compared:")
    for line in e.differences:
        out.err.print(f"  {line}")


baseline_app = typer.Typer(help="Regression baselines.", no_args_is_help=True)


@baseline_app.command("update")
@handle_errors
def baseline_update(
    run_dir: Annotated[Path, typer.Argument(metavar="RUN_DIR", help="A run directory made by `kvdiag regress`.")],
    baseline: BaselineOpt = DEFAULT_BASELINE,
    force: Annotated[bool, typer.Option("--force", help="Accept a run that failed its own "
                                        "ground-truth check.")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Make RUN_DIR the baseline of its key (engine, version, model, flags, suite), replacing
    the one stored for that key; baselines of other keys stay.

    Example: kvdiag baseline update reports/regress-weekly-20261130-221500
    """
    from kvdiag.regress import baselines as B

    out = Output(as_json)
    new = B.from_run(run_dir, force=force)
    replaced, count = B.update(baseline, new)
    if as_json:
        out.json({"baseline": str(baseline), "key_id": new.key.id, "run_id": new.run_id,
                  "replaced": replaced.run_id if replaced else None, "baselines": count})
        return
    was = f" (replacing run {replaced.run_id})" if replaced else ""
    out.out.print(f"{baseline}: baseline of suite {new.key.suite} key {new.key.id} is now run "
                  f"{new.run_id} ({new.target}){was}; {count} baseline(s) in the file")


@handle_errors
def history(
    suite: Annotated[str | None, typer.Option("--suite", help="Only this suite.")] = None,
    target: Annotated[str | None, typer.Option("--target", help="Only this target.")] = None,
    last: Annotated[int, typer.Option("--last", min=1, help="The last N runs.")] = 20,
    history_path: HistoryOpt = DEFAULT_HISTORY,
    as_json: JsonOpt = False,
) -> None:
    """Past regression runs, oldest first: verdict, SQDR, BRAI, cache divergence (--json adds
    the engine, version, model, baseline key and run directory).

    Example: kvdiag history --suite weekly --last 10
    """
    import json

    from kvdiag.regress import history as H
    from kvdiag.report.terminal import HISTORY_COLUMNS, history_table

    out = Output(as_json)
    frame = H.runs(history_path, suite=suite, target=target, last=last)
    if as_json:
        out.json(json.loads(frame[list(HISTORY_COLUMNS)].to_json(orient="records")))
    else:
        out.out.print(history_table(frame, f"{history_path}: {len(frame)} run(s)"))
