"""How one round's user message is laid out: its facts (block-aligned in canary style), a
recitable line, filler and the request (`layout`), and, in natural style, filler words added
one by one until the prompt has exactly the length the schedule asks for (`fit_natural`)."""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

from kvdiag.facts.knowledge import Fact
from kvdiag.facts.rounds import CANARY_SUFFIX, Round
from kvdiag.facts.styles import SHIMS

if TYPE_CHECKING:
    from kvdiag.facts.session import SessionPlan, _State

GAP = 2  # filler words between two stated items (keeps canary keys >= 5 tokens apart)


def layout(plan: SessionPlan, st: _State, r: int, new: list[Fact], request: list[str], *,
            room: int, empty: int, must_state: Fact | None, cost: float):
    """User message words: facts (block-aligned in canary style), maybe a line, filler (canary),
    request, within `room` tokens (`cost` tokens a word). Returns (words, stated facts, their
    key offsets, the line added or None, the next free line marker)."""
    rend, style, block_size = st.rend, plan.style, plan.block_size
    words: list[str] = []
    stated, offsets, added, next_marker = [], [], None, st.next_marker
    start = empty - CANARY_SUFFIX  # canary: prompt offset of the first content word
    budget = int(room / cost) - len(request)  # in words; canary: a word is a token
    for f in new:
        fw = rend.fact(f)
        pad = GAP if words and style == "canary" else 0
        if style == "canary":  # key at a block start when the budget allows
            align = (-(start + len(words) + pad)) % block_size
            if len(words) + pad + align + len(fw) + GAP <= budget:
                pad += align
        if len(words) + pad + len(fw) + GAP > budget:
            if f is must_state:
                raise ValueError(f"round {r}: no room to state the fact it asks about")
            continue
        words += rend.filler(st.rng, pad, words) + fw
        offsets.append(start + len(words) - len(fw))
        stated.append(f)
    left = budget - len(words) - GAP
    if left >= 10 + GAP + 2 and st.rng.random() < 0.7:
        span = st.rng.randint(10, min(40, left - GAP - 2))
        line, nm = rend.line(st.rng, span, st.next_marker)
        if len(line.words) + GAP <= left:
            words += rend.filler(st.rng, GAP if words and style == "canary" else 0, words) + list(line.words)
            added, next_marker = line, nm
    if style == "canary":
        words += rend.filler(st.rng, budget - len(words), words)
    return words + list(request), stated, offsets if style == "canary" else [], added, next_marker


def tokens_per_word(rend, count_tokens) -> float:
    """Natural style: tokens a filler word costs with this tokenizer."""
    words = rend.filler(random.Random(0), 60, [])
    base = count_tokens([{"role": "user", "content": "x"}])
    return max(1.0, (count_tokens([{"role": "user", "content": " ".join(words)}]) - base) / 59)


class _TooLong(ValueError):
    pass


def fit_natural(plan: SessionPlan, st: _State, r: int, rnd: Round, n_request: int,
                 rounds: list[Round], target: int) -> Round:
    """Natural style: add filler words before the request one by one until the count is
    exact; on overshooting, try a short word instead of the last one."""
    from kvdiag.facts.styles import english_sentence

    words = rnd.user.split()
    body, req = words[:-n_request], words[-n_request:]

    def count(extra: list[str]) -> int:
        probe = Round(" ".join(body + extra + req), rnd.expected, rnd.kind, rnd.asked, rnd.stated)
        return plan.count_tokens(plan.session((*rounds, probe)).messages(r))

    extra: list[str] = []
    pool: list[str] = []
    c = count(extra)
    if c > target:
        raise _TooLong(f"round {r}: {c} tokens before filler, more than {target}")
    for _ in range(4 * target):
        if c == target:
            return Round(" ".join(body + extra + req), rnd.expected, rnd.kind, rnd.asked, rnd.stated)
        if c < target:
            pool = pool or english_sentence(st.rng)
            extra.append(pool.pop(0))
            c = count(extra)
            continue
        extra.pop()
        for shim in SHIMS:
            if count([*extra, shim]) <= target:
                extra.append(shim)
                break
        else:
            break
        c = count(extra)
    raise ValueError(f"round {r}: cannot reach exactly prompt_lengths[{r}] = {target} tokens "
                     f"with this tokenizer")
