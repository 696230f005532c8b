"""Every verdict kvdiag gives, in one module that runners import (never the reverse): the
guard gate (a series is clean in every round), the fault detector (the positive control),
the run verdict of an in-process suite run (`judge`), and the exit code of each verdict.

Verdicts and exit codes (ARCHITECTURE.md: 0 pass, 1 the check failed, 2 the run could not
be made):

    pass          0   every series expected clean stayed flat, and every faulty allocator
                      under a trigger showed its corruption
    fail          1   corruption (or a regression) was found where none was expected
    inconclusive  2   the run was made but proves nothing: a faulty allocator under a
                      trigger showed no corruption (the trigger was not reproduced), or a
                      live server never recycled a block (the trigger was not reached)

Pure functions over summary.json's `rounds`."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

from kvdiag.vocab import BRAI_MAX, CLEAN_ALLOCATORS, CONTIGUOUS, GUARD_LOG_LINE, VLLM

PASS, FAIL, INCONCLUSIVE = "pass", "fail", "inconclusive"
EXIT_CODES = {PASS: 0, FAIL: 1, INCONCLUSIVE: 2}
MEANING = {
    PASS: "no corruption where none was expected, and every planted fault was caught",
    FAIL: "corruption (or a regression) was found where none was expected",
    INCONCLUSIVE: "the run proves nothing: the trigger was not reproduced or not reached",
}


def exit_code(verdict: str) -> int:
    """0 pass, 1 fail, 2 inconclusive (and anything unknown: never a silent pass)."""
    return EXIT_CODES.get(verdict, 2)


@dataclass
class GateResult:
    passed: bool
    failures: list[str] = field(default_factory=list)  # "round 7: foreign_slots = 379 (want 0)"

    @property
    def failing_rounds(self) -> list[int]:
        return failing_rounds(self.failures)


def failing_rounds(findings: Iterable[str]) -> list[int]:
    """The round numbers of findings written "round N: ..."."""
    return sorted({int(f.split(":")[0].split()[1]) for f in findings if f.startswith("round ")})


def _nan(x) -> bool:
    return x is None or (isinstance(x, float) and math.isnan(x))


def series(rounds: Iterable[dict], case: str, name: str) -> list[dict]:
    """The per-round rows of one allocator (or target) in one case, by round."""
    rows = [r for r in rounds if r.get("case", case) == case
            and (r["allocator"] == name or r["target"] == name)]
    return sorted(rows, key=lambda r: r["round"])


def guard_gate(rows: list[dict], reference: list[dict], brai_max: float = BRAI_MAX) -> GateResult:
    """Every round: zero foreign and unwritten slots, zero leakage, no non-finite logits,
    BLEU-4 = 100, fact-check pass rate equal to the reference's, and BRAI <= brai_max."""
    if not rows:
        return GateResult(False, ["no rounds were measured"])
    ref = {r["round"]: r for r in reference}
    failures = []
    for r in rows:
        n = r["round"]
        checks = [
            ("foreign_slots", r.get("foreign_slots", 0), lambda v: v == 0, "0"),
            ("unwritten_slots", r.get("unwritten_slots", 0), lambda v: v == 0, "0"),
            ("nonfinite_logits", r.get("nonfinite_logits", 0), lambda v: v == 0, "0"),
            ("attention_leakage", r.get("attention_leakage"), lambda v: _nan(v) or v == 0, "0"),
            ("bleu4", r.get("bleu4"), lambda v: not _nan(v) and v >= 100 - 1e-9, "100"),
        ]
        want = ref.get(n, {}).get("fact_check_pass_rate")
        if not _nan(want):
            checks.append(("fact_check_pass_rate", r.get("fact_check_pass_rate"),
                           lambda v, w=want: not _nan(v) and abs(v - w) < 1e-9, f"{want:g} (reference)"))
        brai = r.get("brai")
        if not _nan(brai):
            checks.append(("brai", brai, lambda v: v <= brai_max + 1e-12, f"<= {brai_max}"))
        for name, value, ok, expect in checks:
            if not ok(value):
                shown = f"{value:.4g}" if isinstance(value, float) else value
                failures.append(f"round {n}: {name} = {shown} (want {expect})")
    return GateResult(not failures, failures)


def fault_findings(rows: list[dict], reference: list[dict]) -> list[str]:
    """What marks a series as corrupted (the positive control): any foreign or unwritten
    slot, leakage, non-finite logits, BLEU-4 below 100, or fact-checks below the reference."""
    ref = {r["round"]: r for r in reference}
    found = []
    for r in rows:
        n = r["round"]
        for key in ("foreign_slots", "unwritten_slots", "nonfinite_logits"):
            if r.get(key, 0):
                found.append(f"round {n}: {key} = {r[key]}")
        if not _nan(r.get("attention_leakage")) and r["attention_leakage"] > 0:
            found.append(f"round {n}: attention_leakage = {r['attention_leakage']:.4g}")
        if not _nan(r.get("bleu4")) and r["bleu4"] < 100 - 1e-9:
            found.append(f"round {n}: bleu4 = {r['bleu4']:.4g}")
        want = ref.get(n, {}).get("fact_check_pass_rate")
        got = r.get("fact_check_pass_rate")
        if not _nan(want) and not _nan(got) and got < want - 1e-9:
            found.append(f"round {n}: fact_check_pass_rate = {got:.4g} (reference {want:.4g})")
    return found


def expected_clean(name: str, ablation: bool) -> bool:
    """Series the guard gate applies to: guarded allocators, the correct allocators, and
    every allocator of an ablation (control) case."""
    return ablation or name.startswith("guarded") or name in CLEAN_ALLOCATORS


def judge(rounds: list[dict], cases: Iterable[tuple[str, bool]]) -> dict:
    """The run verdict of an in-process run over `cases` ((name, is_ablation) pairs):
    {"verdict", "gates": {case/series: {"passed", "failures"}}, "faults": {case/series:
    [findings]}}. fail when a series expected clean broke the gate; inconclusive when every
    gate held but a faulty series under a trigger showed nothing (not reproduced)."""
    gates, faults = {}, {}
    for case, ablation in cases:
        rows_of_case = [r for r in rounds if r.get("case") == case]
        reference = series(rows_of_case, case, CONTIGUOUS)
        for name in dict.fromkeys(r["allocator"] for r in rows_of_case):
            if name == CONTIGUOUS:
                continue
            rows = series(rows_of_case, case, name)
            if name == VLLM:  # vLLM registers blocks when it schedules them, so its reuse
                # differs from our engine's by design (runners/hit_diff.py): BRAI against our
                # guarded baseline is no anomaly signal for it
                rows = [{**r, "brai": None} for r in rows]
            if expected_clean(name, ablation):
                gate = guard_gate(rows, reference)
                gates[f"{case}/{name}"] = {"passed": gate.passed, "failures": gate.failures}
            else:
                faults[f"{case}/{name}"] = fault_findings(rows, reference)
    if not all(g["passed"] for g in gates.values()):
        verdict = FAIL
    elif not all(faults.values()):
        verdict = INCONCLUSIVE
    else:
        verdict = PASS
    return {"verdict": verdict, "gates": gates, "faults": faults}


def not_reproduced(summary: dict) -> list[str]:
    """The faulty series that showed no corruption under their trigger."""
    return [key for key, findings in (summary.get("faults") or {}).items() if not findings]


def guard_logged(engine_log: dict[str, list[str]], case: str, allocator: str) -> bool:
    return GUARD_LOG_LINE in engine_log.get(f"{case}/{allocator}", [])


def gate_verdict(summary: dict, engine_log: dict[str, list[str]], case: str, allocator: str,
                 expect_guard: bool) -> dict:
    """kvdiag verify's gate on one allocator of a finished run: --expect-guard (the guard
    logged and held in every round) or --expect-bug (the positive control: the fault shows)."""
    rounds = [r for r in summary["rounds"] if r.get("case") == case]
    rows, reference = series(rounds, case, allocator), series(rounds, case, CONTIGUOUS)
    if expect_guard:
        findings = list(guard_gate(rows, reference).failures)
        if not guard_logged(engine_log, case, allocator):
            findings.insert(0, f'the engine did not log "{GUARD_LOG_LINE}"')
        passed = not findings
        what = ("guard held in every round" if passed
                else f"failing rounds {failing_rounds(findings)}")
        shown = findings[:20]
    else:
        findings = fault_findings(rows, reference)
        passed = bool(findings)
        what = f"fault detected ({len(findings)} findings)" if passed else "no corruption detected"
        shown = []
    return {"name": "expect-guard" if expect_guard else "expect-bug", "allocator": allocator,
            "case": case, "passed": passed, "findings": findings, "what": what, "shown": shown,
            "failing_rounds": failing_rounds(findings)}
