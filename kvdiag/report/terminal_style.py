"""What every terminal renderer shares: the verdict's colour, number formats, a compact
table, the headline (the verdict and the sentence why) and the footer (signature, where)."""

from __future__ import annotations

import math

from kvdiag.verdicts import Verdict

COLOURS = {Verdict.PASS: "green", Verdict.FAIL: "red", Verdict.INCONCLUSIVE: "yellow",
           Verdict.ERROR: "magenta"}


def fmt(value, spec: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return format(value, spec)


def compact_table(title: str, caption: str | None = None):
    """A Rich table without vertical rules, so wide round tables fit an 80-column terminal."""
    from rich import box
    from rich.table import Table

    return Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, collapse_padding=True,
                 caption=caption, caption_justify="left")


def headline(result, what: str = "") -> str:
    """The verdict in colour and one sentence: `what`, else the summary's reason."""
    v = result.verdict
    reason = result.summary.reason or v.meaning
    return f"[bold {COLOURS[v]}]{v.value.upper()}[/] {what or reason}"


def footer(result) -> list[str]:
    return [f"signature: {result.signature}",
            f"wall time {result.summary.wall_seconds:.1f} s; results in {result.run_dir}/ "
            "(report.html, results.parquet, summary.json)"]


def generic(result) -> list:
    return [headline(result), *footer(result)]


