"""A regression comparison never covers less than the baseline silently: what the baseline
measured and the run did not (a case, a round, a metric) is listed, and the judge makes it an
error (tests/kvdiag/verdicts/test_verdicts.py)."""

from __future__ import annotations

from kvdiag.record.summary_rows import CaseMeasurement, RoundMeasurement
from kvdiag.regress.compare import unmatched


def _measurement(rounds: int, **missing) -> dict[str, CaseMeasurement]:
    out = []
    for n in range(1, rounds + 1):
        row = {"round": n, "bleu4": 100.0, "fact_check_pass_rate": 1.0, "attention_leakage": None}
        row.update({k: None for k, rnd in missing.items() if rnd == n})
        out.append(RoundMeasurement(**row))
    return {"trigger": CaseMeasurement(series="guarded", sqdr=0.0, rounds=out)}


def test_what_the_baseline_measured_and_the_run_lacks():
    base = _measurement(4)
    assert unmatched(_measurement(4), base) == []
    assert unmatched(_measurement(3), base) == ["trigger: round 4"]
    assert unmatched(_measurement(4, bleu4=2), base) == ["trigger: round 2 bleu4"]
    assert unmatched(_measurement(5), base) == ["trigger: round 5 (not in the baseline)"]
    assert unmatched({}, base) == ["trigger: no measurement"]
    # a metric neither side measured (attention leakage from outside) is no gap
    assert unmatched(_measurement(4, bleu4=2), base, skip=("bleu4",)) == []
