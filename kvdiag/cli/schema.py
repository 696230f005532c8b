"""kvdiag schema: the JSON schema of summary.json, every kind of run (docs/summary.schema.json)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from kvdiag.cli.common import Output, handle_errors


@handle_errors
def schema(
    out: Annotated[Path | None, typer.Option("-o", "--out", show_default=False, help="Write it to "
                                             "this file instead of stdout.")] = None,
) -> None:
    """Print the JSON schema (draft 2020-12) that every run's summary.json validates against:
    reproduce, verify, probe, audit, isolation, regress (a fleet cell too) and the detection
    matrix, each naming itself in `kind`. Fields may be added between versions, none renamed.

    Example: kvdiag schema --out summary.schema.json
    """
    from kvdiag.record.kinds import json_schema

    text = json.dumps(json_schema(), indent=2) + "\n"
    if out is None:
        Output().out.print(text, markup=False, end="", soft_wrap=True)
        return
    out.write_text(text)
    Output().info(f"wrote {out}")
