"""Terminal rendering of finished runs: one renderer per kind of run (terminal_runs.py,
terminal_gates.py), each returning the lines (Rich markup strings and tables) that the CLI's
Output prints. Library code never prints; a new kind of run adds its renderer to RENDERERS."""

from __future__ import annotations

from kvdiag.report.terminal_gates import (
    render_fleet,
    render_isolation,
    render_matrix,
    render_regress,
)
from kvdiag.report.terminal_runs import render_audit, render_probe, render_reproduce, render_verify
from kvdiag.report.terminal_style import generic


def render(result) -> list:
    """The lines of a finished run, by its kind."""
    return RENDERERS.get(result.kind, generic)(result)


RENDERERS = {"reproduce": render_reproduce, "verify": render_verify, "probe": render_probe,
             "audit": render_audit, "regress": render_regress, "isolation": render_isolation,
             "fleet": render_fleet, "matrix": render_matrix}
