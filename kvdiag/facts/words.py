"""The canary style's words: requests, line markers and filler pseudo-words, chosen to be
disjoint from every fact key and value word. They belong to the facts' language; the canary
model's vocabulary (kvdiag.canary.vocab) makes each of them one token."""

from __future__ import annotations

from kvdiag.facts.flavours import FLAVOUR_TABLE, VALUE_WORDS

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
