"""The over-hit oracle online (kvdiag.watch.index): the bound a request gets from what was
sent before it ended, the same as the batch oracle's, and what eviction leaves behind."""

import random

from kvdiag.runners.live.oracle import HitRule, Sent, bounds
from kvdiag.watch.index import BLOCK, PrefixIndex

NS = ("m", None, None)


def _req(key, ids, sent, done=0.0, out=None, ns=NS):
    return Sent(key=key, namespace=ns, ids=tuple(ids), sent=sent, done=done, cached=None, out=out)


def _traffic(overlap: bool):
    rng = random.Random(7)
    base = [rng.randrange(50) for _ in range(200)]
    reqs = []
    for k in range(60):
        cut = rng.randrange(1, 200)
        ids = base[:cut] + [rng.randrange(50) for _ in range(rng.randrange(0, 40))]
        sent = rng.uniform(0, 100) if overlap else float(k)
        done = sent + (rng.uniform(0.1, 20) if overlap else 0.5)
        reqs.append(_req(k, ids, sent, done, out=rng.randrange(0, 30)))
    return reqs


def _online(reqs):
    index, got = PrefixIndex(), {}
    events = sorted([(r.sent, 1, r) for r in reqs] + [(r.done, 2, r) for r in reqs],
                    key=lambda e: (e[0], e[1]))
    for _, kind, r in events:
        if kind == 1:
            index.sent(_req(r.key, r.ids, r.sent))  # its output is unknown until done
        else:
            got[r.key] = min(index.done(_req(r.key, r.ids, r.sent), r.out), len(r.ids))
    return got


def test_online_bound_equals_the_batch_oracle_when_requests_do_not_overlap():
    reqs = _traffic(overlap=False)
    assert _online(reqs) == bounds(reqs, HitRule(1, False))


def test_online_bound_never_falls_below_the_batch_oracle_under_concurrency():
    """The batch oracle knows an in-flight request's final output; online, it is unbounded
    until done, so the online bound can only be higher (sound), never lower."""
    reqs = _traffic(overlap=True)
    got, want = _online(reqs), bounds(reqs, HitRule(1, False))
    assert all(got[k] >= want[k] for k in want) and any(got[k] > want[k] for k in want)


def test_a_request_in_flight_counts_its_output_as_unbounded():
    index = PrefixIndex()
    y = _req("y", range(40), 0.0)
    index.sent(y)  # still generating when x finishes
    x = _req("x", list(range(40)) + [99] * 30, 1.0)
    index.sent(x)
    assert index.done(x, 5) >= 70  # x extends y's prompt: y's unknown output may cover the rest


def test_eviction_forgets_oldest_first_and_leaves_what_explains_a_hit():
    index = PrefixIndex(max_tokens=100)
    old = _req("old", range(64), 0.0)
    index.sent(old), index.done(old, 8)
    fresh = _req("new", range(1000, 1064), 1.0)
    index.sent(fresh), index.done(fresh, 0)
    assert index.evicted == 1  # 128 tokens held > 100: the oldest went
    again = _req("again", range(80), 2.0)
    index.sent(again)
    bound = index.done(again, 0)
    assert bound < 64  # the evicted request no longer bounds it...
    assert index.explained(again, 64) and index.explained(again, 72)  # ...but explains it
    assert not index.explained(again, 73)  # beyond its prompt + output: a real over-hit
    other = _req("other", range(500, 580), 3.0)
    index.sent(other), index.done(other, 0)
    assert not index.explained(other, BLOCK)  # shares no block with anything forgotten


def test_namespaces_are_kept_apart_and_a_reset_empties_them():
    index = PrefixIndex()
    a = _req("a", range(48), 0.0, ns=("m", "salt-a", None))
    index.sent(a), index.done(a, 0)
    b = _req("b", range(48), 1.0, ns=("m", "salt-b", None))
    index.sent(b)
    assert index.done(b, 0) == 0
    index.clear()
    c = _req("c", range(48), 2.0, ns=("m", "salt-b", None))
    index.sent(c)
    assert index.done(c, 0) == 0  # what b computed was reset away


def test_the_forgotten_map_is_bounded_and_says_when_it_overflowed():
    index = PrefixIndex(max_tokens=BLOCK, max_lost=10)
    for k in range(20):
        r = _req(k, range(k * 100, k * 100 + 2 * BLOCK), float(k))
        index.sent(r), index.done(r, 0)
    assert len(index.lost) <= 10 and index.overflowed > 0
