"""The metric contract: one aggregate per group of per-round records, registered by name.

A runner yields one row per (case, target, allocator, session, round) — the columns are
listed in `kvdiag.metrics.decay`. `per_round` groups those rows by (case, target,
allocator, round) and asks every registered metric for one number per group. Adding a
metric means writing one small subclass in its own file, decorating it with `register`, and
importing that module in `kvdiag/metrics/__init__.py`: registration happens at import, and
only the modules imported there are registered.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Iterable
from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:
    from pandas import DataFrame


class Metric(ABC):
    """Aggregates the rows of one (case, target, allocator, round) group into one float.

    `name` is the column the value lands in (per-round table, summary.json `rounds`);
    `columns` are the record columns it reads. `compute` returns NaN when the group holds
    nothing to measure (e.g. leakage was not captured), never raises on an empty group.
    """

    name: ClassVar[str]
    columns: ClassVar[tuple[str, ...]]

    @abstractmethod
    def compute(self, rows: DataFrame) -> float: ...


METRICS: dict[str, type[Metric]] = {}


def register(cls: type[Metric]) -> type[Metric]:
    """Class decorator: make `cls` known to `per_round` under `cls.name`."""
    if cls.name in METRICS:
        raise ValueError(f"metric {cls.name!r} is registered twice")
    METRICS[cls.name] = cls
    return cls


def nan_mean(values: Iterable[float]) -> float:
    """Mean of the finite-or-inf values, ignoring NaN/None; NaN when nothing is left."""
    kept = [float(v) for v in values if v is not None and not _is_nan(v)]
    return sum(kept) / len(kept) if kept else math.nan


def nan_max(values: Iterable[float]) -> float:
    """Max ignoring NaN/None; NaN when nothing is left."""
    kept = [float(v) for v in values if v is not None and not _is_nan(v)]
    return max(kept) if kept else math.nan


def _is_nan(value: object) -> bool:
    try:
        return math.isnan(float(value))  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return True  # pandas.NA and friends
