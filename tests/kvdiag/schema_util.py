"""Validate a run's summary.json against the published schema (docs/summary.schema.json),
with a JSON-schema validator that is not kvdiag's own code (jsonschema_rs), and check that
its signature names the model with a digest."""

from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path

SCHEMA = Path(__file__).resolve().parents[2] / "docs" / "summary.schema.json"
DIGEST = re.compile(r"\|model:[^|]*[-@][0-9a-f]{8}\|")  # <dir>-<sha8>, <name>@<sha8>, trace-<sha8>


@cache
def _validator():
    import jsonschema_rs

    return jsonschema_rs.validator_for(json.loads(SCHEMA.read_text()))


def assert_valid_summary(run_dir: Path, kind: str) -> dict:
    summary = json.loads((Path(run_dir) / "summary.json").read_text())
    errors = [str(e) for e in _validator().iter_errors(summary)]
    assert not errors, f"{run_dir}/summary.json ({kind}): " + "; ".join(errors[:3])
    assert summary["kind"] == kind, summary["kind"]
    assert DIGEST.search(summary["signature"]), summary["signature"]
    return summary
