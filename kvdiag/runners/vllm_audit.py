"""The vLLM audit as data: a trace (recorded, or made from a suite case and the contiguous
reference) replayed through vLLM's KVCacheManager and through one of our allocators, turned
into the same records, summary and verdict as a reproduce run, so report, verify and regress
read it unchanged; `audit_run` does it from `kvdiag audit-vllm`'s options to a finished run
directory. Library code: returns data, prints nothing."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from kvdiag.errors import KvdiagError
from kvdiag.lifecycle import RunResult
from kvdiag.runners.records import Record
from kvdiag.runners.trace import Trace
from kvdiag.verdicts import FAIL, INCONCLUSIVE, PASS, judge
from kvdiag.vocab import CONTIGUOUS, VLLM


def trace_for_case(suite, case, model=None, device: str = "cpu", dtype: str | None = None) -> Trace:
    """Plan the case with the model's tokenizer and run the contiguous reference for the
    outputs every replay teacher-forces."""
    from kvdiag.paths import CANARY
    from kvdiag.runners.plan import plan_case
    from kvdiag.runners.reference import run_case
    from kvdiag.runners.trace import from_plan
    from reference_engine.loader import load_checkpoint

    checkpoint = load_checkpoint(Path(model or suite.model or CANARY))
    plan = plan_case(suite, case, checkpoint.tokenizer)
    result = run_case(plan, checkpoint, [], device=device, dtype=dtype)
    return from_plan(plan, result.records)


def reference_records(trace: Trace) -> list[Record]:
    """The contiguous reference's rows, from the outputs the trace carries."""
    return [Record(case=trace.config.case, target="reference", allocator=CONTIGUOUS,
                   session=r.session, round=r.round, kind=r.kind, prompt_tokens=len(r.prompt_ids),
                   output_text=r.output_text, reference_text=r.output_text,
                   expected_text=r.expected_text, output_token_ids=list(r.output_ids),
                   reference_token_ids=list(r.output_ids), fact_check_pass=r.fact_check_pass,
                   fact_check_reason=r.fact_check_reason)
            for r in trace.requests]


def vllm_section(result, ours=None, stages=()) -> dict:
    """summary.json's "vllm_audit": vLLM's own statistics, invariants, per-round reads."""
    rounds: dict[int, dict] = {}
    for r in result.records:
        row = rounds.setdefault(r.round, {"round": r.round, "hit_tokens": 0, "query_tokens": 0,
                                          "foreign_slots": 0, "unwritten_slots": 0,
                                          "sessions_with_foreign_reads": []})
        row["hit_tokens"] += r.cached_tokens
        row["query_tokens"] += r.prompt_tokens
        row["foreign_slots"] += r.foreign_slots
        row["unwritten_slots"] += r.unwritten_slots
        if r.foreign_slots or r.unwritten_slots:
            row["sessions_with_foreign_reads"].append(r.session)
    for row in rounds.values():
        row["vllm_hit_rate"] = row["hit_tokens"] / row["query_tokens"] if row["query_tokens"] else 0.0
    bad_rounds = sorted(n for n, row in rounds.items() if row["foreign_slots"] or row["unwritten_slots"])
    section = {"target": result.target, **result.stats, "steps": result.steps,
               "replay_seconds": round(result.seconds, 3),
               "invariant_messages": result.violations, "rounds": list(rounds.values()),
               "corrupted_rounds": bad_rounds,
               "corrupted": bool(bad_rounds) or bool(result.stats.get("invariant_violations"))}
    if ours is not None:
        mine = {(r.session, r.round): r.blocks_hit for r in ours.records}
        theirs = {(r.session, r.round): r.blocks_hit for r in result.records}
        section["compare"] = {
            "allocator": ours.allocator, "blocks_hit": sum(mine.values()),
            "vllm_blocks_hit": sum(theirs.values()),
            "requests_differing": sum(mine[k] != theirs[k] for k in mine),
            "requests": len(mine), "invariant_messages": ours.violations,
            "explained": [{"stage": s.label, "requests_differing": len(s.differing),
                           "blocks_hit": s.ours_blocks_hit, "vllm_blocks_hit": s.vllm_blocks_hit}
                          for s in stages]}
    return section


def audit_trace(trace: Trace, *, compare: str | None = "prefix-cache", explain: bool = True,
                api=None, model_label: str = "trace", seed: int = 0) -> RunResult:
    """Replay `trace` through vLLM (and `compare`, one of our allocators); records, summary
    (as summary.json holds it) and the verdict: fail when vLLM read a foreign or unwritten
    slot or broke an invariant. `extra` holds the replays ("vllm", "ours") for rendering."""
    import pandas as pd

    from kvdiag.metrics.decay import summarize
    from kvdiag.runners.replay import replay_allocator
    from kvdiag.runners.vllm_api import load
    from kvdiag.runners.vllm_replay import replay_vllm
    from kvdiag.runs import signature

    api = api or load()
    result = replay_vllm(trace, api=api)
    ours = replay_allocator(trace, compare) if compare else None
    stages = []
    if explain and compare == "prefix-cache":
        from kvdiag.runners.hit_diff import explain as explain_hits

        stages = explain_hits(trace, api)
    rows = reference_records(trace) + result.records + (ours.records if ours else [])
    frame = pd.DataFrame([r.as_dict() for r in rows])
    summary = summarize(frame)
    cfg = trace.config
    allocators = [VLLM] + ([compare] if compare else [])
    summary.update({
        "signature": signature(engine=f"vllm-replay:{api.version}", allocators=allocators,
                               block_size=cfg.block_size, model=model_label, suite=cfg.suite,
                               seed=seed),
        "suite": cfg.suite, "cases": [cfg.case], "targets": [result.target] + ([ours.target] if ours else []),
        "allocators": allocators, "model": model_label,
        "vllm_audit": vllm_section(result, ours, stages),
    })
    summary.update(judge(summary["rounds"], [(cfg.case, False)]))
    if summary["verdict"] == INCONCLUSIVE:  # the audit judges vLLM: a faulty allocator of
        summary["verdict"] = PASS  # ours replayed beside it is only a comparison
    if summary["vllm_audit"]["corrupted"]:
        summary["verdict"] = FAIL
    return RunResult("audit", frame, summary, extra={"vllm": result, "ours": ours, "stages": stages})


def audit_run(suite: str, case: str | None = None, *, trace: Path | None = None,
              write_trace: Path | None = None, compare: str = "prefix-cache",
              model: Path | None = None, device: str = "cpu", out_dir: Path | None = None,
              info: Callable[[str], None] = lambda _: None) -> RunResult:
    """kvdiag audit-vllm, start to finish: the recorded `trace`, or the trace of the suite's
    `case` (planned, and the contiguous reference run), saved to `write_trace` if given,
    audited with `compare` ('none': no allocator of ours) into a finished run directory."""
    from kvdiag.lifecycle import finish_run
    from kvdiag.runners.trace import read_trace
    from kvdiag.runners.trace import write_trace as save_trace
    from kvdiag.runs import RunDir, Timer
    from kvdiag.suites import load_cases
    from kvdiag.targets import check_allocator

    timer = Timer()
    compare = None if compare == "none" else check_allocator(compare)  # before any work
    if trace is not None:
        if case is not None:
            raise KvdiagError("give --trace or --case, not both")
        recorded, label, seed = read_trace(trace), f"trace:{trace.name}", 0
    else:
        loaded, (chosen,) = load_cases(suite, case, one=True)
        info(f"planning {loaded.name}/{chosen.name} and running the contiguous reference ...")
        recorded = trace_for_case(loaded, chosen, model=model, device=device)
        label = "canary" if model is None and loaded.model is None else str(model or loaded.model)
        seed = loaded.seed
    if write_trace is not None:
        save_trace(recorded, write_trace)
        info(f"trace written to {write_trace}")
    with RunDir.begin(out_dir, recorded.config.suite) as run:
        result = audit_trace(recorded, compare=compare, model_label=label, seed=seed)
    return finish_run(result, run, timer)
