"""From a suite case to concrete sessions: knowledge bases, fact sessions whose every
request has the length the case's schedule asks for, and their prompt token ids.

Histories are teacher-forced with the expected answers (a client replaying a transcript),
so every target and allocator sees exactly the same prompts, and the trigger's lengths
(4095 -> 4112, ...) hold exactly under the model's own tokenizer and chat template.

Two options make the traffic reach fault classes the trigger alone does not (the probe and
the model-free audit use both; reproduce's cases keep their prompts as they are):

    spread    the shared system prompt states shared facts, and each session's copy is cut
              just before one fact's key, so that sessions diverge from one another at every
              slot offset of a block, the last slot first, not only at block starts; and
              each session asks about the facts where shorter copies part from it. A block
              hash that leaves part of the block out then makes two blocks collide, and the
              longer copy reads the shorter one's end marker where its fact's key was:

                  block:       | 0 1 2 ... 29 30 31 |
                  session 0:   | f f f ...  f  f  E | ...          cut at offset 31
                  session 15:  | f f f ...  f  f  K | v v . f ...  the whole prompt; asked K

    adapter   rounds alternate between the base model and a LoRA adapter (model_for):
              every round reads a history the other model computed, which a block hash
              without the adapter serves from the cache
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass

from kvdiag.errors import SuiteError
from kvdiag.facts import Session, SessionPlan, build_session, make_knowledge_base
from kvdiag.facts.styles import renderer
from kvdiag.planning.scenarios import LengthPlanner, Schedule, finish_schedule
from kvdiag.planning.suites import Case, Suite


@dataclass
class CasePlan:
    suite: Suite
    case: Case
    sessions: list[Session]
    prompts: list[list[list[int]]]  # [session][round] -> prompt token ids
    schedule: Schedule
    adapter: str | None = None  # a LoRA adapter that alternate rounds are sent under
    user: dict | None = None  # a sessions file's plan: what was read, kept, skipped (kvdiag.userdata)

    def model_for(self, session: int, rnd: int) -> str | None:
        """The adapter round `rnd` (0-based) of session `session` names, or None (the base
        model): rounds alternate, and neighbouring sessions start on different models."""
        return self.adapter if self.adapter and (session + rnd) % 2 else None

    @staticmethod
    def has_twin(session: int) -> bool:
        """Whether session `session`'s shared requests each go out with a one-token twin
        (kvdiag.runners.live.phases; the audit's trace alike): every other session. The rest
        keep the trigger's own traffic, since twins make the reference engine's stale-hash
        fault fire less often (measured over HTTP in docs/faults.md, "Two lessons")."""
        return session % 2 == 1

    @property
    def style(self) -> str:
        return self.case.style or self.suite.style

    @property
    def seed(self) -> int:
        return self.case.seed if self.case.seed is not None else self.suite.seed


def system_prompt(style: str, tokenizer, tokens: int, seed: int) -> str | None:
    """A shared system prompt of about `tokens` tokens (every session starts with it)."""
    if tokens <= 0:
        return None
    rend, rng = renderer(style), random.Random(f"system:{seed}")
    words = rend.filler(rng, tokens, [])
    while len(tokenizer.encode_chat([{"role": "system", "content": " ".join(words)}])) > tokens:
        words.pop()
    return " ".join(words)


@dataclass(frozen=True)
class Spread:
    """The shared system prompt as facts, and each session's cut of it (kvdiag.planning.plan's module
    docstring): `systems[s]` its text, `facts[s]` the facts it states, `ask[s]` the facts
    where shorter cuts part from it (asked first: a block shared up to a cut whose hash
    leaves the cut's slot out serves the shorter session's end marker there)."""

    systems: list[str]
    facts: list[tuple]
    ask: list[tuple]


def spread_system(style: str, tokenizer, tokens: int, seed: int, flavour: str, sessions: int,
                  block_size: int) -> Spread | None:
    """A system prompt of about `tokens` tokens of shared facts (filler between them), cut
    for each session just before a fact's key, at block offsets block_size - 1, - 2, ...
    first, then spread over the block; the longest cut is the whole text, the shorter cuts
    go to the earlier sessions (sent first, so they write the blocks where prompts part)."""
    from kvdiag.facts.knowledge import FLAVOURS, make_knowledge_base

    if tokens <= 0 or sessions < 2:
        return None
    rend, rng = renderer(style), random.Random(f"system-facts:{seed}")
    kb = make_knowledge_base(flavour if flavour in FLAVOURS else FLAVOURS[0], 40, -1 - seed)
    words, keys = [], []  # keys: (word index of a fact's key, fact)

    def count(ws: list[str]) -> int:
        return len(tokenizer.encode_chat([{"role": "system", "content": " ".join(ws)}]))

    start = _content_start(tokenizer, rend.filler(random.Random(0), 2, []))  # canary: a word is
    # a token, so keys land exactly
    for n, fact in enumerate(kb.facts):
        gap = rng.randint(2, 5)
        if style == "canary":  # key n >= 1 (a cut before it) at offset block_size - n of its block
            gap = (block_size - n % block_size - start - len(words)) % block_size
            gap += block_size if gap < 2 else 0
        more = rend.filler(rng, gap, words) + rend.fact(fact)
        if count(words + more) > tokens:
            break
        keys.append((len(words) + len(more) - len(rend.fact(fact)), fact))
        words += more
    if len(keys) < 2:
        return None
    whole = tokenizer.encode_chat([{"role": "system", "content": " ".join(words)}])
    at: dict[int, list] = {}  # block offset -> cuts (word index, fact) diverging there
    for i, fact in keys[1:]:
        ids = tokenizer.encode_chat([{"role": "system", "content": " ".join(words[:i])}])
        d = next((j for j, (a, b) in enumerate(zip(ids, whole)) if a != b), len(ids))
        at.setdefault(d % block_size, []).append((i, fact))
    order = [block_size - 1 - n for n in range(block_size)]
    chosen = [max(at[o]) for o in order if o in at][:sessions - 1]  # the latest key per offset
    priority = {cut: n for n, cut in enumerate(chosen)}
    chosen.sort()
    cuts = chosen + [(len(words), None)] * (sessions - len(chosen))
    spread = Spread([], [], [])
    for n, (end, _) in enumerate(cuts):
        spread.systems.append(" ".join(words[:end]))
        spread.facts.append(tuple(f for i, f in keys if i < end))
        shorter = sorted(chosen[:n] if n < len(chosen) else chosen, key=priority.get)
        spread.ask.append(tuple(f for _, f in shorter))
    return spread


def _content_start(tokenizer, two_words: list[str]) -> int:
    """The index of the first token of a system message's content (where two one-word
    contents part)."""
    a, b = (tokenizer.encode_chat([{"role": "system", "content": w}]) for w in two_words)
    return next((i for i, (p, q) in enumerate(zip(a, b)) if p != q), 0)


def plan_case(suite: Suite, case: Case, tokenizer, block_size: int | None = None, *,
              spread: bool = False, adapter: str | None = None) -> CasePlan:
    """`block_size`: the server's, where it differs from the suite's (the jump then lands on
    that block size's boundary: 4095 -> 4128 at 32); the plan's suite carries it. `spread`
    and `adapter`: see the module docstring."""
    if suite.sessions:  # the user's own conversations instead of generated ones
        from kvdiag.planning.sessions import plan_sessions_file

        u = plan_sessions_file(suite, case, PieceEncoder.wrap(tokenizer), block_size)
        return CasePlan(u.suite, u.case, u.sessions, u.prompts, u.schedule, adapter, user=u.user)
    if block_size and block_size != suite.block_size:
        suite = dataclasses.replace(suite, block_size=block_size)
    tokenizer = PieceEncoder.wrap(tokenizer)
    seed = case.seed if case.seed is not None else suite.seed
    style = case.style or suite.style
    shared = spread_system(style, tokenizer, case.shared_prefix, seed, suite.flavours[0],
                           case.sessions, suite.block_size) if spread else None
    system = None if shared else system_prompt(style, tokenizer, case.shared_prefix, seed)

    def count_tokens(messages: list[dict]) -> int:
        return len(tokenizer.encode_chat(messages))

    def answer_tokens(expected: str) -> int:  # generated tokens, stop token included
        return len(tokenizer.encode(" " + expected, add_special_tokens=False)) + 1

    sessions, prompts = [], []
    for s in range(case.sessions):
        flavour = suite.flavours[s % len(suite.flavours)]
        kb = make_knowledge_base(flavour, suite.facts_per_session, seed * 1000 + s)
        if shared:  # a key the system prompt states names its fact, not one of the session's
            taken = {f.key_token for f in shared.facts[-1]} | {(f.entity, f.relation) for f in shared.facts[-1]}
            kb = dataclasses.replace(kb, facts=tuple(f for f in kb.facts if f.key_token not in taken
                                                     and (f.entity, f.relation) not in taken))
        planner = LengthPlanner(case.condition, s, seed=seed, block_size=suite.block_size,
                                boundary=case.boundary, start_range=case.start_range,
                                min_turn=case.min_turn)
        try:
            session = build_session(SessionPlan(
                kb, style=style, seed=seed, planner=planner, num_rounds=case.rounds,
                answer_tokens=answer_tokens, count_tokens=count_tokens, session_id=f"s{s:02d}",
                recite_every=case.recite_every, block_size=suite.block_size,
                system=shared.systems[s] if shared else system,
                system_facts=shared.facts[s] if shared else (), ask_system=shared.ask[s] if shared else (),
                new_facts=case.new_facts, ask_recent=case.ask_recent, ask_new=case.ask_new))
        except ValueError as e:
            raise SuiteError(f"{suite.path}: case {case.name}: session {s}: {e}") from None
        sessions.append(session)
        prompts.append([tokenizer.encode_chat(session.messages(r)) for r in range(case.rounds)])
    if isinstance(tokenizer, PieceEncoder):
        tokenizer.check([ses.messages(case.rounds - 1) for ses in sessions], prompts)
    first = [p[0] for p in prompts]
    shared = 0
    while all(len(p) > shared and p[shared] == first[0][shared] for p in first):
        shared += 1
    answers = [[answer_tokens(r.expected) for r in ses.rounds] for ses in sessions]
    schedule = finish_schedule(case.condition, [[len(p) for p in ps] for ps in prompts], answers,
                               block_size=suite.block_size, shared_prefix=shared,
                               pressure_round=case.pressure_round, max_think=case.max_think, seed=seed)
    return CasePlan(suite, case, sessions, prompts, schedule, adapter)


class PieceEncoder:
    """A local tokenizer's encode_chat, message by message. A chat renders as one piece per
    message, each ending in the end-of-turn special token (`<|im_end|>`). Tokenizers split
    special tokens out before anything else, so the ids of the whole equal the ids of its
    pieces, and each piece is encoded once: planning re-counts whole histories hundreds of
    times, each longer than the last, and most of a case's planning time was spent there.

    check() encodes each session's last prompt whole and compares: a tokenizer for which the
    pieces do not add up (one that treats the start of the text differently) raises there,
    so a plan is never built from wrong counts."""

    def __init__(self, tokenizer, marker: str) -> None:
        self.tokenizer, self.marker, self.pieces = tokenizer, marker, {}

    @classmethod
    def wrap(cls, tokenizer):
        """`tokenizer` itself where it cannot be split (a server's /tokenize, no end token)."""
        marker = getattr(tokenizer, "eos_token", None)
        if not marker or not hasattr(tokenizer, "render_chat"):
            return tokenizer
        return cls(tokenizer, marker)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=add_special_tokens)

    def encode_chat(self, messages: list[dict], add_generation_prompt: bool = True) -> list[int]:
        ids, parts = [], self.tokenizer.render_chat(messages, add_generation_prompt).split(self.marker)
        for i, part in enumerate(parts):
            piece = part + self.marker if i < len(parts) - 1 else part
            if piece not in self.pieces:
                self.pieces[piece] = self.tokenizer.encode(piece, add_special_tokens=False)
            ids += self.pieces[piece]
        return ids

    def check(self, last_messages: list[list[dict]], prompts: list[list[list[int]]]) -> None:
        for messages, ps in zip(last_messages, prompts):
            whole = self.tokenizer.encode_chat(messages)
            if whole != ps[-1]:
                raise ValueError("this tokenizer's chat encodings do not add up message by message; "
                                 "planning cannot count by pieces (please report it)")
