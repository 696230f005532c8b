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
