"""The slot events' lifecycle phase (llama.cpp), without a server: its plan, and what the
coverage table says from the rows a run stores. The live side (the stock build reaching every
row, the plants at each event failing) is tests/kvdiag/engines/test_llamacpp_live.py."""

from __future__ import annotations

import pytest

from kvdiag.runners.live.events import _row
from kvdiag.runners.live.lifeplan import ANSWER, LifePlan, LifeRequest
from kvdiag.runners.live.slotlife import LEAD, PARENTS, children_sets, plan_slots
from kvdiag.runners.live.slotrows import coverage_rows
from kvdiag.vocab import CANCELS, SLOT_EVENTS


def _sessions(n: int = 6, rounds: int = 5) -> list[list[list[int]]]:
    """n conversations sharing a 20-token system prompt, each round its last prompt, an
    answer and a question longer (unevenly)."""
    out = []
    for k in range(n):
        prompts, ids = [], list(range(20)) + [1000 + k] * 30
        for r in range(rounds):
            ids = ids + [2000 + 100 * k + r] * (17 + 11 * ((k + r) % 3))
            prompts.append(list(ids))
        out.append(prompts)
    return out


def test_the_plan_sends_the_suites_own_prompts_one_more_conversation_than_slots():
    sessions = _sessions()
    plan = plan_slots(sessions, 4)
    assert plan == plan_slots(sessions, 4) and plan.kind == "slots"
    rotate, pinned = plan.group("rotate"), plan.group("pinned")
    assert len({q.salt for q in rotate}) == 5 and len(rotate) == 15 and len(pinned) == 5
    for q in rotate + pinned:
        k, r = int(q.salt.split("-")[1]), plan.sizing["rounds"]
        assert list(q.ids) in sessions[k][:r]  # the suite's own prompts
        if q.of is not None:  # each round the same conversation's last, extended
            assert q.ids[:len(plan.requests[q.of].ids)] == plan.requests[q.of].ids
    a1, b1, b2, a2 = plan.group("restore")
    assert a1.ids == a2.ids == tuple(sessions[0][-1]) and b1.ids == b2.ids == tuple(sessions[1][-1])
    assert b2.of == b1.j and a2.of == a1.j and plan.group("erase")[0].of == a2.j


@pytest.mark.parametrize("slots, sessions, why", [(None, 6, "total_slots"), (6, 6, "need 7"),
                                                  (2, 1, "fewer than 2")])
def test_what_cannot_be_driven_is_said(slots, sessions, why):
    plan = plan_slots(_sessions(sessions), slots)
    assert not plan.group("rotate") and why in " ".join(plan.skipped.values())
    rows = coverage_rows({}, plan, {}, _row)
    assert tuple(r["event"] for r in rows) + CANCELS == SLOT_EVENTS  # the cancels: events.py's rows
    assert not rows[0]["reached"] and "not driven" in rows[0]["evidence"]
    if sessions < 2:  # nothing to restore: said, not counted as a restore that failed
        assert all(not r["reached"] and "fewer than 2" in r["evidence"] for r in rows[1:])


def _stored(plan, cached: dict[int, int]) -> dict[str, list[dict]]:
    """Rows as the phase stores them, in the plan's order, with these cached counts."""
    by_group: dict[str, list[dict]] = {}
    for k, q in enumerate(plan.requests):
        by_group.setdefault(q.group, []).append({"session": q.j, "index": k, "group": q.group,
                                                 "cached_tokens": cached.get(q.j, 0)})
    return by_group


def test_ram_cache_is_reached_only_by_a_hit_no_slot_since_could_have_given():
    plan = plan_slots(_sessions(), 4)
    second = plan.group("rotate")[5]  # conversation 0's second round
    cold = coverage_rows(_stored(plan, {}), plan, {}, _row)[0]
    assert not cold["reached"] and "0 of 10 returning" in cold["evidence"]
    warm = coverage_rows(_stored(plan, {second.j: len(plan.requests[second.of].ids)}), plan, {}, _row)[0]
    assert warm["reached"] and "1 of 10 returning" in warm["evidence"] and warm["server"]["restored"] == 1
    # a hit no longer than what it shares with a request sent since is no evidence: one slot,
    # X, then Y (its first 50 tokens X's), then X again
    x, y = tuple(range(100)), tuple(range(50)) + tuple(range(500, 550))
    small = LifePlan((LifeRequest(0, "rotate", x, 16, "x"), LifeRequest(1, "rotate", y, 16, "y"),
                      LifeRequest(2, "rotate", x + (7, 8), 16, "x", of=0)), {}, {"slots": 1}, kind="slots")
    assert not coverage_rows(_stored(small, {2: 50}), small, {}, _row)[0]["reached"]
    assert coverage_rows(_stored(small, {2: 51}), small, {}, _row)[0]["reached"]


def test_a_refused_save_says_the_server_needs_a_slot_save_path():
    plan = plan_slots(_sessions(), 4)
    observed = {"slot_actions": [{"action": "save", "file": "x.bin", "ok": False,
                                  "error": "HTTP 501: This server does not support slots action"}]}
    by_group = _stored(plan, {})
    by_group["restore"] = by_group["restore"][:1]  # A was answered, then nothing more was sent
    del by_group["erase"]
    _, restore, erase, children = coverage_rows(by_group, plan, observed, _row)
    assert not children["reached"] and "not driven" in children["evidence"]
    assert not restore["reached"] and "--slot-save-path" in restore["evidence"] and "501" in restore["evidence"]
    assert not erase["reached"]


def test_the_restore_row_counts_the_restores_and_what_was_asked_after_them():
    plan = plan_slots(_sessions(), 4)
    a1, b1, b2, a2 = plan.group("restore")
    observed = {"slot_actions": [{"action": "save", "ok": True, "n_saved": 200},
                                 {"action": "restore", "ok": True, "n_restored": 200},
                                 {"action": "restore", "ok": True, "n_restored": 200},
                                 {"action": "erase", "ok": True, "n_erased": 250}]}
    _, restore, erase, _ = coverage_rows(_stored(plan, {a2.j: 200}), plan, observed, _row)
    assert restore["reached"] and restore["server"] == {"restores": 2, "restored_tokens": 200}
    assert "[0, 200] cached" in restore["evidence"]
    assert erase["reached"] and "(250)" in erase["evidence"]
    one = {"slot_actions": observed["slot_actions"][:2]}  # the second restore refused: not reached
    one["slot_actions"].append({"action": "restore", "ok": False, "error": "HTTP 400"})
    assert not coverage_rows(_stored(plan, {}), plan, one, _row)[1]["reached"]


def test_the_children_group_fills_the_other_slots_then_asks_for_one_answer_per_slot():
    """For each of up to PARENTS conversations (B first): every slot but 0 holds another
    conversation's prompt, the longest that ends with its answer before the parent does
    (past it, llama.cpp's batch check would refuse the child: loud), then the parent asks
    for one completion per slot."""
    sessions = _sessions()
    plan = plan_slots(sessions, 4)
    sets = children_sets(plan)
    assert len(sets) == PARENTS and len(plan.group("children")) == PARENTS * (3 + 4)
    for p, (held, children) in zip(range(1, PARENTS + 1), sets):
        parent = tuple(sessions[p][-1])
        assert len(held) == 3 and len(children) == 4 and all(q.ids == parent for q in children)
        others = {tuple(x) for c, s in enumerate(sessions) if c != p for x in s}
        fits = [x for x in others if len(x) + ANSWER < len(parent)]
        assert all(q.ids in others and len(q.ids) + ANSWER < len(parent) for q in held)
        assert sorted(len(q.ids) for q in held) == sorted(len(x) for x in fits)[-3:]  # the longest
    row = coverage_rows(_stored(plan, {}), plan, {"children_answered": [4, 1, 4]}, _row)[3]
    assert row["event"] == "n-children" and row["reached"] and row["server"] == {"children": 6}
    assert "2 answered all 4" in row["evidence"]
    one = coverage_rows(_stored(plan, {}), plan, {"children_answered": [1, 1, 1]}, _row)[3]
    assert not one["reached"]  # n asked, one answered: no child ran
    alone = plan_slots(sessions, 1)
    assert not alone.group("children") and "one slot" in alone.skipped["children"]
    assert not coverage_rows({}, alone, {}, _row)[3]["reached"]
    crowded = plan_slots(sessions, 40)  # more slots than the suite has shorter prompts for
    assert "to hold 39 slots" in crowded.skipped["children"]


def test_each_cancel_sends_a_conversations_last_prompt_and_the_row_names_what_came_back():
    """One cancel of each kind, each a conversation's last prompt (not A's or B's, where the
    suite has more): cancelled on slot 0, then sent again there. The row is reached by a
    close before the first token (prefill) or after some (decode), and says what the
    re-sent prompt reported cached: the cells the cancelled task left."""
    from kvdiag.runners.live.events import _cancels

    sessions = _sessions()
    plan = plan_slots(sessions, 4)
    pre, dec = (plan.group(event) for event in CANCELS)
    assert [q.ids for q in pre + dec] == [tuple(sessions[2][-1]), tuple(sessions[3][-1])]
    assert plan_slots(sessions, 4) == plan and not plan_slots([], 4).group(CANCELS[0])
    by_group = _stored(plan, {pre[0].j: 300, dec[0].j: 0})
    observed = {"cancels": [{"j": pre[0].j, "group": CANCELS[0], "first_token": None, "tokens_seen": 0},
                            {"j": dec[0].j, "group": CANCELS[1], "first_token": 1.0, "tokens_seen": 4}]}
    prefill, decode = _cancels(observed, by_group, {}, {})
    assert prefill["reached"] and "1 of 1 streamed requests closed before" in prefill["evidence"]
    assert "(300 cached tokens)" in prefill["evidence"] and "(0 cached tokens)" in decode["evidence"]
    assert decode["reached"] and "aborted" not in decode["evidence"]  # no abort counter here
    late = {"cancels": [observed["cancels"][0] | {"first_token": 2.0, "tokens_seen": 1}]}
    assert not _cancels(late, by_group, {}, {})[0]["reached"]  # a token came: not a prefill cancel
    never = _cancels({}, {}, {}, {})
    assert not any(r["reached"] for r in never) and all("not driven" in r["evidence"] for r in never)


def test_chunk_reuse_is_driven_only_where_the_server_reuses_chunks_and_has_no_twin():
    """A span of another conversation pasted after X's first quarter, then X: the last three
    quarters come back as a chunk shifted over the span. No row, and nothing sent, on a server
    that reuses no chunks; a chunk shorter than N is said, not sent."""
    sessions = _sessions()
    assert not plan_slots(sessions, 4).group("reuse")
    assert "chunk-reuse" not in [r["event"] for r in coverage_rows({}, plan_slots(sessions, 4), {}, _row)]
    plan = plan_slots(sessions, 4, reuse_chunk=16)
    reuse = plan.group("reuse")
    assert len(reuse) == 2 * 3
    sent = {tuple(p) for s in sessions for p in s}
    for c, (pasted, x) in enumerate(zip(reuse[::2], reuse[1::2])):
        q, last = len(sessions[c][-1]) // 4, sessions[c][-1]
        assert x.of == pasted.j and pasted.twinned and not x.twinned  # no ground truth from scratch
        assert x.ids[:q] == tuple(last[:q]) and x.ids[-(len(last) - q) - LEAD:-LEAD] == tuple(last[q:])
        head = q + LEAD  # both begin alike, then the pasted one has a span as long as q
        assert pasted.ids[:head] == x.ids[:head] and pasted.ids[head + q:] == x.ids[head:-LEAD]
        # the chunk ends before the prompt does: past it, the prompt has words the slot lacks
        assert x.ids[-LEAD:] != pasted.ids[-LEAD:]
        assert pasted.ids[head:head + q] != x.ids[head:head + q]
        assert x.ids not in sent and pasted.ids not in sent  # neither restored from an earlier round
    long = max(len(s[-1]) for s in sessions)
    assert "reuse" in plan_slots(sessions, 4, reuse_chunk=long).skipped
    # reached where X reported cached tokens past what it shares with its pasted version
    cached = {x.j: len(sessions[k][-1]) // 4 + LEAD + (40 if k == 0 else 0) for k, x in enumerate(reuse[1::2])}
    row = coverage_rows(_stored(plan, cached), plan, {}, _row)[-1]
    assert row["event"] == "chunk-reuse" and row["reached"] and "1 reported" in row["evidence"]
    cached = {x.j: len(sessions[k][-1]) // 4 + LEAD for k, x in enumerate(reuse[1::2])}
    assert not coverage_rows(_stored(plan, cached), plan, {}, _row)[-1]["reached"]


def test_a_failed_restore_is_driven_only_where_kvdiag_can_break_a_slot_file():
    """The longer of A and B on the slot, saved; the other; the broken file's restore; the
    other again, its answer twinned. No row where kvdiag did not start the server; a restore
    that took the broken file whole, a file kvdiag could not break, or a refused save, is not
    reached; a cleared slot reports none."""
    sessions = _sessions()
    assert "failed-restore" not in [r["event"] for r in coverage_rows({}, plan_slots(sessions, 4), {}, _row)]
    plan = plan_slots(sessions, 4, failed_restore=True)
    longer, first, again = plan.group("failed-restore")
    a, b = sessions[0][-1], sessions[1][-1]
    assert longer.ids == tuple(max(a, b, key=len)) and first.ids == again.ids == tuple(min(a, b, key=len))
    assert len(longer.ids) > len(first.ids) and again.of == first.j and again.twinned
    refused = [{"action": "save", "ok": True, "n_saved": 300},
               {"action": "restore", "ok": False, "error": "HTTP 400: Unable to restore slot"}]
    row = coverage_rows(_stored(plan, {}), plan, {"failed_restore": refused}, _row)[-1]
    assert row["event"] == "failed-restore" and row["reached"] and row["server"] == {"cached_after": 0}
    kept = coverage_rows(_stored(plan, {again.j: len(again.ids) - 1}), plan, {"failed_restore": refused}, _row)[-1]
    assert kept["reached"] and kept["server"]["cached_after"] == len(again.ids) - 1
    taken = [refused[0], {"action": "restore", "ok": True, "n_restored": 300}]
    row = coverage_rows(_stored(plan, {}), plan, {"failed_restore": taken}, _row)[-1]
    assert not row["reached"] and "taken whole" in row["evidence"]
    row = coverage_rows(_stored(plan, {}), plan, {"failed_restore": refused[:1]}, _row)[-1]
    assert not row["reached"] and "layout" in row["evidence"]
    row = coverage_rows(_stored(plan, {}), plan, {"failed_restore": [{"action": "save", "ok": False,
                                                                     "error": "HTTP 501"}]}, _row)[-1]
    assert not row["reached"] and "501" in row["evidence"]
    one = plan_slots(sessions[:1], 4, failed_restore=True)
    assert not one.group("failed-restore") and "fewer than 2" in coverage_rows({}, one, {}, _row)[-1]["evidence"]
