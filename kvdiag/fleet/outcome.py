"""One fleet cell's outcome: its verdict (a Verdict in the process), the worst metric or the
error, and where its run is. cells.jsonl keeps it as `status`, the verdict in capitals (PASS,
FAIL, INCONCLUSIVE, ERROR), as the fleet page and earlier fleet runs read it; the verdict is
parsed back only when a later process reads that file."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from kvdiag.verdicts import Verdict


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
        """A line of cells.jsonl, written by this or an earlier driver."""
        fields = {k: v for k, v in data.items() if k != "status"}
        return cls(**fields, verdict=Verdict.parse(data["status"]))
