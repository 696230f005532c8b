"""A suite's cases through the in-process engine: for each case, the contiguous reference and
every allocator (runners/reference/), and the `vllm` allocator replayed through vLLM's own
KVCacheManager (runners/replay/) where a case names it. Returns records and raw facts only;
the reproduce, verify and regress commands judge them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from kvdiag.planning.suites import Case, Suite
from kvdiag.record.audit_section import AuditSection
from kvdiag.vocab import VLLM


@dataclass
class SuiteRun:
    """What a suite run measured: one record per (case, allocator, session, round), the
    engine's log lines and wall seconds per case and allocator, the cached blocks each
    allocator recycled per case, and vLLM's replay section per case (where it ran)."""

    records: list[dict] = field(default_factory=list)
    engine_log: dict[str, list[str]] = field(default_factory=dict)  # "case/allocator" -> lines
    seconds: dict[str, dict[str, float]] = field(default_factory=dict)
    recycled: dict[str, dict[str, int]] = field(default_factory=dict)
    vllm_audit: dict[str, AuditSection] = field(default_factory=dict)
    allocators: list[str] = field(default_factory=list)  # in the order first used

    @property
    def vllm_corrupted(self) -> bool:
        return any(s.corrupted for s in self.vllm_audit.values())


def case_allocators(suite: Suite, case: Case, override: list[str] | None) -> list[str]:
    return list(override or case.allocators or suite.allocators)


def total_requests(suite: Suite, cases: list[Case], override: list[str] | None) -> int:
    return sum(c.sessions * c.rounds * (1 + len(case_allocators(suite, c, override))) for c in cases)


def run_suite(suite: Suite, cases: list[Case], model_dir: Path, *,
              allocators: list[str] | None = None, device: str = "cpu", dtype: str | None = None,
              spacy_model: str | None = None, progress: Callable[[int], None] | None = None,
              on_case: Callable[[str], None] | None = None, use_cache: bool = True,
              check_integrity: bool = False) -> SuiteRun:
    """Every case through the contiguous reference (read from the on-disk reference cache
    when `use_cache`) and each allocator."""
    from kvdiag.planning.plan import plan_case
    from kvdiag.runners.reference.engine import run_case
    from reference_engine.loader import load_checkpoint

    vllm_api = None
    if any(VLLM in case_allocators(suite, c, allocators) for c in cases):
        from kvdiag.runners.replay.vllm_api import load

        vllm_api = load()  # fail before anything runs if vLLM is missing or unsupported
    checkpoint = load_checkpoint(model_dir)
    out = SuiteRun()
    for case in cases:
        if on_case:
            on_case(case.name)
        names = case_allocators(suite, case, allocators)
        out.allocators += [n for n in names if n not in out.allocators]
        plan = plan_case(suite, case, checkpoint.tokenizer)
        result = run_case(plan, checkpoint, [n for n in names if n != VLLM], device=device,
                          dtype=dtype, spacy_model=spacy_model, progress=progress,
                          use_cache=use_cache, check_integrity=check_integrity)
        out.records += [r.as_dict() for r in result.records]
        out.recycled[case.name] = dict(result.evicted)
        if VLLM in names:
            from kvdiag.runners.replay.audit import vllm_section
            from kvdiag.runners.replay.trace import from_plan
            from kvdiag.runners.replay.vllm import replay_vllm

            replay = replay_vllm(from_plan(plan, result.records), api=vllm_api)
            out.records += [r.as_dict() for r in replay.records]
            section = out.vllm_audit[case.name] = vllm_section(replay)
            out.recycled[case.name][VLLM] = section.recycled_blocks
            if progress:
                progress(len(replay.records))
        out.engine_log.update({f"{case.name}/{k}": v for k, v in result.engine_log.items()})
        out.seconds[case.name] = result.seconds
    return out
