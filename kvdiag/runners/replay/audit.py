"""The vLLM audit as data: a trace (recorded, or made from a suite case and the contiguous
reference) replayed through vLLM's KVCacheManager and through one of our allocators, turned
into the same records as a reproduce run, so report and regress read it unchanged. Returns
what was measured; kvdiag.commands.audit judges it."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from kvdiag.record.audit_section import (
    AuditCompare,
    AuditRound,
    AuditSection,
    AuditTwins,
    CompareStage,
)
from kvdiag.runners.records import Record
from kvdiag.runners.replay.trace import Trace, is_twin
from kvdiag.vocab import CONTIGUOUS


def trace_for_case(suite, case, model=None, device: str = "cpu", dtype: str | None = None, *,
                   spread: bool = True, twins: bool = True, adapter: str | None = None) -> Trace:
    """Plan the case with the model's tokenizer and run the contiguous reference for the
    outputs every replay teacher-forces. `spread`, `adapter` (kvdiag.planning.plan) and `twins`
    (trace.from_plan) are the live probe's traffic, so the audit reaches what it reaches."""
    from kvdiag.paths import CANARY
    from kvdiag.planning.plan import plan_case
    from kvdiag.runners.reference.engine import run_case
    from kvdiag.runners.replay.trace import from_plan
    from reference_engine.loader import load_checkpoint

    checkpoint = load_checkpoint(Path(model or suite.model or CANARY))
    plan = plan_case(suite, case, checkpoint.tokenizer, spread=spread, adapter=adapter)
    result = run_case(plan, checkpoint, [], device=device, dtype=dtype)
    return from_plan(plan, result.records, twins=twins)


def reference_records(trace: Trace) -> list[Record]:
    """The contiguous reference's rows, from the outputs the trace carries."""
    return [Record(case=trace.config.case, target="reference", allocator=CONTIGUOUS,
                   session=r.session, round=r.round, kind=r.kind, prompt_tokens=len(r.prompt_ids),
                   output_text=r.output_text, reference_text=r.output_text,
                   expected_text=r.expected_text, output_token_ids=list(r.output_ids),
                   reference_token_ids=list(r.output_ids), fact_check_pass=r.fact_check_pass,
                   fact_check_reason=r.fact_check_reason)
            for r in trace.requests]


def vllm_section(result, ours=None, stages=()) -> AuditSection:
    """summary.json's "vllm_audit": vLLM's own statistics, invariants, per-round reads (the
    twins' reads counted apart, under `twins`)."""
    rounds: dict[int, AuditRound] = {}
    twins = [r for r in result.records if is_twin(r.session)]
    for r in result.records:
        if is_twin(r.session):
            continue
        row = rounds.setdefault(r.round, AuditRound(round=r.round))
        row.hit_tokens += r.cached_tokens
        row.query_tokens += r.prompt_tokens
        row.foreign_slots += r.foreign_slots
        row.unwritten_slots += r.unwritten_slots
        if r.foreign_slots or r.unwritten_slots:
            row.sessions_with_foreign_reads.append(r.session)
    for row in rounds.values():
        row.vllm_hit_rate = row.hit_tokens / row.query_tokens if row.query_tokens else 0.0
    bad_rounds = sorted({n for n, row in rounds.items() if row.foreign_slots or row.unwritten_slots}
                        | {r.round for r in twins if r.foreign_slots or r.unwritten_slots})
    section = AuditSection.model_validate(result.stats | {
        "target": result.target, "steps": result.steps,
        "replay_seconds": round(result.seconds, 3), "invariant_messages": result.violations,
        "rounds": list(rounds.values()),
        "twins": AuditTwins(requests=len(twins), foreign_slots=sum(r.foreign_slots for r in twins),
                            unwritten_slots=sum(r.unwritten_slots for r in twins)),
        "corrupted_rounds": bad_rounds,
        "corrupted": bool(bad_rounds) or bool(result.stats.get("invariant_violations"))})
    if ours is not None:
        mine = {(r.session, r.round): r.blocks_hit for r in ours.records}
        theirs = {(r.session, r.round): r.blocks_hit for r in result.records}
        section.compare = AuditCompare(
            allocator=ours.allocator, blocks_hit=sum(mine.values()),
            vllm_blocks_hit=sum(theirs.values()),
            requests_differing=sum(mine[k] != theirs[k] for k in mine),
            requests=len(mine), invariant_messages=ours.violations,
            explained=[CompareStage(stage=s.label, requests_differing=len(s.differing),
                                    blocks_hit=s.ours_blocks_hit, vllm_blocks_hit=s.vllm_blocks_hit)
                       for s in stages])
    return section


@dataclass
class AuditRun:
    """What an audit measured: the records (the reference's, vLLM's and, with `compare`, one
    allocator of ours), their metrics, and the replays themselves for the renderer."""

    trace: Trace
    frame: object  # pandas DataFrame
    metrics: dict  # kvdiag.metrics.decay.summarize of the frame
    vllm: object  # ReplayResult of vLLM's KVCacheManager
    ours: object | None  # ReplayResult of one of our allocators, or None
    stages: list = field(default_factory=list)  # hit_diff stages explaining hit differences
    vllm_version: str = ""

    @cached_property
    def section(self) -> AuditSection:
        """summary.json's "vllm_audit", built once: the audit's judge writes the differential
        phase's over-hits into it (kvdiag.commands.audit.judge) and the summary stores it."""
        return vllm_section(self.vllm, self.ours, self.stages)

    def _bad_turns(self) -> list:
        return [t for turns in self.vllm.turns.values() for t in turns
                if t.stats.foreign_slots or t.stats.unwritten_slots]

    def corrupted_requests(self) -> int:
        """Requests (twins included) that read a foreign or unwritten slot."""
        return len(self._bad_turns())

    def first_corruption(self) -> tuple[int | None, int | None]:
        """(its round, requests admitted up to and including it) of the first request that
        read a foreign or unwritten slot; (None, None) when none did."""
        bad = self._bad_turns()
        if not bad:
            return None, None
        first = min(bad, key=lambda t: t.admitted)
        return first.tag.round + 1, first.admitted + 1


def audit_trace(trace: Trace, *, compare: str | None = "prefix-cache", explain: bool = True,
                api=None, epilogue: bool = True) -> AuditRun:
    """Replay `trace` through vLLM (and `compare`, one of our allocators), then vLLM's
    isolation and reset checks (epilogue.py)."""
    import pandas as pd

    from kvdiag.metrics.decay import summarize
    from kvdiag.runners.replay.drive import replay_allocator
    from kvdiag.runners.replay.vllm import replay_vllm
    from kvdiag.runners.replay.vllm_api import load

    api = api or load()
    result = replay_vllm(trace, api=api, epilogue=epilogue)
    ours = replay_allocator(trace, compare) if compare else None
    stages = []
    if explain and compare == "prefix-cache":
        from kvdiag.runners.replay.hit_diff import explain as explain_hits

        stages = explain_hits(trace, api)
    rows = [r for r in reference_records(trace) + result.records + (ours.records if ours else [])
            if not is_twin(r.session)]  # twins are traffic: their reads are in the section
    frame = pd.DataFrame([r.as_dict() for r in rows])
    return AuditRun(trace, frame, summarize(frame), result, ours, stages, api.version)
