"""The per-round record every runner yields, whatever it measured (reference engine, live
endpoint, vLLM replay), so metrics, reports and verdicts never know the difference."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields

from kvdiag.facts import Fact, Round


@dataclass
class Record:
    case: str
    target: str  # "reference" for the in-process engine, a URL for a live endpoint
    allocator: str  # "contiguous" for the ground-truth rows
    session: str
    round: int  # 1-based
    kind: str  # "question" | "recite"
    prompt_tokens: int = 0
    cached_tokens: int = 0
    blocks_needed: int = 0
    blocks_hit: int = 0
    attention_leakage: float = math.nan
    attention_leakage_max: float = math.nan
    foreign_slots: int = 0
    unwritten_slots: int = 0
    guard_rejections: int = 0
    nonfinite_logits: int = 0
    preemptions: int = 0
    output_text: str = ""
    reference_text: str = ""
    expected_text: str = ""
    output_token_ids: list[int] = field(default_factory=list)
    reference_token_ids: list[int] = field(default_factory=list)
    first_divergence: int | None = None
    fact_check_pass: float = math.nan
    fact_check_reason: str = ""
    divergence_margin: float = math.nan  # live probes: logprob margin at the first divergent token
    classification: str = ""  # live probes: "match", "numerics" or "corruption"

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def columns(cls) -> list[str]:
        """The frame's columns, for a run that recorded no round."""
        return [f.name for f in fields(cls)]


def canary_view(fact: Fact) -> Fact:
    """The canary answers a fact with its value tokens: check against those."""
    return Fact(fact.entity, fact.relation, " ".join(fact.value_tokens), fact.key_token,
                fact.value_tokens)


class Checker:
    """Fact-checks answers per session knowledge base (one spaCy pipeline per KB)."""

    def __init__(self, style: str, spacy_model: str | None = None) -> None:
        self.style, self.spacy_model = style, spacy_model
        self._by_kb: dict[int, tuple] = {}  # id(kb) -> (kb, its checker): kb held, so its id
        # is never another's (a freed object's id comes back for a later one)

    def check(self, kb, rnd: Round, answer: str) -> tuple[float, str]:
        if rnd.kind != "question":
            return math.nan, ""
        from kvdiag.metrics.factcheck import FactChecker

        view = canary_view if self.style == "canary" else (lambda f: f)
        held, checker = self._by_kb.get(id(kb), (None, None))
        if held is not kb:
            checker = FactChecker([view(f) for f in kb.facts], self.style, self.spacy_model)
            self._by_kb[id(kb)] = (kb, checker)
        result = checker.check(answer, [view(f) for f in rnd.asked])
        return (1.0 if result.passed else 0.0), result.reason
