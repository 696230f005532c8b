"""The fact check on free text: are the entities of the isolated answer still there,
unchanged, in the shared one?

Entities are what a corrupted cache tends to change while the prose around them survives:

    number   4.2, 1,250, 17%, $66.0 (digits, with a sign, separators, a unit sign)
    date     2024-03-05, March 5, 2024, 5 March 2024, March 2024 (read before numbers)
    title    a quoted span: "The Quiet Ledger", \u201cA Field Guide\u201d
    code     an identifier inside a code block or `inline code` (keywords left out)
    name     a proper noun: with a trained spaCy pipeline, its named entities; otherwise a
             run of capitalised words that does not start a sentence and is no stop word or
             month (the rule-based pipeline kvdiag.metrics.factcheck builds)

An answer passes when every entity of the reference is among the answer's (compared by kind
and normalised text); a reference without any entity has nothing to check (NaN).
`pipeline_name()` says which spaCy pipeline was used, for the summary.
"""

from __future__ import annotations

import math
import re
from typing import NamedTuple

TRAINED = "en_core_web_sm"  # used where installed (not on PyPI under its own name)
MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September",
          "October", "November", "December", "Jan", "Feb", "Mar", "Apr", "Jun", "Jul", "Aug", "Sep",
          "Sept", "Oct", "Nov", "Dec")
_MONTH = rf"(?:{'|'.join(MONTHS)})\.?"
_DATE = re.compile(rf"\b\d{{4}}-\d{{2}}-\d{{2}}\b|\b{_MONTH}\s+\d{{1,2}}(?:st|nd|rd|th)?,?\s+\d{{4}}\b|"
                   rf"\b\d{{1,2}}\s+{_MONTH}\s+\d{{4}}\b|\b{_MONTH}\s+\d{{4}}\b")
_NUMBER = re.compile(r"[-+]?[$\u20ac\u00a3]?\d+(?:,\d{3})*(?:\.\d+)?%?")
_TITLE = re.compile(r"\"([^\"\n]{2,120})\"|\u201c([^\u201d\n]{2,120})\u201d")
_FENCE = re.compile(r"```[^\n]*\n(.*?)(?:```|$)", re.S)
_INLINE = re.compile(r"`([^`\n]+)`")
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_KEYWORDS = {"def", "return", "if", "else", "elif", "for", "while", "in", "import", "from",
             "class", "and", "or", "not", "is", "None", "True", "False", "with", "as", "try",
             "except", "lambda", "pass", "const", "let", "var", "function", "int", "str",
             "float", "print", "self", "python", "max", "min", "round", "len", "range"}
_NER = {"PERSON", "ORG", "GPE", "LOC", "NORP", "FAC", "PRODUCT", "EVENT", "WORK_OF_ART", "LAW"}


class Entity(NamedTuple):
    kind: str  # number, date, title, code, name
    text: str  # normalised


class EntityCheck(NamedTuple):
    passed: float  # 1.0, 0.0, or NaN when the reference has no entity
    missing: tuple[Entity, ...]  # the reference's entities the answer lacks


def entities(text: str | None, spacy_model: str | None = "auto") -> set[Entity]:
    """Every entity of `text` (kinds above). `spacy_model`: "auto" (the trained pipeline where
    installed, else the rule-based one), None (rule-based), or a pipeline's name."""
    if not isinstance(text, str) or not text.strip():
        return set()
    found: set[Entity] = set()
    prose = text
    for block in [*_FENCE.findall(text), *_INLINE.findall(text)]:
        found |= {Entity("code", w) for w in _IDENT.findall(block) if w not in _KEYWORDS and len(w) > 1}
    prose = _INLINE.sub(" ", _FENCE.sub(" ", prose))
    for m in _TITLE.finditer(prose):
        found.add(Entity("title", " ".join((m.group(1) or m.group(2)).split()).lower()))
    for m in _DATE.finditer(prose):
        found.add(Entity("date", " ".join(m.group(0).replace(",", " ").split()).lower()))
    rest = _DATE.sub(" ", prose)
    for m in _NUMBER.finditer(rest):
        found.add(Entity("number", m.group(0).replace(",", "").lstrip("+")))
    found |= _names(_TITLE.sub(" ", prose), spacy_model)
    return found


def check(reference: str | None, answer: str | None, spacy_model: str | None = "auto") -> EntityCheck:
    """Whether every entity of `reference` is in `answer` (see the module docstring)."""
    want = entities(reference, spacy_model)
    if not want:
        return EntityCheck(math.nan, ())
    missing = tuple(sorted(want - entities(answer, spacy_model)))
    return EntityCheck(0.0 if missing else 1.0, missing)


def pipeline_name(spacy_model: str | None = "auto") -> str:
    """The pipeline `entities` uses for names: a trained one's name and version, or the rules."""
    nlp, _ = _pipeline(spacy_model)
    if nlp.has_pipe("ner"):
        return f"{nlp.meta.get('name', '?')} {nlp.meta.get('version', '?')} (trained)"
    return "spacy.blank('en') + kvdiag rules (rule-based)"


def _pipeline(spacy_model: str | None):
    from kvdiag.metrics.factcheck import _base_pipeline

    if spacy_model == "auto":
        import spacy.util

        full = "core_web_sm"  # spaCy's own name for its packaged English pipeline
        spacy_model = f"en_{full}" if spacy.util.is_package(f"en_{full}") else None
    return _base_pipeline(spacy_model)


def _names(text: str, spacy_model: str | None) -> set[Entity]:
    from spacy.lang.en.stop_words import STOP_WORDS

    nlp, _ = _pipeline(spacy_model)
    doc = nlp(text)
    if nlp.has_pipe("ner"):
        return {Entity("name", " ".join(e.text.split()).lower()) for e in doc.ents if e.label_ in _NER}
    months = {m.lower() for m in MONTHS}
    out, run = set(), []
    for sent in doc.sents:
        words = [tok.text for tok in sent if not tok.is_space]
        for i, word in enumerate(words):
            capital = word[:1].isupper() and word[1:].islower() or (word.isupper() and len(word) > 1)
            if capital and i > 0 and word.lower() not in STOP_WORDS and word.lower() not in months:
                run.append(word)
                continue
            if run:
                out.add(Entity("name", " ".join(run).lower()))
            run = []
        if run:
            out.add(Entity("name", " ".join(run).lower()))
        run = []
    return out
