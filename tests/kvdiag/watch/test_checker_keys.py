"""The checker keys each exchange in the over-hit index by a number never reused. It once keyed
them by id(): a finished exchange's memory came back for a later one, which then skipped the
earlier prompt as its own and read a healthy hit on it as an over-hit (2 findings in 3,767
requests of the probe's traffic through a watch in front of a healthy SGLang, at commit 248).
In process: a conversation of rounds, one exchange at a time, each freed once judged."""

from __future__ import annotations

import time

from kvdiag.watch.checker import Checker
from kvdiag.watch.exchange import Exchange
from kvdiag.watch.index import PrefixIndex
from kvdiag.watch.log import WatchLog
from kvdiag.watch.metrics import WatchMetrics
from kvdiag.watch.twins import Sampler


def _round(checker: Checker, ids: tuple[int, ...], cached: int, out: int) -> None:
    """One request sent, answered (`out` tokens) and judged; nothing holds it after, so the
    next round's exchange is most likely made in its memory (CPython reuses it first)."""
    ex = Exchange(path="/v1/completions", namespace=("m", "salt", None), prompt={"prompt": list(ids)},
                  request_id="r", stream=False, sent=time.time())
    checker._apply("sent", ex, {ex.seq: ids})
    ex.complete, ex.done = True, time.time()
    ex.prompt_tokens, ex.cached, ex.completion_tokens = len(ids), cached, out
    checker._apply("done", ex, {})


def test_each_round_is_held_against_the_last_whatever_memory_its_exchange_reuses(tmp_path):
    checker = Checker(None, PrefixIndex(), None, Sampler(0.0, 1.0), WatchLog(tmp_path / "w.jsonl"),
                      WatchMetrics(), warmup=0.0)
    ids, cached = tuple(range(1000, 1087)), 0
    for r in range(40):
        _round(checker, ids, cached, out=3)
        # the next round's prompt holds this one's whole prompt, its 3 generated tokens and a
        # new user turn: a healthy cache serves all but the new turn
        cached = len(ids) + 3
        ids = ids + tuple(range(5000 + 10 * r, 5000 + 10 * r + 3)) + tuple(range(7, 7 + 5 + r % 7))
    assert len(checker.index.spaces[("m", "salt", None)].outs) == 40  # every exchange its own key
    assert checker.metrics.judged._value.get() == 40
    assert checker.metrics.over_hits._value.get() == 0, (tmp_path / "w.jsonl").read_text()[-600:]
