"""The judges of in-process runs on the reference engine: reproduce (every clean series flat,
every faulty one caught, the trigger reached), the release gate, and one series under test."""

from __future__ import annotations

from collections.abc import Iterable

from kvdiag.verdicts.core import Judgement, Verdict
from kvdiag.verdicts.findings import (
    expected_clean,
    failing_rounds,
    fault_findings,
    guard_gate,
    rows_of,
)
from kvdiag.vocab import CONTIGUOUS, GUARD_LOG_LINE


def judge_reference(rounds: list[dict], cases: Iterable[tuple[str, bool]],
                    recycled: dict[str, dict[str, int]], vllm_corrupted: bool = False) -> Judgement:
    """reproduce: every series expected clean stayed flat and every faulty one under a
    trigger showed its corruption. `cases`: (name, is_ablation); `recycled`: case ->
    allocator -> cached blocks recycled (the trigger's recycling, as the allocator counted it).
    details: {"gates": {case/series: {"passed", "failures"}}, "faults": {case/series: [findings]}}.

    fail          a clean series broke the gate, or vLLM's replayed allocator read foreign slots
    inconclusive  a faulty series under a trigger showed nothing (not reproduced), or a trigger
                  case has no faulty series and recycled nothing (its clean pass proves nothing)
    pass          otherwise"""
    gates, faults, unexercised = {}, {}, []
    for case, ablation in cases:
        names = dict.fromkeys(r["allocator"] for r in rounds if r.get("case") == case)
        names.pop(CONTIGUOUS, None)
        for name in names:
            rows, reference = rows_of(rounds, case, name)
            if expected_clean(name, ablation):
                gate = guard_gate(rows, reference)
                gates[f"{case}/{name}"] = {"passed": gate.passed, "failures": gate.failures}
            else:
                faults[f"{case}/{name}"] = fault_findings(rows, reference)
        faulty_here = any(k.startswith(f"{case}/") for k in faults)
        if not ablation and not faulty_here and not any((recycled.get(case) or {}).values()):
            unexercised.append(case)
    details = {"gates": gates, "faults": faults}
    broken = [k for k, g in gates.items() if not g["passed"]]
    missed = [k for k, found in faults.items() if not found]
    caught = [k for k, found in faults.items() if found]
    if broken or vllm_corrupted:
        what = ", ".join(broken) or "vLLM's replayed allocator"
        return Judgement(Verdict.FAIL, f"{what} expected to stay clean departed from the "
                         "contiguous reference (ground truth)", details)
    if missed:
        return Judgement(Verdict.INCONCLUSIVE, f"the trigger was not reproduced: {', '.join(missed)} "
                         "(faulty by design) showed no corruption, so a clean result from the "
                         "other allocators here proves nothing", details)
    if unexercised:
        return Judgement(Verdict.INCONCLUSIVE, f"the trigger was not reached: no cached block was "
                         f"recycled in {', '.join(unexercised)} and no faulty allocator ran beside, "
                         "so a clean result proves nothing", details)
    clean = ", ".join(k for k, g in gates.items() if g["passed"]) or "every series"
    text = f"{clean} expected to stay clean gave the contiguous reference's output in every round"
    if caught:
        text += f"; corruption reproduced by the faulty {', '.join(caught)}, as intended"
    return Judgement(Verdict.PASS, text, details)


def judge_gate(rounds: list[dict], engine_log: dict[str, list[str]], case: str, allocator: str,
               expect_guard: bool, recycled: int) -> Judgement:
    """verify on one allocator of a finished run: --expect-guard (the guard logged and held in
    every round, on a case that recycled cached blocks: otherwise it could not have failed)
    or --expect-bug (the positive control: the fault shows). details: the gate as
    summary.json's `gate` holds it."""
    rows, reference = rows_of(rounds, case, allocator)
    if expect_guard:
        findings = list(guard_gate(rows, reference).failures)
        if GUARD_LOG_LINE not in engine_log.get(f"{case}/{allocator}", []):
            findings.insert(0, f'the engine did not log "{GUARD_LOG_LINE}"')
        verdict = Verdict.FAIL if findings else Verdict.PASS if recycled else Verdict.INCONCLUSIVE
        what = {Verdict.PASS: "guard held in every round",
                Verdict.FAIL: f"failing rounds {failing_rounds(findings)}",
                Verdict.INCONCLUSIVE: f"guard held, but case {case} recycled no cached block: the "
                                      "trigger was not reached, so the gate could not have failed"}[verdict]
        shown = findings[:20]
    else:
        findings = fault_findings(rows, reference)
        verdict = Verdict.PASS if findings else Verdict.FAIL
        what = f"fault detected ({len(findings)} findings)" if findings else "no corruption detected"
        shown = []
    gate = {"name": "expect-guard" if expect_guard else "expect-bug", "allocator": allocator,
            "case": case, "passed": verdict is Verdict.PASS, "findings": findings, "what": what,
            "shown": shown, "failing_rounds": failing_rounds(findings)}
    return Judgement(verdict, f"{gate['name']} --allocator {allocator}: {what}", gate)


def judge_series(findings: list[str], recycled: bool, name: str) -> Judgement:
    """One series under test (a reference allocator in a regression run): any finding against
    the contiguous reference fails it; a clean series passes only where cached blocks were
    recycled (the trigger reached)."""
    if findings:
        return Judgement(Verdict.FAIL, f"{name}: {len(findings)} finding(s) against the "
                         f"contiguous reference, first: {findings[0]}")
    if not recycled:
        return Judgement(Verdict.INCONCLUSIVE, f"{name}: the trigger was not reached (no cached "
                         "block was recycled), so its clean output proves nothing")
    return Judgement(Verdict.PASS, f"{name}: the contiguous reference's output in every round, "
                     "with cached blocks recycled")
