"""Every verdict kvdiag gives, decided here and nowhere else: one Verdict type, and one judge
per kind of run. Runners measure and return facts; commands call the judge of their kind;
every consumer (exit code, console, JSON, report badge, history, JUnit, Prometheus, fleet
page) reads the Verdict it returns. A test checks that no other module assigns one.

    verdict       exit  means
    pass          0     kvdiag looked where the bug lives (the trigger was reached, the ground
                        truth was sound) and found no corruption
    fail          1     corruption, a leak or a regression was found (or a positive control
                        that must catch its fault did not)
    inconclusive  2     the run was made but proves nothing: the trigger was not reached
                        (nothing recycled) or not reproduced (a faulty allocator showed nothing)
    error         2     the run's own ground truth is unsound (isolated requests hit the cache),
                        so nothing it measured can be judged

The judges, by kind of run (each returns a Judgement: the verdict and one sentence why):

    judge_reference   reproduce: clean series flat, faulty series caught, trigger reached
    judge_gate        verify --expect-guard / --expect-bug on one allocator
    judge_series      one series under test (regress on the reference engine)
    judge_probe       a live server: corruption, recycling observed, ground truth sound
    judge_audit       vLLM's allocator replayed: foreign reads, invariants, recycling
    judge_isolation   the tenant-isolation audit: judged configurations vs the control
    judge_regress     a run against its baseline, never better than its own ground truth
    judge_fleet       every cell of a fleet
    judge_matrix      the detection matrix: healthy passes, every planted fault is caught
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass, field

from kvdiag.findings import (
    expected_clean,
    failing_rounds,
    fault_findings,
    guard_gate,
    rows_of,
)
from kvdiag.vocab import CONTIGUOUS, GUARD_LOG_LINE


class Verdict(str, enum.Enum):
    PASS = "pass"
    FAIL = "fail"
    INCONCLUSIVE = "inconclusive"
    ERROR = "error"

    def __str__(self) -> str:
        return self.value

    @property
    def exit_code(self) -> int:
        """0 pass, 1 fail, 2 inconclusive or error."""
        return _EXIT[self]

    @property
    def meaning(self) -> str:
        return _MEANING[self]

    @property
    def passed(self) -> bool:
        return self is Verdict.PASS

    @classmethod
    def parse(cls, value) -> Verdict:
        """A recorded verdict (summary.json, history rows); anything unknown reads as error,
        never as a silent pass."""
        try:
            return cls(str(value).lower())
        except ValueError:
            return cls.ERROR

    @classmethod
    def worst(cls, verdicts: Iterable[Verdict]) -> Verdict:
        """fail > error > inconclusive > pass; pass for none."""
        return max(verdicts, key=_RANK.__getitem__, default=cls.PASS)


_EXIT = {Verdict.PASS: 0, Verdict.FAIL: 1, Verdict.INCONCLUSIVE: 2, Verdict.ERROR: 2}
_RANK = {Verdict.PASS: 0, Verdict.INCONCLUSIVE: 1, Verdict.ERROR: 2, Verdict.FAIL: 3}
_MEANING = {
    Verdict.PASS: "no corruption where none was expected, and every planted fault was caught",
    Verdict.FAIL: "corruption (or a regression) was found where none was expected",
    Verdict.INCONCLUSIVE: "the run proves nothing: the trigger was not reproduced or not reached",
    Verdict.ERROR: "the run's own ground truth is unsound, so nothing it measured can be judged",
}


@dataclass(frozen=True)
class Judgement:
    """A verdict and the one sentence that says why (the report's and the console's)."""

    verdict: Verdict
    reason: str
    details: dict = field(default_factory=dict)


# --- in-process runs (reference engine) ---------------------------------------------------
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


# --- live servers ---------------------------------------------------------------------------
def judge_probe(*, corrupted: int, rounds: list[int], recycling_observed: bool,
                recycling_how: str, contaminated: int, isolated: int, isolation: str,
                pool: str, logprob_mismatches: int = 0, logprob_rounds: list[int] = ()) -> Judgement:
    """A live probe. fail: a shared answer decisively departed from its isolated twin (whatever
    else: a healthy cache gives two runs of one prompt the same greedy answer), or prompt
    logprobs did; error: no such departure, but isolated requests (or first requests after a
    reset) reported cached tokens (`contaminated`): the ground truth is unsound, so no pass
    can be claimed; inconclusive: no recycling observed; pass otherwise.
    `logprob_mismatches`: requests whose prompt logprobs departed from their isolated twin's
    (positions served from the cache whose logprobs were never computed)."""
    if corrupted:  # two runs of one prompt that decisively disagree: whichever side the
        # cache served wrong, a healthy cache gives neither (even with the ground truth hit)
        also = (f"; and {contaminated} of {isolated} isolated requests hit the cache"
                if contaminated else "")
        return Judgement(Verdict.FAIL, f"{corrupted} request{'s' * (corrupted != 1)} answered from "
                         "the shared prefix cache departed from the cache-isolated run beyond the "
                         f"noise floor (rounds {', '.join(map(str, rounds))}){also}")
    if logprob_mismatches:
        return Judgement(Verdict.FAIL, f"{logprob_mismatches} request{'s' * (logprob_mismatches != 1)}"
                         "' prompt logprobs departed from the cache-isolated run's (rounds "
                         f"{', '.join(map(str, logprob_rounds))}): positions served from the cache")
    if contaminated:
        via = "a fresh cache_salt" if isolation == "cache_salt" else "an emptied prefix cache"
        return Judgement(Verdict.ERROR, f"ground truth contaminated: {contaminated} of {isolated} "
                         f"isolated requests hit the cache despite {via}, so no answer can be "
                         "judged against them")
    if not recycling_observed:
        return Judgement(Verdict.INCONCLUSIVE, f"trigger not reached: no recycling observed "
                         f"({recycling_how}; server pool {pool})")
    return Judgement(Verdict.PASS, "every request answered from the shared prefix cache matched "
                     "its cache-isolated run, or departed only within the noise floor, with "
                     f"recycled blocks observed ({recycling_how})")


def judge_audit(*, corrupted_rounds: list[int], invariant_violations: int, cross_tenant_hits: int,
                recycled_blocks: int, epilogue: list[str] = ()) -> Judgement:
    """vLLM's allocator replayed model-free: any foreign or unwritten read, broken invariant,
    hit across cache_salts, or wrong hit after the trace (`epilogue`: after a reset, across
    salts, across adapters) fails; a replay that recycled no cached block is inconclusive
    (the trigger was not reached)."""
    if corrupted_rounds or invariant_violations or cross_tenant_hits or epilogue:
        parts = []
        if corrupted_rounds:
            parts.append(f"foreign or unwritten slots read in rounds {corrupted_rounds}")
        if invariant_violations:
            parts.append(f"{invariant_violations} invariant violation(s)")
        if cross_tenant_hits:
            parts.append(f"{cross_tenant_hits} cache hit(s) on blocks another cache_salt wrote")
        parts += list(epilogue)
        return Judgement(Verdict.FAIL, "vLLM's allocator: " + "; ".join(parts))
    if not recycled_blocks:
        return Judgement(Verdict.INCONCLUSIVE, "the trigger was not reached: the replay recycled no "
                         "cached block, so a clean replay proves nothing")
    return Judgement(Verdict.PASS, f"no foreign slot read and every invariant held, with "
                     f"{recycled_blocks} cached blocks recycled")


ISOLATION_JUDGED = ("per-tenant", "adapter")  # the configurations whose leaks fail the audit


def judge_isolation(cells: list[dict], lengths, error: str | None) -> Judgement:
    """The tenant-isolation audit over its analysed cells (each marked `leaks` by the runner):
    fail if a judged configuration leaks at any length; inconclusive if the positive control
    missed at any planned length or the run stopped early; else pass. details: {"leaks"}."""
    leaks = [c for c in cells if c["config"] in ISOLATION_JUDGED and c["leaks"]]
    if leaks:
        worst = max(leaks, key=lambda c: (c["content_leak"], c["length"]))
        return Judgement(Verdict.FAIL, f"{worst['config']} leaks at a {worst['length']}-token "
                         f"prefix: AUC {worst['auc']:.2f} (p={worst['p_value']:.2g}), cached tokens "
                         f"correct {worst['cached_correct_mean']:.0f} vs wrong "
                         f"{worst['cached_wrong_mean']:.0f}", {"leaks": leaks})
    if error:
        return Judgement(Verdict.INCONCLUSIVE, error, {"leaks": []})
    hits = {c["length"] for c in cells if c["config"] == "same-salt" and c["hit"]}
    missed = [n for n in lengths if n not in hits]
    if missed:
        return Judgement(Verdict.INCONCLUSIVE, "the positive control (same salt for both tenants) did "
                         f"not hit at {', '.join(map(str, missed))} tokens: prefix caching is off, "
                         "the server drops cache_salt, or evicts between requests", {"leaks": []})
    return Judgement(Verdict.PASS, "isolated: the positive control hit at every length "
                     f"({', '.join(map(str, lengths))} tokens) and across salts cached tokens and "
                     "TTFT were indistinguishable", {"leaks": []})


# --- runs of runs ---------------------------------------------------------------------------
def judge_regress(ground_truth: Verdict, ground_reason: str, regressed: list[str]) -> Judgement:
    """A run against its baseline: at best as good as its own ground truth. A regression
    against the baseline fails it whatever the ground truth said; otherwise the ground
    truth's verdict stands (an inconclusive run stays inconclusive when every metric
    matches its baseline)."""
    if regressed:
        return Judgement(Verdict.FAIL, f"regressed against the baseline: {', '.join(regressed)}")
    if ground_truth is Verdict.PASS:
        return Judgement(Verdict.PASS, f"no regression; {ground_reason}")
    return Judgement(ground_truth, ground_reason)


def judge_fleet(cells: Iterable[Verdict]) -> Judgement:
    """Every cell's verdict: the worst wins (a dead cell is an error, never a pass)."""
    cells = list(cells)
    verdict = Verdict.worst(cells)
    counts = ", ".join(f"{sum(c is v for c in cells)} {v.value}" for v in Verdict
                       if any(c is v for c in cells))
    return Judgement(verdict, f"{len(cells)} cell(s): {counts or 'none'}")


def expected_detection(live: str | None, path: str) -> Verdict:
    """The verdict a detection-matrix row must give: pass for the healthy engine (`live`
    None), else the verdict of a run that catches the fault: fail, but error for a fault run
    live by the probe's reset fallback (its ground truth is what the fault breaks)."""
    if live is None:
        return Verdict.PASS
    return Verdict.ERROR if path == "live" and live == "probe-reset" else Verdict.FAIL


def judge_matrix(rows: Iterable[tuple[str, Verdict, Verdict]]) -> Judgement:
    """The detection matrix: (fault, verdict measured, verdict expected) per row. Healthy must
    pass (no false positive) and every fault must give its expected verdict. fail when a row
    missed (a fault judged pass, or healthy not pass); inconclusive when a row could not reach
    its trigger; else pass."""
    rows = list(rows)
    missed = [f for f, got, want in rows if got is not want and
              (got is Verdict.PASS or want is Verdict.PASS)]
    unreached = [f for f, got, want in rows if got is not want and f not in missed]
    if missed:
        return Judgement(Verdict.FAIL, f"not detected as expected: {', '.join(missed)}")
    if unreached:
        return Judgement(Verdict.INCONCLUSIVE, f"proved nothing for: {', '.join(unreached)}")
    faults = {name.split("/")[0] for name, _, want in rows if want is not Verdict.PASS}
    return Judgement(Verdict.PASS, f"healthy passed and all {len(faults)} planted faults were "
                     f"caught as expected ({len(rows)} rows)" if faults else "healthy passed")


def judge_unmeasured(reason: str) -> Judgement:
    """A run that could not be measured at all (a dead server, a baseline key mismatch, a
    fleet cell that raised or ran out of time): an error, never a pass."""
    return Judgement(Verdict.ERROR, reason)
