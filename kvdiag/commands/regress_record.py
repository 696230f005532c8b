"""A regression run's second half, from what was measured to the finished run directory, the
JUnit XML and the history row (kvdiag.commands.regress.record's body; a fleet's driver
calls it with what a Ray task measured elsewhere).

    ground truth   the series under test against the run's own reference: the contiguous
                   reference (judge_series) or the cache-isolated twins (judge_probe)
    baseline       every metric against the baseline of the same key, under tolerances
    verdict        judge_regress: a regression fails; otherwise the ground truth stands
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from kvdiag.record.results import RunExtras, RunResult
from kvdiag.record.summary import RegressProbeSummary, RegressReferenceSummary
from kvdiag.record.summary_rows import (
    BaselineRef,
    CaseMeasurement,
    CaseMetrics,
    FailedCheck,
    KeyBlock,
    RegressBlock,
    SeriesFindings,
)
from kvdiag.regress import history as H
from kvdiag.regress.compare import Check, compare, regressed_rounds, unmatched
from kvdiag.regress.measure import CaseBrai
from kvdiag.verdicts import Judgement, Verdict, judge_regress, judge_series


def ground_truth(p, measured, model_label: str | None = None) -> tuple[Judgement, dict]:
    """(the run's own verdict on the series under test, the measured run's summary fields)."""
    if p.target.is_reference:
        run_verdict = measured.judge()
        found = SeriesFindings.model_validate(run_verdict.details)
        name = p.target.allocator
        per_case = []
        for case in measured.cases:
            key = f"{case.name}/{name}"
            gate = found.gates.get(key)
            findings = list(gate.failures) if gate else list(found.faults.get(key, []))
            recycled = measured.run.recycled.get(case.name, {}).get(name, 0) > 0
            per_case.append(judge_series(findings, recycled, key))
        worst = Verdict.worst(j.verdict for j in per_case)
        chosen = next(j for j in per_case if j.verdict is worst)
        return chosen, measured.fields(run_verdict) | {"verdict": chosen.verdict,
                                                       "reason": chosen.reason}
    from kvdiag.commands.probe import judge, summary_fields

    verdict = judge(measured)
    spec = p.target.spec if p.target.is_local else None
    return verdict, summary_fields(measured, p.suite, verdict, model_label=model_label,
                                   target_spec=spec)


def record(p, opts, measured, cold: bool, timer) -> RunResult:
    from kvdiag.commands.lifecycle import finish_run
    from kvdiag.record.rundir import write_run
    from kvdiag.regress.measure import main_case, measure

    truth, fields = ground_truth(p, measured, opts.model_label)
    kind = RegressReferenceSummary if p.target.is_reference else RegressProbeSummary
    frame = measured.frame
    series = measure(frame, p.target.allocator)
    base = p.baseline.measurement if p.baseline else None
    checks: list[Check] = []
    missing: list[str] = []
    if base is not None:
        # block reuse from a warm cache (earlier runs, other traffic) is no anomaly
        skip = () if cold else ("brai",)
        checks = compare(series, base, opts.tolerances, skip=skip, per_round_brai=p.target.is_reference)
        missing = unmatched(series, base, skip)
    failed = [c for c in checks if not c.passed]
    regressed = regressed_rounds(failed)
    verdict = judge_regress(truth.verdict, truth.reason,
                            [f"{m} (rounds {', '.join(map(str, r))})" for m, r in regressed.items()],
                            missing)
    truth_failures = [truth.reason] if truth.verdict is Verdict.FAIL else []
    if truth_failures:
        failed.append(Check(p.cases[0].name, "ground_truth", None, 1.0, 0.0, 0.0, False, truth.reason))
    brais = _brais(series, base, cold, fields)
    main = main_case(series)
    run_id = H.unique_run_id(opts.history, p.run.final.resolve().name)
    block = RegressBlock(
        run_id=run_id, target=p.target.spec, verdict=verdict.verdict, reason=verdict.reason,
        key=KeyBlock.model_validate(p.key.as_dict()), key_id=p.key.id,
        tolerances=opts.tolerances.as_dict(), measurement=series,
        brai={c: b.brai for c, b in brais.items()},
        baseline=None if p.baseline is None else BaselineRef(
            path=str(opts.baseline), run_id=p.baseline.run_id, target=p.baseline.target,
            created=p.baseline.created, key_id=p.baseline.key.id),
        regressed=regressed, ground_truth_failures=truth_failures,
        failed_checks=[FailedCheck.model_validate(c.as_dict()) for c in failed])
    fields |= {"verdict": verdict.verdict, "reason": verdict.reason, "cold_cache": cold,
               "regress": block}
    summary = kind(**fields)
    write_run(p.run.path, frame, summary)  # what was measured is on disk before anything else
    result = RunResult("regress", frame, summary,
                       extra=RunExtras(checks=checks, ground_truth=truth, run_id=run_id))

    def history_row(stamped) -> dict:  # of the summary as finish_run stamps it (its `created`)
        return _history_row(p, run_id, stamped, main, brais[main].brai, truth.verdict)

    def trend(stamped):
        import pandas as pd

        past = (H.runs(opts.history, suite=p.suite.name, last=51) if Path(opts.history).is_file()
                else pd.DataFrame())  # the first run of a new history
        return pd.concat([past, pd.DataFrame([history_row(stamped)])], ignore_index=True)

    finish_run(result, p.run, timer, history=trend,
               before_report=lambda d: [shutil.copy(f, d / Path(f).name) for f in opts.attach
                                        if Path(f).is_file()])
    row = history_row(result.summary) | {"run_dir": str(result.run_dir.resolve())}
    rounds = [{"case": case, **r.model_dump(), "brai": brais[case].rounds.get(r.round)}
              for case, cm in series.items() for r in cm.rounds]
    if opts.junit is not None:
        result.extra.junit = _junit(p, opts, summary, checks, truth, result.run_dir, timer)
    H.append(opts.history, row, rounds, failed)  # last
    return result


def _brais(series: dict[str, CaseMeasurement], base: dict[str, CaseMeasurement] | None,
           cold: bool, fields: dict) -> dict[str, CaseBrai]:
    """Per case, the run-level and per-round BRAI against the baseline; None where a warm
    cache makes reuse meaningless; without a baseline, the in-run guarded series' reuse
    (the measured run's `by_case` summary field: case -> "brai" -> series -> BRAI)."""
    from kvdiag.regress.measure import brai_against

    if not cold:  # a warm cache's reuse says nothing: publish no BRAI rather than a false one
        return {case: CaseBrai() for case in series}
    brais = brai_against(series, base)
    if base is None:
        by_case = {case: CaseMetrics.model_validate(m) for case, m in (fields.get("by_case") or {}).items()}
        brais = {case: CaseBrai(brai=by_case[case].brai.get(m.series) if case in by_case else None)
                 for case, m in series.items()}
    return brais


def _junit(p, opts, summary, checks, truth: Judgement, run_dir: Path, timer) -> Path:
    from kvdiag.regress.junit import junit_xml, write_junit

    props = {"signature": summary.signature, "key_id": p.key.id, "verdict": summary.verdict.value,
             "baseline": p.baseline.run_id if p.baseline else "(none)", "run_dir": str(run_dir)}
    return write_junit(opts.junit, junit_xml(p.suite.name, p.target.spec, checks,
                                             seconds=timer.seconds, properties=props,
                                             ground_truth=(truth.verdict, truth.reason),
                                             case=p.cases[0].name))


def _history_row(p, run_id: str, summary, main: str, run_brai, run_verdict: Verdict) -> dict:
    """The history's `runs` row of a finished, stamped run."""
    from kvdiag import __version__

    reg = summary.regress
    m = reg.measurement[main]
    return {"run_id": run_id, "created": summary.created, "suite": p.suite.name,
            "target": p.target.spec, "series": m.series, "engine": p.key.engine,
            "engine_version": p.key.engine_version, "model": p.key.model, "key_id": p.key.id,
            "key_json": json.dumps(p.key.as_dict(), sort_keys=True),
            "baseline_key_id": p.baseline.key.id if p.baseline else None,
            "signature": summary.signature, "verdict": reg.verdict.value,
            "run_verdict": run_verdict.value,
            "main_case": main, "sqdr": m.sqdr, "brai": run_brai,
            "block_reuse_rate": m.block_reuse_rate, "attention_leakage": m.attention_leakage,
            "divergence_ratio": m.divergence_ratio, "wall_seconds": summary.wall_seconds,
            "run_dir": str(p.run.final.resolve()), "command": summary.command,
            "kvdiag_version": __version__, "reason": reg.reason, "events": _events(summary)}


def _events(summary: RegressReferenceSummary | RegressProbeSummary) -> str | None:
    """A live run's coverage beside its verdict: the events its probe reached and missed."""
    rows = summary.events if isinstance(summary, RegressProbeSummary) else []
    if not rows:
        return None
    return json.dumps({"reached": [r.event for r in rows if r.reached],
                       "missing": [r.event for r in rows if not r.reached]})
