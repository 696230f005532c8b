"""The regression and export commands on one Typer app, for tests: kvdiag's own app when
kvdiag/cli/__init__.py wires them, else a local app registering the same functions.
`python -m tests.kvdiag.regress_cli ...` runs it as a subprocess."""

from __future__ import annotations

import sys

import typer


def wired() -> bool:
    from kvdiag.cli import app

    return any(c.name == "regress" for c in app.registered_commands)


def make_app() -> typer.Typer:
    if wired():
        from kvdiag.cli import app

        return app
    from kvdiag.cli import export, regress

    app = typer.Typer(pretty_exceptions_enable=False, add_completion=False)
    app.command("regress")(regress.regress)
    app.add_typer(regress.baseline_app, name="baseline")
    app.command("history")(regress.history)
    app.command("export")(export.export)
    app.command("exporter")(export.exporter)
    return app


def command(*args: str) -> list[str]:
    """argv for a real subprocess running `kvdiag ARGS...`."""
    module = "kvdiag" if wired() else "tests.kvdiag.regress_cli"
    return [sys.executable, "-m", module, *args]


if __name__ == "__main__":
    make_app()()
