"""Detect's "to first": when the first detection's request landed, by any channel the judge
counted. A fault caught only by the lifecycle phase's answers or by the sentinel is placed
too, not left as '-' (a recorded vLLM summary, the lifecycle phase's classes as the judge
writes them back)."""

from __future__ import annotations

import json
from pathlib import Path

from kvdiag.commands.detect import _landed
from kvdiag.record.evidence import LifeDivergence
from kvdiag.record.summary import ProbeSummary

RECORDED = Path(__file__).parents[2] / "fixtures/summaries/probe-vllm-ref-undercount-1d8c4e8.json"


def _summary() -> ProbeSummary:
    return ProbeSummary.model_validate(json.loads(RECORDED.read_text()))


def test_each_channel_places_its_detection():
    s = _summary()
    shared = min(f.index for f in s.first_divergences)
    assert _landed(s) == [f.index for f in s.first_divergences]  # its findings predate the index
    s.first_divergences = None
    assert _landed(s) == []  # nothing placed: '-', never a guess
    s.lifecycle.divergences = [
        LifeDivergence(request=3, group="flood", first_divergence=2, margin=0.1, index=shared - 7,
                       label="numerics"),
        LifeDivergence(request=4, group="follow", first_divergence=0, margin=9.0, index=shared + 5,
                       label="corruption"),
        LifeDivergence(request=5, group="revisit", index=1)]  # did not depart
    assert _landed(s) == [shared + 5]  # only what the judge labelled corruption
    s.sentinel.findings[2].index = shared + 2
    assert min(_landed(s)) == shared + 2


def test_a_departure_is_placed_when_both_answers_had_landed(tmp_path):
    """A twin answered after a fault corrupted it (a page the free list held twice, handed to
    the isolated run) departs from its request only then: the detection is placed at the later
    of the two landings, not at the request's own, which may predate the fault."""
    from kvdiag.runners.live.compare import lifecycle_divergences, seen
    from kvdiag.runners.live.lifeplan import LIFE, LIFE_ISOLATED
    from kvdiag.runners.live.store import RoundStore

    store = RoundStore(tmp_path / "rounds.jsonl")
    store.done = {(LIFE, 0, 0): {"index": 3, "tokens": ["a", "b"], "group": "flood"},
                  (LIFE_ISOLATED, 0, 0): {"index": 40, "tokens": ["a", "c"], "top": []},
                  (LIFE, 1, 0): {"index": 50, "tokens": ["x"], "group": "revisit"},
                  (LIFE_ISOLATED, 1, 0): {"index": 9, "tokens": ["x"], "top": []}}
    placed = {d.request: d.index for d in lifecycle_divergences(store)}
    assert placed == {0: 40, 1: 50}
    assert seen({"index": 5}, {}) is None  # a landing unknown: not placed, never a guess
