"""The coverage table: one row per event of a block's life (kvdiag.vocab.EVENTS), whether the
probe's traffic reached it, the server's own evidence where it reports any (vLLM's and the
reference server's preemption and queue figures, SGLang's retractions, queue and aborts),
otherwise what the traffic itself observed, and the requests exposed to it. Measured only:
kvdiag.verdicts decides what a missing event means for the verdict (--require).
"""

from __future__ import annotations

from kvdiag.record.evidence import Recycling
from kvdiag.runners.live.identity import every_server
from kvdiag.runners.live.lifeplan import LIFE, LifePlan
from kvdiag.runners.live.phases import SHARED, TWIN
from kvdiag.runners.live.slotrows import coverage_rows
from kvdiag.vocab import EVENTS

PREEMPTIONS, ABORTS = every_server("preemptions"), every_server("aborts")


def delta(names: tuple[str, ...], before: dict, after: dict) -> float | None:
    """What the server's counters `names` rose by between two /metrics samples, summed; None
    where it reports none of them."""
    found = [after[n] - before.get(n, 0.0) for n in names if n in after]
    return sum(found) if found else None


def _row(event: str, reached: bool, evidence: str, requests: int, server: dict | None = None) -> dict:
    return {"event": event, "reached": bool(reached), "evidence": evidence, "requests": requests,
            "server": server or {}}


def coverage(store, life: LifePlan | None, observed: dict, recycling: Recycling,
             before: dict, after: dict) -> list[dict]:
    """The table's rows, in EVENTS' order. `before`/`after`: the server's counters when the
    probe began and after its lifecycle phase; `observed`: what lifecycle_phase saw."""
    by_group: dict[str, list[dict]] = {}
    for (phase, _, _), row in store.done.items():
        if phase == LIFE:
            by_group.setdefault(row.get("group", ""), []).append(row)
    if life is not None and life.kind == "slots":  # an engine of slots (llama.cpp)
        return [_recycle(recycling, by_group), *coverage_rows(by_group, life, observed, _row),
                *_cancels(observed, by_group, before, after)]
    skipped = life.skipped if life else {"all": "the lifecycle phase was not run"}
    table = [_recycle(recycling, by_group), _early_free(store, recycling)]
    table.append(_preemption(by_group, before, after, skipped))
    table += _cancels(observed, by_group, before, after)
    table.append(_chunk(observed, by_group, life, skipped))
    table.append(_backlog(observed, by_group))
    table.append(_dedup(by_group, life))
    order = list(EVENTS)
    return sorted(table, key=lambda r: order.index(r["event"]))


def _recycle(recycling: Recycling, by_group: dict) -> dict:
    n = recycling.requests_with_recycled_prefix + len(by_group.get("revisit", []))
    return _row("recycle", recycling.observed, recycling.how or "not measured", n,
                {"evictions": recycling.evictions})


def _early_free(store, recycling: Recycling) -> dict:
    """Twins that finished (and freed their hold on the shared blocks) while their partner
    still decoded."""
    early = 0
    for (phase, j, r), twin in store.done.items():
        partner = store.done.get((SHARED, j, r))
        if phase == TWIN and partner and twin.get("done", 0) < partner.get("done", 0):
            early += 1
    reached = early > 0 and recycling.observed
    why = (f"{early} one-token twins finished while the request sharing their blocks still decoded"
           + ("" if recycling.observed else ", but no recycling was observed"))
    return _row("early-free", reached, why if early else "no twin finished before its partner", early)


def _preemption(by_group: dict, before: dict, after: dict, skipped: dict) -> dict:
    n = delta(PREEMPTIONS, before, after)
    exposed = sum(len(by_group.get(g, [])) for g in ("flood", "reflood", "return", "follow"))
    if "flood" in skipped and not n:
        return _row("preemption", False, f"not driven: {skipped['flood']}", 0)
    if n is None:
        return _row("preemption", False, "unknown: the server reports no preemption or retraction "
                    "counter", exposed)
    again = by_group.get("reflood")
    return _row("preemption", n > 0, f"{n:g} preemptions (or retractions) reported by the server"
                + (f" (the flood sent again, {len(again)} requests: the first preempted nothing)"
                   if again else ""), exposed, {"preemptions": n})


def _cancels(observed: dict, by_group: dict, before: dict, after: dict) -> list[dict]:
    aborts = delta(ABORTS, before, after)
    out = []
    for event in ("cancel-prefill", "cancel-decode"):
        done = [c for c in observed.get("cancels", []) if c["group"] == event]
        if event == "cancel-prefill":
            hit = [c for c in done if c["first_token"] is None]
            by_rid = sum(c.get("aborted") is not None for c in hit)
            what = "closed before their first token" + (
                f" ({by_rid} aborted through the server's abort API before it)" if by_rid else "")
        else:
            hit = [c for c in done if c["tokens_seen"] >= 1]
            what = "closed after tokens had come"
        server = {"aborts": aborts} if aborts is not None else {}
        tail = f"; the server counted {aborts:g} aborted" if aborts is not None else ""
        again = [r.get("cached_tokens") for r in sorted(by_group.get(event, []), key=lambda r: r["index"])]
        if not done:
            out.append(_row(event, False, "not driven: no request was cancelled", len(again), server))
            continue
        out.append(_row(event, bool(hit), f"{len(hit)} of {len(done)} streamed requests {what}, "
                        f"then the same prompt sent again ({', '.join(map(str, again)) or 'none'} "
                        f"cached tokens){tail}", len(again), server))
    return out


def _chunk(observed: dict, by_group: dict, life: LifePlan | None, skipped: dict) -> dict:
    if "chunk" in skipped:
        return _row("chunked-prefill", False, f"not driven: {skipped['chunk']}", 0)
    seen = observed.get("chunk")
    if not seen:
        return _row("chunked-prefill", False, "not driven", 0)
    first = seen.get("first_token")
    during = [t for t in seen["followers_sent"] if first is None or t < first]
    chunk = (life.sizing.get("prefill_chunk") if life else None)
    length = len(life.group("chunk")[0].ids) if life and life.group("chunk") else 0
    size = (f"a prompt of {length} tokens, the server's prefill chunk {chunk}" if chunk else
            f"a prompt of {length} tokens (the server does not report its prefill chunk)")
    return _row("chunked-prefill", bool(during), f"{size}; {len(during)} of {len(seen['followers_sent'])} "
                "copies sent before its first token came", len(by_group.get("chunk", [])))


def _backlog(observed: dict, by_group: dict) -> dict:
    most = (observed.get("sampled") or {}).get("max_waiting")
    at = observed.get("return_sent_waiting")
    returning = len(by_group.get("return", [])) + len(by_group.get("follow", []))
    if most is None:
        return _row("backlog", False, "unknown: the server reports no waiting-request gauge", returning)
    return _row("backlog", most > 0, f"up to {most:g} requests waiting (sampled /metrics); "
                f"{at if at is not None else 'unknown'} waiting when the returning sessions and the flood's "
                "followers were sent",
                returning, {"max_waiting": most})


def _dedup(by_group: dict, life: LifePlan | None) -> dict:
    """Reached where a burst's requests (one prefix under a fresh salt, so uncached when sent)
    were all in flight together and either two or more computed the prefix themselves (an
    engine that prefills duplicates side by side, as SGLang does before it frees one copy), or
    one computed it and the others hit it while that request was still running (an engine
    that publishes a prefix's blocks when it allocates them, as vLLM does)."""
    rows = by_group.get("dedup", [])
    if not rows or life is None:
        return _row("concurrent-prefill", False, "not driven", 0)
    prefix = len(life.group("dedup")[0].ids) - 5
    said, reached = [], False
    for salt in dict.fromkeys(r["salt"] for r in rows):
        burst = [r for r in rows if r["salt"] == salt]
        together = max(r["sent"] for r in burst) < min(r["done"] for r in burst)
        computed = sum((r.get("cached_tokens") or 0) < prefix // 2 for r in burst)
        reached |= together and computed >= 1 and len(burst) >= 2
        said.append(f"{computed} of {len(burst)}" + ("" if together else " (not all in flight together)"))
    return _row("concurrent-prefill", reached, f"{len(rows) // len(said)} requests with one uncached "
                f"{prefix}-token prefix sent at once, {len(said)} times: {', '.join(said)} computed it "
                "themselves (reported under half of it cached), the others hit it while it was being "
                "computed or decoded", len(rows))
