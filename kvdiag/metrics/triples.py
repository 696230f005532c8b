"""From a spaCy doc of an answer to (entity, relation, value) triples; comparable values.

The rules these functions implement are stated in `kvdiag.metrics.factcheck`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from decimal import Decimal, InvalidOperation
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from kvdiag.metrics.factcheck import FactLike

_UNITS = {"billion": "bn", "bn": "bn", "b": "bn", "million": "m", "mn": "m", "m": "m",
          "thousand": "k", "k": "k", "percent": "%", "pct": "%", "%": "%"}
_CURRENCY = {"$": "$", "usd": "$", "dollars": "$", "€": "€", "eur": "€", "euros": "€",
             "£": "£", "gbp": "£", "pounds": "£"}
_UNIT_WORDS = {*_UNITS, "day", "days", "week", "weeks", "month", "months", "year", "years",
               "hour", "hours", "mg", "g", "kg", "ml", "l", "mmol", "bpm", "x"}
_MONTHS = {"january", "february", "march", "april", "may", "june", "july", "august",
           "september", "october", "november", "december"}
_NER_ROLES = {**dict.fromkeys(("MONEY", "PERCENT", "QUANTITY", "CARDINAL"), "VALUE"),
              **dict.fromkeys(("ORG", "PERSON", "GPE", "NORP", "FAC", "LOC", "PRODUCT"), "NAME")}


class Triple(NamedTuple):
    entity: str | None  # a KB entity, a NAME's text, or None when nothing says
    relation: str | None
    value: str  # as written in the answer


class Mention(NamedTuple):
    role: str  # "entity" | "relation" | "value" | "name"
    text: str  # KB string for KB mentions, the answer's text otherwise
    start: int  # token index
    sent: int
    known: bool  # from the KB


def canonical_value(text: str) -> tuple[str, ...]:
    """Comparable form of a value: ('$', '4.2', 'bn') for '$4.20 Billion'."""
    t = re.sub(r"(?<=\d),(?=\d{3})", "", str(text).lower()).replace("per cent", "percent")
    words = re.findall(r"\d+(?:\.\d+)?|[a-z_]+|[^\sa-z\d.,]", t)
    return tuple(_CURRENCY.get(w) or _UNITS.get(w) or _number(w) for w in words)


def values_equal(a: str, b: str) -> bool:
    ca, cb = canonical_value(a), canonical_value(b)
    if ca == cb:
        return True
    cur = set(_CURRENCY.values())
    sa, sb = tuple(w for w in ca if w not in cur), tuple(w for w in cb if w not in cur)
    return sa == sb and (len(sa) == len(ca) or len(sb) == len(cb))


def _number(word: str) -> str:
    if not word[0].isdigit():
        return word
    try:
        return format(Decimal(word).normalize(), "f")
    except InvalidOperation:
        return word


def mentions(doc) -> tuple[list[Mention], list[str]]:
    """KB mentions from the ruler (or NER), then VALUE / NAME read from uncovered tokens."""
    sent_of = {tok.i: k for k, sent in enumerate(doc.sents) for tok in sent}
    found, covered = [], set()
    for ent in doc.ents:
        role = {"KB_ENTITY": "entity", "KB_RELATION": "relation", "KB_VALUE": "value"}.get(
            ent.label_) or _NER_ROLES.get(ent.label_, "").lower()
        if role:
            known = ent.label_.startswith("KB_")
            found.append(Mention(role, ent.ent_id_ if known else ent.text, ent.start,
                                  sent_of[ent.start], known))
            covered.update(range(ent.start, ent.end))
    i, leftover = 0, []  # leftover: uncovered tokens that are no mention at all
    while i < len(doc):
        tok, j = doc[i], i
        if i in covered or tok.is_punct or tok.is_space:
            i += 1
            continue
        if tok.text.lower() in _CURRENCY and i + 1 < len(doc) and doc[i + 1].text[:1].isdigit():
            j = i + 1
        if doc[j].text[:1].isdigit() and j not in covered:
            end = j + 1
            if end < len(doc) and end not in covered and doc[end].lower_ in _UNIT_WORDS:
                end += 1
            if i == j and end == j + 1 and re.fullmatch(r"(19|20)\d\d", tok.text):
                leftover.append(tok.text)  # a year: a date, not a value
            else:
                found.append(Mention("value", doc[i:end].text, i, sent_of[i], False))
            i = end
        elif tok.is_title and not tok.is_stop and tok.lower_ not in _MONTHS:
            end = i + 1
            while end < len(doc) and end not in covered and doc[end].is_title:
                end += 1
            found.append(Mention("name", doc[i:end].text, i, sent_of[i], False))
            i = end
        else:
            leftover.append(tok.text)
            i += 1
    return sorted(found, key=lambda m: m.start), leftover


def _defaults(asked: Sequence[FactLike]) -> tuple[str | None, dict[str, str]]:
    entities = {f.entity for f in asked}
    by_entity: dict[str, list[str]] = {}
    for f in asked:
        by_entity.setdefault(f.entity, []).append(f.relation)
    relation = {e: rels[0] for e, rels in by_entity.items() if len(rels) == 1}
    return (next(iter(entities)) if len(entities) == 1 else None), relation


def natural_triples(found: list[Mention], asked: Sequence[FactLike]) -> list[Triple]:
    """Triples of an English answer, sentence by sentence (rule 3, natural)."""
    default_entity, default_relation = _defaults(asked)
    triples, last_entity = [], None
    for sent in sorted({m.sent for m in found}):
        ms = [m for m in found if m.sent == sent]
        values = [m for m in ms if m.role == "value"]
        relations = [m for m in ms if m.role == "relation"]
        paired: dict[Mention, str | None] = _pair(values, relations)
        if not relations and values:
            paired[next((v for v in values if v.known), values[0])] = None
        for v in sorted(paired, key=lambda m: m.start):
            entity = _nearest(v, [m for m in ms if m.role == "entity"]) or _nearest(
                v, [m for m in ms if m.role == "name"]) or last_entity or default_entity
            relation = paired[v] or default_relation.get(entity or "")
            triples.append(Triple(entity, relation, v.text))
            last_entity = entity
    return triples


def _pair(values: list[Mention], relations: list[Mention]) -> dict[Mention, str | None]:
    """Relation of each value: read "revenue of $4.2 bn" (relation before its value) or
    "$4.2 bn in revenue" (after), whichever pairs more values; only a relation between a
    value and its neighbouring value can belong to it."""
    best: dict[Mention, str | None] = {}
    for after in (False, True):
        pairs: dict[Mention, str | None] = {}
        for k, v in enumerate(values):
            if after:
                lo, hi = v.start, values[k + 1].start if k + 1 < len(values) else math.inf
            else:
                lo, hi = values[k - 1].start if k else -1, v.start
            inside = [r for r in relations if lo < r.start < hi]
            if inside:
                pairs[v] = (min if after else max)(inside, key=lambda r: r.start).text
        best = pairs if len(pairs) > len(best) else best
    return best


def _nearest(v: Mention, candidates: list[Mention]) -> str | None:
    if not candidates:
        return None
    return min(candidates, key=lambda m: (abs(m.start - v.start), m.start > v.start)).text


def canary_triples(found: list[Mention], leftover: list[str],
                   asked: Sequence[FactLike]) -> tuple[list[Triple], str]:
    """Triples of a canary answer (rule 3, canary) and what in it was not understood."""
    stray = [m.text for m in found if not m.known] + leftover
    triples: list[Triple] = []
    entity = relation = None  # mentioned since the previous value
    for m in found:
        if m.role == "entity" and m.known:
            entity = m.text
        elif m.role == "relation":
            relation = m.text
        elif m.role == "value" and m.known:
            i = len(triples)
            if i >= len(asked):
                stray.append(m.text)
                continue
            triples.append(Triple(entity or asked[i].entity, relation or asked[i].relation,
                                  m.text))
            entity = relation = None
    return triples, (f"unrecognised tokens: {' '.join(dict.fromkeys(stray))}" if stray else "")


