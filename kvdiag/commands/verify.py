"""kvdiag verify: the release gate on one allocator.

    plan     exactly one of --expect-guard / --expect-bug; the allocator; one case
    measure  the case under the allocator (beside guarded when it is another)
    judge    kvdiag.verdicts.judge_gate: the gate's verdict is the run's
    finish   VerifySummary (`run_verdict`: the reproduce verdict of the same run)
"""

from __future__ import annotations

from pathlib import Path

from kvdiag.commands.lifecycle import finish_run, no_progress
from kvdiag.commands.reproduce import check_engine_run, measure
from kvdiag.errors import KvdiagError
from kvdiag.planning.suites import load_cases
from kvdiag.record.results import RunExtras, RunResult
from kvdiag.record.summary import VerifySummary
from kvdiag.targets import check_allocator
from kvdiag.verdicts import judge_gate


def verify(allocator: str, expect_guard: bool, expect_bug: bool, suite: str,
           case: str | None = None, *, model: Path | None = None, out_dir: Path | None = None,
           progress=no_progress, **options) -> RunResult:
    """`options` as kvdiag.commands.reproduce.reproduce takes them."""
    from kvdiag.record.rundir import RunDir, Timer

    timer = Timer()
    if expect_guard == expect_bug:
        raise KvdiagError("give exactly one of --expect-guard or --expect-bug")
    check_allocator(allocator)
    pair = [allocator] if allocator == "guarded" else [allocator, "guarded"]
    check_engine_run(pair, model)
    loaded, (chosen,) = load_cases(suite, case, one=True)
    with RunDir.begin(out_dir, loaded.name) as run_dir:
        measured = measure(loaded, [chosen], allocators=pair, model=model, progress=progress,
                           **options)
    run_verdict = measured.judge()
    gate = judge_gate(measured.rounds, measured.run.engine_log, chosen.name, allocator,
                      expect_guard, measured.run.recycled[chosen.name].get(allocator, 0))
    fields = measured.fields(run_verdict) | {"verdict": gate.verdict, "reason": gate.reason,
                                              "gate": gate.details,
                                              "run_verdict": run_verdict.verdict}
    result = RunResult("verify", measured.frame, VerifySummary(**fields),
                       extra=RunExtras(engine_log=measured.run.engine_log))
    return finish_run(result, run_dir, timer)
