"""What a regression run measures about the series under test, per case: per-round metrics
and run-level SQDR, block reuse rate, leakage and cache divergence ratio. Baselines store
it, compare reads it, the history and the Prometheus export publish it.

The series under test is one allocator of the reference engine (target "reference") or the
`shared` (cache on) rows of a live probe; its ground truth is the contiguous reference or
the probe's `isolated` rows.

cache divergence ratio = requests whose output departs from the ground truth because of the
cache / requests. In the reference engine any departure counts (it is exact); in a live
probe only departures classified as corruption do (numerics are excluded).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kvdiag.errors import KvdiagError
from kvdiag.record.summary_rows import CaseMeasurement, RoundMeasurement

if TYPE_CHECKING:
    from pandas import DataFrame

PROBE_SERIES = "shared"
ROUND_METRICS = ("fact_check_pass_rate", "bleu4", "block_reuse_rate", "attention_leakage",
                 "divergence_ratio", "foreign_slots", "unwritten_slots", "nonfinite_logits")


@dataclass(frozen=True)
class CaseBrai:
    """A case's BRAI against the baseline's reuse: over the whole run (None where the
    baseline lacks the case) and per round (round -> BRAI, rounds both sides measured)."""

    brai: float | None = None
    rounds: dict[int, float | None] = field(default_factory=dict)


def _num(value):
    """NaN / NA -> None; numpy scalars -> Python."""
    if value is None:
        return None
    if hasattr(value, "item"):
        value = value.item()
    try:
        return None if math.isnan(value) else value
    except TypeError:
        return None


def _diverged(rows: DataFrame) -> int:
    if "classification" in rows and rows["classification"].astype(str).ne("").any():
        return int((rows["classification"] == "corruption").sum())
    return int(rows["first_divergence"].notna().sum())


def under_test(frame: DataFrame, allocator: str | None) -> DataFrame:
    """The rows of the series under test: `allocator`'s in the reference engine, or the
    probe's shared rows (allocator None)."""
    return frame[frame["allocator"] == (allocator or PROBE_SERIES)]


def _rounds(case_table: DataFrame, case_rows: DataFrame) -> list[RoundMeasurement]:
    """Each round of one case: per_round's metrics and the round's divergence ratio."""
    out = []
    for rec in case_table.itertuples(index=False):
        part = case_rows[case_rows["round"] == rec.round]
        values = {k: _num(getattr(rec, k)) for k in ROUND_METRICS if k != "divergence_ratio"}
        ratio = _diverged(part) / len(part) if len(part) else None
        out.append(RoundMeasurement(round=int(rec.round), divergence_ratio=_num(ratio), **values))
    return out


def measure(frame: DataFrame, allocator: str | None) -> dict[str, CaseMeasurement]:
    """{case: CaseMeasurement} for every case in `frame`: the series, its run-level SQDR,
    block reuse rate, leakage and divergence ratio, and each round's ROUND_METRICS."""
    from kvdiag.metrics.decay import per_round, series_name, sqdr
    from kvdiag.metrics.reuse import block_reuse_rate

    rows = under_test(frame, allocator)
    if rows.empty:
        raise KvdiagError(f"the results hold no rows of {allocator or PROBE_SERIES!r}")
    table = per_round(rows)
    out = {}
    for case, case_rows in rows.groupby("case", sort=False):
        rounds = _rounds(table[table["case"] == case], case_rows)
        first = case_rows.iloc[0]
        leak = case_rows["attention_leakage"].astype(float)
        out[str(case)] = CaseMeasurement(
            series=series_name(first["target"], first["allocator"]),
            sqdr=_num(sqdr({r.round: (math.nan if r.fact_check_pass_rate is None
                                      else r.fact_check_pass_rate) for r in rounds})),
            block_reuse_rate=block_reuse_rate(case_rows["blocks_hit"], case_rows["blocks_needed"]),
            attention_leakage=_num(leak.mean()) if leak.notna().any() else None,
            divergence_ratio=_diverged(case_rows) / len(case_rows),
            requests=int(len(case_rows)),
            rounds=rounds,
        )
    return out


def main_case(measured: dict[str, CaseMeasurement]) -> str:
    from kvdiag.metrics.decay import MAIN_CASE

    return MAIN_CASE if MAIN_CASE in measured else next(iter(measured))


def brai_against(measured: dict[str, CaseMeasurement],
                 baseline: dict[str, CaseMeasurement] | None) -> dict[str, CaseBrai]:
    """{case: CaseBrai} against a baseline's reuse: run-level, and per round where both the
    run and the baseline measured the round's reuse (None where the baseline lacks the case)."""
    from kvdiag.metrics.reuse import brai

    out = {}
    for case, m in measured.items():
        base = (baseline or {}).get(case)
        if base is None:
            out[case] = CaseBrai()
            continue
        by_round = {r.round: r.block_reuse_rate for r in base.rounds}
        out[case] = CaseBrai(
            brai=_num(brai(m.block_reuse_rate, base.block_reuse_rate)),
            rounds={r.round: _num(brai(r.block_reuse_rate, by_round[r.round]))
                    for r in m.rounds if by_round.get(r.round) is not None
                    and r.block_reuse_rate is not None},
        )
    return out
