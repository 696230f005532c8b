"""Per-round quality metrics: block reuse, attention leakage, BLEU-4, fact-check, decay.

One file per metric, each registering a `Metric` subclass in `METRICS` (see `base.py`).
Heavy libraries (pandas, sacrebleu, spaCy) are imported inside the functions that use them.
"""

from kvdiag.metrics import bleu, factcheck, leakage, reuse  # noqa: F401  (fill METRICS)
from kvdiag.metrics.base import METRICS, Metric, register
from kvdiag.metrics.decay import first_divergence, per_round, sqdr, summarize

__all__ = [
    "METRICS",
    "Metric",
    "register",
    "first_divergence",
    "per_round",
    "sqdr",
    "summarize",
]
