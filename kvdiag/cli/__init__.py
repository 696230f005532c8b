"""The kvdiag command line. This module only wires the command groups together; each
command lives in its own module and imports what it needs when it runs."""

from __future__ import annotations

import typer

from kvdiag.cli import (
    audit,
    compare,
    detect,
    export,
    fixtures,
    fleet,
    generate,
    isolation,
    probe,
    regress,
    report,
    reproduce,
    schema,
    sentinel,
    serve,
    watch,
)

app = typer.Typer(
    name="kvdiag",
    help="Find, measure and gate silent output corruption caused by KV-cache block reuse "
    "in paged-attention LLM serving engines.\n\nExit codes of gates (verify, probe, "
    "regress): 0 pass, 1 the check failed, 2 the run could not be made.",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode="markdown",  # paragraphs reflow to the terminal width
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _print_version(value: bool) -> None:
    """Eager: runs while the options are parsed, before click asks for a command."""
    if value:
        from kvdiag import __version__

        typer.echo(f"kvdiag {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", help="Print the version and exit.",
                                 is_eager=True, callback=_print_version),
) -> None:
    """kvdiag's commands (the help text above is the app's)."""


app.command("reproduce")(reproduce.reproduce)
app.command("verify")(reproduce.verify)
app.command("report")(report.report)
app.command("generate")(generate.generate)
app.command("serve")(serve.serve)
app.command("probe")(probe.probe)
app.command("compare")(compare.compare)
app.command("audit-vllm")(audit.audit_vllm)
app.command("isolation")(isolation.isolation)
app.command("detect")(detect.detect)
app.command("regress")(regress.regress)
app.add_typer(regress.baseline_app, name="baseline")
app.command("history")(regress.history)
app.command("export")(export.export)
app.command("exporter")(export.exporter)
app.add_typer(fixtures.app, name="fixtures")
app.add_typer(fleet.app, name="fleet")
app.command("schema")(schema.schema)
app.command("sentinel")(sentinel.sentinel)
app.add_typer(watch.app, name="watch")


def main() -> None:
    app()
