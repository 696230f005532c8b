"""kvdiag fleet run: the weekly job over a fleet of targets, fanned out over Ray. The fleet sits
above the command layer: each cell is a regress run (kvdiag.commands.regress).

    plan     FLEET.yaml checked entirely before Ray starts; the fleet's run directory
    measure  every cell not finished yet (kvdiag.fleet.driver.run_fleet: each cell a
             regress run, measured on a Ray worker and recorded here)
    judge    kvdiag.verdicts.judge_fleet over the cells' verdicts
    finish   fleet.html
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kvdiag.errors import KvdiagError
from kvdiag.fleet.driver import Outcome, run_fleet
from kvdiag.verdicts import Judgement, Verdict, judge_fleet


@dataclass
class FleetResult:
    """A finished fleet run, rendered and exited on like any run (kind, exit_code, as_json)."""
    run_dir: Path
    page: Path
    outcomes: list[Outcome]
    kind: str = "fleet"

    @property
    def judgement(self) -> Judgement:
        return judge_fleet(o.verdict for o in self.outcomes)

    @property
    def verdict(self) -> Verdict:
        return self.judgement.verdict

    @property
    def exit_code(self) -> int:
        """0 every cell passed; 1 a cell failed; 2 no cell failed but one proved nothing or
        could not be measured."""
        return self.verdict.exit_code

    def as_json(self) -> dict:
        return {"verdict": self.verdict.value, "reason": self.judgement.reason,
                "run_dir": str(self.run_dir), "page": str(self.page),
                "cells": [o.record() for o in self.outcomes]}


def fleet_run(fleet_file: Path, *, out: Path | None = None, resume: Path | None = None,
              ray_address: str | None = None, num_cpus: int | None = None,
              on_cell: Callable[[Outcome], None] = lambda o: None) -> FleetResult:
    """kvdiag fleet run, start to finish: FLEET.yaml checked entirely before Ray starts, the
    run directory (new, or the one to `resume`), every cell not finished yet, fleet.html."""
    from kvdiag.fleet.page import write_page
    from kvdiag.fleet.spec import load_fleet

    fleet = load_fleet(fleet_file)  # every error here, before Ray starts
    run_dir = resume if resume is not None else fleet_dir(out)
    outcomes = run_fleet(fleet, run_dir, resume=resume is not None, ray_address=ray_address,
                         num_cpus=num_cpus, on_cell=on_cell)
    return FleetResult(run_dir, write_page(run_dir), outcomes)


def fleet_dir(out: Path | None) -> Path:
    from datetime import datetime, timezone

    from kvdiag.paths import REPORTS

    if out is not None:
        if Path(out).exists() and any(Path(out).iterdir()):
            raise KvdiagError(f"--out {out}: already exists and is not empty (resume it with --resume)")
        return Path(out)
    return REPORTS / ("fleet-" + datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S"))


