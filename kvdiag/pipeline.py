"""One suite run against the reference engine: plan every case, run the contiguous
reference and each allocator, compute metrics, and assemble summary.json. Library code:
returns data, prints nothing (the CLI renders)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kvdiag.paths import CANARY
from kvdiag.regress.verdicts import GUARD_LOG_LINE, fault_findings, guard_gate, series
from kvdiag.runners.reference import CONTIGUOUS
from kvdiag.suites import Case, Suite

CLEAN = ("prefix-cache", "vllm")  # allocators expected flat, besides every guarded one
VLLM = "vllm"  # not an allocator of ours: the case's traffic replayed through vLLM's own
# KVCacheManager (kvdiag.runners.vllm_replay), teacher-forced with the contiguous reference


def expected_clean(name: str, case: Case) -> bool:
    """Series the guard gate applies to: guarded allocators, the correct allocator, and
    every allocator of an ablation (control) case."""
    return case.ablation or name.startswith("guarded") or name in CLEAN


@dataclass
class SuiteRun:
    frame: object  # pandas DataFrame of records
    summary: dict
    engine_log: dict[str, list[str]]


def case_allocators(suite: Suite, case: Case, override: list[str] | None) -> list[str]:
    return list(override or case.allocators or suite.allocators)


def total_requests(suite: Suite, cases: list[Case], override: list[str] | None) -> int:
    return sum(c.sessions * c.rounds * (1 + len(case_allocators(suite, c, override))) for c in cases)


def run_suite(suite: Suite, cases: list[Case], *, allocators: list[str] | None = None,
              model: Path | None = None, device: str = "cpu", dtype: str | None = None,
              spacy_model: str | None = None, progress: Callable[[int], None] | None = None,
              on_case: Callable[[str], None] | None = None) -> SuiteRun:
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
                          dtype=dtype, spacy_model=spacy_model, progress=progress)
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
    summary.update(judge(summary, cases))
    if any(s["corrupted"] for s in vllm_stats.values()):
        summary["verdict"] = "fail"  # vLLM read foreign slots or broke an invariant
    return SuiteRun(frame, summary, logs)


def judge(summary: dict, cases: list[Case]) -> dict:
    """verdict: pass when every series expected clean passes the guard gate; plus what the
    faulty allocators showed (the reproduction itself)."""
    gates, faults = {}, {}
    for case in cases:
        rounds = [r for r in summary["rounds"] if r.get("case") == case.name]
        reference = series(rounds, case.name, CONTIGUOUS)
        for name in dict.fromkeys(r["allocator"] for r in rounds):
            if name == CONTIGUOUS:
                continue
            rows = series(rounds, case.name, name)
            if name == VLLM:  # vLLM registers blocks when it schedules them, so its reuse
                # differs from our engine's by design (runners/hit_diff.py): BRAI against our
                # guarded baseline is no anomaly signal for it
                rows = [{**r, "brai": None} for r in rows]
            if expected_clean(name, case):
                gate = guard_gate(rows, reference)
                gates[f"{case.name}/{name}"] = {"passed": gate.passed, "failures": gate.failures}
            else:
                faults[f"{case.name}/{name}"] = fault_findings(rows, reference)
    verdict = "pass" if all(g["passed"] for g in gates.values()) else "fail"
    return {"verdict": verdict, "gates": gates, "faults": faults}


def guard_logged(engine_log: dict[str, list[str]], case: str, allocator: str) -> bool:
    return GUARD_LOG_LINE in engine_log.get(f"{case}/{allocator}", [])
