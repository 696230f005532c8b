"""The rows summary.json's kinds are made of (kvdiag.record.summary): a round of the per-round
table, a case's SQDR and BRAI, a row of a probe's coverage table, a regression's comparison
block."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from kvdiag.verdicts import Verdict
from kvdiag.vocab import EVENTS

Num = int | float  # ints stay ints and floats floats, as the runs wrote them
Opt = Num | None


class RoundRow(BaseModel):
    """One (case, target, allocator, round) of the per-round table (metrics.decay.per_round)."""

    model_config = ConfigDict(extra="forbid")
    case: str | None = None
    target: str
    allocator: str
    round: int
    sessions: int | None = None
    bleu4: Opt = None
    fact_check_pass_rate: Opt = None
    attention_leakage: Opt = None
    attention_leakage_max: Opt = None
    block_reuse_rate: Opt = None
    foreign_slots: int = 0
    unwritten_slots: int = 0
    guard_rejections: int = 0
    nonfinite_logits: int = 0
    preemptions: int = 0
    diverged_sessions: int = 0
    brai: Opt = None


class CaseMetrics(BaseModel):
    """One case's run-level metrics (summary.json's `by_case`, from
    kvdiag.metrics.decay.summarize): series -> SQDR and series -> BRAI (None: no value; the
    contiguous reference has neither). A key not declared here is ignored on load."""

    model_config = ConfigDict(extra="ignore")
    sqdr: dict[str, Opt] = Field(default_factory=dict)
    brai: dict[str, Opt] = Field(default_factory=dict)


class EventRow(BaseModel):
    """One row of a probe's coverage table (kvdiag.vocab.EVENTS)."""

    model_config = ConfigDict(extra="forbid")
    event: Literal[tuple(EVENTS)]  # type: ignore[valid-type]
    reached: bool
    evidence: str
    requests: int
    server: dict[str, Opt] = Field(default_factory=dict)


class MatrixRow(BaseModel):
    """One row of kvdiag detect's matrix (results.parquet and summary.json's `matrix`): a fault
    on a path, the verdict its run gave and the one a run that catches it gives, whether it
    was caught and by which channel, and how soon (kvdiag.commands.detect)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, serialize_by_alias=True)
    fault: str
    path: str
    fault_class: str = Field("-", alias="class")
    event: str = "-"
    reports: str = ""
    verdict: Verdict
    expected: Verdict
    caught: bool
    caught_by: str = "-"
    corrupted: int | None = None
    first_round: int | None = None
    requests_to_first: int | None = None
    numerics: int | None = None
    seconds: Num | None = None
    run_dir: str | None = None
    reason: str = ""


class SeriesGate(BaseModel):
    """One guarded series of a reproduce run against the contiguous reference: flat (no
    finding) or not, and the findings."""

    model_config = ConfigDict(extra="forbid")
    passed: bool
    failures: list[str] = Field(default_factory=list)


class SeriesFindings(BaseModel):
    """What kvdiag.verdicts.judge_reference found per series (its details; a reproduce
    summary's `gates` and `faults`): each clean series' gate, each faulty series' findings,
    both keyed case/series."""

    model_config = ConfigDict(extra="ignore")
    gates: dict[str, SeriesGate] = Field(default_factory=dict)
    faults: dict[str, list[str]] = Field(default_factory=dict)


class VerifyGate(BaseModel):
    """kvdiag verify's gate (kvdiag.verdicts.judge_gate): --expect-guard or --expect-bug on one
    allocator and case, whether it held, every finding, the first shown, the failing rounds."""

    model_config = ConfigDict(extra="forbid")
    name: Literal["expect-guard", "expect-bug"]
    allocator: str
    case: str
    passed: bool
    findings: list[str] = Field(default_factory=list)
    what: str = ""
    shown: list[str] = Field(default_factory=list)
    failing_rounds: list[int] = Field(default_factory=list)


class KeyBlock(BaseModel):
    """What a baseline is keyed by (kvdiag.regress.keys.BaselineKey): a run is compared only
    with a baseline of the same engine, version, model, suite and cache flags."""

    model_config = ConfigDict(extra="forbid")
    engine: str
    engine_version: str
    model: str
    suite: str
    suite_sha: str
    flags: dict[str, str | int | float | bool | None] = Field(default_factory=dict)


class BaselineRef(BaseModel):
    """The baseline a regress run was held against: its file, run, target, date and key."""

    model_config = ConfigDict(extra="forbid")
    path: str
    run_id: str
    target: str
    created: str
    key_id: str


class RoundMeasurement(BaseModel):
    """One round of a case as kvdiag.regress.measure measured it: the round and its metrics
    (kvdiag.regress.measure.ROUND_METRICS; None where the round has no value)."""

    model_config = ConfigDict(extra="forbid")
    round: int
    fact_check_pass_rate: Opt = None
    bleu4: Opt = None
    block_reuse_rate: Opt = None
    attention_leakage: Opt = None
    divergence_ratio: Opt = None
    foreign_slots: Opt = None
    unwritten_slots: Opt = None
    nonfinite_logits: Opt = None


class CaseMeasurement(BaseModel):
    """One case as kvdiag.regress.measure measured it: the series under test, its run-level
    metrics, and each round's (`rounds`: round and the per-round metrics)."""

    model_config = ConfigDict(extra="forbid")
    series: str
    sqdr: Opt = None
    block_reuse_rate: Opt = None
    attention_leakage: Opt = None
    divergence_ratio: Opt = None
    requests: int = 0
    rounds: list[RoundMeasurement] = Field(default_factory=list)


class FailedCheck(BaseModel):
    """A check against the baseline that failed (kvdiag.regress.compare.Check): the case, the
    metric and round (None: the whole run), the value, the baseline's, the worst still passing."""

    model_config = ConfigDict(extra="forbid")
    case: str
    metric: str
    round: int | None = None
    value: Opt = None
    baseline: Opt = None
    limit: Opt = None
    passed: bool = False
    message: str = ""


class RegressBlock(BaseModel):
    model_config = ConfigDict(extra="forbid")
    run_id: str
    target: str
    verdict: Verdict
    reason: str = ""
    key: KeyBlock
    key_id: str
    tolerances: dict[str, Num]
    measurement: dict[str, CaseMeasurement]
    brai: dict[str, Opt]
    baseline: BaselineRef | None
    regressed: dict[str, list[int]]
    ground_truth_failures: list[str]
    failed_checks: list[FailedCheck]


class CompareTarget(BaseModel):
    """One target of kvdiag compare, judged by its own probe (kvdiag.commands.compare)."""

    model_config = ConfigDict(extra="forbid")
    target: str = Field(description="the target's spec")
    verdict: Verdict
    reason: str = ""
    run_dir: str | None = Field(None, description="its own run directory, under the comparison's")
    signature: str | None = None
    sqdr: Opt = None
    first_corruption_round: int | None = None
