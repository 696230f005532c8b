"""FLEET_RUN/fleet.json, typed: the plan a fleet run was made from (the fleet file, the history,
the baseline, the targets and every cell with its id), written by the driver before any cell
runs and read back by the page. The JSON keys are the ones every earlier driver wrote, so an
existing run directory still renders; an unknown key is ignored.

    {"fleet": ..., "history": ..., "baseline": ...,
     "targets": [{"name", "spec", "kind"}],
     "cells": [{"target", "suite", "suite_name", "case", "id"}]}
"""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from kvdiag.errors import KvdiagError
from kvdiag.fleet.spec import Cell, Fleet, FleetTarget

PLAN_FILE = "fleet.json"


class _Record(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")


class PlanTarget(_Record):
    name: str
    spec: str
    kind: str  # "url", "reference" or "<engine>-local" (FleetTarget.kind)

    @classmethod
    def of(cls, t: FleetTarget) -> PlanTarget:
        return cls(name=t.name, spec=t.spec, kind=t.kind)


class PlanCell(_Record):
    """A Cell as the plan keeps it: its fields, then its id (the run directory's name)."""

    target: str
    suite: str
    suite_name: str
    case: str
    id: str

    @classmethod
    def of(cls, c: Cell) -> PlanCell:
        return cls(**c.model_dump(), id=c.id)


class FleetPlan(_Record):
    fleet: str  # the fleet file, resolved
    history: str
    baseline: str
    targets: list[PlanTarget]
    cells: list[PlanCell]

    @classmethod
    def of(cls, fleet: Fleet) -> FleetPlan:
        """The plan of a loaded fleet, its paths resolved."""
        return cls(fleet=str(fleet.path.resolve()), history=str(fleet.history.resolve()),
                   baseline=str(fleet.baseline.resolve()),
                   targets=[PlanTarget.of(t) for t in fleet.targets],
                   cells=[PlanCell.of(c) for c in fleet.cells])

    def save(self, run_dir: Path) -> Path:
        path = Path(run_dir) / PLAN_FILE
        path.write_text(json.dumps(self.model_dump(), indent=2) + "\n")  # as every driver wrote it
        return path

    @classmethod
    def load(cls, run_dir: Path) -> FleetPlan:
        """RUN_DIR/fleet.json; KvdiagError when it is missing or not a plan."""
        path = Path(run_dir) / PLAN_FILE
        if not path.is_file():
            raise KvdiagError(f"{run_dir}: not a fleet run (no {PLAN_FILE})")
        try:
            return cls.model_validate_json(path.read_text())
        except ValueError as e:  # pydantic's ValidationError is a ValueError
            raise KvdiagError(f"{path}: not a fleet plan ({str(e).splitlines()[0]})") from None
