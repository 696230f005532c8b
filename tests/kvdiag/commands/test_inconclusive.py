"""A run that never reached the trigger is inconclusive in every consumer: exit code 2, and
"inconclusive" in the console, the JSON, the history, the JUnit XML, the Prometheus export
and the page; never "pass". Three such runs: regress against reference:buggy on a case whose
pool never recycles, regress against a live server (`kvdiag serve`) with a pool too big to
recycle, and a fleet cell against that server."""

from __future__ import annotations

import json
import re
import sqlite3
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest

from tests.kvdiag.commands.test_regress import TINY
from tests.kvdiag.schema_util import assert_valid_summary
from tests.kvdiag.serving import served

pytestmark = pytest.mark.e2e  # starts a server, a CLI subprocess or a browser

# TINY with a pool big enough that nothing is ever recycled (and no probe pressure)
BIG_POOL = TINY.replace("  - name: trigger\n", "  - name: trigger\n    condition: big-pool\n")


def _kvdiag(*args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kvdiag", *args], capture_output=True, text=True,
                          timeout=timeout)


def _regress(tmp_path, target: str, *extra: str, json_out: bool = False):
    (tmp_path / "big.yaml").write_text(BIG_POOL)
    out = tmp_path / ("run-json" if json_out else "run")
    return out, _kvdiag("regress", "--suite", str(tmp_path / "big.yaml"), "--target", target,
                        "--history", str(tmp_path / "h.sqlite"), "--baseline", str(tmp_path / "b.json"),
                        "--junit", str(tmp_path / f"{out.name}.xml"), "--out", str(out), *extra,
                        *(["--json"] if json_out else []))


def _assert_inconclusive_everywhere(tmp_path, out, console, as_json) -> None:
    assert console.returncode == 2, console.stderr[-2000:]
    assert "INCONCLUSIVE" in console.stdout and "PASS" not in console.stdout
    assert as_json.returncode == 2, as_json.stderr[-2000:]
    data = json.loads(as_json.stdout)
    assert data["verdict"] == "inconclusive" and data["run_id"]
    assert "trigger" in data["reason"] and "not reached" in data["reason"]
    summary = assert_valid_summary(out, "regress")
    assert summary["verdict"] == summary["regress"]["verdict"] == "inconclusive"
    with sqlite3.connect(tmp_path / "h.sqlite") as con:
        verdicts = [r[0] for r in con.execute("SELECT verdict FROM runs")]
    assert verdicts == ["inconclusive", "inconclusive"]
    history = _kvdiag("history", "--history", str(tmp_path / "h.sqlite"), "--json")
    assert {r["verdict"] for r in json.loads(history.stdout)} == {"inconclusive"}
    suite = ET.parse(tmp_path / "run.xml").getroot().find("testsuite")
    skipped = suite.findall(".//skipped")
    assert suite.get("skipped") == "1" and len(skipped) == 1 and "inconclusive" in skipped[0].get("message")
    assert suite.get("failures") == "0" and suite.get("errors") == "0"
    prom = _kvdiag("export", "--history", str(tmp_path / "h.sqlite"), "--textfile", str(tmp_path / "prom"))
    assert prom.returncode == 0, prom.stderr
    text = (tmp_path / "prom" / "kvdiag.prom").read_text()
    assert re.search(r'kvdiag_run_verdict\{[^}]*verdict="inconclusive"\} 1\.0', text)
    assert re.search(r'kvdiag_run_verdict\{[^}]*verdict="pass"\} 0\.0', text)
    assert re.search(r"kvdiag_regress_passed\{[^}]*\} 0\.0", text)
    page = (out / "report.html").read_text()
    assert re.search(r'<span class="badge">INCONCLUSIVE</span>', page)
    assert ">PASS<" not in page and 'class="badge">PASS' not in page


@pytest.mark.slow  # 18-28 s on 2 cores: make test stays near 400 s
def test_regress_against_a_buggy_allocator_whose_pool_never_recycles(tmp_path):
    out, console = _regress(tmp_path, "reference:buggy")
    _, as_json = _regress(tmp_path, "reference:buggy", json_out=True)
    _assert_inconclusive_everywhere(tmp_path, out, console, as_json)
    _assert_no_baseline_without_force(tmp_path, out)


def _assert_no_baseline_without_force(tmp_path, out) -> None:
    """A run that proved nothing never becomes a baseline silently: exit 2 without --force;
    with it, the baseline is kept and the history records that it was forced."""
    args = ("baseline", "update", str(out), "--baseline", str(tmp_path / "b.json"),
            "--history", str(tmp_path / "h.sqlite"))
    refused = _kvdiag(*args)
    assert refused.returncode == 2 and "inconclusive, not pass" in refused.stderr, refused.stderr
    assert "Traceback" not in refused.stderr and not (tmp_path / "b.json").exists()
    forced = _kvdiag(*args, "--force")
    assert forced.returncode == 0, forced.stderr
    with sqlite3.connect(tmp_path / "h.sqlite") as con:
        rows = con.execute("SELECT verdict, forced FROM baselines").fetchall()
    assert rows == [("inconclusive", 1)]


@pytest.mark.slow  # over 30 s on 2 cores
def test_regress_against_a_live_server_that_never_recycles(tmp_path):
    with served("--allocator", "guarded", "--max-model-len", "2048", "--num-blocks", "3000",
                timeout=600) as (url, _):
        out, console = _regress(tmp_path, url, "--model", "canary")
        _, as_json = _regress(tmp_path, url, "--model", "canary", json_out=True)
    _assert_inconclusive_everywhere(tmp_path, out, console, as_json)
    summary = assert_valid_summary(out, "regress")
    assert summary["recycling"]["observed"] is False and summary["recycling"]["pressure_sessions"] == 0
    assert summary["ground_truth"]["contaminated"] == 0  # the ground truth itself was sound
