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
    judge_probe       a live server: corruption, over-hits, recycling observed, ground truth
                      proved (every isolated request reported 0 cached tokens) and stable
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
        """fail > error > inconclusive > pass; error for none (no evidence is never a pass)."""
        return max(verdicts, key=_RANK.__getitem__, default=cls.ERROR)


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
# How each live server's flag that makes it report cached tokens reads, for the messages.
CACHED_TOKEN_FLAGS = ("vLLM: --enable-prompt-tokens-details; SGLang: --enable-cache-report; "
                      "a proxy must pass usage.prompt_tokens_details.cached_tokens through")


def classify_divergence(margin: float, numerics_margin: float) -> str:
    """A shared answer's first departure from its isolated twin: `numerics` when the isolated
    run preferred its own token there by no more than `numerics_margin` nats (a near-tie that
    batch-dependent kernels can flip), `corruption` otherwise (a decisive answer changed,
    which numerics do not do). NaN margin: no departure (`match`)."""
    if margin != margin:  # NaN
        return "match"
    return "numerics" if margin <= numerics_margin else "corruption"


def logprob_departed(same_token: bool, difference: float, numerics_margin: float) -> bool:
    """A prompt position whose logprob, shared against isolated, names another token or
    differs by more than the numerics margin: served from the cache, never computed."""
    return not same_token or difference > numerics_margin


def over_hit(cached: int | None, bound: int | None) -> bool:
    """A request whose server-reported cached tokens exceed the most any earlier request of its
    namespace could have cached for it (kvdiag.runners.live.oracle): the cache served a block
    whose tokens differ from the request's, or the server's accounting over-reports."""
    return cached is not None and bound is not None and cached > bound


@dataclass(frozen=True)
class ProbeEvidence:
    """What a live probe measured, raw: the judge classifies (runners/live/ never does).

    divergences      per shared request that departed from its isolated twin: (round, margin)
    floor_margins    per pair of isolated runs of one request that departed: the margin
    numerics_margin  nats: the most a near-tie may be preferred by and still be numerics
    isolated         isolated requests sent; `contaminated` reported cached tokens > 0,
                     `unchecked` reported no count at all
    recycling        {"observed": bool, "how": str}; `requires_recycling` False for a run of
                     the differential phase alone (key coverage needs no recycling)
    hits             per request the oracle bounded: {"what", "cached", "bound", "margin"}
                     (margin: its answer against its isolated twin's; None without one)
    oracle           {"available": bool, "checked": int}
    logprob_departures  (round) per prompt-logprob request that departed
    """

    divergences: list[tuple[str, float]]
    floor_margins: list[float]
    numerics_margin: float
    isolated: int
    contaminated: int
    unchecked: int
    isolation: str
    recycling: dict
    pool: str
    hits: list[dict] = field(default_factory=list)
    oracle: dict = field(default_factory=dict)
    logprob_departures: list[int] = field(default_factory=list)
    answered: int = 0  # shared requests compared with their isolated twins
    requires_recycling: bool = True


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'s' * (n != 1)}"


def judge_probe(e: ProbeEvidence) -> Judgement:
    """A live probe. In order:
    fail          a shared answer decisively departed from its isolated twin (a healthy cache
                  gives two runs of one prompt the same greedy answer, whatever else went
                  wrong); a request reported more cached tokens than any earlier request could
                  have cached for it (over-hit); prompt logprobs departed
    error         isolated requests hit the cache (contaminated) or reported no count at all
                  (unchecked): the ground truth is unproved; or two isolated runs of one
                  request decisively disagreed: the ground truth is unstable
    inconclusive  no recycling observed (or not observable): the trigger was not reached
    pass          otherwise, naming what was covered
    details: {"corrupted", "numerics", "unstable_floor", "over_hits", "logprob_mismatches"}."""
    def decisive(m) -> bool:
        return m is not None and classify_divergence(m, e.numerics_margin) == "corruption"

    corrupt = [r for r, m in e.divergences if decisive(m)]
    unstable = [m for m in e.floor_margins if decisive(m)]
    over = [h for h in e.hits if over_hit(h["cached"], h["bound"])]
    details = {"corrupted": len(corrupt), "numerics": len(e.divergences) - len(corrupt),
               "unstable_floor": len(unstable), "over_hits": len(over),
               "over_hit_examples": over[:10], "logprob_mismatches": len(e.logprob_departures)}
    also = []
    if e.contaminated:
        also.append(f"{e.contaminated} of {e.isolated} isolated requests hit the cache")
    if unstable:
        also.append(f"{len(unstable)} pair(s) of isolated runs decisively disagreed")
    tail = f"; and {'; '.join(also)}" if also else ""
    findings = []
    if corrupt:
        findings.append(f"{_plural(len(corrupt), 'request')} answered from the shared prefix cache "
                        f"departed decisively (by a margin above {e.numerics_margin:g} nats) from the "
                        f"cache-isolated run (rounds {', '.join(map(str, sorted(set(corrupt))))})")
    if over:
        first, compared = over[0], [h for h in over if h["margin"] is not None]
        departed = sum(decisive(h["margin"]) for h in compared)
        findings.append(f"over-hit: {_plural(len(over), 'request')} reported more cached tokens "
                        "than any earlier request of their namespace shares with them (first: "
                        f"{first['what']}, {first['cached']} cached, at most {first['bound']} "
                        "possible): the cache served blocks whose tokens differ from the request's, "
                        "or the server's accounting over-reports; the answers say which: "
                        f"{departed} of the {len(compared)} with an isolated twin departed from it "
                        "decisively")
    if e.logprob_departures:
        findings.append(f"{_plural(len(e.logprob_departures), 'request')}' prompt logprobs departed "
                        "from the cache-isolated run's (rounds "
                        f"{', '.join(map(str, sorted(set(e.logprob_departures))))}): positions served "
                        "from the cache")
    if findings:
        return Judgement(Verdict.FAIL, "; ".join(findings) + tail, details)
    if e.contaminated:
        via = "a fresh cache_salt" if e.isolation == "cache_salt" else "an emptied prefix cache"
        return Judgement(Verdict.ERROR, f"ground truth contaminated: {e.contaminated} of {e.isolated} "
                         f"isolated requests hit the cache despite {via}, so no answer can be "
                         "judged against them", details)
    if e.unchecked or not e.isolated:
        return Judgement(Verdict.ERROR, f"ground truth unproved: {e.unchecked} of {e.isolated} isolated "
                         "requests reported no cached-token count, so their isolation from the "
                         f"cache cannot be checked; turn it on ({CACHED_TOKEN_FLAGS})", details)
    if unstable:
        return Judgement(Verdict.ERROR, f"ground truth unstable: {len(unstable)} of "
                         f"{len(e.floor_margins)} diverging pair(s) of cache-isolated runs of one "
                         f"request disagreed decisively (worst margin {max(unstable):.2f} nats > "
                         f"{e.numerics_margin:g}): the server is not deterministic enough for any "
                         "answer to be judged against its isolated twin", details)
    if e.requires_recycling and not e.recycling["observed"]:
        return Judgement(Verdict.INCONCLUSIVE, f"trigger not reached: no recycling observed "
                         f"({e.recycling['how']}; server pool {e.pool})", details)
    oracle = (f"{e.oracle['checked']} requests' cached tokens within the over-hit bound"
              if e.oracle.get("available") else "over-hit oracle unavailable")
    recycled = (f"recycled blocks observed ({e.recycling['how']})" if e.recycling["observed"]
                else "no recycling needed (differential phase only)")
    return Judgement(Verdict.PASS, f"{e.answered} requests answered from the shared prefix cache matched "
                     f"their cache-isolated runs (or departed within {e.numerics_margin:g} nats), with "
                     f"{recycled}; ground truth: {e.isolated} isolated requests reported 0 cached "
                     f"tokens; {oracle}", details)


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
def judge_regress(ground_truth: Verdict, ground_reason: str, regressed: list[str],
                  missing: list[str] = ()) -> Judgement:
    """A run against its baseline: at best as good as its own ground truth. A regression
    against the baseline fails it whatever the ground truth said; a comparison that covered
    less than the baseline measured (`missing`: cases, rounds or metrics) is an error, never a
    pass; otherwise the ground truth's verdict stands (an inconclusive run stays inconclusive
    when every metric matches its baseline)."""
    if regressed:
        return Judgement(Verdict.FAIL, f"regressed against the baseline: {', '.join(regressed)}")
    if missing:
        shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        return Judgement(Verdict.ERROR, f"the run lacks what its baseline measured ({shown}): a "
                         "comparison of fewer rows proves nothing")
    if ground_truth is Verdict.PASS:
        return Judgement(Verdict.PASS, f"no regression; {ground_reason}")
    return Judgement(ground_truth, ground_reason)


def judge_fleet(cells: Iterable[Verdict]) -> Judgement:
    """Every cell's verdict: the worst wins (a dead cell is an error, never a pass; no cell at
    all is an error too)."""
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


def caught_as_expected(got: Verdict, want: Verdict) -> bool:
    """A detection-matrix row: its measured verdict is the one expected, or a FAIL where an
    ERROR was expected (the fault was caught outright, not merely through the ground truth it
    breaks)."""
    return got is want or (want is Verdict.ERROR and got is Verdict.FAIL)


def judge_matrix(rows: Iterable[tuple[str, Verdict, Verdict]]) -> Judgement:
    """The detection matrix: (fault, verdict measured, verdict expected) per row. Healthy must
    pass (no false positive) and every fault must give its expected verdict. fail when a row
    missed (a fault judged pass, or healthy not pass); inconclusive when a row could not reach
    its trigger; error for no rows at all; else pass."""
    rows = list(rows)
    if not rows:
        return Judgement(Verdict.ERROR, "the detection matrix has no rows: nothing was measured")
    off = [(f, got, want) for f, got, want in rows if not caught_as_expected(got, want)]
    missed = [f for f, got, want in off if got is Verdict.PASS or want is Verdict.PASS]
    unreached = [f for f, _, _ in off if f not in missed]
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
