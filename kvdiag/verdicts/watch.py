"""What kvdiag watch's evidence means: an over-hit on real traffic (verdicts.live.over_hit,
unless the proxy is warming up or forgot what could explain it), a sampled twin's departure,
and the verdict of a watch file's windows."""

from __future__ import annotations

from kvdiag.verdicts.core import Judgement, Verdict
from kvdiag.verdicts.live import classify_divergence, over_hit, topk_threshold

NUMERICS_MIN = 1.0  # nats, as the probe's --numerics-margin default


def over_hit_kind(cached: int | None, bound: int | None, warming: bool, explained: bool) -> str:
    """`over_hit` (a finding), `warmup` (the upstream may hold what the proxy never saw),
    `unjudged` (the proxy forgot a request that could explain it), or `ok`."""
    if not over_hit(cached, bound):
        return "ok"
    if warming:
        return "warmup"
    return "unjudged" if explained else "over_hit"


def twin_departed(margin: float, distance: float | None, floor_margins: list[float],
                  floor_distances: list[float]) -> str:
    """A shared replay against its isolated twin: `corruption` when its first tokens depart by
    more than any pair of isolated twins did (NUMERICS_MIN at least), or its top-k shift
    exceeds the threshold the isolated pairs' shifts set; `numerics` for a near-tie; `match`."""
    label = classify_divergence(margin, max([NUMERICS_MIN, *floor_margins]))
    if label == "match" and distance is not None and distance > topk_threshold(floor_distances):
        return "corruption"
    return label


def judge_watch(over_hits: int, departures: int, twins_reached: int, requests_judged: int) -> Judgement:
    """FAIL on any over-hit or twin departure; INCONCLUSIVE when nothing was judged (no
    request's count checked, no twin that hit the cache); PASS names what was checked."""
    if over_hits or departures:
        return Judgement(Verdict.FAIL, f"{over_hits} over-hit(s) and {departures} twin "
                         "departure(s) on the upstream's own traffic")
    if not requests_judged and not twins_reached:
        return Judgement(Verdict.INCONCLUSIVE, "no request's cached count was checked and no "
                         "sampled twin hit the cache: nothing was judged")
    return Judgement(Verdict.PASS, f"{requests_judged} request(s) held against the over-hit "
                     f"bound and {twins_reached} sampled twin(s) that hit the cache, all clean")
