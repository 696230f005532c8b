"""The over-hit bound under llama.cpp's chunk reuse (`--cache-reuse N`): held against
llama-server's own cache-reuse loop (server-context.cpp, b11434), restated below, on
conversations a client trims (a turn dropped from the middle, so the slot's later turns are
shifted into place), over slots that hold each request's prompt and the answer it generated
(ids the client never sees)."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from kvdiag.runners.live.oracle import HitRule, Sent, bounds


def _llamacpp_cached(slot: list[int], prompt: list[int], n: int) -> int:
    """What llama-server reports cached for `prompt` on a slot holding `slot`: the common
    prefix, then, with n > 0, every later run of at least n ids the slot holds (scanned
    forward in the slot, taken in prompt order) shifted into place; the prompt's last token
    is always computed."""
    past = 0
    while past < min(len(slot), len(prompt)) and slot[past] == prompt[past]:
        past += 1
    head_c = head_p = past
    while n > 0 and head_c < len(slot) and head_p < len(prompt):
        m = 0
        while head_c + m < len(slot) and head_p + m < len(prompt) and slot[head_c + m] == prompt[head_p + m]:
            m += 1
        if m >= n:
            past, head_c, head_p = past + m, head_c + m, head_p + m
        else:
            head_c += 1
    return min(past, len(prompt) - 1)


def _served(seed: int, n: int, slots: int = 2) -> list[tuple[Sent, int]]:
    """A run of trimmed chat histories, one request at a time, each on a random slot: every
    request with what llama.cpp would report cached for it."""
    rng = random.Random(seed)
    turns = [[rng.randrange(50) for _ in range(rng.randrange(3, 3 * n))] for _ in range(8)]
    system = [rng.randrange(50) for _ in range(n)]
    held: list[list[int]] = [[] for _ in range(slots)]
    run, t = [], 0.0
    for k in range(12):
        keep = sorted(rng.sample(range(len(turns)), rng.randrange(2, len(turns))))
        prompt = system + [i for j in keep for i in turns[j]]
        s = rng.randrange(slots)
        cached = _llamacpp_cached(held[s], prompt, n)
        answer = [rng.randrange(50) for _ in range(rng.randrange(0, 3 * n))]
        held[s] = prompt + answer  # the slot now holds this prompt and its answer
        run.append((Sent(k, (None,), tuple(prompt), t, t + 1, cached, len(answer)), cached))
        t += 2
    return run


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10**6), n=st.integers(2, 6))
def test_no_chunk_llamacpp_reuses_is_an_over_hit(seed, n):
    run = _served(seed, n)
    found = bounds([s for s, _ in run], HitRule(1, True, n))
    for sent, cached in run:
        assert cached <= found[sent.key], (sent.key, cached, found[sent.key])


def test_without_the_chunk_rule_the_same_traffic_reads_as_over_hits():
    """The traffic does reach past the common prefix: the LCP bound alone is exceeded."""
    over = 0
    for seed in range(20):
        run = _served(seed, 4)
        found = bounds([s for s, _ in run], HitRule(1, True))
        over += sum(cached > found[s.key] for s, cached in run)
    assert over > 0


def test_a_chunk_nobody_sent_is_still_an_over_hit():
    """The rule widens the bound only by windows some request held: a cached count that runs
    through ids no earlier request had stays above it."""
    a = Sent("a", (None,), tuple(range(20)), 0.0, 1.0, 0, 0)
    b = Sent("b", (None,), tuple(range(10)) + tuple(range(100, 110)), 2.0, 3.0, 15, 0)
    found = bounds([a, b], HitRule(1, True, 4))
    assert found["b"] == 10 and b.cached > found["b"]
