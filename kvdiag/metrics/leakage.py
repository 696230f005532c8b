"""Attention leakage: probability mass on foreign or unwritten KV slots.

The engine measures it per generated token, averaged over layers and heads, and stores per
record the mean over the record's generated tokens (`attention_leakage`) and the max
(`attention_leakage_max`); NaN where attention was not captured (live endpoints). Here
those records are aggregated: the mean of the means and the max of the maxima. A healthy
cache leaks exactly 0.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvdiag.metrics.base import Metric, nan_max, nan_mean, register

if TYPE_CHECKING:
    from pandas import DataFrame


@register
class AttentionLeakage(Metric):
    name = "attention_leakage"
    columns = ("attention_leakage",)

    def compute(self, rows: DataFrame) -> float:
        return nan_mean(rows["attention_leakage"])


@register
class AttentionLeakageMax(Metric):
    name = "attention_leakage_max"
    columns = ("attention_leakage_max",)

    def compute(self, rows: DataFrame) -> float:
        return nan_max(rows["attention_leakage_max"])
