"""The judge of a live probe, and every classification it rests on: a divergence as numerics
or corruption, a prompt-logprob departure, an over-hit. Runners return raw margins and
counts (kvdiag.runners.live); only these functions say what they mean."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kvdiag.verdicts.core import Judgement, Verdict
from kvdiag.verdicts.sentinel import (
    sentinel_blind,
    sentinel_cleared,
    sentinel_covered,
    sentinel_finding,
)

if TYPE_CHECKING:
    from kvdiag.record.evidence import BoundedHit, Oracle, PromptLogprobs, Recycling
    from kvdiag.record.summary_rows import EventRow

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


def prompt_logprob_departures(block: PromptLogprobs, numerics_margin: float) -> PromptLogprobs:
    """The block with its pairs judged (logprob_departed, position by position): how many
    were checked and departed, where first, in which rounds. (Built by validation from plain
    values, so the judge imports no record module at run time.)"""
    if not block.pairs:  # a summary's block, judged when it was written
        return block
    bad = []
    for pair in block.pairs:
        at = [(i, a, b) for i, (a, b) in enumerate(zip(pair.shared, pair.isolated))
              if a and b and logprob_departed(a[0] == b[0], abs(a[1] - b[1]), numerics_margin)]
        if at:
            i, a, b = at[0]
            bad.append({"session": pair.session, "round": pair.round, "positions": len(at),
                        "first": i, "shared": a, "isolated": b})
    return type(block).model_validate({
        "checked": len(block.pairs), "mismatched": len(bad), "examples": bad[:5],
        "rounds": sorted({b["round"] for b in bad}), "departed": [b["round"] for b in bad]})


# The second channel: a shift of the first tokens' top-k logprobs, shared against isolated, is
# a departure when it exceeds both TOPK_MIN nats and TOPK_FACTOR times the largest shift
# between repeated isolated runs (the floor). Healthy figures: docs/probe.md.
TOPK_MIN, TOPK_FACTOR = 0.5, 4.0  # 0.1 flagged a healthy vLLM on SmolLM2 (0.12 nats)


def topk_threshold(floor: list[float]) -> float:
    """The least top-k shift that is evidence, given the floor's shifts."""
    return max(TOPK_MIN, TOPK_FACTOR * max(floor, default=0.0))


def over_hit(cached: int | None, bound: int | None) -> bool:
    """A request whose server-reported cached tokens exceed the most any earlier request of its
    namespace could have cached for it (kvdiag.runners.live.oracle): the cache served a block
    whose tokens differ from the request's, or the server's accounting over-reports."""
    return cached is not None and bound is not None and cached > bound


def differential_over_hits(rows, shown: int = 3) -> tuple[int, list[str]]:
    """The model-free audit's differential phase (kvdiag.runners.replay.differential: rows with
    name, cached, bound): how many over-hit and, where any, the finding that names them."""
    over = [r for r in rows if over_hit(r.cached, r.bound)]
    if not over:
        return 0, []
    listed = "; ".join(f"{r.name}: {r.cached} cached, bound {r.bound}" for r in over[:shown])
    more = f" and {len(over) - shown} more" if len(over) > shown else ""
    return len(over), [f"differential: {len(over)} of {len(rows)} requests reported more cached "
                       "tokens than any earlier request of their namespace could have cached "
                       f"({listed}{more}): served blocks their tokens, namespace or a reset rule out"]


@dataclass(frozen=True)
class ProbeEvidence:
    """What a live probe measured, raw: the judge classifies (runners/live/ never does).

    divergences      per shared request that departed from its isolated twin: (round, margin)
    floor_margins    per pair of isolated runs of one request that departed: the margin
    numerics_margin  nats: the most a near-tie may be preferred by and still be numerics
    isolated         isolated requests sent; `contaminated` reported cached tokens > 0,
                     `unchecked` reported no count at all
    recycling        kvdiag.record.evidence.Recycling; `requires_recycling` False for a run of
                     the differential phase alone (key coverage needs no recycling)
    hits             per request the oracle bounded: what, cached, bound, margin (BoundedHit)
                     (margin: its answer against its isolated twin's; None without one)
    oracle           the oracle's counts (kvdiag.record.evidence.Oracle; None: none ran)
    logprob_departures  (round) per prompt-logprob request that departed
    """

    divergences: list[tuple[str, float]]
    floor_margins: list[float]
    numerics_margin: float
    isolated: int
    contaminated: int
    unchecked: int
    isolation: str
    recycling: Recycling
    pool: str
    hits: list[BoundedHit] = field(default_factory=list)
    oracle: Oracle | None = None
    logprob_departures: list[int] = field(default_factory=list)
    answered: int = 0  # shared requests compared with their isolated twins
    requires_recycling: bool = True
    topk: list[tuple[str, float]] = field(default_factory=list)  # (what, shift) per request
    topk_floor: list[float] = field(default_factory=list)  # shifts between isolated repeats
    events: list[EventRow] = field(default_factory=list)  # the coverage table's rows
    required: tuple[str, ...] = ()  # events the run must reach; ("all",): every row of its table
    sentinel: object = None  # kvdiag.record.sentinel.SentinelBlock, where one watched inside


@dataclass(frozen=True)
class ProbeDetails:
    """What judge_probe decided besides the verdict, for the summary and the run's frame.

    labels           one per ProbeEvidence.divergences, in its order: match, numerics or
                     corruption (classify_divergence); the run writes them back
    where            where the corrupted ones were: 'rounds 2, 5; lifecycle flood' ('' if none)
    over_hits        requests over the oracle's bound; `over_hit_examples` the first ten
    topk_threshold   the least top-k shift that was evidence; `topk_departed` those beyond it
    events_missing   lifecycle events not reached
    """

    labels: list[str] = field(default_factory=list)
    corrupted: int = 0
    numerics: int = 0
    where: str = ""
    unstable_floor: int = 0
    over_hits: int = 0
    over_hit_examples: list[BoundedHit] = field(default_factory=list)
    logprob_mismatches: int = 0
    topk_threshold: float = TOPK_MIN
    topk_departed: int = 0
    events_missing: list[str] = field(default_factory=list)


def _where(labels: list[str]) -> str:
    """'rounds 2, 5; lifecycle flood, differential': numbered rounds first, in order."""
    rounds = sorted({int(x) for x in labels if x.isdigit()})
    other = sorted({x for x in labels if not x.isdigit()})
    return "; ".join(([f"rounds {', '.join(map(str, rounds))}"] if rounds else []) + other)


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'s' * (n != 1)}"


def _possessive(n: int, word: str) -> str:
    """'1 request's', '3 requests''"""
    return f"{n} {word}'s" if n == 1 else f"{n} {word}s'"


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
    details: {"labels" (one per divergence, in its order: match, numerics or corruption: the
    one labelling every count of the run follows), "corrupted", "numerics", "unstable_floor",
    "over_hits", "logprob_mismatches"}."""
    def decisive(m) -> bool:
        return m is not None and classify_divergence(m, e.numerics_margin) == "corruption"

    labels = [classify_divergence(m, e.numerics_margin) for _, m in e.divergences]
    corrupt = [r for (r, _), label in zip(e.divergences, labels) if label == "corruption"]
    unstable = [m for m in e.floor_margins if decisive(m)]
    over = [h for h in e.hits if over_hit(h.cached, h.bound)]
    limit = topk_threshold(e.topk_floor)
    shifted = [(what, d) for what, d in e.topk if d > limit]
    details = ProbeDetails(labels=labels, corrupted=len(corrupt), numerics=labels.count("numerics"),
                           where=_where(corrupt), unstable_floor=len(unstable), over_hits=len(over),
                           over_hit_examples=over[:10], logprob_mismatches=len(e.logprob_departures),
                           topk_threshold=limit, topk_departed=len(shifted),
                           events_missing=[r.event for r in e.events if not r.reached])
    also = []
    if e.contaminated:
        also.append(f"{e.contaminated} of {e.isolated} isolated requests hit the cache")
    if unstable:
        also.append(f"{len(unstable)} pair(s) of isolated runs decisively disagreed")
    findings = []
    if corrupt:
        findings.append(f"{_plural(len(corrupt), 'request')} answered from the shared prefix cache "
                        f"departed decisively (by a margin above {e.numerics_margin:g} nats) from the "
                        f"cache-isolated run ({_where(corrupt)})")
    if over:
        first, compared = over[0], [h for h in over if h.margin is not None]
        departed = sum(decisive(h.margin) for h in compared)
        findings.append(f"over-hit: {_plural(len(over), 'request')} reported more cached tokens "
                        "than any earlier request of their namespace shares with them (first: "
                        f"{first.what}, {first.cached} cached, at most {first.bound} "
                        "possible): the cache served blocks whose tokens differ from the request's, "
                        "or the server's accounting over-reports; the answers say which: "
                        f"{departed} of the {len(compared)} with an isolated twin departed from it "
                        "decisively")
    if e.logprob_departures:
        findings.append(f"{_possessive(len(e.logprob_departures), 'request')} prompt logprobs departed "
                        "from the cache-isolated run's (rounds "
                        f"{', '.join(map(str, sorted(set(e.logprob_departures))))}): positions served "
                        "from the cache")
    if shifted:
        what, worst = max(shifted, key=lambda x: x[1])
        findings.append(f"{_possessive(len(shifted), 'request')} first-token distributions moved from "
                        f"the cache-isolated run's by more than {limit:.2f} nats (the noise floor's "
                        f"bound; worst {worst:.2f}, {what})")
    if (inside := sentinel_finding(e.sentinel)) is not None:
        findings.insert(0, inside)
    elif (corrupt or e.logprob_departures or shifted) and (cleared := sentinel_cleared(e.sentinel)):
        also.append(cleared)
    if findings:
        return Judgement(Verdict.FAIL, "; ".join(findings) + (f"; and {'; '.join(also)}" if also else ""),
                         details)
    if e.contaminated:
        via = {"cache_salt": "a fresh cache_salt", "cache_prompt": "cache_prompt: false"}.get(
            e.isolation, "an emptied prefix cache")
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
    if e.requires_recycling and not e.recycling.observed:
        return Judgement(Verdict.INCONCLUSIVE, f"trigger not reached: no recycling observed "
                         f"({e.recycling.how}; server pool {e.pool})", details)
    if (blind := sentinel_blind(e.sentinel)) is not None:
        return Judgement(Verdict.INCONCLUSIVE, blind, details)
    required = {r.event for r in e.events} if "all" in e.required else set(e.required)
    missing = [r for r in e.events if r.event in required and not r.reached]
    unknown = sorted(required - {r.event for r in e.events})
    if missing or unknown:
        why = [f"{r.event} ({r.evidence})" for r in missing] + [f"{u} (not measured)" for u in unknown]
        return Judgement(Verdict.INCONCLUSIVE, f"required events not reached: {'; '.join(why)}", details)
    oracle = (f"{e.oracle.checked} requests' cached tokens within the over-hit bound"
              if e.oracle is not None and e.oracle.available else "over-hit oracle unavailable")
    if e.oracle is not None and e.oracle.available and e.oracle.reuse_chunk:
        oracle += (f" (chunks of {e.oracle.reuse_chunk}+ tokens counted: {e.oracle.chunk_hits} "
                   "requests hit past their common prefix)")
    recycled = (f"recycled blocks observed ({e.recycling.how})" if e.recycling.observed
                else "no recycling needed (differential phase only)")
    return Judgement(Verdict.PASS, f"{e.answered} requests answered from the shared prefix cache matched "
                     f"their cache-isolated runs (or departed within {e.numerics_margin:g} nats), with "
                     f"{recycled}; ground truth: {e.isolated} isolated requests reported 0 cached "
                     f"tokens; {oracle}{_covered(e)}{sentinel_covered(e.sentinel)}", details)


def _covered(e: ProbeEvidence) -> str:
    """What a PASS covered, event by event, and the second channel."""
    if not e.events:
        return ""
    reached = [r.event for r in e.events if r.reached]
    missed = [r.event for r in e.events if not r.reached]
    out = f"; events reached: {', '.join(reached) or 'none'}"
    out += f"; not reached: {', '.join(missed)}" if missed else ""
    if e.topk:
        out += (f"; top-k logprobs of {len(e.topk)} requests within {topk_threshold(e.topk_floor):.2f} "
                "nats of their isolated runs'")
    return out
