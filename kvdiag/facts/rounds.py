"""A session as data: its rounds (each round's user message, expected answer, what it asks
and states) and the chat messages of any round's request."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kvdiag.facts.knowledge import Fact, KnowledgeBase

CANARY_SUFFIX = 3  # canary template tokens after the user content: <|im_end|><|im_start|>assistant


@dataclass(frozen=True)
class Round:
    user: str
    expected: str
    kind: str  # "question" or "recite"
    asked: tuple[Fact, ...]
    stated: tuple[Fact, ...]
    stated_offsets: tuple[int, ...] = ()  # canary: token offset of each stated fact's key in the prompt


@dataclass(frozen=True)
class Session:
    session_id: str
    style: str
    kb: KnowledgeBase
    rounds: tuple[Round, ...]
    system: str | None = None

    def messages(self, round_index: int, answers: Sequence[str] | None = None) -> list[dict]:
        """Chat messages of round `round_index`'s request (0-based): system (if any), then for
        each earlier round its user message and its assistant answer (answers[i] if given,
        else rounds[i].expected), then this round's user message."""
        if not 0 <= round_index < len(self.rounds):
            raise IndexError(f"round {round_index} of a {len(self.rounds)}-round session")
        msgs = [{"role": "system", "content": self.system}] if self.system else []
        for i, rnd in enumerate(self.rounds[:round_index]):
            answer = answers[i] if answers is not None and i < len(answers) else rnd.expected
            msgs += [{"role": "user", "content": rnd.user}, {"role": "assistant", "content": answer}]
        msgs.append({"role": "user", "content": self.rounds[round_index].user})
        return msgs
