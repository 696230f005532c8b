"""Shared answers against their cache-isolated twins: where two greedy answers first differ,
how decisively the isolated run preferred its own token there (the margin), the margins at
which repeated isolated runs diverged (the noise floor), the per-round records, and the
probe's check of its own ground truth. Measured only: whether a margin is numerics or
corruption, and whether the floor is stable, is kvdiag.verdicts' to say.
"""

from __future__ import annotations

import math

from kvdiag.planning.plan import CasePlan
from kvdiag.record.evidence import (
    FirstDivergence,
    GroundTruth,
    IsolatedExample,
    LifeDivergence,
    LogprobPair,
    NoiseFloor,
    PromptLogprobs,
    TopK,
)
from kvdiag.runners.live.differential import DIFF_ISOLATED
from kvdiag.runners.live.lifeplan import LIFE, LIFE_ISOLATED
from kvdiag.runners.live.phases import (
    FLOOR,
    ISOLATED,
    PLP,
    PLP_ISOLATED,
    PRESSURE,
    SHARED,
    pressure_id,
)
from kvdiag.runners.live.store import RoundStore
from kvdiag.runners.records import Checker, Record
from reference_engine.util import cdiv


def divergence(a: list[str], b: list[str]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def margin_at(reference: dict, other_tokens: list[str], i: int) -> float:
    """How much the reference run preferred its own token at position i over the other
    run's (from its top logprobs; a lower bound when the other token is not among them)."""
    if i >= len(reference["tokens"]) or i >= len(reference["top"]):
        return math.inf  # the reference stopped or went on: a length difference, not a near-tie
    own = reference["logprobs"][i]
    top = dict((t, lp) for t, lp in reference["top"][i])
    other = other_tokens[i] if i < len(other_tokens) else None
    if other in top:
        return own - top[other]
    return own - min(top.values()) if top else math.inf


def noise_floor(store: RoundStore, numerics_margin: float) -> NoiseFloor:
    """Repeated isolated runs of one request against the first: the pairs compared and the
    margin of every pair that diverged (a length difference counts as 0: the run stopped),
    beside the numerics margin the judge holds them to."""
    margins, pairs = [], 0
    for (phase, k, r), row in store.done.items():
        if phase != FLOOR or (ISOLATED, k, r) not in store.done:
            continue
        pairs += 1
        ref = store.done[(ISOLATED, k, r)]
        i = divergence(ref["tokens"], row["tokens"])
        if i is not None:
            m = margin_at(ref, row["tokens"], i)
            margins.append(m if math.isfinite(m) else 0.0)
    return NoiseFloor(pairs=pairs, diverged_pairs=len(margins), margins=margins,
                      margin=max(margins, default=0.0), numerics_margin=numerics_margin)


TOPK_POSITIONS = 4  # the second channel reads the first generated tokens' top-k logprobs


def topk_distance(a: dict, b: dict, upto: int | None = None) -> float | None:
    """The largest change, in nats, of any token's logprob among both runs' top-k at each of
    the first TOPK_POSITIONS generated positions (before the answers part, `upto`): a shift of
    the distribution that need not flip the greedy token. None where the server gave no top-k."""
    worst = None
    n = min(TOPK_POSITIONS, len(a.get("top") or []), len(b.get("top") or []))
    for i in range(n if upto is None else min(n, upto)):
        mine, theirs = dict(map(tuple, a["top"][i])), dict(map(tuple, b["top"][i]))
        for token in mine.keys() & theirs.keys():
            d = abs(mine[token] - theirs[token])
            worst = d if worst is None else max(worst, d)
    return worst


def topk_channel(plan: CasePlan, store: RoundStore, pressure: list[int]) -> TopK:
    """The second channel, raw: every shared (and pressure, and lifecycle) request's top-k
    distance from its isolated twin (`shifts`: what, distance), and the same distance between
    repeated isolated runs (its noise floor)."""
    pairs = [((SHARED, k, r), (ISOLATED, k, r), f"round {r + 1}") for (p, k, r) in store.done if p == SHARED]
    pairs += [((PRESSURE, j, r), (ISOLATED, pressure[j], r), f"round {r + 1}")
              for (p, j, r) in store.done if p == PRESSURE and j < len(pressure)]
    pairs += [((LIFE, j, 0), (LIFE_ISOLATED, j, 0), f"lifecycle {store.done[(LIFE, j, 0)].get('group')}")
              for (p, j, _) in store.done if p == LIFE]
    distances = []
    for shared, iso, what in pairs:
        a, b = store.done.get(shared), store.done.get(iso)
        if a and b and (d := topk_distance(a, b, divergence(a["tokens"], b["tokens"]))) is not None:
            distances.append((what, d))
    floor = [d for (p, k, r), row in store.done.items() if p == FLOOR and (ISOLATED, k, r) in store.done
             and (d := topk_distance(row, store.done[(ISOLATED, k, r)],
                                     divergence(row["tokens"], store.done[(ISOLATED, k, r)]["tokens"])))
             is not None]
    return TopK(positions=TOPK_POSITIONS, shifts=distances, floor_shifts=floor, compared=len(distances),
                floor=max(floor, default=None), largest=max((d for _, d in distances), default=None))


def lifecycle_divergences(store: RoundStore) -> list[LifeDivergence]:
    """Every answered lifecycle request against its isolated twin: where they first part and
    the isolated run's margin there (None: no twin, NaN: no departure)."""
    out = []
    for (phase, j, _), row in sorted(store.done.items(), key=lambda kv: kv[0][1]):
        iso = store.done.get((LIFE_ISOLATED, j, 0))
        if phase != LIFE or iso is None:
            continue
        i = divergence(row["tokens"], iso["tokens"])
        out.append(LifeDivergence(request=j, group=row.get("group"), first_divergence=i,
                                  margin=margin_at(iso, row["tokens"], i) if i is not None else math.nan,
                                  cached_tokens=row.get("cached_tokens"), prompt_tokens=row.get("prompt_tokens"),
                                  index=seen(row, iso)))
    return out


def seen(row: dict, twin: dict) -> int | None:
    """When a departure between a request and its isolated twin could first be seen: the later
    of their two landings (a twin answered after a fault corrupted it departs only then)."""
    at = [x for x in (row.get("index"), twin.get("index")) if x is not None]
    return max(at) if len(at) == 2 else None


def ground_truth(store: RoundStore) -> GroundTruth:
    """The probe's check of its own ground truth: every isolated request (fresh salt, or the
    first after an emptied cache) must report 0 cached tokens. `contaminated` counts those
    that reported more; `unchecked` those that reported no count at all."""
    isolated = (ISOLATED, FLOOR, PLP_ISOLATED, DIFF_ISOLATED, LIFE_ISOLATED)
    rows = [row for (phase, _, _), row in store.done.items() if phase in isolated]
    hit = [row for row in rows if (row.get("cached_tokens") or 0) > 0]
    return GroundTruth(isolated=len(rows), contaminated=len(hit),
                       unchecked=sum(row.get("cached_tokens") is None for row in rows),
                       examples=[IsolatedExample(phase=r["phase"], session=r["session"], round=r["round"] + 1,
                                                 cached_tokens=r["cached_tokens"],
                                                 prompt_tokens=r["prompt_tokens"]) for r in hit[:5]])


def prompt_logprob_pairs(store: RoundStore) -> PromptLogprobs:
    """Prompt logprobs, shared against isolated, per twin that has both: the judge says which
    departed (kvdiag.verdicts.prompt_logprob_departures): a position served from the cache
    was never computed for the request."""
    pairs = [LogprobPair(session=k, round=r + 1, shared=shared["prompt_logprobs"],
                         isolated=iso["prompt_logprobs"])
             for (phase, k, r), shared in store.done.items()
             if phase == PLP and shared.get("prompt_logprobs")
             and (iso := store.done.get((PLP_ISOLATED, k, r))) and iso.get("prompt_logprobs")]
    return PromptLogprobs(pairs=pairs, checked=len(pairs))


def records(plan: CasePlan, store: RoundStore, target: str, style: str, block_size: int,
            pressure: list[int] = (), bad_reads: dict | None = None) -> list[Record]:
    """Per round: the isolated row and the shared row of every suite session, and a shared
    row for every pressure session (judged against the isolated twin of the session it
    replays), each with its margin; the judge's labels fill `classification` later
    (kvdiag.commands.probe.judge). `bad_reads`: a sentinel's foreign and unwritten slots per
    (phase, session, round), the reference engine's columns."""
    checker = Checker(style)
    out = []
    runs = [(session.session_id, SHARED, k, k, True) for k, session in enumerate(plan.sessions)]
    runs += [(pressure_id(plan, j, k), PRESSURE, j, k, False) for j, k in enumerate(pressure)]
    for sid, shared_phase, j, k, with_iso in runs:
        session = plan.sessions[k]
        for r, rnd in enumerate(session.rounds):
            iso, shared = store.done.get((ISOLATED, k, r)), store.done.get((shared_phase, j, r))
            if iso is None or shared is None:
                continue
            for phase, row in ((ISOLATED, iso), (SHARED, shared))[0 if with_iso else 1:]:
                text = row["text"].strip()
                passed, reason = checker.check(session.kb, rnd, text)
                i = divergence(row["tokens"], iso["tokens"]) if phase == SHARED else None
                margin = margin_at(iso, row["tokens"], i) if i is not None else math.nan
                cached = row["cached_tokens"]
                needed = cdiv(row["prompt_tokens"], block_size)
                out.append(Record(
                    case=plan.case.name, target=target, allocator=phase,
                    session=sid, round=r + 1, kind=rnd.kind,
                    **(bad_reads or {}).get((shared_phase, j, r), {}) if phase == SHARED else {},
                    prompt_tokens=row["prompt_tokens"], cached_tokens=cached or 0,
                    blocks_needed=needed, blocks_hit=min(needed, (cached or 0) // block_size),
                    output_text=text, reference_text=iso["text"].strip(), expected_text=rnd.expected,
                    first_divergence=i, fact_check_pass=passed, fact_check_reason=reason,
                    divergence_margin=margin))
    return out


def first_divergences(plan: CasePlan, store: RoundStore, corrupt, pressure: list[int]) -> list[FirstDivergence]:
    """The first divergent token of each corrupted request (`corrupt`: its rows of the
    records frame), in round order."""
    index = {ses.session_id: (SHARED, k, k) for k, ses in enumerate(plan.sessions)}
    index |= {pressure_id(plan, j, k): (PRESSURE, j, k) for j, k in enumerate(pressure)}
    firsts = []
    for row in corrupt.sort_values(["round", "session"]).itertuples():
        (phase, j, k), r, i = index[row.session], int(row.round) - 1, int(row.first_divergence)
        got, want = store.done[(phase, j, r)]["tokens"], store.done[(ISOLATED, k, r)]["tokens"]
        firsts.append(FirstDivergence(session=row.session, round=r + 1, token_index=i,
                                      index=seen(store.done[(phase, j, r)], store.done[(ISOLATED, k, r)]),
                                      shared_token=got[i] if i < len(got) else None,
                                      isolated_token=want[i] if i < len(want) else None,
                                      margin=float(row.divergence_margin)))
    return firsts


def by_request_index(plan: CasePlan, store: RoundStore, frame, pressure: list[int],
                     windows: int = 8) -> list[dict]:
    """The divergence rate of the shared requests by the order they landed, in `windows`
    equal windows: slow decay over a long run shows as a rising rate."""
    index = {ses.session_id: (SHARED, k) for k, ses in enumerate(plan.sessions)}
    index |= {pressure_id(plan, j, k): (PRESSURE, j) for j, k in enumerate(pressure)}
    shared = frame[frame["allocator"] == SHARED]
    landed = []
    for row in shared.itertuples():
        phase, j = index[row.session]
        landed.append((store.done[(phase, j, int(row.round) - 1)]["index"], row.classification))
    landed.sort()
    size = max(1, cdiv(len(landed), windows))
    out = []
    for start in range(0, len(landed), size):
        chunk = landed[start:start + size]
        diverged = sum(c != "match" for _, c in chunk)
        corrupted = sum(c == "corruption" for _, c in chunk)
        out.append({"first": chunk[0][0], "last": chunk[-1][0], "requests": len(chunk),
                    "diverged": diverged, "corrupted": corrupted,
                    "rate": diverged / len(chunk)})
    return out
