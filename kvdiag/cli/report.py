"""kvdiag report: the self-contained HTML decay-curve page of a run directory."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from kvdiag.cli.common import Output, handle_errors


@handle_errors
def report(
    run_dir: Annotated[Path, typer.Argument(metavar="RUN_DIR", help="A run directory (results.parquet + summary.json).")],
    out: Annotated[Path | None, typer.Option("-o", "--out", help="HTML file to write "
                                             "(default: RUN_DIR/report.html).")] = None,
    history: Annotated[Path | None, typer.Option("--history", help="History database whose runs "
                                                 "of the same suite give the trend over runs.")] = None,
) -> None:
    """Write one self-contained HTML page (plots inlined as SVG, no scripts): verdict, what
    was run and how to rerun it, decay curves per round against the reference, a leakage
    heatmap by session x round, the ablation table, SQDR/BRAI with their alert thresholds,
    and, with --history, the trend over past runs.

    Example: kvdiag report reports/reproduce-20261130-221500
    """
    from kvdiag.report.html import write_report
    from kvdiag.runs import require_finished

    require_finished(run_dir)  # an interrupted run is never shown as finished
    frame = None
    if history is not None:
        from kvdiag.regress.history import runs
        from kvdiag.runs import read_summary

        suite = read_summary(run_dir).get("suite")
        frame = runs(history, suite=suite, last=52)
    path = write_report(run_dir, out, history=frame)
    Output().out.print(str(path))
