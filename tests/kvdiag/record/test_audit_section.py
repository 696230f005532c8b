"""The model-free vLLM audit's section (kvdiag.record.audit_section), typed: a section as
kvdiag wrote it before the types loads, reads by attribute and writes back the same JSON; an
older one without some keys loads with their defaults; vllm_section builds that same shape
from a replay (no vLLM needed: a stand-in replay result); the audit's judge counts the
differential phase's over-hits once and the console reads the section by attribute."""

from __future__ import annotations

import copy
import json
from types import SimpleNamespace as NS

import pytest

from kvdiag.record.audit_section import AuditSection
from kvdiag.record.kinds import parse_summary
from kvdiag.record.summary import AuditSummary, ReproduceSummary

pytestmark = pytest.mark.unit

PHASE = {"phase": "after reset", "requests": 2, "hit_tokens": 0, "foreign_slots": 0,
         "unwritten_slots": 0, "cross_tenant_hits": 0}
ROWS = [{"name": "base", "family": "base", "cached": 0, "bound": 0},
        {"name": "slot 3", "family": "slot", "cached": 64, "bound": 16}]
DIFFERENTIAL = {"requests": 2, "unit": 16, "rows": ROWS, "foreign_slots": 0, "unwritten_slots": 0,
                "skipped": None}
COUNTERS = {"vllm_version": "0.11.0", "prefix_cache_requests": 4, "prefix_cache_queries": 128,
            "prefix_cache_hits": 48, "prefix_cache_hit_rate": 0.375, "preempted_requests": 0,
            "preempted_queries": 0, "preempted_hits": 0, "preemptions": 0, "manager_seconds": 0.25,
            "invariant_violations": 0, "recycled_blocks": 3, "cross_tenant_hits": 0,
            "prompt_logprob_hits": 0}
# what kvdiag.runners.replay.audit.vllm_section wrote while the section was a dict (kvdiag
# 54fdef7), for the stand-in replay below, with an epilogue and one allocator of ours
WRITTEN = {
    "target": "vllm-0.11.0", **COUNTERS,
    "epilogue": {"reset": True, "phases": [PHASE], "differential": DIFFERENTIAL, "findings": []},
    "steps": 9, "replay_seconds": 0.123, "invariant_messages": [],
    "rounds": [{"round": 1, "hit_tokens": 0, "query_tokens": 64, "foreign_slots": 0,
                "unwritten_slots": 0, "sessions_with_foreign_reads": [], "vllm_hit_rate": 0.0},
               {"round": 2, "hit_tokens": 32, "query_tokens": 64, "foreign_slots": 2,
                "unwritten_slots": 0, "sessions_with_foreign_reads": ["s0"], "vllm_hit_rate": 0.5}],
    "twins": {"requests": 1, "foreign_slots": 0, "unwritten_slots": 1},
    "corrupted_rounds": [2], "corrupted": True,
    "compare": {"allocator": "prefix-cache", "blocks_hit": 3, "vllm_blocks_hit": 5,
                "requests_differing": 3, "requests": 4, "invariant_messages": [],
                "explained": [{"stage": "raw", "requests_differing": 1, "blocks_hit": 3,
                               "vllm_blocks_hit": 4}]}}
FINDING = ("differential: 1 of 2 requests reported more cached tokens than any earlier request "
           "of their namespace could have cached (slot 3: 64 cached, bound 16)")


def _judged(section: dict) -> dict:
    """The section as audit-vllm's summary.json holds it: the differential judged."""
    out = copy.deepcopy(section)
    out["epilogue"]["differential"]["over_hits"] = 1
    out["epilogue"]["findings"] = [FINDING + ": served blocks their tokens, namespace or a reset rule out"]
    return out


def _audit_summary(section: dict) -> dict:
    return {"kind": "audit", "signature": "vllm-replay:0.11.0|model:trace-0123abcd", "suite": "s",
            "verdict": "fail", "cases": ["trigger"], "targets": ["vllm-0.11.0"],
            "allocators": ["vllm"], "model": "trace-0123abcd", "vllm_audit": section}


def _record(session, rnd, cached=16, prompt=32, foreign=0, unwritten=0, hit=1):
    return NS(session=session, round=rnd, cached_tokens=cached, prompt_tokens=prompt,
              foreign_slots=foreign, unwritten_slots=unwritten, blocks_hit=hit)


def _replay(epilogue: bool = True):
    """A stand-in for vLLM's ReplayResult: two sessions, two rounds, a twin that read an
    unwritten slot, a foreign read in round 2."""
    stats = COUNTERS | ({"epilogue": copy.deepcopy(WRITTEN["epilogue"])} if epilogue else {})
    records = [_record("s0", 1, cached=0), _record("s1", 1, cached=0), _record("s0", 2, foreign=2),
               _record("s1", 2), _record("t~s0", 2, unwritten=1)]
    return NS(target="vllm-0.11.0", records=records, stats=stats, steps=9, seconds=0.12345,
              violations=[])


def _ours():
    return NS(allocator="prefix-cache", violations=[],
              records=[_record("s0", 1, hit=0), _record("s1", 1, hit=0), _record("s0", 2, hit=2),
                       _record("s1", 2, hit=1)])


STAGES = [NS(label="raw", differing=[1], ours_blocks_hit=3, vllm_blocks_hit=4)]


def test_a_section_written_before_the_types_loads_reads_and_writes_back_the_same():
    data = _audit_summary(_judged(WRITTEN))
    s = parse_summary(copy.deepcopy(data))
    assert type(s) is AuditSummary and isinstance(s.vllm_audit, AuditSection)
    a = s.vllm_audit
    assert (a.vllm_version, a.prefix_cache_hits, a.recycled_blocks) == ("0.11.0", 48, 3)
    assert [r.round for r in a.rounds] == [1, 2] and a.rounds[1].sessions_with_foreign_reads == ["s0"]
    assert a.epilogue.differential.rows[1].cached == 64 and a.epilogue.differential.over_hits == 1
    assert a.compare.explained[0].stage == "raw" and a.twins.unwritten_slots == 1
    assert json.loads(s.to_json())["vllm_audit"] == data["vllm_audit"]


def test_an_older_section_loads_with_defaults_and_ignores_a_dropped_key():
    old = {k: v for k, v in WRITTEN.items() if k not in ("twins", "cross_tenant_hits",
                                                          "prompt_logprob_hits", "epilogue", "compare")}
    a = parse_summary(_audit_summary(old | {"no_longer_written": 1})).vllm_audit
    assert a.cross_tenant_hits == 0 and a.twins.requests == 0 and a.epilogue is None
    assert a.compare is None and "compare" not in a.model_dump(mode="json")
    assert not hasattr(a, "no_longer_written")
    assert AuditSection().corrupted is False and AuditSection().rounds == []


def test_reproduce_keeps_a_section_per_case_or_none():
    fields = {"signature": "sig", "suite": "s", "verdict": "pass", "suite_path": "s.yaml",
              "cases": ["trigger"], "targets": ["reference"], "allocators": ["vllm"], "model": "m",
              "device": "cpu", "engine_log": {}, "seconds": {}, "gates": {}, "faults": {}}
    typed = ReproduceSummary(**fields, vllm_audit={"trigger": WRITTEN})
    assert typed.vllm_audit["trigger"].corrupted_rounds == [2]
    assert json.loads(typed.to_json())["vllm_audit"] == {"trigger": WRITTEN}
    assert "vllm_audit" not in json.loads(ReproduceSummary(**fields).to_json())


def test_vllm_section_builds_the_shape_it_always_wrote():
    from kvdiag.runners.replay.audit import vllm_section

    assert vllm_section(_replay(), _ours(), STAGES).model_dump(mode="json") == WRITTEN
    bare = vllm_section(_replay(epilogue=False))
    assert bare.model_dump(mode="json") == {k: v for k, v in WRITTEN.items() if k != "compare"} | {"epilogue": None}


def test_the_judge_counts_the_differentials_over_hits_once():
    from kvdiag.commands.audit import judge
    from kvdiag.runners.replay.audit import AuditRun
    from kvdiag.verdicts.detection import audit_caught_by

    run = AuditRun(trace=None, frame=None, metrics={}, vllm=_replay(), ours=_ours(), stages=STAGES)
    first = judge(run)
    assert first.verdict.value == "fail" and FINDING in first.reason
    assert judge(run) == first  # judged once: the section is built once and keeps the count
    ep = run.section.epilogue
    assert ep.differential.over_hits == 1 and len(ep.findings) == 1 and ep.findings[0].startswith(FINDING)
    written = run.section.model_dump(mode="json")["epilogue"]
    assert written == _judged(WRITTEN)["epilogue"]  # the judge's line is the epilogue's, not the phase's
    assert audit_caught_by(run.section) == "read,over-hit"


def test_the_console_reads_the_section_by_attribute():
    import pandas as pd

    from kvdiag.record.results import RunExtras, RunResult
    from kvdiag.report.terminal_runs import render_audit

    s = parse_summary(_audit_summary(_judged(WRITTEN)))
    lines = render_audit(RunResult("audit", pd.DataFrame(), s, extra=RunExtras()))
    text = "\n".join(x for x in lines if isinstance(x, str))
    assert "48 of 128 tokens hit (0.375)" in text and "hit counts vs prefix-cache: 3 of 4" in text
    assert "raw" not in text  # the first stage is the raw comparison, not an explanation
    assert "cached blocks recycled: 3" in text
