"""Key coverage, measured: every request of the probe's own namespaces (the shared phase, its
twins and prompt-logprob requests, the pressure sessions, the differential phase) with the
cached tokens its server reported beside the most the over-hit oracle allows (oracle.py),
and the differential phase's answers against their cache-isolated twins. Raw rows only:
kvdiag.verdicts.judge_probe decides what over-hits and what departed."""

from __future__ import annotations

import math

from kvdiag.record.evidence import BoundedHit, DifferentialPair, HitAccount, KeyCoverage, Oracle
from kvdiag.runners.live import phases as P
from kvdiag.runners.live.compare import divergence, margin_at
from kvdiag.runners.live.differential import DIFF, DIFF_ISOLATED
from kvdiag.runners.live.lifeplan import LIFE, LIFE_ISOLATED, LifePlan
from kvdiag.runners.live.oracle import HitRule, Sent, check
from kvdiag.runners.live.pressure import ServerCache
from kvdiag.runners.live.store import RoundStore
from kvdiag.runners.records import Record


def _ids(plan, phase: str, j: int, r: int, row: dict, pressure: list[int],
         life: LifePlan | None) -> list[int] | None:
    if phase in (LIFE, LIFE_ISOLATED):
        return list(life.requests[j].ids) if life is not None and j < len(life.requests) else None
    if phase in (DIFF, DIFF_ISOLATED):
        return row.get("ids")
    if phase in (P.SHARED, P.TWIN, P.ISOLATED):
        return plan.prompts[j][r]
    if phase == P.PRESSURE:
        return plan.prompts[pressure[j]][r]
    if phase in (P.PLP, P.PLP_ISOLATED):
        return P.plp_ids(plan, j, r)
    return None


def _what(plan, phase: str, j: int, r: int, row: dict, pressure: list[int]) -> str:
    if phase == DIFF:
        return f"differential pair {row.get('name')!r} ({row.get('family')})"
    if phase == LIFE:
        return f"lifecycle {row.get('group')} request {j}"
    k = pressure[j] if phase == P.PRESSURE else j
    return f"{phase} request of session {plan.sessions[k].session_id}, round {r + 1}"


def _margin(shared: dict, isolated: dict | None) -> float | None:
    """The isolated run's margin at the first token where the two answers part; NaN where
    they agree; None without an isolated twin."""
    if isolated is None:
        return None
    i = divergence(isolated["tokens"], shared["tokens"])
    return math.nan if i is None else margin_at(isolated, shared["tokens"], i)


def _group(phase: str, row: dict) -> str:
    return f"lifecycle {row.get('group')}" if phase == LIFE else phase


def accounting(hits: list[tuple[str, int, int]]) -> list[HitAccount]:
    """(group, cached, bound) of every bounded request -> one HitAccount per group, in the
    order the groups first appear."""
    out: dict[str, HitAccount] = {}
    for group, cached, bound in hits:
        a = out.setdefault(group, HitAccount(group=group))
        a.requests += 1
        a.possible += bound
        a.reported += cached
        a.short += cached < bound
        a.none += cached == 0 < bound
    return list(out.values())


def key_coverage(plan, store: RoundStore, pressure: list[int], server: ServerCache,
                 meta: dict, ids_known: bool, namespaces: bool = True,
                 reuse_chunk: int = 0, life: LifePlan | None = None) -> KeyCoverage:
    """The oracle's counts (oracle.check) with every request it bounded (`hits`), and the
    differential phase's pairs (name, family, cached, bound, margin). The margin of a
    suite round is its shared answer's against the isolated run of the same round.
    `namespaces` False (an engine that keys its cache by tokens only, llama.cpp): one
    namespace for every salt, and the isolated requests, which such an engine still leaves
    in its slots, count as sources of hits (never judged: the ground truth checks them).
    `reuse_chunk`: the chunk reuse every request was pinned to (llama.cpp's n_cache_reuse).
    `life`: the lifecycle phase's plan. A slot engine's (llama.cpp: one request at a time, or
    pinned to slots) is bounded too, its isolated twins sources; a paged engine's flood,
    preempted, retracted and cancelled, is judged by its answers only."""
    rule = HitRule.for_server(server, reuse_chunk)
    slots = life is not None and life.kind == "slots"
    judged = (P.SHARED, P.TWIN, P.PRESSURE, P.PLP, DIFF) + ((LIFE,) if slots else ())
    sources = () if namespaces else (P.ISOLATED, P.PLP_ISOLATED, DIFF_ISOLATED) + (
        (LIFE_ISOLATED,) if slots else ())
    sent = []
    for (phase, j, r), row in store.done.items():
        if phase not in judged + sources or "sent" not in row:  # rows of an older kvdiag carry no times
            continue
        ids = _ids(plan, phase, j, r, row, pressure, life) if ids_known else None
        if ids is not None and row.get("prompt_tokens") and len(ids) != row["prompt_tokens"]:
            ids = None  # the server counted another prompt than the client's ids: no bound
        sent.append(Sent((phase, j, r), (row.get("salt") if namespaces else None, row.get("model")),
                         tuple(ids) if ids is not None else None, row["sent"], row["done"],
                         row.get("cached_tokens") if phase in judged else None,
                         int(row.get("completion_tokens") or 0)))
    evidence = check(sent, rule, meta.get("resets", []))
    if sources:  # sources only: no count of theirs was missing
        evidence["unreported"] -= sum(s.key[0] in sources for s in sent)
    hits, pairs, bounded, groups = [], [], {}, []
    for (phase, j, r), cached, bound in evidence.pop("rows"):
        row = store.done[(phase, j, r)]
        groups.append((_group(phase, row), cached, bound))
        if phase == DIFF:
            twin = store.done.get((DIFF_ISOLATED, j, r))
        elif phase in (P.SHARED, P.PRESSURE):
            twin = store.done.get((P.ISOLATED, pressure[j] if phase == P.PRESSURE else j, r))
        else:
            twin = None  # a one-token twin or a prompt-logprob request: no answer to compare
        hits.append(BoundedHit(what=_what(plan, phase, j, r, row, pressure), phase=phase, cached=cached,
                               bound=bound, prompt_tokens=row.get("prompt_tokens"), index=row.get("index"),
                               margin=_margin(row, twin) if phase in (DIFF, P.SHARED, P.PRESSURE) else None))
        bounded[(phase, j, r)] = bound
    for (phase, j, r), row in sorted(store.done.items(), key=lambda kv: kv[0][1]):
        if phase == DIFF:  # every pair's answer, with or without a count
            pairs.append(DifferentialPair(name=row.get("name"), family=row.get("family"),
                                          cached=row.get("cached_tokens"), bound=bounded.get((phase, j, r)),
                                          margin=_margin(row, store.done.get((DIFF_ISOLATED, j, r)))))
    return KeyCoverage(oracle=Oracle(**evidence, hits=hits, accounting=accounting(groups)),
                       differential=pairs,
                       differential_skipped=meta.get("differential_skipped", []))


def differential_records(store: RoundStore, target: str, block_size: int) -> list[Record]:
    """The differential phase as records of a case of its own ("differential", one round per
    pair): the frame of a --differential-only run, so its page shows what was answered."""
    out = []
    for (phase, j, r), row in sorted(store.done.items(), key=lambda kv: kv[0][1]):
        iso = store.done.get((DIFF_ISOLATED, j, r))
        if phase != DIFF or iso is None:
            continue
        i = divergence(iso["tokens"], row["tokens"])
        margin = math.nan if i is None else margin_at(iso, row["tokens"], i)
        for who, data in ((DIFF_ISOLATED, iso), (DIFF, row)):
            shared = who == DIFF
            cached = data.get("cached_tokens") or 0
            needed = -(-data["prompt_tokens"] // block_size)
            out.append(Record(
                case="differential", target=target, allocator=P.SHARED if shared else P.ISOLATED,
                session=f"{j:02d} {row.get('name')}", round=1, kind="recite",
                prompt_tokens=data["prompt_tokens"], cached_tokens=cached, blocks_needed=needed,
                blocks_hit=min(needed, cached // block_size), output_text=data["text"],
                reference_text=iso["text"], first_divergence=i if shared else None,
                divergence_margin=margin if shared else math.nan))
    return out
