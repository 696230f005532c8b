"""The report's tables: pandas frames built from a run, rendered to plain HTML tables.

Builders return DataFrames (so the CLI or a notebook can reuse them); `to_html` renders one
with pandas' Styler, number formats fixed and status cells carrying a CSS class
(`healthy`, `watch`, `alert`, `n/a`) that the page colours.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pandas import DataFrame

    from kvdiag.record.summary_rows import CaseMetrics, EventRow

FORMATS = {"SQDR": "{:.4f}", "BRAI": "{:.3f}", "leakage (mean)": "{:.4f}",
           "leakage (max)": "{:.4f}", "fact-check": "{:.3f}", "BLEU-4": "{:.1f}",
           "block reuse": "{:.3f}", "sqdr": "{:.4f}", "brai": "{:.3f}",
           "fact-check pass rate": "{:.3f}", "attention leakage": "{:.4f}"}
COUNTS = ("foreign slots", "unwritten slots", "guard rejections")  # shown as integers
BLANK = ""  # a cell that does not apply (a reference's BRAI): empty, unlike "—" (no value)


def sqdr_status(value: float | None) -> str:
    """healthy <= 0.005 < watch <= 0.01 < alert (a negative SQDR means answers improved)."""
    from kvdiag.metrics.decay import SQDR_ALERT, SQDR_HEALTHY

    if _missing(value):
        return "n/a"
    return "healthy" if value <= SQDR_HEALTHY else "watch" if value <= SQDR_ALERT else "alert"


def brai_status(value: float | None) -> str:
    from kvdiag.vocab import BRAI_MAX

    return "n/a" if _missing(value) else "healthy" if value <= BRAI_MAX else "alert"


def ablation_table(df: DataFrame, by_case: Mapping[str, CaseMetrics]) -> DataFrame:
    """One row per case x series: slots, leakage, fact-check, BLEU-4 over all rounds, SQDR, BRAI.

    `df` holds the raw records with a `series` column; `by_case` is summary.json's
    case -> its SQDR and BRAI per series.
    """
    import pandas as pd

    from kvdiag.metrics.base import nan_max, nan_mean
    from kvdiag.metrics.bleu import corpus_bleu
    from kvdiag.metrics.decay import REFERENCE_ALLOCATORS

    rows = []
    for (case, series), g in df.groupby(["case", "series"], sort=False):
        metrics = by_case.get(case)
        sq = metrics.sqdr.get(series) if metrics else None
        br = metrics.brai.get(series) if metrics else None
        reference = series in REFERENCE_ALLOCATORS  # no cache, so no reuse to compare
        rows.append({
            "case": case, "allocator / target": series,
            "foreign slots": int(g["foreign_slots"].sum()),
            "unwritten slots": int(g["unwritten_slots"].sum()),
            "leakage (mean)": nan_mean(g["attention_leakage"]),
            "leakage (max)": nan_max(g["attention_leakage_max"]),
            "fact-check": nan_mean(g["fact_check_pass"]),
            "BLEU-4": corpus_bleu(list(g["output_text"]), list(g["reference_text"])).score,
            "SQDR": _float(sq), "SQDR status": sqdr_status(_float(sq)),
            "BRAI": BLANK if reference else _float(br),
            "BRAI status": BLANK if reference else brai_status(_float(br)),
        })
    return pd.DataFrame(rows)


def alert_table(sqdr: Mapping[str, float | None], brai: Mapping[str, float | None]) -> DataFrame:
    """SQDR and BRAI of the main case per series, with their status words."""
    import pandas as pd

    names = list(dict.fromkeys([*sqdr, *brai]))
    return pd.DataFrame([{
        "allocator / target": n,
        "SQDR": _float(sqdr.get(n)), "SQDR status": sqdr_status(_float(sqdr.get(n))),
        "BRAI": _float(brai.get(n)), "BRAI status": brai_status(_float(brai.get(n))),
    } for n in names])


def rounds_table(table: DataFrame) -> DataFrame:
    """Per-round metrics of one case, series side by side (round x series)."""
    columns = {"fact_check_pass_rate": "fact-check", "bleu4": "BLEU-4",
               "attention_leakage": "leakage (mean)", "block_reuse_rate": "block reuse",
               "foreign_slots": "foreign slots"}
    wide = table.pivot(index="round", columns="series", values=list(columns))
    wide.columns = [f"{columns[m]} · {s}" for m, s in wide.columns]
    return wide.reset_index()


def events_table(events: list[EventRow]) -> DataFrame:
    """A probe's coverage table: one row per event of a block's life."""
    import pandas as pd

    return pd.DataFrame([{"event": r.event, "reached": "yes" if r.reached else "NO",
                          "requests": r.requests, "evidence": r.evidence} for r in events])


def history_table(history: DataFrame, last: int = 20) -> DataFrame:
    keep = [c for c in ("created", "run_id", "suite", "target", "sqdr", "brai", "verdict")
            if c in history.columns]
    return history.sort_values("created", ascending=False)[keep].head(last)


def to_html(frame: DataFrame, name: str, caption: str | None = None) -> str:
    """Plain <table id="T_name"> markup; status columns ("... status", "verdict") get classes."""
    from pandas.io.formats.style import Styler

    styler = Styler(frame, uuid=name, cell_ids=False).hide(axis="index")
    formats = {c: _formatter(f) for c, f in FORMATS.items() if c in frame.columns}
    formats.update({c: _formatter("{:.0f}" if str(c).startswith(COUNTS) else "{:.3f}")
                    for c in frame.columns if c not in formats and " · " in str(c)})
    formats.update({c: _formatter("{:.0f}") for c in frame.columns if c in COUNTS})
    styler = styler.format(formats, na_rep="—")
    status = [c for c in frame.columns if str(c).endswith("status") or c == "verdict"]
    if status:
        classes = frame.copy().astype(object)
        classes.loc[:, :] = ""
        for c in status:
            classes[c] = frame[c].astype(str).str.lower().str.replace("/", "")
        styler = styler.set_td_classes(classes)
    if caption:
        styler = styler.set_caption(caption)
    return styler.set_table_attributes('class="data"').to_html()


def _formatter(pattern: str):
    return lambda v: BLANK if isinstance(v, str) and v == BLANK else (
        "—" if _missing(v) else pattern.format(v))


def _float(value) -> float | None:
    return None if _missing(value) else float(value)


def _missing(value) -> bool:
    try:
        return value is None or math.isnan(float(value))
    except (TypeError, ValueError):
        return True
