"""load_summary, every reader's one way into summary.json: real runs of the reference engine
(a few seconds' suite) load as the class of their kind, verdicts as Verdicts; the two regress
kinds, which both write kind "regress", are told apart; a bad or missing field is named with
its file; a summary written before schema 3's fields still loads; and no module of kvdiag
reads a summary as a raw dict."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError
from typer.testing import CliRunner

import kvdiag
from kvdiag.errors import KvdiagError
from kvdiag.record.kinds import parse_summary
from kvdiag.record.rundir import load_summary
from kvdiag.record.summary import (
    RegressReferenceSummary,
    ReproduceSummary,
    VerifySummary,
)
from kvdiag.verdicts import Verdict
from tests.kvdiag.commands.test_regress import TINY
from tests.kvdiag.regress_cli import make_app


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """One real run of each kind the reference engine makes in seconds: kind -> run directory."""
    d = tmp_path_factory.mktemp("kinds")
    suite = d / "tiny.yaml"
    suite.write_text(TINY)
    argv = {"reproduce": ["reproduce", "--suite", str(suite)],
            "verify": ["verify", "--expect-guard", "--allocator", "guarded", "--suite", str(suite)],
            "regress": ["regress", "--suite", str(suite), "--target", "reference:guarded",
                        "--history", str(d / "history.sqlite"), "--baseline", str(d / "b.json")]}
    for kind, args in argv.items():
        result = CliRunner().invoke(make_app(), [*args, "--out", str(d / kind)])
        assert result.exit_code == 0, result.output
    return {kind: d / kind for kind in argv}


@pytest.mark.parametrize(("kind", "cls"), [("reproduce", ReproduceSummary), ("verify", VerifySummary),
                                           ("regress", RegressReferenceSummary)])
def test_a_real_run_loads_as_the_class_of_its_kind(runs, kind, cls):
    summary = load_summary(runs[kind])
    assert type(summary) is cls and summary.kind == kind
    assert summary.verdict is Verdict.PASS
    assert json.loads(summary.to_json()) == json.loads((runs[kind] / "summary.json").read_text())


def test_the_regress_kinds_are_told_apart_by_what_a_probe_writes(runs):
    data = json.loads((runs["regress"] / "summary.json").read_text())
    assert data["kind"] == "regress" and load_summary(runs["regress"]).regress.verdict is Verdict.PASS
    with pytest.raises(ValidationError) as probe:  # `style`: validated as the live kind, not this one
        parse_summary(data | {"style": "canary"})
    assert {e["loc"][0] for e in probe.value.errors()} == {"regress-probe"}


def _written(tmp_path: Path, data: dict) -> Path:
    (tmp_path / "summary.json").write_text(json.dumps(data))
    return tmp_path


@pytest.mark.parametrize(("change", "named"), [
    ({"verdict": "maybe"}, "verdict: Input should be 'pass'"),
    ({"wall_seconds": "slow"}, "wall_seconds"),
    ({"rounds": [{"round": "first"}]}, "rounds.0.target: Field required"),
    ({"kind": "nonsense"}, "kind: `kind` missing or unknown"),
    ({"model": None}, "model: Input should be a valid string"),
    ({"unheard_of": 1}, "unheard_of: Extra inputs are not permitted")])
def test_a_bad_field_is_named_with_its_file(runs, tmp_path, change, named):
    data = json.loads((runs["reproduce"] / "summary.json").read_text())
    with pytest.raises(KvdiagError) as bad:
        load_summary(_written(tmp_path, data | change))
    assert str(tmp_path / "summary.json") in str(bad.value) and named in str(bad.value)


def test_a_missing_file_or_kind_is_named(runs, tmp_path):
    with pytest.raises(KvdiagError, match="summary.json: not found"):
        load_summary(tmp_path)
    data = json.loads((runs["reproduce"] / "summary.json").read_text())
    del data["kind"]
    with pytest.raises(KvdiagError, match="kind: `kind` missing or unknown"):
        load_summary(_written(tmp_path, data))


def test_a_summary_older_than_its_fields_still_loads(runs, tmp_path):
    """Schema 3 added `reason` and `recycled` (kvdiag.record.summary): a schema 2 file lacks them."""
    data = json.loads((runs["reproduce"] / "summary.json").read_text())
    for added in ("reason", "recycled"):
        del data[added]
    old = load_summary(_written(tmp_path, data | {"schema_version": 2}))
    assert type(old) is ReproduceSummary and old.reason == "" and old.recycled == {}


def test_no_module_reads_a_summary_as_a_raw_dict():
    root = Path(kvdiag.__file__).parent
    texts = {p.relative_to(root): p.read_text(encoding="utf-8") for p in sorted(root.rglob("*.py"))}
    raw = [str(p) for p, text in texts.items() if "summary.get(" in text or "read_summary(" in text]
    assert raw == [], "read summary.json with kvdiag.record.rundir.load_summary"
