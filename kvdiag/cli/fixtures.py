"""kvdiag fixtures: build the bundled files (the canary model)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from kvdiag.cli.common import Output, handle_errors

app = typer.Typer(help="Build the bundled fixtures (the canary model).", no_args_is_help=True)


@app.command("build-canary")
@handle_errors
def build_canary(
    out: Annotated[Path, typer.Option("--out", help="Directory to write the checkpoint into.")] = Path("fixtures/canary"),
) -> None:
    """Build the canary checkpoint deterministically (two builds are byte-identical) and print
    each file's sha256."""
    from kvdiag.canary.build import build_canary as build

    console = Output().out
    for name, digest in build(out).items():
        console.print(f"{digest}  {out / name}")
