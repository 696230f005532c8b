"""Knowledge bases and fact sessions: determinism, exact lengths, infeasible lengths, styles."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from kvdiag.canary.vocab import MARKERS
from kvdiag.facts import FLAVOURS, STYLES, SessionPlan, build_session, make_knowledge_base

CANARY = Path(__file__).resolve().parents[3] / "fixtures" / "canary"
LENGTHS = [300, 317, 333, 700, 1023, 1040, 1300, 1317, 1600, 2047, 2064, 2400]


@pytest.fixture(scope="module")
def canary_count():
    """count_tokens with the canary tokenizer and chat template (tokenizers + jinja2 only)."""
    import jinja2
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(CANARY / "tokenizer.json"))
    template = json.loads((CANARY / "tokenizer_config.json").read_text())["chat_template"]
    render = jinja2.Environment().from_string(template).render

    def count(messages: list[dict]) -> int:
        text = render(messages=messages, add_generation_prompt=True)
        return len(tok.encode(text, add_special_tokens=False).ids)

    count.encode = lambda messages: tok.encode(
        render(messages=messages, add_generation_prompt=True), add_special_tokens=False)
    return count


def test_knowledge_base_is_deterministic_and_distinct():
    for flavour in FLAVOURS:
        a = make_knowledge_base(flavour, 60, seed=3)
        assert a == make_knowledge_base(flavour, 60, seed=3)
        assert a != make_knowledge_base(flavour, 60, seed=4)
        assert len({f.key_token for f in a.facts}) == 60
        assert len({(f.entity, f.relation) for f in a.facts}) == 60
        for f in a.facts:
            assert 1 <= len(f.value_tokens) <= 6
            assert len(set(f.value_tokens)) == len(f.value_tokens)
            assert re.fullmatch(r"[A-Za-z]+", f.key_token)


def test_knowledge_base_rejects_bad_input():
    with pytest.raises(ValueError, match="flavour"):
        make_knowledge_base("medieval", 3, seed=0)
    with pytest.raises(ValueError, match="num_facts"):
        make_knowledge_base("legal", 500, seed=0)


@pytest.mark.parametrize("style", STYLES)
def test_session_is_deterministic_by_seed(style, canary_count):
    kb = make_knowledge_base("legal", 40, seed=1)
    lengths = LENGTHS if style == "canary" else [400 + 250 * i for i in range(8)]
    a = build_session(SessionPlan(kb, style=style, seed=5, prompt_lengths=lengths,
                                  count_tokens=canary_count))
    b = build_session(SessionPlan(kb, style=style, seed=5, prompt_lengths=lengths,
                                  count_tokens=canary_count))
    c = build_session(SessionPlan(kb, style=style, seed=6, prompt_lengths=lengths,
                                  count_tokens=canary_count))
    assert a == b
    assert a != c


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_canary_prompt_lengths_are_exact(flavour, canary_count):
    kb = make_knowledge_base(flavour, 50, seed=2)
    s = build_session(SessionPlan(kb, style="canary", seed=2, prompt_lengths=LENGTHS,
                                  count_tokens=canary_count))
    assert len(s.rounds) == len(LENGTHS)
    for r, want in enumerate(LENGTHS):
        assert canary_count(s.messages(r)) == want
    kinds = [r.kind for r in s.rounds]
    assert "recite" in kinds and "question" in kinds
    for rnd in s.rounds:
        if rnd.kind == "recite":
            assert 10 <= len(rnd.expected.split()) <= 40
            assert rnd.asked == ()
        else:
            (fact,) = rnd.asked
            assert rnd.expected == " ".join(fact.value_tokens)


def test_canary_session_layout(canary_count):
    """Facts start blocks when there is room; keys are >= 5 tokens apart; asked facts were stated."""
    kb = make_knowledge_base("clinical", 60, seed=9)
    s = build_session(SessionPlan(kb, style="canary", seed=9, prompt_lengths=LENGTHS,
                                  count_tokens=canary_count))
    stated: set = set()
    for rnd in s.rounds:
        stated |= set(rnd.stated)
        assert all(f in stated for f in rnd.asked)
    aligned = [off % 16 == 0 for rnd in s.rounds for off in rnd.stated_offsets]
    assert sum(aligned) >= 0.8 * len(aligned)
    keys = {"Ġ" + f.key_token for f in kb.facts} | {"Ġ" + m for m in MARKERS}
    last = len(s.rounds) - 1
    toks = canary_count.encode(s.messages(last)).tokens
    where = [i for i, t in enumerate(toks) if t in keys]
    assert min(b - a for a, b in zip(where, where[1:])) >= 5
    stated_markers = [w for rnd in s.rounds for prev, w in zip([""] + rnd.user.split(), rnd.user.split())
                      if w.startswith("tag") and prev != "recite"]
    assert len(stated_markers) == len(set(stated_markers))  # every line marker is used once


def test_messages_replay_answers(canary_count):
    kb = make_knowledge_base("financial", 30, seed=0)
    s = build_session(SessionPlan(kb, style="canary", seed=0, prompt_lengths=LENGTHS[:4],
                                  count_tokens=canary_count))
    msgs = s.messages(2)
    assert [m["role"] for m in msgs] == ["user", "assistant", "user", "assistant", "user"]
    assert msgs[1]["content"] == s.rounds[0].expected
    replay = s.messages(2, answers=["unknown", "x"])
    assert replay[1]["content"] == "unknown" and replay[3]["content"] == "x"


def test_infeasible_length_names_the_round(canary_count):
    kb = make_knowledge_base("financial", 30, seed=0)
    with pytest.raises(ValueError, match="round 2"):
        build_session(SessionPlan(kb, style="canary", seed=0, prompt_lengths=[300, 317, 320],
                      count_tokens=canary_count))


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_natural_lengths_are_exact_with_a_bpe_tokenizer(flavour, canary_count):
    """Natural English through the canary's byte-level BPE (many tokens per word)."""
    kb = make_knowledge_base(flavour, 30, seed=4)
    lengths = [500 + 300 * i for i in range(7)]
    s = build_session(SessionPlan(kb, style="natural", seed=4, prompt_lengths=lengths,
                                  count_tokens=canary_count))
    for r, want in enumerate(lengths):
        assert canary_count(s.messages(r)) == want
    fact = next(r.asked[0] for r in s.rounds if r.kind == "question")
    assert fact.value in next(r.expected for r in s.rounds if r.asked == (fact,))
    assert fact.entity in " ".join(r.user for r in s.rounds)


def test_natural_lengths_with_word_count():
    """A tokenizer that counts words: every length is reachable exactly."""
    def count(messages):
        return sum(len(m["content"].split()) + 3 for m in messages) + 2

    kb = make_knowledge_base("clinical", 30, seed=1)
    lengths = [200, 260, 330, 400, 480, 560, 700, 760]
    s = build_session(SessionPlan(kb, style="natural", seed=1, prompt_lengths=lengths,
                                  count_tokens=count))
    assert [count(s.messages(r)) for r in range(len(lengths))] == lengths
    assert any(r.kind == "recite" for r in s.rounds)
