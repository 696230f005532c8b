"""kvdiag fleet run / kvdiag fleet report: the weekly job across a fleet, over Ray."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from kvdiag.cli.common import JsonOpt, OutOpt, Output, ResumeOpt, handle_errors

app = typer.Typer(help="The weekly job across a fleet of targets, fanned out over Ray.",
                  no_args_is_help=True)


@app.command("run")
@handle_errors
def run(
    fleet_file: Annotated[Path, typer.Argument(help="FLEET.yaml: targets, their suites, cases and "
                                                    "concurrency (see docs/fleet.md).")],
    ray_address: Annotated[str | None, typer.Option("--ray-address", help="Join this Ray cluster "
                                                    "(e.g. ray://head:10001 or auto); default: start "
                                                    "Ray locally and stop it at the end.")] = None,
    num_cpus: Annotated[int | None, typer.Option("--num-cpus", min=1, help="Local Ray only: the "
                                                 "CPUs it may use (default: all).")] = None,
    resume: ResumeOpt = None,
    out_dir: OutOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Run every (target, suite, case) of FLEET.yaml as one Ray task; the driver records each
    cell (run directory, history row) as it finishes and writes fleet.html.

    The fleet file is checked entirely before Ray starts (unknown target scheme, duplicate
    target name, unknown suite or case: exit 2). A dead endpoint, a task that raises or
    runs past its time limit is an ERROR cell; the other cells complete. Exit code: 0 every
    cell passed; 1 a cell failed (regression or corruption); 2 no cell failed but one could
    not be measured.

    Example: kvdiag fleet run fleet.yaml --out reports/fleet-week48
    """
    from kvdiag.fleet.run import fleet_run

    out = Output(as_json)

    def show(o) -> None:
        if not as_json:
            out.info(f"{o.status:5} {o.cell}{' (finished earlier)' if o.resumed else ''}: {o.worst}")

    out.finish(fleet_run(fleet_file, out=out_dir, resume=resume, ray_address=ray_address,
                         num_cpus=num_cpus, on_cell=show))


@app.command("report")
@handle_errors
def report(
    run_dir: Annotated[Path, typer.Argument(help="A fleet run directory (kvdiag fleet run's).")],
) -> None:
    """Write RUN_DIR/fleet.html: targets x (suite, case), each cell PASS/FAIL/ERROR with its
    worst metric and a link to its report, and each target's trend from the history.

    Example: kvdiag fleet report reports/fleet-week48
    """
    from kvdiag.fleet.page import write_page

    Output().out.print(str(write_page(run_dir)))
