"""How a session reads in each style: the canary's token language, or English sentences.

A renderer turns facts, recitable lines, requests and filler into lists of words; the
session builder joins them with single spaces. In canary style one word is one token.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from kvdiag.facts.knowledge import Fact
from kvdiag.vocab import STYLES


@dataclass(frozen=True)
class Line:
    """A recitable span: the words of its statement and the span a recitation returns."""

    words: tuple[str, ...]  # as stated in the user message
    span: tuple[str, ...]  # the expected recitation
    request: tuple[str, ...]  # the user message words that ask for it


class CanaryRenderer:
    """Facts "acmeREV usd four point two billion ."; questions "ask acmeREV"; lines
    "tagAa w w w w tagAb w w w ... ." recited by "recite tagAa" (everything after the
    first marker, up to the "."). Filler is the canary's pseudo-words."""

    style = "canary"
    first_record_max = 6  # words before the 2nd marker (the template adds 3 tokens of gap)
    record_max = 9
    record_min = 3

    def __init__(self) -> None:
        from kvdiag.facts.words import ASK, FILLER_WORDS, MARKERS, RECITE, STOP

        self.ask, self.recite, self.stop = ASK, RECITE, STOP
        self.filler_words, self.markers = FILLER_WORDS, MARKERS

    def fact(self, fact: Fact) -> list[str]:
        return [fact.key_token, *fact.value_tokens, self.stop]

    def question(self, fact: Fact) -> tuple[list[str], str]:
        return [self.ask, fact.key_token], " ".join(fact.value_tokens)

    def line(self, rng: random.Random, span_len: int, next_marker: int) -> tuple[Line, int]:
        """A line whose recitation has span_len tokens; returns it and the next free marker."""
        sizes = self._record_sizes(span_len)
        if next_marker + len(sizes) > len(self.markers):
            raise ValueError("the session ran out of canary line markers (256)")
        words = rng.sample(self.filler_words, span_len - (len(sizes) - 1))
        out, span, it = [], [], iter(words)
        for i, n in enumerate(sizes):
            marker = self.markers[next_marker + i]
            record = [next(it) for _ in range(n)]
            out += [marker, *record]
            span += ([marker] if i else []) + record
        first_marker = self.markers[next_marker]
        return Line(tuple(out + [self.stop]), tuple(span), (self.recite, first_marker)), next_marker + len(sizes)

    def _record_sizes(self, span_len: int) -> list[int]:
        """Words per record: the first <= 6, later ones 3..9 (each after its marker)."""
        first, rem = min(self.first_record_max, span_len), span_len - min(self.first_record_max, span_len)
        while 0 < rem < self.record_min + 1 and first > self.record_min:
            first, rem = first - 1, rem + 1
        sizes = [first]
        while rem > 0:
            n = min(self.record_max, rem - 1)
            after = rem - 1 - n
            if 0 < after < self.record_min + 1:
                n -= self.record_min + 1 - after
            sizes.append(n)
            rem -= n + 1
        if min(sizes) < self.record_min or rem:
            raise ValueError(f"a recitable line of {span_len} tokens cannot be split into records")
        return sizes

    def filler(self, rng: random.Random, n: int, recent: list[str]) -> list[str]:
        """n pseudo-words, none repeating one of the 12 before it (the canary copies the
        token after a (current key, token) match, so repeats near a key are ambiguous)."""
        out = []
        for _ in range(n):
            while True:
                w = rng.choice(self.filler_words)
                if w not in (recent + out)[-12:]:
                    break
            out.append(w)
        return out


_NOUNS = ("report", "team", "market", "quarter", "office", "project", "meeting", "budget", "plan",
          "review", "client", "system", "region", "policy", "schedule", "supplier", "update",
          "process", "audit", "committee", "forecast", "survey", "network", "warehouse")
_ADJS = ("annual", "steady", "regional", "new", "detailed", "early", "internal", "careful",
         "brief", "broad", "final", "quiet", "formal", "recent", "shared", "modest")
_VERBS = ("noted", "described", "reviewed", "mentioned", "outlined", "discussed", "confirmed",
          "summarised", "examined", "tracked", "compared", "recorded")
_PREPS = ("during", "after", "before", "across", "within", "despite", "beyond", "through")
SHIMS = ("the", "and", "of", "to", "in", "a", "on", "for", "it", "is", "as", "at", "by", "or")


def english_sentence(rng: random.Random, n_words: int | None = None) -> list[str]:
    """A plausible filler sentence; with n_words, exactly that many words (>= 4)."""
    words = ["The", rng.choice(_ADJS), rng.choice(_NOUNS), rng.choice(_VERBS), "the",
             rng.choice(_ADJS), rng.choice(_NOUNS), rng.choice(_PREPS), "the", rng.choice(_NOUNS)]
    if n_words is not None:
        while len(words) < n_words:
            words += ["and", "the", rng.choice(_ADJS), rng.choice(_NOUNS)]
        words = words[:n_words]
    return words[:-1] + [words[-1] + "."]


class NaturalRenderer:
    """English sentences for real chat models; the knowledge base stays beside them."""

    style = "natural"

    def fact(self, fact: Fact) -> list[str]:
        return self._fact_sentence(fact).split()

    def _fact_sentence(self, f: Fact) -> str:
        if f.relation in _LEGAL:
            return f"Under its contract, {f.entity} has a {f.relation} of {f.value}."
        if f.entity.startswith("patient"):
            return f"The {f.relation} of {f.entity} was recorded as {f.value}."
        return f"{f.entity} reported {f.relation} of {f.value}."

    def question(self, f: Fact) -> tuple[list[str], str]:
        if f.relation in _LEGAL:
            q = f"What is the {f.relation} in the contract with {f.entity}?"
            a = f"The {f.relation} in the contract with {f.entity} is {f.value}."
        elif f.entity.startswith("patient"):
            q = f"What was the {f.relation} recorded for {f.entity}?"
            a = f"The {f.relation} recorded for {f.entity} was {f.value}."
        else:
            q = f"What was {f.entity}'s {f.relation}?"
            a = f"{f.entity}'s {f.relation} was {f.value}."
        return q.split(), a

    def line(self, rng: random.Random, span_len: int, next_marker: int) -> tuple[Line, int]:
        words = english_sentence(rng, span_len)
        words[0] = rng.choice(("Notably,", "Meanwhile,", "Overall,", "Separately,", "Later,")) + " " + words[0].lower()
        words = " ".join(words).split()[:span_len]
        words[-1] = words[-1].rstrip(".") + "."
        head = " ".join(words[:4])
        request = f'Please repeat, word for word, the sentence that begins "{head}".'.split()
        return Line(tuple(words), tuple(words), tuple(request)), next_marker + 1

    def filler(self, rng: random.Random, n: int, recent: list[str]) -> list[str]:
        out: list[str] = []
        while len(out) < n:
            out += english_sentence(rng)
        return out[:n]


_LEGAL = {"termination notice", "payment terms", "liability cap", "governing law", "renewal term",
          "confidentiality period", "late payment interest", "non-compete period"}


def renderer(style: str) -> CanaryRenderer | NaturalRenderer:
    if style == "canary":
        return CanaryRenderer()
    if style == "natural":
        return NaturalRenderer()
    raise ValueError(f"style must be one of {', '.join(STYLES)}, got {style!r}")
