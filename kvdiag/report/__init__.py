"""The run report: one self-contained HTML page (tables from pandas, plots from matplotlib)."""

from kvdiag.report.html import load_run, render_report, write_report

__all__ = ["load_run", "render_report", "write_report"]
