"""Decay over rounds: SQDR, first divergent token, the per-round table and the run summary.

Input: the runners' records, one row per (case, target, allocator, session, round), with
columns `case`, `target`, `allocator` ("contiguous" for the ground-truth reference rows),
`session`, `round` (1-based), `kind` ("question" | "recite"), `prompt_tokens`,
`cached_tokens`, `blocks_needed`, `blocks_hit`, `attention_leakage` (NaN when not
captured), `attention_leakage_max`, `foreign_slots`, `unwritten_slots`, `guard_rejections`,
`nonfinite_logits`, `preemptions`, `output_text`, `reference_text`, `output_token_ids`,
`reference_token_ids`, `first_divergence` (<NA> when equal) and `fact_check_pass` (1.0 /
0.0, NaN for recitations).

Series names (keys of `sqdr` / `brai`): the allocator for reference-engine rows (target
"reference"), the target otherwise (live probes, replays); `series_name` says which.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvdiag.metrics.base import METRICS
from kvdiag.metrics.reuse import block_reuse_rate, brai
from kvdiag.vocab import CONTIGUOUS

if TYPE_CHECKING:
    from pandas import DataFrame

GROUP = ("case", "target", "allocator", "round")
COUNTERS = ("foreign_slots", "unwritten_slots", "guard_rejections", "nonfinite_logits",
            "preemptions")
REFERENCE_ALLOCATOR = CONTIGUOUS  # ground truth: no paging, no reuse
ISOLATED = "isolated"  # a live probe's ground truth: the same request with a fresh cache_salt
REFERENCE_ALLOCATORS = (REFERENCE_ALLOCATOR, ISOLATED)
BASELINE_ALLOCATOR = "guarded"  # BRAI's expected block reuse comes from it
MAIN_CASE = "trigger"
SQDR_HEALTHY, SQDR_ALERT = 0.005, 0.01


def sqdr(pass_rates: Sequence[float] | Mapping[int, float]) -> float:
    """(pass_rate@round_1 - pass_rate@round_n) / n; positive when answers decay.

    A sequence is read as rounds 1..n; a mapping as round -> rate. Rounds without a pass
    rate (NaN: recitation-only) are skipped: round_1 is the first round with one, round_n
    the last, n that last round's number. NaN when no round has a pass rate.
    """
    items = pass_rates.items() if isinstance(pass_rates, Mapping) else enumerate(pass_rates, 1)
    rated = sorted((int(r), float(v)) for r, v in items if v is not None and not math.isnan(v))
    if not rated:
        return math.nan
    (_, first), (n, last) = rated[0], rated[-1]
    return (first - last) / n


def first_divergence(output_ids: Sequence[int], reference_ids: Sequence[int]) -> int | None:
    """Index of the first token where the two id lists differ; None when they are equal.

    When one list is a strict prefix of the other, they diverge where the shorter ends.
    """
    for i, (a, b) in enumerate(zip(output_ids, reference_ids)):
        if int(a) != int(b):
            return i
    return None if len(output_ids) == len(reference_ids) else min(len(output_ids),
                                                                   len(reference_ids))


def series_name(target: str, allocator: str) -> str:
    """The allocator for reference-engine rows and for the contiguous reference, else the target."""
    return allocator if target == "reference" or allocator in REFERENCE_ALLOCATORS else target


def per_round(df: DataFrame) -> DataFrame:
    """One row per case x target x allocator x round: every registered metric plus counters.

    Columns: case, target, allocator, round, sessions, then METRICS (block_reuse_rate,
    attention_leakage, attention_leakage_max, bleu4, fact_check_pass_rate), the COUNTERS
    summed, and diverged_sessions (rows whose output departs from the reference).
    Rows keep the order in which cases, targets and allocators first appear; rounds ascend.
    """
    import pandas as pd

    import kvdiag.metrics  # noqa: F401  (registers every metric)

    needed = {*GROUP, "session", *(c for m in METRICS.values() for c in m.columns)}
    missing = sorted(needed - set(df.columns))
    if missing:
        raise ValueError(f"results lack column(s) {', '.join(missing)}")
    metrics = [cls() for cls in METRICS.values()]
    order = {c: {v: i for i, v in enumerate(dict.fromkeys(df[c]))} for c in GROUP[:3]}
    records = []
    for key, rows in df.groupby(list(GROUP), sort=False):
        record = dict(zip(GROUP, key))
        record["round"] = int(record["round"])
        record["sessions"] = int(rows["session"].nunique())
        record.update({m.name: float(m.compute(rows)) for m in metrics})
        record.update({c: int(rows[c].sum()) if c in rows else 0 for c in COUNTERS})
        record["diverged_sessions"] = (int(rows["first_divergence"].notna().sum())
                                       if "first_divergence" in rows else 0)
        records.append(record)
    records.sort(key=lambda r: (*(order[c][r[c]] for c in GROUP[:3]), r["round"]))
    columns = [*GROUP, "sessions", *METRICS, *COUNTERS, "diverged_sessions"]
    return pd.DataFrame.from_records(records, columns=columns)


@dataclass(frozen=True)
class DecayMetrics:
    """summarize's answer: the per-round table (`rounds`: dicts, a `case` field each), SQDR and
    BRAI per series of the main case, the same per case (`by_case`), and sacrebleu's signature;
    `fields()` gives them as the summary's keys."""

    rounds: list[dict]
    sqdr: dict
    brai: dict
    main_case: str | None
    by_case: dict[str, dict]
    bleu_signature: str

    def fields(self) -> dict:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


def summarize(df: DataFrame, expected_reuse: Mapping[str, float] | None = None,
              baseline: str | None = BASELINE_ALLOCATOR) -> DecayMetrics:
    """The `rounds`, `sqdr`, `brai` parts of summary.json (plus `by_case`, `bleu_signature`),
    as a DecayMetrics.

    `expected_reuse` maps case -> the block_reuse_rate of the guarded baseline of the same
    suite and case (from a stored baseline, e.g. for probes). Without it, the `baseline`
    allocator's rows of the same case in `df` give it, per round and overall (None: no
    baseline in `df`, as in a live probe). BRAI of the
    baseline itself is 0; None where no expected rate is known. `sqdr` / `brai` hold the main
    case ("trigger" if present, else the first case); `by_case` holds every case. `rounds`
    lists every case, with a `case` field. The contiguous reference gets no SQDR/BRAI.
    NaN values come out as None so the dict dumps as strict JSON.
    """
    from kvdiag.metrics.bleu import bleu_signature

    table = per_round(df)
    expected_reuse = dict(expected_reuse or {})
    rounds, by_case = [], {}
    for case, case_rows in table.groupby("case", sort=False):
        base = case_rows[case_rows["allocator"] == baseline]
        base_by_round = dict(zip(base["round"], base["block_reuse_rate"]))
        raw = df[(df["case"] == case) & (df["allocator"] == baseline)]
        expected = expected_reuse.get(case, block_reuse_rate(raw["blocks_hit"],
                                                             raw["blocks_needed"])
                                      if len(raw) else math.nan)
        sqdrs, brais = {}, {}
        for (target, allocator), series in case_rows.groupby(["target", "allocator"],
                                                             sort=False):
            name, is_base = series_name(target, allocator), allocator == baseline
            for rec in series.to_dict("records"):
                exp_r = expected if case in expected_reuse else base_by_round.get(
                    rec["round"], expected)
                rec["brai"] = 0.0 if is_base else brai(rec["block_reuse_rate"], exp_r)
                rounds.append(_json_safe(rec))
            if allocator in REFERENCE_ALLOCATORS:
                continue
            sqdrs[name] = sqdr(dict(zip(series["round"], series["fact_check_pass_rate"])))
            raw_s = df[(df["case"] == case) & (df["target"] == target)
                       & (df["allocator"] == allocator)]
            rate = block_reuse_rate(raw_s["blocks_hit"], raw_s["blocks_needed"])
            brais[name] = 0.0 if is_base else brai(rate, expected)
        by_case[case] = {"sqdr": _json_safe(sqdrs), "brai": _json_safe(brais)}
    cases = list(by_case)
    main = MAIN_CASE if MAIN_CASE in by_case else (cases[0] if cases else None)
    return DecayMetrics(rounds=rounds, sqdr=by_case[main]["sqdr"] if main else {},
                        brai=by_case[main]["brai"] if main else {}, main_case=main,
                        by_case=by_case, bleu_signature=bleu_signature())


def _json_safe(record: Mapping) -> dict:
    """NaN / pandas NA -> None, numpy scalars -> Python scalars."""
    out = {}
    for key, value in record.items():
        if hasattr(value, "item"):
            value = value.item()
        if value is None or (isinstance(value, float) and math.isnan(value)):
            value = None
        elif not isinstance(value, (str, int, float, bool)):
            value = None if str(value) == "<NA>" else value
        out[key] = value
    return out
