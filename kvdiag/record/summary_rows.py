"""The rows summary.json's kinds are made of (kvdiag.record.summary): a round of the per-round
table, a row of a probe's coverage table, a regression's comparison block."""

from __future__ import annotations

from typing import Any, Literal

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


class EventRow(BaseModel):
    """One row of a probe's coverage table (kvdiag.vocab.EVENTS)."""

    model_config = ConfigDict(extra="forbid")
    event: Literal[tuple(EVENTS)]  # type: ignore[valid-type]
    reached: bool
    evidence: str
    requests: int
    server: dict[str, Opt] = Field(default_factory=dict)


class RegressBlock(BaseModel):
    model_config = ConfigDict(extra="forbid")
    run_id: str
    target: str
    verdict: Verdict
    reason: str = ""
    key: dict[str, Any]
    key_id: str
    tolerances: dict[str, Num]
    measurement: dict[str, dict[str, Any]]
    brai: dict[str, Opt]
    baseline: dict[str, Any] | None
    regressed: dict[str, list[int]]
    ground_truth_failures: list[str]
    failed_checks: list[dict[str, Any]]


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
