"""The detection matrix's "caught by" (kvdiag.verdicts.detection): each channel is named when
its count is not zero, several are joined by commas in a fixed order, and "-" when none
counted anything; in-process, from typed blocks and the audit's section as written."""

from __future__ import annotations

import pytest

from kvdiag.record.audit_section import AuditSection
from kvdiag.record.evidence import GroundTruth, Oracle, PromptLogprobs, TopK
from kvdiag.record.sentinel import SentinelBlock
from kvdiag.verdicts import Verdict
from kvdiag.verdicts.detection import NONE, audit_caught_by, isolation_caught_by, probe_caught_by


def _sentinel(bad: int = 0) -> SentinelBlock:
    return SentinelBlock(source="sentinel.jsonl", starts=1, steps=4, requests=2, reads=100,
                         writes=10, unchecked=0, foreign=bad, unwritten=0, overwrite=0)


def _probe(**counts) -> str:
    blocks = {"sentinel": None, "oracle": Oracle(), "corrupted_requests": 0,
              "prompt_logprobs": PromptLogprobs(), "topk": TopK(), "ground_truth": GroundTruth()}
    return probe_caught_by(**(blocks | counts))


def test_a_probe_that_counted_nothing_caught_nothing():
    assert NONE == "-"
    assert _probe() == "-"
    assert _probe(sentinel=_sentinel(0)) == "-"  # a sentinel that saw no bad read


@pytest.mark.parametrize("counts, channel", [
    ({"sentinel": _sentinel(3)}, "sentinel"),
    ({"oracle": Oracle(over_hits=2)}, "over-hit"),
    ({"corrupted_requests": 1}, "answer"),
    ({"prompt_logprobs": PromptLogprobs(mismatched=4)}, "logprobs"),
    ({"topk": TopK(departed=1)}, "top-k"),
    ({"ground_truth": GroundTruth(contaminated=5)}, "ground truth"),
])
def test_each_probe_channel_is_named_when_its_count_is_not_zero(counts, channel):
    assert _probe(**counts) == channel


def test_several_probe_channels_in_their_order():
    assert _probe(ground_truth=GroundTruth(contaminated=1), corrupted_requests=2,
                  sentinel=_sentinel(1)) == "sentinel,answer,ground truth"


def test_the_isolation_audit_caught_its_fault_only_when_it_failed():
    assert isolation_caught_by(Verdict.FAIL, 2, None) == "isolation"
    assert isolation_caught_by(Verdict.FAIL, 0, _sentinel(5)) == "sentinel"
    assert isolation_caught_by(Verdict.FAIL, 1, _sentinel(5)) == "isolation,sentinel"
    assert isolation_caught_by(Verdict.FAIL, 1, _sentinel(0)) == "isolation"
    for v in (Verdict.PASS, Verdict.INCONCLUSIVE, Verdict.ERROR):
        assert isolation_caught_by(v, 1, _sentinel(5)) == "-"


EMPTY_AUDIT = {"corrupted_rounds": [], "invariant_violations": 0, "cross_tenant_hits": 0,
               "epilogue": None}


def _audit(section: dict) -> AuditSection:
    """The section as summary.json holds it, read back typed."""
    return AuditSection.model_validate(section)


def test_an_audit_that_counted_nothing_caught_nothing():
    assert audit_caught_by(_audit(EMPTY_AUDIT)) == "-"
    assert audit_caught_by(_audit({})) == "-"  # an older section without these keys
    quiet = {"reset": True, "phases": [], "differential": {"over_hits": 0}, "findings": []}
    assert audit_caught_by(_audit(EMPTY_AUDIT | {"epilogue": quiet})) == "-"


@pytest.mark.parametrize("section, channel", [
    ({"corrupted_rounds": [3, 4]}, "read"),
    ({"invariant_violations": 2}, "invariant"),
    ({"cross_tenant_hits": 1}, "salt"),
    ({"epilogue": {"differential": {"over_hits": 2}, "findings": ["differential: 2 over-hits"]}},
     "over-hit"),
    ({"epilogue": {"findings": ["salt b: 3 cache hits on blocks another salt wrote"]}}, "epilogue"),
])
def test_each_audit_channel_is_named_when_its_count_is_not_zero(section, channel):
    assert audit_caught_by(_audit(EMPTY_AUDIT | section)) == channel


def test_the_differentials_own_finding_is_not_counted_twice_as_the_epilogues():
    over = {"differential": {"over_hits": 1}}
    assert audit_caught_by(_audit({"epilogue": over | {"findings": ["d"]}})) == "over-hit"
    assert audit_caught_by(_audit({"epilogue": over | {"findings": ["d", "salt a"]}})) == "over-hit,epilogue"
    assert audit_caught_by(_audit(EMPTY_AUDIT | {"corrupted_rounds": [1], "cross_tenant_hits": 2})) == "read,salt"
