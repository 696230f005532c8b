"""The history rows the Prometheus exporter publishes, typed: the newest run of each (suite,
target, model) with the rounds of its main case, and the rows of the newest isolation audit
of each (target, model). Built here, and only here, from what kvdiag.regress.history returns
(pandas records, sqlite rows); the exporter reads them by attribute.

A text column keeps the value the history holds (None where it holds NULL: the exporter's
labels print it as before); a numeric column is a float or None (NULL, NaN or not a number),
as the exporter publishes it or leaves it out; a verdict is a Verdict (anything unknown reads
as error, never as a pass).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path

from kvdiag.verdicts import Verdict


def number(v) -> float | None:
    """A numeric column's value as the exporter publishes it; None: leave the sample out."""
    if v is None:
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(f) else f


@dataclass(frozen=True)
class RoundRow:
    """One round of a run's main case (the history's `rounds` table)."""

    round: int
    fact_check_pass_rate: float | None
    bleu4: float | None

    @classmethod
    def of(cls, record: Mapping) -> RoundRow:
        return cls(round=int(record["round"]),
                   fact_check_pass_rate=number(record.get("fact_check_pass_rate")),
                   bleu4=number(record.get("bleu4")))


@dataclass(frozen=True)
class RunRow:
    """The newest run of a (suite, target, model): the history's `runs` row, with the rounds
    of its main case (oldest first)."""

    run_id: str
    created: str  # ISO 8601, as the history stamps it
    suite: str
    target: str
    engine: str | None
    engine_version: str | None
    model: str | None
    signature: str | None
    main_case: str | None
    verdict: Verdict
    sqdr: float | None
    brai: float | None
    attention_leakage: float | None
    divergence_ratio: float | None
    block_reuse_rate: float | None
    rounds: tuple[RoundRow, ...] = ()

    @classmethod
    def of(cls, record: Mapping, rounds: tuple[RoundRow, ...] = ()) -> RunRow:
        return cls(
            **{k: record.get(k) for k in _RUN_TEXT}, verdict=Verdict.parse(record.get("verdict")),
            **{k: number(record.get(k)) for k in _RUN_VALUES}, rounds=rounds)

    @property
    def model_name(self) -> str:
        """The served name for live targets (so it joins vLLM's model_name); the model label
        (<dir>-<sha8>) for the reference engine."""
        model = str(self.model or "")
        return model.split("@", 1)[0] if self.engine != "reference" else model

    @property
    def timestamp(self) -> float:
        """When the run was made (Unix time)."""
        return datetime.fromisoformat(self.created).timestamp()


_RUN_TEXT = ("run_id", "created", "suite", "target", "engine", "engine_version", "model",
             "signature", "main_case")
_RUN_VALUES = ("sqdr", "brai", "attention_leakage", "divergence_ratio", "block_reuse_rate")


@dataclass(frozen=True)
class IsolationRow:
    """One (configuration, prefix length) of a tenant-isolation audit (the history's
    `isolation` table)."""

    target: str
    model: str | None
    verdict: Verdict  # the audit's, the same on each of its rows
    config: str
    length: int
    auc: float | None
    cached_correct: float | None  # mean cached tokens of the correct guesses
    cached_wrong: float | None

    @classmethod
    def of(cls, record: Mapping) -> IsolationRow:
        return cls(target=record["target"], model=record.get("model"),
                   verdict=Verdict.parse(record.get("verdict")), config=record["config"],
                   length=int(record["length"]), auc=number(record.get("auc")),
                   cached_correct=number(record.get("cached_correct")),
                   cached_wrong=number(record.get("cached_wrong")))


def latest_runs(history: Path, suite: str | None = None) -> list[RunRow]:
    """The newest run of each (suite, target, model), with the rounds of its main case."""
    from kvdiag.regress import history as H

    frame = H.runs(history, suite=suite)
    if frame.empty:
        return []
    newest = frame.groupby(["suite", "target", "model"], sort=False).tail(1).to_dict("records")
    runs = [RunRow.of(r) for r in newest]
    rounds: dict[tuple, list[RoundRow]] = {}  # (run id, case) -> its rounds
    for r in H.rounds_of(history, [run.run_id for run in runs]).to_dict("records"):
        rounds.setdefault((r["run_id"], r["case_name"]), []).append(RoundRow.of(r))
    return [replace(run, rounds=tuple(rounds.get((run.run_id, run.main_case), ()))) for run in runs]


def latest_isolation(history: Path) -> list[IsolationRow]:
    """The rows of the newest isolation audit of each (target, model)."""
    from kvdiag.regress import history as H

    return [IsolationRow.of(r) for r in H.latest_isolation(history)]
