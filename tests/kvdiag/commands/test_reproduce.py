"""kvdiag reproduce and verify on the bundled suite and canary: guarded flat, buggy
decaying, and the gate's exit codes (CliRunner and a real subprocess)."""

from __future__ import annotations

import re
import subprocess
import sys

import pandas as pd
import pytest
from typer.testing import CliRunner

from kvdiag.cli import app

pytestmark = pytest.mark.e2e  # starts a server, a CLI subprocess or a browser


@pytest.fixture(scope="module")
def reproduced(reproduce_run):
    return reproduce_run


def _series(summary, name, key):
    rows = sorted((r for r in summary["rounds"] if r["case"] == "trigger" and r["allocator"] == name),
                  key=lambda r: r["round"])
    return [r[key] for r in rows]


def test_guarded_is_flat_and_buggy_decays(reproduced):
    out, summary = reproduced
    assert summary["verdict"] == "pass" and summary["gates"]["trigger/guarded"]["passed"]
    assert _series(summary, "guarded", "fact_check_pass_rate") == [1.0] * 12
    assert _series(summary, "guarded", "bleu4") == [100.0] * 12
    assert _series(summary, "guarded", "attention_leakage") == [0.0] * 12
    assert set(_series(summary, "guarded", "foreign_slots")) == {0}
    fact = _series(summary, "buggy", "fact_check_pass_rate")
    leak = _series(summary, "buggy", "attention_leakage")
    assert sum(fact[-4:]) / 4 < sum(fact[:4]) / 4  # fact-check falls
    assert sum(leak[-4:]) / 4 > sum(leak[:4]) / 4 > 0  # leakage rises
    assert summary["sqdr"]["buggy"] > 0.01
    assert summary["faults"]["trigger/buggy"]
    assert summary["brai"]["guarded"] == 0.0


def test_run_directory_contract(reproduced):
    out, summary = reproduced
    for key in ("signature", "suite", "verdict", "rounds", "sqdr", "brai", "wall_seconds"):
        assert key in summary
    assert summary["signature"].startswith("kvdiag:") and "|alloc:buggy,guarded|bs:16|" in summary["signature"]
    for r in summary["rounds"]:
        for key in ("block_reuse_rate", "fact_check_pass_rate"):
            assert r[key] is None or 0.0 <= r[key] <= 1.0
        assert r["bleu4"] is None or 0.0 <= r["bleu4"] <= 100.0
        for key in ("target", "allocator", "round", "attention_leakage", "foreign_slots", "guard_rejections"):
            assert key in r
    frame = pd.read_parquet(out / "results.parquet")
    assert len(frame) == 3 * 16 * 12  # contiguous, buggy, guarded x sessions x rounds
    assert (out / "report.html").stat().st_size > 0


def test_the_summary_validates_against_the_published_schema(reproduced):
    from tests.kvdiag.schema_util import assert_valid_summary

    out, _ = reproduced
    summary = assert_valid_summary(out, "reproduce")
    assert summary["reason"] and summary["recycled"]["trigger"]["guarded"] > 0


def test_results_describe_themselves(reproduced):
    """summary.json carries its schema version, its kind and the environment it ran in;
    results.parquet carries the signature in its metadata."""
    import pyarrow.parquet as pq

    out, summary = reproduced
    assert summary["schema_version"] >= 2 and summary["kind"] == "reproduce"
    env = summary["environment"]
    assert env["packages"]["kvdiag"] and env["packages"]["torch"] and env["python"]
    meta = pq.read_schema(out / "results.parquet").metadata
    assert meta[b"kvdiag.signature"].decode() == summary["signature"]


def test_a_trigger_not_reproduced_is_no_pass(tmp_path):
    """A faulty allocator that shows nothing under a case too small to recycle: the run
    proves nothing, so the verdict is inconclusive (exit 2), never PASS."""
    from tests.kvdiag.commands.test_regress import TINY

    suite = tmp_path / "tiny.yaml"
    suite.write_text(TINY)
    result = CliRunner().invoke(app, ["reproduce", "--suite", str(suite), "--allocator", "buggy",
                                      "--out", str(tmp_path / "run")])
    assert result.exit_code == 2, result.output
    assert "INCONCLUSIVE" in result.output and "NOT reproduced" in result.output
    assert "PASS" not in result.output
    import json

    assert json.loads((tmp_path / "run" / "summary.json").read_text())["verdict"] == "inconclusive"


@pytest.mark.slow  # over 30 s on 2 cores
def test_verify_catches_stale_bytes_in_process(tmp_path):
    """Fault class 2 (stale bytes read where nothing was written) fails the guard gate, in
    process on the smoke suite; the slow test below runs the rest of the gate matrix."""
    nan = CliRunner().invoke(app, ["verify", "--expect-guard", "--allocator", "stale-bytes", "--suite",
                                   "smoke", "--out", str(tmp_path / "c")])
    assert nan.exit_code == 1, nan.output
    assert "nonfinite_logits" in nan.output


@pytest.mark.slow  # ~120 s: three more verifies; the subprocess test below gates guarded
def test_verify_gates_with_cli_runner(tmp_path):
    """The rest of the gate matrix in-process, on the smoke suite (the same trigger at
    1k-token histories)."""
    runner = CliRunner()
    smoke = ["--suite", "smoke"]
    ok = runner.invoke(app, ["verify", "--expect-guard", "--allocator", "guarded", *smoke, "--out", str(tmp_path / "a")])
    assert ok.exit_code == 0, ok.output
    assert "PASS" in ok.output
    bad = runner.invoke(app, ["verify", "--expect-guard", "--allocator", "buggy", *smoke, "--out", str(tmp_path / "b")])
    assert bad.exit_code == 1, bad.output
    assert "failing rounds" in bad.output and "foreign_slots" in bad.output
    control = runner.invoke(app, ["verify", "--expect-bug", "--allocator", "buggy", *smoke, "--out", str(tmp_path / "d")])
    assert control.exit_code == 0, control.output


def _kvdiag(*args):
    return subprocess.run([sys.executable, "-m", "kvdiag", *args], capture_output=True, text=True,
                          timeout=900)


@pytest.mark.slow  # 18-28 s on 2 cores: make test stays near 400 s
def test_verify_as_a_subprocess(tmp_path):
    """The real command, its log lines and exit codes (smoke suite; the slow tests run buggy
    and the default suite)."""
    ok = _kvdiag("verify", "--expect-guard", "--allocator", "guarded", "--suite", "smoke",
                 "--out", str(tmp_path / "a"))
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "Using SequenceGuard for block allocation." in ok.stderr
    assert "PagedAttention enabled with block size 16." in ok.stderr
    from tests.kvdiag.schema_util import assert_valid_summary

    summary = assert_valid_summary(tmp_path / "a", "verify")
    assert summary["gate"]["passed"] and summary["run_verdict"] == "pass"
    usage = _kvdiag("verify", "--expect-guard", "--suite", str(tmp_path / "missing.yaml"))
    assert usage.returncode == 2 and "no such suite" in usage.stderr
    both = _kvdiag("verify", "--expect-guard", "--expect-bug")
    assert both.returncode == 2


@pytest.mark.slow
@pytest.mark.parametrize("args,code", [
    (("--expect-guard", "--allocator", "guarded"), 0),
    (("--expect-guard", "--allocator", "buggy"), 1),
    (("--expect-guard", "--allocator", "stale-bytes"), 1),
    (("--expect-bug", "--allocator", "buggy"), 0),
])
def test_verify_gates_on_the_default_suite_as_a_subprocess(tmp_path, args, code):
    run = _kvdiag("verify", *args, "--out", str(tmp_path / "v"))
    assert run.returncode == code, run.stdout + run.stderr


def test_check_integrity_stops_buggy_at_its_first_stale_entry(tmp_path):
    """--check-integrity checks the allocator after every engine step: the stale-hash fault
    stops the run at its first stale entry, one line naming the block and its generations,
    exit 1, and no run directory is left behind."""
    run = _kvdiag("reproduce", "--suite", "smoke", "--allocator", "buggy", "--check-integrity",
                  "--out", str(tmp_path / "run"))
    assert run.returncode == 1, run.stdout + run.stderr
    errors = [line for line in run.stderr.splitlines() if line.startswith("error")]
    assert len(errors) == 1 and "Traceback" not in run.stderr
    assert re.search(r"stale hash entry \w+: block \d+ was cached at generation \d+ .* "
                     r"\(now generation \d+\)", errors[0]), errors[0]
    assert not list(tmp_path.iterdir())


@pytest.mark.slow  # ~3 min: three allocators on the default case with the check on
def test_check_integrity_on_the_default_case(tmp_path):
    clean = _kvdiag("reproduce", "--allocator", "guarded,prefix-cache", "--check-integrity",
                    "--out", str(tmp_path / "clean"))
    assert clean.returncode == 0, clean.stdout + clean.stderr
    buggy = _kvdiag("reproduce", "--allocator", "buggy", "--check-integrity", "--out", str(tmp_path / "b"))
    assert buggy.returncode == 1 and "stale hash entry" in buggy.stderr, buggy.stderr[-2000:]


@pytest.mark.slow  # 18-28 s on 2 cores: make test stays near 400 s
def test_allocators_side_by_side_give_what_they_give_in_turn(monkeypatch):
    """On CPU run_case runs the allocators in threads, each single-threaded: every record and
    each allocator's engine log equal those of a run in turn (KVDIAG_ALLOCATOR_WORKERS=1)."""
    from kvdiag.runners.reference.engine import allocator_workers, run_case

    plan, checkpoint = _smoke_trigger()
    names = ["buggy", "guarded"]

    def run(workers: str):
        monkeypatch.setenv("KVDIAG_ALLOCATOR_WORKERS", workers)
        assert allocator_workers(names, "cpu") == int(workers)
        return run_case(plan, checkpoint, names)

    apart, together = run("1"), run("2")
    assert [r.as_dict() for r in together.records] == [r.as_dict() for r in apart.records]
    assert together.engine_log == apart.engine_log
    assert any("SequenceGuard" in line for line in together.engine_log["guarded"])
    assert not any("SequenceGuard" in line for line in together.engine_log["buggy"])
    assert any(r.foreign_slots for r in together.records if r.allocator == "buggy")  # corruption seen


def test_a_failing_allocator_stops_the_others_and_its_error_is_raised(monkeypatch):
    """Side by side, buggy under --check-integrity raises at its first stale entry; guarded,
    beside it, stops at its next step instead of running to the end, and the error raised is
    buggy's own."""
    from kvdiag.runners.reference.engine import run_case
    from reference_engine.errors import IntegrityError

    plan, checkpoint = _smoke_trigger()
    monkeypatch.setenv("KVDIAG_ALLOCATOR_WORKERS", "2")
    finished = []
    with pytest.raises(IntegrityError, match="stale hash entry"):
        run_case(plan, checkpoint, ["buggy", "guarded"], progress=finished.append,
                 check_integrity=True)
    turns = sum(len(s.rounds) for s in plan.sessions)
    # the contiguous reference's turns, then fewer than a whole run of either allocator
    assert turns <= len(finished) < 2 * turns


def _smoke_trigger():
    from kvdiag.paths import CANARY
    from kvdiag.planning.plan import plan_case
    from kvdiag.planning.suites import load_cases
    from reference_engine.loader import load_checkpoint

    suite, (case,) = load_cases("smoke", ["trigger"])
    checkpoint = load_checkpoint(CANARY)
    return plan_case(suite, case, checkpoint.tokenizer), checkpoint
