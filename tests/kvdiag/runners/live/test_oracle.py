"""The over-hit oracle's bound against its definition, computed the slow way (every pair of
requests), on random traffic: namespaces, overlapping requests in flight, resets, generated
tokens that a later prompt extends, any block size and either engine rule."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kvdiag.runners.live.oracle import HitRule, Sent, bounds, check


def _by_definition(reqs: list[Sent], rule: HitRule, resets: list[float]) -> dict:
    out = {}
    for x in reqs:
        best = 0
        for y in reqs:
            if y is x or y.namespace != x.namespace or not y.sent <= x.done:
                continue
            if any(y.sent < t < x.done for t in resets):
                continue
            n = 0
            while n < min(len(x.ids), len(y.ids)) and x.ids[n] == y.ids[n]:
                n += 1
            best = max(best, len(y.ids) + y.out if n == len(y.ids) < len(x.ids) else n)
        cap = len(x.ids) - rule.last_token_computed
        out[x.key] = max(0, min(best, cap)) // rule.unit * rule.unit
    return out


@st.composite
def traffic(draw):
    base = draw(st.lists(st.integers(0, 3), min_size=40, max_size=40))
    reqs = []
    for i in range(draw(st.integers(1, 10))):
        ids = list(base[:draw(st.integers(1, 40))])
        for _ in range(draw(st.integers(0, 2))):
            ids[draw(st.integers(0, len(ids) - 1))] = draw(st.integers(0, 3))
        if reqs and draw(st.booleans()):  # a later round: an earlier prompt and more
            ids = list(draw(st.sampled_from(reqs)).ids) + ids[:draw(st.integers(0, 4))]
        sent = draw(st.floats(0, 10))
        reqs.append(Sent(i, (draw(st.integers(0, 1)),), tuple(ids), sent,
                         sent + draw(st.floats(0, 3)), draw(st.integers(0, 40)), draw(st.integers(0, 4))))
    resets = draw(st.lists(st.floats(0, 12), max_size=1))
    # a reset succeeds only with nothing in flight
    return [r for r in reqs if not any(r.sent <= t <= r.done for t in resets)], resets


@settings(max_examples=300, deadline=None)
@given(traffic(), st.sampled_from([HitRule(1, True), HitRule(4, True), HitRule(1, False)]),
       st.sampled_from([1, 3, 16]))
def test_the_bound_is_the_definition(case, rule, block):
    reqs, resets = case
    assert bounds(reqs, rule, resets, block=block) == _by_definition(reqs, rule, resets)


def test_a_later_prompt_may_hit_what_an_earlier_request_generated():
    """Y generated 5 tokens as its usage counts them: a prompt that extends Y's may hit Y's
    prompt and those 5 (their ids are not known to the client), no further."""
    y = Sent("y", ("s",), tuple(range(10)), 0.0, 1.0, 0, out=5)
    x = Sent("x", ("s",), tuple(range(10)) + (50, 51, 52, 53, 54, 55, 56), 2.0, 3.0, 14)
    assert bounds([y, x], HitRule(1, True))["x"] == 15
    other = Sent("o", ("s",), tuple(range(9)) + (77,), 0.0, 1.0, 0, out=5)  # parts before its end
    assert bounds([other, x], HitRule(1, True))["x"] == 9


def test_what_the_judge_reads():
    a = Sent("a", ("s",), (1, 2, 3, 4, 5, 6, 7, 8, 9), 0.0, 1.0, 0)
    b = Sent("b", ("s",), (1, 2, 3, 4, 9, 9, 9, 9, 9), 2.0, 3.0, 8)  # parts from a at 4: 8 is an over-hit
    c = Sent("c", ("t",), (1, 2, 3, 4, 5, 6, 7, 8, 9), 2.0, 3.0, None)  # another namespace, no count
    d = Sent("d", ("s",), None, 2.0, 3.0, 4)  # ids unknown to the client
    found = check([a, b, c, d], HitRule(4, True))
    assert found["rows"] == [("a", 0, 0), ("b", 8, 4)]
    assert found["checked"] == 2 and found["unreported"] == 1 and found["unknown_ids"] == 1


def test_the_unit_is_vllms_match_unit_where_smaller_than_its_block():
    """vLLM with --prefix-match-unit 16 beside a Mamba group serves a hit of 48 tokens in a
    block of 64 (kvdiag.canary.mamba_hybrid): bounded in blocks, a request sharing 60 tokens
    would read as an over-hit; in the match unit it does not, and 64 still would."""
    from kvdiag.record.evidence import ServerCache

    flags = {"block_size": "64", "prefix_match_unit": "16", "mamba_cache_mode": "align"}
    server = ServerCache(block_size=64, source="cache_config_info", flags=flags)
    assert HitRule.for_server(server).unit == 16
    assert HitRule.for_server(server.model_copy(update={"flags": {"prefix_match_unit": "None"}})).unit == 64
    assert HitRule.for_server(ServerCache(block_size=64, source="cache_config_info")).unit == 64
    assert HitRule.for_server(ServerCache(block_size=16, source="server_info")).unit == 1
    a = Sent("a", ("s",), tuple(range(70)), 0.0, 1.0, 0)
    b = Sent("b", ("s",), tuple(range(60)) + (99,) * 20, 2.0, 3.0, 48)
    assert bounds([a, b], HitRule(64, True))["b"] == 0 < 48  # the block's bound: a false over-hit
    assert bounds([a, b], HitRule.for_server(server))["b"] == 48
