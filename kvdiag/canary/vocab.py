"""The canary's vocabulary: a byte-level BPE (kvdiag.canary.bpe) where each canary word is
one token. Canary text is letters-only words each preceded by one space; the chat
template's role words follow no space.

Token classes:
  special   <|endoftext|> <|im_start|> <|im_end|>      (added tokens)
  role      system user assistant                       (bare: "assistant")
  request   ask recite . unknown                         (question, recitation, end, sink)
  filler    192 pseudo-words "bado"                       (filler text, recitable lines)
  value     spelled numbers and unit words               (kvdiag.facts.flavours.VALUE_WORDS)
  key       384 fact keys "acmeREV" and 256 line markers "tagAa".."tagJv"
  junk      the 256 bytes and the merge intermediates    (never in canary text)
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from kvdiag.canary import bpe
from kvdiag.facts.flavours import VALUE_WORDS
from kvdiag.facts.words import (  # the canary style's words are the facts' language
    FILLER_HEADS,
    FILLER_TAILS,
    FILLER_WORDS,
    MARKERS,
    REQUEST,
    fact_key_parts,
)

IM_START, IM_END, EOT = "<|im_start|>", "<|im_end|>", "<|endoftext|>"
SPECIAL = (EOT, IM_START, IM_END)
ROLES = ("system", "user", "assistant")


def _parts(word: str) -> tuple[str, ...]:
    """How bpe builds a spaced word: compound numbers join a tens head and a ones part,
    filler pseudo-words a head and a tail."""
    if len(word) == 4 and word[:2] in FILLER_HEADS and word[2:] in FILLER_TAILS:
        return (word[:2], word[2:])
    for tens in ("twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"):
        if word.startswith(tens) and word != tens:
            return (tens, word[len(tens):])
    return (word,)


@dataclass(frozen=True)
class Vocab:
    """BPE token strings by id, merges, and the classes the circuit needs."""

    tokens: tuple[str, ...]
    merges: tuple[tuple[str, str], ...]
    keys: tuple[str, ...]  # token strings ("Ġ" + word)
    content: tuple[str, ...]  # token strings with a content code (not keys, not <|im_start|>)

    @cached_property
    def ids(self) -> dict[str, int]:
        return {t: i for i, t in enumerate(self.tokens)}

    def __len__(self) -> int:
        return len(self.tokens)


def token(word: str) -> str:
    """BPE token string of a canary word as it appears in text (after a space)."""
    return bpe.SPACE + word


def canary_words() -> tuple[str, ...]:
    keys = tuple(a + b for a, b in fact_key_parts()) + MARKERS
    return (*REQUEST, *FILLER_WORDS, *VALUE_WORDS, *keys)


def canary_vocab() -> Vocab:
    words = canary_words()
    if len(set(words)) != len(words):
        dup = sorted({w for w in words if words.count(w) > 1})
        raise RuntimeError(f"canary vocabulary has duplicate words: {dup}")
    spaced = [_parts(w) for w in (*REQUEST, *FILLER_WORDS, *VALUE_WORDS)]
    spaced += [*fact_key_parts(), *((m,) for m in MARKERS)]
    tokens, merges = bpe.build(spaced, ROLES)
    tokens += [t for t in SPECIAL if t not in tokens]
    keys = tuple(token(a + b) for a, b in fact_key_parts()) + tuple(token(m) for m in MARKERS)
    content = (*ROLES, EOT, IM_END, *(token(w) for w in (*REQUEST, *FILLER_WORDS, *VALUE_WORDS)))
    return Vocab(tuple(tokens), tuple(merges), keys, content)
