"""Corpus BLEU-4 of a round's outputs against the contiguous reference outputs (sacrebleu).

Scores are sacrebleu's own, in [0, 100], with sacrebleu's signature beside them
(`nrefs:1|case:mixed|eff:yes|tok:13a|smooth:exp|version:2.x`). Two choices, both visible
in that signature or documented here:

- `effective_order=True` by default. Question rounds of the canary answer with one or two
  tokens, so a round may hold no 3- or 4-grams at all, and plain corpus BLEU-4 is then 0
  even when every answer is right. With effective order sacrebleu only averages the orders
  that have n-grams; whenever any segment of the round has 4 or more tokens the score is
  identical to plain BLEU-4 (and to `sacrebleu -m bleu` on the command line).
- When every hypothesis equals its reference exactly the score is 100 — this only changes
  the degenerate all-empty round, where sacrebleu has nothing to count and says 0.

An empty list of segments has no score: NaN.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, NamedTuple

from kvdiag.metrics.base import Metric, register

if TYPE_CHECKING:
    from pandas import DataFrame


class BleuScore(NamedTuple):
    score: float  # [0, 100], NaN for no segments
    signature: str  # sacrebleu's, e.g. "nrefs:1|case:mixed|eff:yes|tok:13a|..."


def corpus_bleu(
    hypotheses: Sequence[str | None],
    references: Sequence[str | None],
    effective_order: bool = True,
) -> BleuScore:
    """Corpus BLEU-4 of `hypotheses` against one reference each (None counts as "")."""
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} references")
    bleu, signature = _bleu(effective_order)
    hyps = [_text(h) for h in hypotheses]
    refs = [_text(r) for r in references]
    if not hyps:
        return BleuScore(math.nan, signature)
    if hyps == refs:
        return BleuScore(100.0, signature)
    score = bleu.corpus_score(hyps, [refs]).score
    return BleuScore(min(100.0, max(0.0, score)), signature)  # 100.00000000000004 happens


def bleu_signature(effective_order: bool = True) -> str:
    """The signature `corpus_bleu` attaches, without scoring any run output."""
    return _bleu(effective_order)[1]


def _bleu(effective_order: bool):
    from sacrebleu.metrics import BLEU

    bleu = BLEU(effective_order=effective_order)
    bleu.corpus_score(["x"], [["x"]])  # sacrebleu knows nrefs, hence its signature, only now
    return bleu, str(bleu.get_signature())


def _text(value: object) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return str(value)


@register
class Bleu4(Metric):
    name = "bleu4"
    columns = ("output_text", "reference_text")

    def compute(self, rows: DataFrame) -> float:
        return corpus_bleu(list(rows["output_text"]), list(rows["reference_text"])).score
