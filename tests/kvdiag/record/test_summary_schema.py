"""The published schema of summary.json is the one the code builds, and it can fail: a
summary with a renamed or missing contract field, or a verdict outside the four, does not
validate. (Each kind of run validates its own summary.json in its own test module, through
tests/kvdiag/schema_util.py: reproduce, verify, probe, audit, isolation, regress, a fleet
cell, the detection matrix.)"""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from kvdiag.cli import app
from kvdiag.record.kinds import json_schema
from tests.kvdiag.schema_util import SCHEMA, _validator


def test_the_published_schema_is_the_one_the_code_builds():
    assert json.loads(SCHEMA.read_text()) == json_schema(), "rerun: kvdiag schema --out docs/summary.schema.json"


def test_kvdiag_schema_prints_it():
    result = CliRunner().invoke(app, ["schema"])
    assert result.exit_code == 0 and json.loads(result.stdout) == json_schema()


def _minimal() -> dict:
    return {"kind": "isolation", "signature": "kvdiag:0.1.0|engine:e|alloc:isolation|bs:16|"
            "model:canary-397f8e10|suite:isolation|seed:0", "suite": "isolation",
            "verdict": "inconclusive", "reason": "r", "target": "http://x", "model": "canary",
            "requests": 0, "leaks": [], "isolation": {}, "wall_seconds": 1.0}


@pytest.mark.parametrize("change", [
    {}, {"verdict": "PASS?"}, {"verdict": "maybe"}, {"wall_seconds": "slow"}, {"leaks": None}])
def test_the_schema_can_fail(change):
    summary = _minimal() | change
    errors = list(_validator().iter_errors(summary))
    assert bool(errors) == bool(change), errors


def test_a_missing_contract_field_does_not_validate():
    summary = _minimal()
    del summary["signature"]
    assert list(_validator().iter_errors(summary))
