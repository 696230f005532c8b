"""The lifecycle phase's plan, sized from the server (pure: a resumed probe plans the same),
the second channel's distance, and how the judge reads the coverage table and top-k shifts."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvdiag.commands.probe import parse_events
from kvdiag.errors import KvdiagError
from kvdiag.record.evidence import Recycling
from kvdiag.record.summary_rows import EventRow
from kvdiag.runners.live.compare import topk_distance
from kvdiag.runners.live.lifeplan import OVERCOMMIT, plan_lifecycle
from kvdiag.verdicts import ProbeEvidence, Verdict, judge_probe
from kvdiag.vocab import BLOCK_EVENTS, SLOT_EVENTS

MATERIAL = list(range(1000, 1000 + 5003))


@settings(max_examples=60, deadline=None)
@given(block=st.sampled_from([16, 32, 64]), blocks=st.integers(200, 3000),
       context=st.integers(1024, 16384), concurrency=st.integers(4, 32))
def test_the_flood_overcommits_the_pool_and_outgrows_what_it_leaves_free(block, blocks, context,
                                                                         concurrency):
    life = plan_lifecycle(MATERIAL, block, blocks, context, None, concurrency)
    flood = life.group("flood")
    pool = block * blocks
    if not flood:
        assert "flood" in life.skipped  # said why, never silently
        return
    length = len(flood[0].ids)
    assert sum(len(q.ids) for q in flood) >= OVERCOMMIT * pool
    assert all(len(q.ids) + q.max_tokens <= context for q in life.requests)
    assert all(q.ignore_eos for q in flood)
    # the admitted prompts leave under one prompt free; each running one outgrows it by half
    # its prompt (so together by half a pool), or by all the context allows
    assert flood[0].max_tokens >= length // 2 or flood[0].max_tokens == life.sizing["longest_prompt"] - length
    # the flood once more, the same prompts under salts of their own (sent where it preempted
    # nothing): misses, so it overcommits again
    again = life.group("reflood")
    assert [(q.ids, q.max_tokens, q.ignore_eos) for q in again] == [(q.ids, q.max_tokens, True) for q in flood]
    assert not {q.salt for q in again} & {q.salt for q in life.requests if q.group != "reflood"}


def test_the_plan_is_pure_and_keeps_its_groups_apart():
    a = plan_lifecycle(MATERIAL, 16, 805, 2048, 512, 16)
    assert a == plan_lifecycle(MATERIAL, 16, 805, 2048, 512, 16)
    salts = {}
    for q in a.requests:
        salts.setdefault(q.salt, set()).add(q.group)
    # a salt is one group's, except the requests that come back to a prefix: returning sessions,
    # the flood's followers, and revisits
    assert all(groups <= {"warm", "return", "revisit"} or groups <= {"flood", "follow", "revisit"}
               or len(groups) == 1
               for groups in salts.values())
    warm, back, follow = a.group("warm"), a.group("return"), a.group("follow")
    flood = a.group("flood")
    assert flood and [q.salt for q in warm] == [q.salt for q in back]
    assert [q.salt for q in flood] == [q.salt for q in follow] and [q.of for q in follow] == [q.j for q in flood]
    for earlier, later in zip(warm + flood, back + follow):  # each extends its prefix past a block
        assert later.ids[:len(earlier.ids)] == earlier.ids and len(later.ids) > len(earlier.ids) + 16
        assert not later.ignore_eos
    # after the flood, every prefix an event touched is asked again as it was, if it was sent
    revisit = a.group("revisit")
    assert [(q.ids, q.salt) for q in revisit] == [(q.ids, q.salt) for q in warm + flood + back]
    assert all(a.requests[q.of].ids == q.ids for q in revisit)
    assert not any(q.ignore_eos for q in revisit)
    for salt in ("dedup-flood", "dedup-chunk"):  # two bursts, each one prefix, distinct tails
        dedup = [q for q in a.group("dedup") if q.salt == salt]
        common = min(len(q.ids) for q in dedup) - 5
        assert len(dedup) == 4 and len({q.ids[:common] for q in dedup}) == 1
        assert len({q.ids for q in dedup}) == len(dedup)
    chunk = a.group("chunk")
    assert len({q.ids for q in chunk}) == 1 and len(chunk[0].ids) > 512
    others = [q.ids for q in a.requests if q.group in ("warm", "flood", "cancel-prefill", "cancel-decode")]
    assert len(set(others)) == len(others)


def test_the_long_prompts_end_on_a_conversations_last_question():
    """flood, chunk and cancel prompts end where a prompt of the suite ends (its question),
    each distinct, cycling through the prompts a token shorter each lap."""
    prompts = [list(range(1000 + 700 * k, 1000 + 700 * k + 600 + 17 * k)) for k in range(6)]
    material = [t for p in prompts for t in p]
    ends = tuple(itertools.accumulate(len(p) for p in prompts))
    life = plan_lifecycle(material, 16, 805, 2048, 512, 16, ends)
    lasts = {p[-1] for p in prompts}
    long = life.group("flood") + life.group("chunk")[:1] + life.group("cancel-prefill") + life.group("cancel-decode")
    assert len(long) > len(prompts)  # more than one lap
    assert all(q.ids[-1] in lasts for q in long)
    for q in long:  # each is the tail of one contiguous stretch of the material, up to a prompt's end
        end = material.index(q.ids[-1]) + 1
        assert list(q.ids) == [material[(end - len(q.ids) + i) % len(material)] for i in range(len(q.ids))]
    assert len({q.ids for q in long}) == len(long)
    # without ends, plain windows, as before
    assert plan_lifecycle(material, 16, 805, 2048, 512, 16) != life


def test_what_cannot_be_driven_is_named():
    life = plan_lifecycle(MATERIAL, 16, None, 2048, 8192, 16)
    assert "pool" in life.skipped["flood"] and not life.group("flood")
    assert "8192" in life.skipped["chunk"] and not life.group("chunk")
    huge = plan_lifecycle(MATERIAL, 16, 10**6, 2048, None, 16)
    assert "at most" in huge.skipped["flood"]


def test_topk_distance_reads_shared_tokens_before_the_answers_part():
    a = {"top": [[["x", -0.1], ["y", -2.5]], [["z", -0.2]], [["w", -0.1]]]}
    b = {"top": [[["x", -0.2], ["y", -2.0]], [["z", -3.0]], [["w", -9.0]]]}
    assert math.isclose(topk_distance(a, b, upto=1), 0.5)
    assert math.isclose(topk_distance(a, b, upto=2), 2.8)
    assert topk_distance({"top": []}, b) is None
    assert topk_distance(a, {"top": [[["q", -1.0]]]}) is None  # no token in both: no distance


def _evidence(**kw) -> ProbeEvidence:
    base = dict(divergences=[], floor_margins=[], numerics_margin=1.0, isolated=10, contaminated=0,
                unchecked=0, isolation="cache_salt", recycling=Recycling(observed=True, how="evictions"),
                pool="805 blocks", answered=10)
    return ProbeEvidence(**(base | kw))


def _rows(missing: str | None = None) -> list[EventRow]:
    return [EventRow(event=e, reached=e != missing, evidence="why", requests=3) for e in BLOCK_EVENTS]


def test_a_required_event_not_reached_is_inconclusive_and_a_pass_names_what_it_covered():
    judged = judge_probe(_evidence(events=_rows("preemption"), required=("preemption",)))
    assert judged.verdict is Verdict.INCONCLUSIVE and "preemption (why)" in judged.reason
    judged = judge_probe(_evidence(events=_rows("preemption")))
    assert judged.verdict is Verdict.PASS
    assert "not reached: preemption" in judged.reason and "events reached: recycle" in judged.reason
    judged = judge_probe(_evidence(events=[], required=("backlog",)))
    assert judged.verdict is Verdict.INCONCLUSIVE and "backlog (not measured)" in judged.reason


def test_require_all_means_every_row_of_the_runs_own_table():
    """A paged engine's table and llama.cpp's have different rows: `all` asks each run for
    its own, so neither is inconclusive for the other's events, and a row not reached is."""
    assert judge_probe(_evidence(events=_rows(), required=("all",))).verdict is Verdict.PASS
    slots = [EventRow(event=e, reached=e != "slot-restore", evidence="refused", requests=2)
             for e in ("recycle", *SLOT_EVENTS)]
    judged = judge_probe(_evidence(events=slots, required=("all",)))
    assert judged.verdict is Verdict.INCONCLUSIVE and "slot-restore (refused)" in judged.reason
    assert "preemption" not in judged.reason


def test_a_topk_shift_beyond_the_floor_fails_and_one_within_it_passes():
    floor = [0.01, 0.03]
    within = judge_probe(_evidence(topk=[("round 2", 0.4)], topk_floor=floor, events=_rows()))
    assert within.verdict is Verdict.PASS and within.details.topk_departed == 0
    beyond = judge_probe(_evidence(topk=[("round 2", 0.4), ("lifecycle flood", 0.9)], topk_floor=floor))
    assert beyond.verdict is Verdict.FAIL and "lifecycle flood" in beyond.reason
    # a noisy floor raises the bar: the same shift is then within it
    noisy = judge_probe(_evidence(topk=[("lifecycle flood", 0.9)], topk_floor=[0.3]))
    assert noisy.verdict is Verdict.PASS


def test_require_takes_known_events_or_all():
    assert parse_events("preemption, backlog") == ("preemption", "backlog")
    assert parse_events("all") == ("all",)  # the run's own table decides what all is
    assert parse_events(None) == ()
    with pytest.raises(KvdiagError, match="unknown event 'preemtion'"):
        parse_events("preemtion")
