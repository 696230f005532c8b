"""Fact-check answers against the session's knowledge base (KB) with spaCy.

Pipeline: `spacy.blank("en")` + sentencizer + an EntityRuler whose phrase patterns
(matched on lower case) come from the KB: KB_ENTITY (entity names), KB_RELATION (relation
names, "_" read as a space) and KB_VALUE (values), plus any extra surface forms given in
`aliases`. Tokens the ruler leaves alone are read as VALUE (an optional currency sign, a
token starting with a digit, an optional unit word) or NAME (a run of title-case tokens
that are not stop words or months), so that a fact stated about an entity the KB does not
know ("Globex reported ...") is attributed to that entity, not to the one asked about.
With `spacy_model` (a package name or a directory) the model is loaded instead, the ruler
goes before its NER, and NER labels fill the same roles (MONEY, PERCENT, QUANTITY,
CARDINAL → VALUE; ORG, PERSON, GPE, NORP, FAC, LOC, PRODUCT → NAME); when it cannot be
loaded the blank pipeline is used and `FactChecker.note` says so.

The KB is a `kvdiag.facts.KnowledgeBase` (anything with `.facts`) or any iterable of facts;
a fact needs `entity`, `relation` and `value` strings. In canary style the KB's strings must
be the ones the canary emits (its token text), as the fact session renders them.

Rules, in order:
1. Empty — nothing but whitespace and end-of-turn markers — fails ("empty answer").
2. Hedged — any phrase of HEDGES as whole words, case-insensitive — fails ("hedged").
3. Triples (entity, relation, value). Defaults come from the asked facts: the default
   entity is theirs if they all share one; an entity's default relation is that of the
   only asked fact about it.
   natural: per sentence, a value takes the nearest relation mention between it and the
   previous value ("revenue of $4.2 bn and net income of ...") or, if that reading pairs
   more values, between it and the next value ("$4.2 bn in revenue and ..."); a sentence
   without relation mentions gives its first KB value (else its first value) the default
   relation; other values stay unattached. Years (1900-2100, no unit) are dates, not
   values. A triple's entity is the nearest KB entity in its sentence, else the nearest
   NAME there, else the previous triple's, else the default entity.
   canary: answers are canary tokens, usually the value alone ("4.2 bn"). Values are read in
   order; the i-th takes the entity and relation mentioned since the previous value, else
   those of the i-th asked fact. A value beyond the asked facts, or any token that is not
   punctuation nor part of a KB mention, fails the answer ("unrecognised tokens").
4. Pass iff every asked fact has a triple with its (entity, relation) and its value, and
   no triple gives an asked (entity, relation) another value. Values compare after
   `canonical_value` (case, spacing, "billion" = "bn", "4.20" = "4.2"; a currency sign on
   one side only is ignored).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, NamedTuple, Protocol

from kvdiag.metrics.base import Metric, nan_mean, register
from kvdiag.metrics.triples import (
    Triple,
    canary_triples,
    canonical_value,  # noqa: F401  (re-exported: part of the rules)
    mentions,
    natural_triples,
    values_equal,
)
from kvdiag.vocab import STYLES

if TYPE_CHECKING:
    from pandas import DataFrame

HEDGES = ("i think", "i believe", "i guess", "i suppose", "maybe", "perhaps", "possibly",
          "probably", "might", "may be", "not sure", "unsure", "not certain", "uncertain",
          "i don't know", "i do not know", "can't recall", "cannot recall", "don't remember",
          "do not remember", "it seems", "seems to", "likely", "roughly", "approximately")
END_MARKERS = ("<|im_end|>", "<|endoftext|>", "</s>", "<eos>", "<|eot_id|>")
_HEDGE_RE = re.compile(r"\b(" + "|".join(re.escape(h) for h in HEDGES) + r")\b")


class FactLike(Protocol):
    entity: str
    relation: str
    value: str


class FactCheckResult(NamedTuple):
    passed: bool
    triples: tuple[Triple, ...]
    reason: str  # "ok" or why it failed


class FactChecker:
    """Checks answers against one session's KB; build once per session, reuse per answer."""

    def __init__(self, kb: Iterable[FactLike] | object, style: str,
                 spacy_model: str | None = None,
                 aliases: Mapping[str, Sequence[str]] | None = None) -> None:
        if style not in STYLES:
            raise ValueError(f"style must be one of {STYLES}, got {style!r}")
        self.style = style
        self.facts: tuple[FactLike, ...] = tuple(getattr(kb, "facts", kb))  # type: ignore[arg-type]
        self.note = ""
        self.nlp = self._pipeline(spacy_model, dict(aliases or {}))

    def _pipeline(self, spacy_model: str | None, aliases: dict[str, Sequence[str]]):
        """This KB's entity ruler over the shared base pipeline of `spacy_model` (_Ruled)."""
        from spacy.pipeline import EntityRuler

        base, self.note = _base_pipeline(spacy_model)
        ruler = EntityRuler(base, phrase_matcher_attr="LOWER")
        patterns, seen = [], set()
        for fact in self.facts:
            for label, kb_text in (("KB_ENTITY", fact.entity), ("KB_RELATION", fact.relation),
                                   ("KB_VALUE", str(fact.value))):
                forms = {kb_text, kb_text.replace("_", " "), *aliases.get(kb_text, ())}
                for form in forms - {""}:
                    if (label, form.lower()) not in seen:
                        seen.add((label, form.lower()))
                        patterns.append({"label": label, "pattern": form, "id": kb_text})
        ruler.add_patterns(patterns)
        return _Ruled(base, ruler)

    def check(self, answer: str | None, asked: Sequence[FactLike] | FactLike) -> FactCheckResult:
        """Extracts triples from `answer` and judges them against `asked` (rules above)."""
        asked = (asked,) if hasattr(asked, "entity") else tuple(asked)  # type: ignore[arg-type]
        text = answer if isinstance(answer, str) else ""  # None, NaN, pd.NA: no answer
        for marker in END_MARKERS:
            text = text.replace(marker, " ")
        if not text.strip():
            return FactCheckResult(False, (), "empty answer")
        hedge = _HEDGE_RE.search(text.lower().replace("\u2019", "'"))
        if hedge:
            return FactCheckResult(False, (), f"hedged: {hedge.group(1)!r}")
        doc = self.nlp(text)
        found, leftover = mentions(doc)
        if self.style == "canary":
            triples, problem = canary_triples(found, leftover, asked)
        else:
            triples, problem = natural_triples(found, asked), ""
        return FactCheckResult(*_judge(triples, asked, problem))


def _judge(triples: list[Triple], asked: Sequence[FactLike], problem: str):
    found = tuple(triples)
    for fact in asked:
        key = (fact.entity, fact.relation)
        same = [t for t in found if (t.entity, t.relation) == key]
        wrong = [t.value for t in same if not values_equal(t.value, str(fact.value))]
        if wrong:
            return False, found, f"wrong value for {key[0]} / {key[1]}: {wrong[0]!r} " \
                                 f"(expected {str(fact.value)!r})"
        if not same:
            return False, found, f"missing: {key[0]} / {key[1]}"
    return (False, found, problem) if problem else (True, found, "ok")


@register
class FactCheckPassRate(Metric):
    name = "fact_check_pass_rate"
    columns = ("fact_check_pass",)

    def compute(self, rows: DataFrame) -> float:
        return nan_mean(rows["fact_check_pass"])  # NaN rows are recitations: not checked


class _Ruled:
    """A shared base pipeline with one KB's entity ruler added before its "ner" (or last):
    what nlp(text) would do had the ruler been added to the pipeline itself."""

    def __init__(self, base, ruler) -> None:
        names = [name for name, _ in base.pipeline]
        at = names.index("ner") if "ner" in names else len(names)
        self.base = base
        self.pipe_names = [*names[:at], "entity_ruler", *names[at:]]
        self.pipes = [pipe for _, pipe in base.pipeline[:at]] + [ruler] + [
            pipe for _, pipe in base.pipeline[at:]]

    def __call__(self, text: str):
        doc = self.base.make_doc(text)
        for pipe in self.pipes:
            doc = pipe(doc)
        return doc


_BASES: dict[str | None, tuple[object, str]] = {}


def _base_pipeline(spacy_model: str | None) -> tuple[object, str]:
    """(the pipeline every checker of this process shares, a note if `spacy_model` was not
    available): `spacy_model`, else a blank English one, with sentence boundaries. Loading
    it is most of a checker's cost (about half a second for the blank one), so it is
    loaded once; each KB adds only its own entity ruler (see FactChecker._pipeline)."""
    if spacy_model not in _BASES:
        import spacy

        nlp, note = None, ""
        if spacy_model:
            try:
                nlp = spacy.load(spacy_model)
            except (OSError, ImportError) as exc:
                note = f"spaCy model {spacy_model!r} not available ({exc}); using blank 'en'"
        nlp = nlp or spacy.blank("en")
        if not any(nlp.has_pipe(p) for p in ("parser", "senter", "sentencizer")):
            nlp.add_pipe("sentencizer", first=True)
        _BASES[spacy_model] = nlp, note
    return _BASES[spacy_model]

