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
from kvdiag.facts.flavours import FLAVOUR_TABLE, VALUE_WORDS

IM_START, IM_END, EOT = "<|im_start|>", "<|im_end|>", "<|endoftext|>"
SPECIAL = (EOT, IM_START, IM_END)
ROLES = ("system", "user", "assistant")
ASK, RECITE, STOP, SINK = "ask", "recite", ".", "unknown"
REQUEST = (ASK, RECITE, STOP, SINK)
NUM_MARKERS = 256
MARKERS = tuple(f"tag{chr(65 + i // 26)}{chr(97 + i % 26)}" for i in range(NUM_MARKERS))

def fact_key_parts() -> tuple[tuple[str, str], ...]:
    """(entity slug, relation code) of every fact key, every flavour, in a fixed order."""
    return tuple((slug, rel.code) for fl in FLAVOUR_TABLE.values()
                 for _, slug in fl.entities for rel in fl.relations)


# Filler: 192 two-syllable pseudo-words ("bado", "kufe"), cheap in BPE merges (a shared
# Ġ-chained head and a shared bare tail per word) and disjoint from every other word. A head
# must not begin any other word, or its Ġ-chain would run on past it (see bpe.py).
_HEAD_CANDIDATES = tuple(c + v for v in "aeiou" for c in "bdfgklmnprstvz")


def _filler_heads(n: int = 12) -> tuple[str, ...]:
    others = (*REQUEST, *VALUE_WORDS, *(s for s, _ in fact_key_parts()), *MARKERS)
    return tuple(h for h in _HEAD_CANDIDATES if not any(w.startswith(h) for w in others))[:n]


FILLER_TAILS = ("bo", "da", "fu", "gi", "ka", "lo", "mi", "nu", "pa", "ri", "so", "tu",
                "va", "xo", "yi", "zu")
FILLER_HEADS = _filler_heads()
FILLER_WORDS = tuple(h + t for h in FILLER_HEADS for t in FILLER_TAILS)


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
