"""Baseline files: what a known-good run measured, keyed by engine, engine version, model
hash, flags and suite (kvdiag.regress.keys). One JSON file may hold several baselines (one
per key: a fleet of engines, several suites); teams commit it beside their CI config.

    {"schema": 1, "baselines": [{"key": {...}, "key_id": "3f2a...", "target": "...",
      "run_id": "...", "created": "...", "signature": "...", "cases": [...],
      "measurement": {case: {...}}}]}     (measurement: kvdiag.regress.measure.measure)

Each entry loads into StoredBaseline, its measurement into the summary's CaseMeasurement and
RoundMeasurement (kvdiag.record.summary_rows): a file written before those models existed
has the same keys and loads as it is.

A lookup that finds baselines of the suite but none with the run's key raises
KeyMismatch (exit 2): a run is never compared with a baseline of another engine, version,
model or flag set.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

from kvdiag.errors import KvdiagError
from kvdiag.record.rundir import load_summary, require_finished
from kvdiag.record.summary import RegressRun
from kvdiag.record.summary_rows import CaseMeasurement
from kvdiag.regress.keys import BaselineKey
from kvdiag.verdicts import Verdict

SCHEMA = 1
DEFAULT_PATH = Path("reports/baselines.json")


class KeyMismatch(KvdiagError):
    """The baseline file holds baselines of this suite, but none with the run's key."""

    def __init__(self, path: Path, key: BaselineKey, nearest: BaselineKey, differences: list[str]):
        self.path, self.key, self.nearest, self.differences = path, key, nearest, differences
        super().__init__(f"{path}: no baseline of suite {key.suite} with this run's key "
                         f"({'; '.join(differences)}); compare nothing, record a new baseline "
                         "with `kvdiag baseline update RUN_DIR` if the change is intended")


class StoredBaseline(BaseModel):
    """One baseline as the file holds it (key_id is derived from the key, so not read back;
    other keys are ignored, as they always were)."""

    model_config = ConfigDict(extra="ignore")
    key: dict
    target: str
    run_id: str
    created: str
    signature: str = ""
    cases: list[str]
    measurement: dict[str, CaseMeasurement]


@dataclass(frozen=True)
class Baseline:
    key: BaselineKey
    target: str
    run_id: str
    created: str
    signature: str
    cases: tuple[str, ...]
    measurement: dict[str, CaseMeasurement]

    def as_dict(self) -> dict:
        return {"key": self.key.as_dict(), "key_id": self.key.id, "target": self.target,
                "run_id": self.run_id, "created": self.created, "signature": self.signature,
                "cases": list(self.cases),
                "measurement": {c: m.model_dump() for c, m in self.measurement.items()}}

    @classmethod
    def from_dict(cls, data: dict) -> Baseline:
        """A file's entry; pydantic's ValidationError names what is wrong with it."""
        stored = StoredBaseline.model_validate(data)
        return cls(BaselineKey.from_dict(stored.key), stored.target, stored.run_id, stored.created,
                   stored.signature, tuple(stored.cases), stored.measurement)


def load(path: Path) -> list[Baseline]:
    """Every baseline in the file; [] when it does not exist. KvdiagError names a bad file."""
    path = Path(path)
    if not path.exists():
        return []
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if data.get("schema") != SCHEMA:
            raise KvdiagError(f"{path}: baseline schema {data.get('schema')!r}, this kvdiag reads {SCHEMA}")
        return [Baseline.from_dict(b) for b in data["baselines"]]
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(map(str, first["loc"]))
        raise KvdiagError(f"{path}: not a kvdiag baseline file ({where}: {first['msg']})") from None
    except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as e:
        raise KvdiagError(f"{path}: not a kvdiag baseline file ({type(e).__name__}: {e})") from None


def save(path: Path, baselines: list[Baseline]) -> None:
    """Written to a temporary name and renamed: a kill never leaves half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"schema": SCHEMA, "baselines": [b.as_dict() for b in baselines]},
                              indent=1, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def find(path: Path, key: BaselineKey, cases: list[str]) -> Baseline | None:
    """The baseline with exactly `key`; None when the file has none of the suite; raises
    KeyMismatch when it has some of the suite but none with this key, or one that lacks a
    case of the run."""
    same_suite = [b for b in load(path) if b.key.suite == key.suite]
    if not same_suite:
        return None
    for b in same_suite:
        if b.key == key:
            missing = [c for c in cases if c not in b.cases]
            if missing:
                raise KeyMismatch(path, key, b.key, [f"cases: baseline {', '.join(b.cases)}, "
                                                     f"run {', '.join(cases)}"])
            return b
    nearest = min(same_suite, key=lambda b: len(b.key.differences(key)))
    raise KeyMismatch(path, key, nearest.key, nearest.key.differences(key))


def from_run(run_dir: Path, force: bool = False) -> tuple[Baseline, Verdict]:
    """A baseline from a run directory made by `kvdiag regress` (its summary.json carries
    the key and the measurement), and the run's verdict. Only a run that passed proves what a
    baseline must be (its trigger reached, its ground truth sound): any other verdict is
    refused unless `force`."""
    summary = load_summary(require_finished(run_dir))
    if not isinstance(summary, RegressRun):
        raise KvdiagError(f"{run_dir}: not made by `kvdiag regress` (a {summary.kind} run: its "
                          "summary.json has no baseline key)")
    regress, verdict = summary.regress, summary.verdict
    if verdict is not Verdict.PASS and not force:
        why = (regress.ground_truth_failures or [summary.reason or "no reason recorded"])[0]
        raise KvdiagError(f"{run_dir}: the run's verdict is {verdict.value}, not pass ({why}): a "
                          "baseline must come from a run that proved something; pass --force to "
                          "use it anyway (recorded in the history)")
    return Baseline(BaselineKey.from_dict(regress.key.model_dump()), regress.target, regress.run_id,
                    summary.created or "", summary.signature, tuple(regress.measurement),
                    dict(regress.measurement)), verdict


def update(path: Path, baseline: Baseline) -> tuple[Baseline | None, int]:
    """Store `baseline`, replacing the one with the same key; returns (replaced, count)."""
    kept, replaced = [], None
    for b in load(path):
        if b.key == baseline.key:
            replaced = b
        else:
            kept.append(b)
    kept.append(baseline)
    save(path, kept)
    return replaced, len(kept)
