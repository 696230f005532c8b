"""The judges of runs of runs: a regression against its baseline, a fleet's cells, targets
compared on the same sessions, and the detection matrix (healthy passes, every planted fault
gives its expected verdict)."""

from __future__ import annotations

from collections.abc import Iterable

from kvdiag.verdicts.core import Judgement, Verdict


def judge_regress(ground_truth: Verdict, ground_reason: str, regressed: list[str],
                  missing: list[str] = ()) -> Judgement:
    """A run against its baseline: at best as good as its own ground truth. A regression
    against the baseline fails it whatever the ground truth said; a comparison that covered
    less than the baseline measured (`missing`: cases, rounds or metrics) is an error, never a
    pass; otherwise the ground truth's verdict stands (an inconclusive run stays inconclusive
    when every metric matches its baseline)."""
    if regressed:
        return Judgement(Verdict.FAIL, f"regressed against the baseline: {', '.join(regressed)}")
    if missing:
        shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        return Judgement(Verdict.ERROR, f"the run lacks what its baseline measured ({shown}): a "
                         "comparison of fewer rows proves nothing")
    if ground_truth is Verdict.PASS:
        return Judgement(Verdict.PASS, f"no regression; {ground_reason}")
    return Judgement(ground_truth, ground_reason)


def judge_fleet(cells: Iterable[Verdict]) -> Judgement:
    """Every cell's verdict: the worst wins (a dead cell is an error, never a pass; no cell at
    all is an error too)."""
    cells = list(cells)
    verdict = Verdict.worst(cells)
    counts = ", ".join(f"{sum(c is v for c in cells)} {v.value}" for v in Verdict
                       if any(c is v for c in cells))
    return Judgement(verdict, f"{len(cells)} cell(s): {counts or 'none'}")


def judge_compare(targets: Iterable[tuple[str, Verdict]]) -> Judgement:
    """Targets probed on the same sessions (kvdiag compare), each already judged against its
    own isolated twin, never against another target: the worst of their verdicts wins; a
    target that could not be measured is an error, and no target at all is an error too."""
    targets = list(targets)
    if not targets:
        return Judgement(Verdict.ERROR, "no target was measured")
    verdict = Verdict.worst(v for _, v in targets)
    each = "; ".join(f"{name}: {v.value}" for name, v in targets)
    return Judgement(verdict, f"{len(targets)} targets on the same sessions, each against its "
                     f"own isolated twin ({each})")


def expected_detection(live: str | None, path: str) -> Verdict:
    """The verdict a detection-matrix row must give: pass for the healthy engine (`live`
    None), else fail (a run that caught the fault, whichever `path` ran it)."""
    return Verdict.PASS if live is None else Verdict.FAIL


def judge_unreached(why: str) -> Judgement:
    """A detection-matrix row whose fault cannot be reached on this path here: inconclusive,
    the reason given; never a catch."""
    return Judgement(Verdict.INCONCLUSIVE, f"not reachable here: {why}")


def caught_as_expected(got: Verdict, want: Verdict) -> bool:
    """A detection-matrix row: its measured verdict is the one expected."""
    return got is want


def judge_matrix(rows: Iterable[tuple[str, Verdict, Verdict]]) -> Judgement:
    """The detection matrix: (fault, verdict measured, verdict expected) per row. Healthy must
    pass (no false positive) and every fault must give its expected verdict. fail when a row
    missed (a fault judged pass, or healthy not pass); inconclusive when a row could not reach
    its trigger; error for no rows at all; else pass."""
    rows = list(rows)
    if not rows:
        return Judgement(Verdict.ERROR, "the detection matrix has no rows: nothing was measured")
    off = [(f, got, want) for f, got, want in rows if not caught_as_expected(got, want)]
    missed = [f for f, got, want in off if got is Verdict.PASS or want is Verdict.PASS]
    unreached = [f for f, _, _ in off if f not in missed]
    if missed:
        return Judgement(Verdict.FAIL, f"not detected as expected: {', '.join(missed)}")
    if unreached:
        return Judgement(Verdict.INCONCLUSIVE, f"proved nothing for: {', '.join(unreached)}")
    faults = {name.split("/")[0] for name, _, want in rows if want is not Verdict.PASS}
    return Judgement(Verdict.PASS, f"healthy passed and all {len(faults)} planted faults were "
                     f"caught as expected ({len(rows)} rows)" if faults else "healthy passed")
