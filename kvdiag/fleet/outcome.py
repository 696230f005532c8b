"""One fleet cell's outcome: its verdict (a Verdict in the process), the worst metric or the
error, and where its run is. cells.jsonl keeps it as `status`, the verdict in capitals (PASS,
FAIL, INCONCLUSIVE, ERROR), as the fleet page and earlier fleet runs read it; the verdict is
parsed back only when a later process reads that file."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from kvdiag.verdicts import Verdict

CELLS_FILE = "cells.jsonl"


@dataclass
class Outcome:
    cell: str
    target: str
    spec: str
    suite: str
    case: str
    verdict: Verdict
    worst: str  # the worst metric (FAIL: the regressed metric and rounds), or the error
    run_dir: str | None = None
    run_id: str | None = None
    seconds: float | None = None
    resumed: bool = False  # finished by an earlier driver
    events: str | None = None  # a live cell's coverage beside its verdict: "7/8 events (no X)"

    @property
    def status(self) -> str:
        """The verdict as cells.jsonl, the page and the console show it: PASS, FAIL, ..."""
        return self.verdict.value.upper()

    def record(self) -> dict:
        """The JSON line of cells.jsonl (fleet.json's cells too): `status` where the verdict is."""
        return {("status" if k == "verdict" else k): (self.status if k == "verdict" else v)
                for k, v in asdict(self).items()}

    @classmethod
    def from_record(cls, data: dict) -> Outcome:
        """A line of cells.jsonl, written by this or an earlier driver: an unknown key is
        ignored, a missing name reads as empty, a missing or unknown status as ERROR."""
        known = {f.name for f in fields(cls)} - {"verdict"}
        given = {k: v for k, v in data.items() if k in known}
        named = {k: "" for k in _NAMES if given.get(k) is None}
        return cls(**(given | named), verdict=Verdict.parse(data.get("status")))


_NAMES = ("cell", "target", "spec", "suite", "case", "worst")  # the str fields, "" when missing


def read_outcomes(run_dir: Path) -> dict[str, Outcome]:
    """{cell id: its last outcome} of RUN_DIR/cells.jsonl (the last line of a cell wins);
    empty when there is none yet."""
    path, last = Path(run_dir) / CELLS_FILE, {}
    for line in path.read_text().splitlines() if path.is_file() else []:
        if line.strip():
            o = Outcome.from_record(json.loads(line))
            last[o.cell] = o
    return last
