"""kvdiag export and kvdiag exporter: the run history as Prometheus metrics."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from kvdiag.cli.common import DEFAULT_HISTORY, HistoryOpt, Output, SuiteFilterOpt, handle_errors


@handle_errors
def export(
    textfile: Annotated[Path, typer.Option("--textfile", help="node_exporter textfile collector "
                                           "directory (--collector.textfile.directory).")],
    history: HistoryOpt = DEFAULT_HISTORY,
    suite: SuiteFilterOpt = None,
) -> None:
    """Write DIR/kvdiag.prom (SQDR, BRAI, per-round fact-check and BLEU-4, leakage, cache
    divergence of the latest run of each suite, target and model), atomically.

    Example: kvdiag export --textfile /var/lib/node_exporter/textfile
    """
    from kvdiag.export.prometheus import write_textfile

    Output().out.print(f"wrote {write_textfile(textfile, history, suite)}")


@handle_errors
def exporter(
    port: Annotated[int, typer.Option("--port", min=0, max=65535, help="Port for /metrics.")] = 9733,
    addr: Annotated[str, typer.Option("--addr", help="Address to listen on (0.0.0.0 for every "
                                      "interface; mind who can reach it).")] = "127.0.0.1",
    history: HistoryOpt = DEFAULT_HISTORY,
    suite: SuiteFilterOpt = None,
) -> None:
    """Serve the latest runs' metrics on http://ADDR:PORT/metrics (prometheus-client),
    rereading the history on every scrape. Runs until interrupted. A missing history is
    exported as kvdiag_history_present 0, so an alert can fire on it.

    Example: kvdiag exporter --port 9733 --history reports/history.sqlite
    """
    from kvdiag.export.prometheus import serve_forever

    serve_forever(port, history, addr, suite, announce=lambda url: Output().info(
        f"kvdiag exporter on {url} (history {history}); Ctrl-C stops it"))
