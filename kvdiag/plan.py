"""From a suite case to concrete sessions: knowledge bases, fact sessions whose every
request has the length the case's schedule asks for, and their prompt token ids.

Histories are teacher-forced with the expected answers (a client replaying a transcript),
so every target and allocator sees exactly the same prompts, and the trigger's lengths
(4095 -> 4112, ...) hold exactly under the model's own tokenizer and chat template.

Two options make the traffic reach fault classes the trigger alone does not (the probe and
the model-free audit use both; reproduce's cases keep their prompts as they are):

    spread    each session's copy of the shared system prompt is cut a few words short, so
              that sessions diverge from one another at every slot offset of a block, the
              last slot first, not only at block starts: a block hash that leaves part of
              the block out then makes two different blocks collide

                  block:      | 0 1 2 ... 29 30 31 |
                  session 0:  | w w w ...  w  w  w | w w ...   (the whole prompt)
                  session 1:  | w w w ...  w  w  E | ...       diverges at offset 31
                  session 2:  | w w w ...  w  E  . | ...       diverges at offset 30 ...

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
from kvdiag.scenarios import LengthPlanner, Schedule, finish_schedule
from kvdiag.suites import Case, Suite


@dataclass
class CasePlan:
    suite: Suite
    case: Case
    sessions: list[Session]
    prompts: list[list[list[int]]]  # [session][round] -> prompt token ids
    schedule: Schedule
    adapter: str | None = None  # a LoRA adapter that alternate rounds are sent under

    def model_for(self, session: int, rnd: int) -> str | None:
        """The adapter round `rnd` (0-based) of session `session` names, or None (the base
        model): rounds alternate, and neighbouring sessions start on different models."""
        return self.adapter if self.adapter and (session + rnd) % 2 else None

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


def spread_systems(system: str | None, sessions: int, tokenizer, block_size: int) -> list[str | None]:
    """Each session's cut of the shared system prompt (see the module docstring): session 0
    keeps it whole; session s >= 1 ends it where it diverges from the whole one at offset
    block_size - 1 - (s - 1) * block_size // (sessions - 1) of a block (the nearest offset
    a cut at a word reaches, for tokenizers whose words span several tokens)."""
    if not system or sessions < 2:
        return [system] * sessions
    words = system.split(" ")
    whole = tokenizer.encode_chat([{"role": "system", "content": system}])
    at = {}  # offset within a block -> the longest cut (in words) that diverges there
    for m in range(len(words) - 1, max(0, len(words) - 3 * block_size) - 1, -1):
        ids = tokenizer.encode_chat([{"role": "system", "content": " ".join(words[:m])}])
        i = next((j for j, (a, b) in enumerate(zip(ids, whole)) if a != b), min(len(ids), len(whole)))
        at.setdefault(i % block_size, m)
    cuts = [len(words)]
    for s in range(1, sessions):
        want = block_size - 1 - (s - 1) * block_size // (sessions - 1)
        near = min(at, key=lambda o: ((o - want) % block_size, -o)) if at else None
        cuts.append(at.get(want, at.get(near, len(words))))
    return [" ".join(words[:m]) for m in cuts]


def plan_case(suite: Suite, case: Case, tokenizer, block_size: int | None = None, *,
              spread: bool = False, adapter: str | None = None) -> CasePlan:
    """`block_size`: the server's, where it differs from the suite's (the jump then lands on
    that block size's boundary: 4095 -> 4128 at 32); the plan's suite carries it. `spread`
    and `adapter`: see the module docstring."""
    if block_size and block_size != suite.block_size:
        suite = dataclasses.replace(suite, block_size=block_size)
    tokenizer = PieceEncoder.wrap(tokenizer)
    seed = case.seed if case.seed is not None else suite.seed
    style = case.style or suite.style
    system = system_prompt(style, tokenizer, case.shared_prefix, seed)
    systems = (spread_systems(system, case.sessions, tokenizer, suite.block_size) if spread
               else [system] * case.sessions)

    def count_tokens(messages: list[dict]) -> int:
        return len(tokenizer.encode_chat(messages))

    def answer_tokens(expected: str) -> int:  # generated tokens, stop token included
        return len(tokenizer.encode(" " + expected, add_special_tokens=False)) + 1

    sessions, prompts = [], []
    for s in range(case.sessions):
        flavour = suite.flavours[s % len(suite.flavours)]
        kb = make_knowledge_base(flavour, suite.facts_per_session, seed * 1000 + s)
        planner = LengthPlanner(case.condition, s, seed=seed, block_size=suite.block_size,
                                boundary=case.boundary, start_range=case.start_range,
                                min_turn=case.min_turn)
        try:
            session = build_session(SessionPlan(
                kb, style=style, seed=seed, planner=planner, num_rounds=case.rounds,
                answer_tokens=answer_tokens, count_tokens=count_tokens, session_id=f"s{s:02d}",
                recite_every=case.recite_every, system=systems[s], block_size=suite.block_size,
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
