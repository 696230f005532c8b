"""kvdiag audit-vllm: a case's traffic through vLLM's own KVCacheManager, model-free.

    plan     the recorded trace, or the suite's case planned and its contiguous reference
             run; a fault to plant into vLLM in this process (`--fault`), checked first
    measure  kvdiag.runners.replay.audit.audit_trace (the fault planted for the replay only)
    judge    kvdiag.verdicts.judge_audit
    finish   AuditSummary, kvdiag.commands.lifecycle.finish_run
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path

from kvdiag.commands.lifecycle import finish_run
from kvdiag.errors import KvdiagError
from kvdiag.record.results import RunExtras, RunResult, Signature, model_label
from kvdiag.record.summary import AuditSummary
from kvdiag.runners.replay.audit import AuditRun, audit_trace, trace_for_case
from kvdiag.verdicts import Judgement, differential_over_hits, judge_audit, judge_reference
from kvdiag.vocab import VLLM


def judge(run: AuditRun) -> Judgement:
    """judge_audit's verdict; the differential phase's over-hits, counted by the judge
    (differential_over_hits), written into the epilogue's figures and findings first (once:
    run.section is built once, so they stay)."""
    section = run.section
    epilogue = section.epilogue
    if epilogue is not None and epilogue.differential.over_hits is None:
        epilogue.differential.over_hits, found = differential_over_hits(epilogue.differential.rows)
        epilogue.findings = [*epilogue.findings, *found]
    return judge_audit(corrupted_rounds=section.corrupted_rounds,
                       invariant_violations=section.invariant_violations,
                       cross_tenant_hits=section.cross_tenant_hits,
                       recycled_blocks=section.recycled_blocks,
                       epilogue=epilogue.findings if epilogue is not None else [])


def summary_fields(run: AuditRun, label: str, seed: int, fault: str | None,
                   verdict: Judgement) -> dict:
    cfg = run.trace.config
    allocators = [VLLM] + ([run.ours.allocator] if run.ours else [])
    signature = Signature(engine=f"vllm-replay:{run.vllm_version}", allocators=tuple(allocators),
                          block_size=cfg.block_size, model=label, suite=cfg.suite, seed=seed)
    # the rows of every series, judged as reproduce judges them, for the page's tables
    shown = judge_reference(run.metrics.rounds, [(cfg.case, False)],
                            {cfg.case: {VLLM: run.section.recycled_blocks}})
    return run.metrics.fields() | {
        "signature": signature.format(), "suite": cfg.suite, "cases": [cfg.case],
        "targets": [run.vllm.target] + ([run.ours.target] if run.ours else []),
        "allocators": allocators, "model": label, "fault": fault, "vllm_audit": run.section,
        "verdict": verdict.verdict, "reason": verdict.reason, **shown.details}


def audit_run(suite: str, case: str | None = None, *, trace: Path | None = None,
              write_trace: Path | None = None, compare: str = "prefix-cache",
              model: Path | None = None, device: str = "cpu", out_dir: Path | None = None,
              fault: str | None = None, info: Callable[[str], None] = lambda _: None) -> RunResult:
    """kvdiag audit-vllm, start to finish: the recorded `trace`, or the trace of the suite's
    `case`, saved to `write_trace` if given, audited with `compare` ('none': no allocator of
    ours) and `fault` planted in vLLM for the replay, into a finished run directory."""
    from kvdiag.paths import CANARY
    from kvdiag.planning.suites import load_cases
    from kvdiag.record.rundir import RunDir, Timer
    from kvdiag.runners.replay.trace import read_trace
    from kvdiag.runners.replay.trace import write_trace as save_trace
    from kvdiag.targets import check_allocator

    timer = Timer()
    compare = None if compare == "none" else check_allocator(compare)  # before any work
    if fault is not None:
        from kvdiag.engines.vllm.catalog import describe

        describe(fault)
    if trace is not None:
        if case is not None:
            raise KvdiagError("give --trace or --case, not both")
        recorded, seed = read_trace(trace), 0
        digest = hashlib.sha256(Path(trace).read_bytes()).hexdigest()[:8]
        label = recorded.config.model or f"trace-{digest}"
    else:
        loaded, (chosen,) = load_cases(suite, case, one=True)
        info(f"planning {loaded.name}/{chosen.name} and running the contiguous reference ...")
        model_dir = Path(model or loaded.model or CANARY)
        recorded = trace_for_case(loaded, chosen, model=model_dir, device=device)
        label, seed = model_label(model_dir), loaded.seed
        recorded.config = recorded.config.with_model(label)
    if write_trace is not None:
        save_trace(recorded, write_trace)
        info(f"trace written to {write_trace}")
    with RunDir.begin(out_dir, recorded.config.suite) as run_dir:
        measured = planted_audit(recorded, compare, fault)
    verdict = judge(measured)
    summary = AuditSummary(**summary_fields(measured, label, seed, fault, verdict))
    result = RunResult("audit", measured.frame, summary,
                       extra=RunExtras(vllm=measured.vllm, ours=measured.ours, stages=measured.stages))
    return finish_run(result, run_dir, timer)


def planted_audit(trace, compare: str | None, fault: str | None, api=None) -> AuditRun:
    """audit_trace with `fault` planted into this process's vLLM for the replay only."""
    from kvdiag.runners.replay.vllm_api import load

    api = api or load()  # vLLM imported (and checked) before anything is patched
    if fault is None:
        return audit_trace(trace, compare=compare, api=api)
    from kvdiag.engines.vllm.plants import plant

    undo = plant(fault)
    try:
        return audit_trace(trace, compare=compare, explain=False, api=api)
    finally:
        undo()
