"""Knowledge bases: (entity, relation, value) facts of one flavour, drawn by seed."""

from __future__ import annotations

import random
from dataclasses import dataclass

from kvdiag.facts.flavours import FLAVOUR_TABLE

FLAVOURS = ("financial", "legal", "clinical")


@dataclass(frozen=True)
class Fact:
    entity: str  # natural-language entity, e.g. "Acme Corp"
    relation: str  # e.g. "revenue"
    value: str  # e.g. "$4.2 billion"
    key_token: str  # canary style: one token naming entity+relation, e.g. "acmeREV"
    value_tokens: tuple[str, ...]  # canary style: the value as canary tokens (1..6)


@dataclass(frozen=True)
class KnowledgeBase:
    flavour: str
    facts: tuple[Fact, ...]


def make_knowledge_base(flavour: str, num_facts: int, seed: int) -> KnowledgeBase:
    """num_facts distinct (entity, relation) facts with distinct values, deterministic by seed."""
    if flavour not in FLAVOUR_TABLE:
        raise ValueError(f"flavour must be one of {', '.join(FLAVOURS)}, got {flavour!r}")
    fl = FLAVOUR_TABLE[flavour]
    capacity = len(fl.entities) * len(fl.relations)
    if not 1 <= num_facts <= capacity:
        raise ValueError(f"num_facts must be in 1..{capacity} for flavour {flavour!r}, got {num_facts}")
    rng = random.Random(f"kb:{flavour}:{num_facts}:{seed}")
    pairs = rng.sample([(e, r) for e in fl.entities for r in fl.relations], num_facts)
    facts, seen_values = [], set()
    for (name, slug), rel in pairs:
        for _ in range(1000):
            value, tokens = rel.draw(rng)
            if value not in seen_values:
                break
        else:  # a relation with few values (governing law) ran out: accept a repeat
            value, tokens = rel.draw(rng)
        seen_values.add(value)
        facts.append(Fact(entity=name, relation=rel.name, value=value,
                          key_token=slug + rel.code, value_tokens=tokens))
    return KnowledgeBase(flavour=flavour, facts=tuple(facts))
