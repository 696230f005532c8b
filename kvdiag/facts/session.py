"""Fact sessions: multi-round conversations whose every request has an exact token length.

Round r's request is: system (if any), every earlier round's user message and expected
answer (teacher-forced), then round r's user message. Its user message states new facts,
may carry a recitable line, is padded with filler to exactly prompt_lengths[r] tokens (as
count_tokens reports, generation prompt included) and ends with a question about a fact
stated so far or, every `recite_every` rounds, a request to recite an earlier line.

Canary style places each fact at the start of a 16-token block of the final prompt when the
round has room (so a corrupted block loses whole facts), and keeps keys 5+ tokens apart.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from kvdiag.facts.knowledge import Fact, KnowledgeBase
from kvdiag.facts.layout import GAP, _TooLong, fit_natural, layout, tokens_per_word
from kvdiag.facts.rounds import Round, Session
from kvdiag.facts.styles import STYLES, Line, renderer

# planner(round, shortest feasible prompt, tokens the answer will generate) -> prompt length
Planner = Callable[[int, int, int], int]


@dataclass(frozen=True)
class SessionPlan:
    """Everything one session is built from.

    One round per entry of prompt_lengths. Instead of fixed lengths, a `planner` may choose
    each round's length once the round's request is known: planner(r, shortest feasible
    length, answer tokens) (answer tokens as `answer_tokens(expected)` counts them, stop
    token included), for `num_rounds` rounds. `count_tokens(messages)` is the target
    model's prompt length for chat messages (template and generation prompt included)."""

    kb: KnowledgeBase
    style: str
    seed: int
    count_tokens: Callable[[list[dict]], int]
    prompt_lengths: Sequence[int] | None = None
    session_id: str = "s0"
    recite_every: int = 4
    system: str | None = None
    first_round_facts: int = 8
    block_size: int = 16
    planner: Planner | None = None
    num_rounds: int | None = None
    answer_tokens: Callable[[str], int] | None = None
    new_facts: Sequence[int] = (0, 0, 1, 2)  # new facts per round after the first, drawn
    ask_recent: float = 0.7  # chance a question picks a fact of the last two rounds
    ask_new: float = 0.3  # chance a question asks about a fact stated in its own round
    system_facts: tuple[Fact, ...] = ()  # facts the system prompt states (known from round 0)
    ask_system: tuple[Fact, ...] = ()  # of those, asked about first, one every ask_system_every
    ask_system_every: int = 2  # rounds (kvdiag.planning.plan: the facts where sessions' prompts part)

    def session(self, rounds) -> Session:
        kb = (KnowledgeBase(self.kb.flavour, self.kb.facts + self.system_facts)
              if self.system_facts else self.kb)
        return Session(self.session_id, self.style, kb, tuple(rounds), self.system)


@dataclass
class _State:
    rend: object  # the style's renderer
    rng: random.Random
    unstated: list[Fact]
    stated_round: dict[Fact, int] = field(default_factory=dict)
    asked: set[Fact] = field(default_factory=set)
    lines: list[tuple[int, Line]] = field(default_factory=list)
    recited: set[tuple[str, ...]] = field(default_factory=set)
    next_marker: int = 0
    tokens_per_word: float | None = None  # natural style, measured once


def build_session(plan: SessionPlan) -> Session:
    """The session `plan` describes; see the module docstring.

    Raises ValueError naming the round when a length is infeasible (shorter than the
    history + the shortest request, or not reachable exactly with this tokenizer)."""
    if plan.style not in STYLES:
        raise ValueError(f"style must be one of {', '.join(STYLES)}, got {plan.style!r}")
    lengths = plan.prompt_lengths
    if plan.planner is not None:
        if plan.num_rounds is None or plan.answer_tokens is None:
            raise ValueError("a planner needs num_rounds and answer_tokens")
        lengths = [None] * plan.num_rounds
    if not lengths:
        raise ValueError("prompt_lengths is empty: a session needs at least one round")
    st = _State(renderer(plan.style), random.Random(f"session:{plan.style}:{plan.session_id}:{plan.seed}"),
                list(plan.kb.facts), stated_round={f: -1 for f in plan.system_facts})
    st.rng.shuffle(st.unstated)
    rounds: list[Round] = []
    for r, target in enumerate(lengths):
        nxt = lengths[r + 1] if plan.planner is None and r + 1 < len(lengths) else None
        rounds.append(_build_round(plan, st, rounds, r, target, nxt))
    return plan.session(rounds)


def _build_round(plan: SessionPlan, st: _State, rounds: list[Round], r: int, target: int | None,
                 nxt: int | None) -> Round:
    """Round r after `rounds`, of exactly `target` tokens (or the planner's choice)."""
    style = plan.style
    partial = plan.session((*rounds, Round("", "", "question", (), ())))
    empty = plan.count_tokens(partial.messages(r))  # history + this round's empty user message
    if plan.planner:
        cap = getattr(plan.planner, "limit", lambda _r: None)(r)
        room_target = cap or empty + 1_000_000
    else:
        room_target = target
    request, expected, kind, asked, need = _choose_request(plan, st, r, nxt, partial, empty,
                                                           room_target)
    if request is None:
        raise ValueError(f"round {r}: prompt_lengths[{r}] = {target} leaves no room for a "
                         f"request after a history of {empty} tokens")
    if plan.planner is not None:
        cost = 1 if style == "canary" else 3
        target = plan.planner(r, empty + need * cost + GAP, plan.answer_tokens(expected))
    n_new = plan.first_round_facts if r == 0 else st.rng.choice(tuple(plan.new_facts))
    new = st.unstated[:n_new]
    if kind == "question" and asked[0] not in st.stated_round:
        new = [asked[0], *(f for f in new if f != asked[0])]
    must = asked[0] if kind == "question" else None
    for attempt in range(6):  # natural: fewer items per attempt until they fit
        if style == "natural" and st.tokens_per_word is None:
            st.tokens_per_word = tokens_per_word(st.rend, plan.count_tokens)
        cost = 1.0 if style == "canary" else st.tokens_per_word * 1.5 ** attempt
        words, stated, offsets, line, next_marker = layout(
            plan, st, r, new, request, room=target - empty, empty=empty, must_state=must, cost=cost)
        rnd = Round(" ".join(words), expected, kind, asked, tuple(stated), tuple(offsets))
        if style == "canary":
            break
        try:
            rnd = fit_natural(plan, st, r, rnd, len(request), rounds, target)
            break
        except _TooLong:
            if attempt == 5:
                raise ValueError(f"round {r}: its request alone takes more than "
                                 f"prompt_lengths[{r}] = {target} tokens") from None
    if line is not None:
        st.lines.append((r, line))
        st.next_marker = next_marker
    got = plan.count_tokens(plan.session((*rounds, rnd)).messages(r))
    if got != target:
        raise ValueError(f"round {r}: reached {got} tokens, not prompt_lengths[{r}] = {target} "
                         f"(is count_tokens the {style} model's tokenizer and chat template?)")
    for f in stated:
        st.stated_round[f] = r
        st.unstated.remove(f)
    return rnd


def _choose_request(plan: SessionPlan, st: _State, r: int, nxt: int | None, partial: Session,
                    empty: int, target: int):
    """(request words, expected, kind, asked, words it needs) or (None, ...) if nothing fits."""
    rend, block_size = st.rend, plan.block_size
    room = target - empty
    cands: list[tuple[list[str], str, str, tuple[Fact, ...]]] = []
    if plan.recite_every and r > 0 and (r + 1) % plan.recite_every == 0:
        lines = [(rr, ln) for rr, ln in st.lines if ln.span not in st.recited]
        lines.sort(key=lambda x: -x[0] + st.rng.random() * 2)  # recent first, a little shuffled
        cands += [(list(ln.request), " ".join(ln.span), "recite", ()) for _, ln in lines]
    if plan.ask_system and r > 0 and r % plan.ask_system_every == 0 and not cands:
        first = next((f for f in plan.ask_system if f not in st.asked), None)
        if first is not None:
            words, expected = rend.question(first)
            cands.append((words, expected, "question", (first,)))
    stated = [f for f in st.stated_round if f not in st.asked]
    recent = [f for f in stated if st.stated_round[f] >= r - 2]
    pool = recent if recent and st.rng.random() < plan.ask_recent else stated
    order = st.rng.sample(pool, len(pool)) + [f for f in stated if f not in pool]
    if r == 0 or st.rng.random() < plan.ask_new or not order:  # sometimes ask about a fact stated now
        order = [f for f in st.unstated[:1]] + order
    order += [f for f in st.stated_round if f in st.asked]  # repeats as a last resort
    for f in order:
        words, expected = rend.question(f)
        cands.append((words, expected, "question", (f,)))
    def need(c) -> int:  # words of the request, plus the fact if it must be stated now
        unstated = c[2] == "question" and c[3][0] not in st.stated_round
        return len(c[0]) + (len(rend.fact(c[3][0])) + GAP + block_size if unstated else 0)

    fitting = [c for c in cands if need(c) * (1 if rend.style == "canary" else 3) <= room]
    if nxt is not None:  # prefer a request whose answer leaves room for the next round
        fits = (c for c in fitting if _next_fits(plan, partial, r, c[0], c[1], target, nxt))
        fitting = [next(fits, fitting[0] if fitting else None)]
    for c in [c for c in fitting[:1] if c is not None]:
        words, expected, kind, asked = c
        if kind == "recite":
            st.recited.add(tuple(expected.split()))
        else:
            st.asked.add(asked[0])
        return words, expected, kind, asked, need(c)
    return None, "", "question", (), 0


def _next_fits(plan: SessionPlan, partial: Session, r: int, words, expected: str, target: int,
               nxt: int) -> bool:
    """Would round r+1 still fit a two-word request after this round and its answer?"""
    this = Round(" ".join(words), expected, "question", (), ())
    now = plan.count_tokens(plan.session((*partial.rounds[:r], this)).messages(r))
    probe = plan.session((*partial.rounds[:r], this, Round("x x", "", "question", (), ())))
    return plan.count_tokens(probe.messages(r + 1)) + (target - now) <= nxt
