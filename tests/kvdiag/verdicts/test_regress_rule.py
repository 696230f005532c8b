"""The rule of one regression check (kvdiag.verdicts.regress.within_tolerance): a value at the
limit passes, one past it fails, in both directions; kvdiag.regress.compare applies it."""

from __future__ import annotations

import pytest

from kvdiag.record.summary_rows import CaseMeasurement, RoundMeasurement
from kvdiag.regress.compare import Tolerances, compare
from kvdiag.verdicts.regress import within_tolerance


def test_higher_is_worse_passes_at_the_limit_and_fails_over_it():
    assert within_tolerance(0.12, 0.1, +1, 0.02) == (pytest.approx(0.12), True)
    assert within_tolerance(0.1 + 0.02, 0.1, +1, 0.02)[1]  # rounding never fails a value at the limit
    assert within_tolerance(0.05, 0.1, +1, 0.02)[1]  # better than the baseline
    limit, passed = within_tolerance(0.121, 0.1, +1, 0.02)
    assert limit == pytest.approx(0.12) and not passed


def test_lower_is_worse_passes_at_the_limit_and_fails_under_it():
    assert within_tolerance(0.98, 1.0, -1, 0.02) == (pytest.approx(0.98), True)
    assert within_tolerance(1.0, 1.0, -1, 0.02)[1]
    limit, passed = within_tolerance(0.979, 1.0, -1, 0.02)
    assert limit == pytest.approx(0.98) and not passed


def test_zero_tolerance_counts():
    assert within_tolerance(3, 3, +1, 0.0) == (3, True)
    assert within_tolerance(4, 3, +1, 0.0) == (3, False)


def test_a_direction_is_plus_or_minus_one():
    with pytest.raises(ValueError, match="direction"):
        within_tolerance(1.0, 1.0, 0, 0.1)


def _case(rate: float, slots: int, sqdr: float = 0.0) -> dict[str, CaseMeasurement]:
    rounds = [RoundMeasurement(round=n, fact_check_pass_rate=rate if n == 2 else 1.0,
                               foreign_slots=slots if n == 2 else 0, block_reuse_rate=0.5)
              for n in (1, 2)]
    return {"trigger": CaseMeasurement(series="guarded", sqdr=sqdr, block_reuse_rate=0.5, rounds=rounds)}


def test_compare_applies_the_rule_metric_by_metric():
    base = _case(1.0, 0)
    assert all(c.passed for c in compare(_case(0.98, 0), base))  # at the limit (tol 0.02)
    failed = [c for c in compare(_case(0.9, 1, sqdr=0.01), base) if not c.passed]
    assert {(c.metric, c.round) for c in failed} == {("fact_check_pass_rate", 2),
                                                     ("foreign_slots", 2), ("sqdr", None)}
    rate = next(c for c in failed if c.metric == "fact_check_pass_rate")
    assert rate.limit == pytest.approx(0.98) and rate.baseline == 1.0
    assert rate.message == "trigger: round 2: fact_check_pass_rate = 0.9 (baseline 1, min 0.98)"
    looser = Tolerances().with_overrides(["fact_check_pass_rate=0.2", "slots=1", "sqdr=0.01"])
    assert all(c.passed for c in compare(_case(0.9, 1, sqdr=0.01), base, looser))
