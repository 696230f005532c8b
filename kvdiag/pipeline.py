"""One suite run against the reference engine: plan every case, run the contiguous
reference and each allocator, compute metrics, and assemble summary.json. Library code:
returns data, prints nothing (the CLI renders)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from kvdiag.lifecycle import RunResult
from kvdiag.paths import CANARY
from kvdiag.suites import Case, Suite
from kvdiag.verdicts import FAIL, judge
from kvdiag.vocab import VLLM


def case_allocators(suite: Suite, case: Case, override: list[str] | None) -> list[str]:
    return list(override or case.allocators or suite.allocators)


def total_requests(suite: Suite, cases: list[Case], override: list[str] | None) -> int:
    return sum(c.sessions * c.rounds * (1 + len(case_allocators(suite, c, override))) for c in cases)


def run_suite(suite: Suite, cases: list[Case], *, allocators: list[str] | None = None,
              model: Path | None = None, device: str = "cpu", dtype: str | None = None,
              spacy_model: str | None = None, progress: Callable[[int], None] | None = None,
              on_case: Callable[[str], None] | None = None, kind: str = "reproduce",
              use_cache: bool = True) -> RunResult:
    """Every case through the contiguous reference (read from the on-disk reference cache
    when `use_cache`) and each allocator; the RunResult with summary.json's content."""
    import pandas as pd

    from kvdiag.metrics.decay import summarize
    from kvdiag.runners.plan import plan_case
    from kvdiag.runners.reference import run_case
    from kvdiag.runs import model_label, signature
    from reference_engine.loader import load_checkpoint

    model_dir = Path(model or suite.model or CANARY)
    vllm_api = None
    if any(VLLM in case_allocators(suite, c, allocators) for c in cases):
        from kvdiag.runners.vllm_api import load

        vllm_api = load()  # fail before anything runs if vLLM is missing or unsupported
    vllm_stats = {}
    checkpoint = load_checkpoint(model_dir)
    records, logs, seconds = [], {}, {}
    used: list[str] = []
    for case in cases:
        if on_case:
            on_case(case.name)
        names = case_allocators(suite, case, allocators)
        used += [n for n in names if n not in used]
        plan = plan_case(suite, case, checkpoint.tokenizer)
        result = run_case(plan, checkpoint, [n for n in names if n != VLLM], device=device,
                          dtype=dtype, spacy_model=spacy_model, progress=progress,
                          use_cache=use_cache)
        records += [r.as_dict() for r in result.records]
        if VLLM in names:
            from kvdiag.runners.trace import from_plan
            from kvdiag.runners.vllm_audit import vllm_section
            from kvdiag.runners.vllm_replay import replay_vllm

            replay = replay_vllm(from_plan(plan, result.records), api=vllm_api)
            records += [r.as_dict() for r in replay.records]
            vllm_stats[case.name] = vllm_section(replay)
            if progress:
                progress(len(replay.records))
        logs.update({f"{case.name}/{k}": v for k, v in result.engine_log.items()})
        seconds[case.name] = result.seconds
    frame = pd.DataFrame(records)
    summary = summarize(frame)
    summary.update({
        "signature": signature(engine="reference", allocators=used, block_size=suite.block_size,
                               model=model_label(model_dir), suite=suite.name, seed=suite.seed),
        "suite": suite.name,
        "suite_path": str(suite.path),
        "cases": [c.name for c in cases],
        "targets": ["reference"],
        "allocators": used,
        "model": str(model_dir),
        "device": device,
        "engine_log": logs,
        "seconds": seconds,
    })
    if vllm_stats:
        summary["vllm_audit"] = vllm_stats
    summary.update(judge(summary["rounds"], [(c.name, c.ablation) for c in cases]))
    if any(s["corrupted"] for s in vllm_stats.values()):
        summary["verdict"] = FAIL  # vLLM read foreign slots or broke an invariant
    return RunResult(kind, frame, summary, extra={"engine_log": logs})

