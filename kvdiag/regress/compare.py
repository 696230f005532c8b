"""A run against its baseline, metric by metric and round by round, under stated tolerances;
and the run's own ground-truth check, which needs no baseline.

Tolerances (defaults; `kvdiag regress --tolerance NAME=VALUE` overrides one):

    metric                     per     regressed when                       default
    sqdr                       run     sqdr > baseline + tol                0.005 (SQDR_HEALTHY)
    brai                       run and |reuse - baseline reuse| > tol       0.05  (BRAI_MAX)
                               round
    fact_check_pass_rate       round   rate < baseline - tol                0.02
    bleu4                      round   BLEU-4 < baseline - tol (points)     1.0
    attention_leakage          round   leakage > baseline + tol             0.0001
    divergence_ratio           round   ratio > baseline + tol               0.02
    foreign_slots, unwritten_  round   count > baseline + tol               0
    slots, nonfinite_logits

The reference engine is exact, so a guarded run matches its baseline to the last digit;
the tolerances leave room for a live server's numerics between weekly runs (one answer in
fifty per round) while a single corrupted answer per round on 50+ sessions still shows.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from typing import TYPE_CHECKING

from kvdiag.errors import KvdiagError
from kvdiag.metrics.decay import SQDR_HEALTHY
from kvdiag.verdicts.regress import within_tolerance
from kvdiag.vocab import BRAI_MAX

if TYPE_CHECKING:
    from kvdiag.record.summary_rows import CaseMeasurement


@dataclass(frozen=True)
class Tolerances:
    sqdr: float = SQDR_HEALTHY
    brai: float = BRAI_MAX
    fact_check_pass_rate: float = 0.02
    bleu4: float = 1.0
    attention_leakage: float = 1e-4
    divergence_ratio: float = 0.02
    slots: float = 0.0  # foreign_slots, unwritten_slots, nonfinite_logits

    def with_overrides(self, specs: list[str]) -> Tolerances:
        """NAME=VALUE strings -> a copy; ValueError names an unknown or bad one."""
        names = {f.name for f in fields(self)}
        changes = {}
        for spec in specs:
            name, _, value = spec.partition("=")
            if name.strip() not in names:
                raise KvdiagError(f"--tolerance {spec}: unknown metric (known: {', '.join(sorted(names))})")
            try:
                changes[name.strip()] = float(value)
            except ValueError:
                raise KvdiagError(f"--tolerance {spec}: {value!r} is not a number") from None
        return replace(self, **changes)

    def as_dict(self) -> dict:
        return asdict(self)


# metric -> (direction: +1 higher is worse / -1 lower is worse, tolerance field)
ROUND_CHECKS = {
    "fact_check_pass_rate": (-1, "fact_check_pass_rate"),
    "bleu4": (-1, "bleu4"),
    "attention_leakage": (+1, "attention_leakage"),
    "divergence_ratio": (+1, "divergence_ratio"),
    "foreign_slots": (+1, "slots"),
    "unwritten_slots": (+1, "slots"),
    "nonfinite_logits": (+1, "slots"),
}


@dataclass(frozen=True)
class Check:
    case: str
    metric: str
    round: int | None  # None: the whole run
    value: float | None
    baseline: float | None
    limit: float | None  # the worst value still passing
    passed: bool
    message: str = ""

    def as_dict(self) -> dict:
        return asdict(self)


def _fmt(v) -> str:
    """Counts as integers (10150, not 1.015e+04); rates and scores to four significant digits."""
    if v is None:
        return "-"
    if float(v).is_integer() and abs(v) < 1e15:
        return str(int(v))
    return f"{v:.4g}"


def _check(case, metric, rnd, value, baseline, direction, tol) -> Check | None:
    """`metric` against its baseline (kvdiag.verdicts.regress.within_tolerance decides);
    None where either side has no value."""
    if value is None or baseline is None:
        return None
    limit, passed = within_tolerance(value, baseline, direction, tol)
    where = f"round {rnd}: " if rnd is not None else ""
    message = "" if passed else (f"{case}: {where}{metric} = {_fmt(value)} (baseline {_fmt(baseline)}, "
                                 f"{'max' if direction > 0 else 'min'} {_fmt(limit)})")
    return Check(case, metric, rnd, value, baseline, limit, passed, message)


def compare(measured: dict[str, CaseMeasurement], baseline: dict[str, CaseMeasurement],
            tol: Tolerances = Tolerances(), skip: tuple[str, ...] = (),
            per_round_brai: bool = True) -> list[Check]:
    """Every check of every case the baseline holds (measure()'s CaseMeasurements on both
    sides), but the metrics in `skip`. per_round_brai=False keeps BRAI to the whole run: a live
    server's per-round reuse depends on when concurrent requests happen to arrive (in
    round 1, whether one session has cached the shared system prompt before the others
    look it up), so only the reference engine's is compared round by round."""
    from kvdiag.regress.measure import brai_against

    brais = brai_against(measured, baseline)
    checks: list[Check | None] = []
    for case, m in measured.items():
        base = baseline.get(case)
        if base is None:
            continue
        brai = brais[case]
        checks.append(_check(case, "sqdr", None, m.sqdr, base.sqdr, +1, tol.sqdr))
        checks.append(_check(case, "brai", None, brai.brai, 0.0, +1, tol.brai))
        base_rounds = {b.round: b for b in base.rounds}
        for r in m.rounds:
            b = base_rounds.get(r.round)
            if b is None:
                continue
            if per_round_brai:
                checks.append(_check(case, "brai", r.round, brai.rounds.get(r.round), 0.0, +1, tol.brai))
            for metric, (direction, tol_name) in ROUND_CHECKS.items():
                checks.append(_check(case, metric, r.round, getattr(r, metric), getattr(b, metric),
                                     direction, getattr(tol, tol_name)))
    return [c for c in checks if c is not None and c.metric not in skip]


def unmatched(measured: dict[str, CaseMeasurement], baseline: dict[str, CaseMeasurement],
              skip: tuple[str, ...] = ()) -> list[str]:
    """What the baseline measured that this run did not (a case, a round, or a metric with a
    value in the baseline and none here), so a comparison never silently covers less; the
    judge makes any of it an error."""
    out = []
    for case, base in baseline.items():
        m = measured.get(case)
        if m is None:
            out.append(f"{case}: no measurement")
            continue
        if base.sqdr is not None and m.sqdr is None and "sqdr" not in skip:
            out.append(f"{case}: sqdr")
        rounds = {r.round: r for r in m.rounds}
        for b in base.rounds:
            r = rounds.get(b.round)
            if r is None:
                out.append(f"{case}: round {b.round}")
                continue
            out += [f"{case}: round {b.round} {metric}" for metric in ROUND_CHECKS
                    if metric not in skip and getattr(b, metric) is not None and getattr(r, metric) is None]
        extra = sorted(set(rounds) - {b.round for b in base.rounds})
        out += [f"{case}: round {n} (not in the baseline)" for n in extra]
    return out


def regressed_rounds(checks: list[Check]) -> dict[str, list[int]]:
    """metric -> the rounds where it regressed (a run-level failure counts as round 0)."""
    out: dict[str, set[int]] = {}
    for c in checks:
        if not c.passed:
            out.setdefault(c.metric, set()).add(c.round or 0)
    return {k: sorted(v) for k, v in out.items()}
