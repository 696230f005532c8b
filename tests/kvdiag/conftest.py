import json

import pytest


@pytest.fixture(scope="session")
def reproduce_run(tmp_path_factory):
    """One real `kvdiag reproduce` (default suite and case, buggy and guarded on the canary),
    shared by the reproduce and report tests: (run directory, summary)."""
    from typer.testing import CliRunner

    from kvdiag.cli import app

    out = tmp_path_factory.mktemp("reproduce")
    result = CliRunner().invoke(app, ["reproduce", "--out", str(out), "--json"])
    assert result.exit_code == 0, result.output
    return out, json.loads(result.stdout)
