"""block_reuse_rate, BRAI and attention-leakage aggregation."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from kvdiag.metrics import METRICS
from kvdiag.metrics.leakage import AttentionLeakage, AttentionLeakageMax
from kvdiag.metrics.reuse import BlockReuseRate, block_reuse_rate, brai


def test_block_reuse_rate_sums_over_the_group() -> None:
    assert block_reuse_rate([3, 0, 5], [4, 4, 8]) == pytest.approx(0.5)
    assert block_reuse_rate([], []) == 0.0  # no full block needed: nothing to reuse
    assert block_reuse_rate([0], [0]) == 0.0
    with pytest.raises(ValueError, match="blocks_hit=5"):
        block_reuse_rate([5], [4])


def test_brai() -> None:
    assert brai(0.97, 0.93) == pytest.approx(0.04)
    assert brai(0.5, 0.93) == pytest.approx(0.43)
    assert math.isnan(brai(0.5, None)) and math.isnan(brai(0.5, math.nan))


def test_leakage_ignores_uncaptured_records() -> None:
    none = pd.DataFrame({"attention_leakage": [math.nan], "attention_leakage_max": [math.nan]})
    assert math.isnan(AttentionLeakage().compute(none)) and math.isnan(AttentionLeakageMax().compute(none))
    rows = pd.DataFrame({"attention_leakage": [0.1, 0.3, float("nan")],
                         "attention_leakage_max": [0.2, 0.8, float("nan")]})
    assert AttentionLeakage().compute(rows) == pytest.approx(0.2)
    assert AttentionLeakageMax().compute(rows) == pytest.approx(0.8)


def test_registry_names_every_metric() -> None:
    assert set(METRICS) == {"block_reuse_rate", "attention_leakage", "attention_leakage_max",
                            "bleu4", "fact_check_pass_rate"}
    assert METRICS["block_reuse_rate"] is BlockReuseRate
