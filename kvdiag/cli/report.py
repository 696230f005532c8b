"""kvdiag report: the self-contained HTML decay-curve page of a run directory."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from kvdiag.cli.common import HistoryOpt, Output, handle_errors


@handle_errors
def report(
    run_dir: Annotated[Path, typer.Argument(metavar="RUN_DIR", help="A run directory (results.parquet + summary.json).")],
    out: Annotated[Path | None, typer.Option("-o", "--out", help="HTML file to write "
                                             "(default: RUN_DIR/report.html).")] = None,
    history: HistoryOpt = None,
) -> None:
    """Write one self-contained HTML page (plots inlined as SVG, no scripts): verdict, what
    was run and how to rerun it, decay curves per round against the reference, a leakage
    heatmap by session x round, the ablation table, SQDR/BRAI with their alert thresholds,
    and, with --history, the trend over past runs of the same suite.

    Example: kvdiag report reports/reproduce-20261130-221500
    """
    from kvdiag.record.rundir import require_finished
    from kvdiag.regress.history import trend
    from kvdiag.report.html import write_report

    require_finished(run_dir)  # an interrupted run is never shown as finished
    frame = None if history is None else trend(history, run_dir)
    Output().out.print(str(write_report(run_dir, out, history=frame)))
