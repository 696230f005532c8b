"""kvdiag fleet: a bad fleet file exits 2 before Ray starts; on a local Ray (2 CPUs, started
and stopped by each run) a fleet of a guarded `kvdiag serve`, a buggy one, a URL with nothing
listening and reference:guarded gives PASS / FAIL (rounds named) / ERROR / PASS, with one
history row per finished cell even though one cell's worker is killed mid-task (Ray runs it
again); a driver killed mid-run resumes without duplicate rows; the page shows the matrix."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvdiag.cli import app
from kvdiag.fleet.cell import PID_DIR_ENV, CellTimeout, _time_limit
from tests.kvdiag.commands.test_regress import TINY
from tests.kvdiag.serving import free_port, served, smoke_pool

pytestmark = pytest.mark.e2e  # starts a server, a CLI subprocess or a browser

needs_ray = pytest.mark.skipif(
    subprocess.run([sys.executable, "-c", "import ray"], capture_output=True).returncode != 0,
    reason="ray is not installed (pip install 'kvdiag[fleet]', or make test-fleet)")


def _fleet(d: Path, targets: list[dict], **top) -> Path:
    (d / "tiny.yaml").write_text(TINY)
    data = {"history": str(d / "history.sqlite"), "baseline": str(d / "baselines.json"),
            "time_limit": 600, **top, "targets": targets}
    (d / "fleet.yaml").write_text(json.dumps(data))  # JSON is YAML
    return d / "fleet.yaml"


def _fleet_run(fleet: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "kvdiag", "fleet", "run", str(fleet), "--num-cpus", "2", *args]


def _rows(history: Path) -> list[tuple]:
    with sqlite3.connect(history) as con:
        return con.execute("SELECT run_id, target, verdict, run_dir FROM runs").fetchall()


@pytest.mark.parametrize("target, message", [
    ({"name": "a", "target": "ftp://gpu-01", "suites": ["smoke"]}, "expected reference:ALLOCATOR"),
    ({"name": "a", "target": "reference:nosuch", "suites": ["smoke"]}, "nosuch"),
    ({"name": "a", "target": "reference:guarded", "suites": ["nosuchsuite"]}, "no such suite"),
    ({"name": "a", "target": "reference:guarded", "suites": [{"suite": "smoke", "cases": ["nope"]}]}, "nope"),
    ({"name": "a", "target": "http://127.0.0.1:1", "suites": ["smoke"]}, "model"),
    ({"name": "b", "target": "reference:guarded", "suites": ["smoke"]}, "duplicate target name 'b'"),
])
def test_a_bad_fleet_file_exits_2_before_ray_starts(tmp_path, target, message):
    fleet = _fleet(tmp_path, [{"name": "b", "target": "reference:guarded", "suites": ["smoke"]}, target])
    result = CliRunner().invoke(app, ["fleet", "run", str(fleet), "--out", str(tmp_path / "out")])
    assert result.exit_code == 2, result.output
    assert "error:" in result.output and message in result.output and "Traceback" not in result.output
    assert not (tmp_path / "out").exists()  # nothing started, nothing written


def test_every_cell_has_a_time_limit():
    with pytest.raises(CellTimeout, match="time limit of 0.2 s"), _time_limit(0.2, "x.tiny.trigger"):
        time.sleep(30)


@pytest.mark.slow
@needs_ray
def test_a_fleet_pass_fail_error_pass_with_a_worker_killed(tmp_path):
    pids = tmp_path / "pids"
    pids.mkdir()
    # the smoke suite on the smoke pool: the tiny suite does not always recycle a block on a
    # live server (it depends on when concurrent requests arrive), the smoke suite does
    buggy = ["--allocator", "buggy", "--num-blocks", str(smoke_pool()), "--max-num-seqs", "16",
             "--recycled-block-fill", "nan", "--max-model-len", "2048"]
    with served("--allocator", "guarded", "--max-model-len", "2048", timeout=600) as (good, _), \
            served(*buggy, timeout=600) as (bad, _):
        fleet = _fleet(tmp_path, [
            {"name": "good", "target": good, "model": "canary", "suites": ["tiny.yaml"]},
            {"name": "bad", "target": bad, "model": "canary", "suites": ["smoke"]},
            {"name": "dead", "target": f"http://127.0.0.1:{free_port()}", "model": "canary",
             "suites": ["tiny.yaml"]},
            {"name": "ref", "target": "reference:guarded", "suites": ["tiny.yaml"]}])
        out = tmp_path / "run"
        proc = subprocess.Popen(_fleet_run(fleet, "--out", str(out), "--json"), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=dict(os.environ, **{PID_DIR_ENV: str(pids)}))
        deadline = time.monotonic() + 600
        while not list(pids.glob("ref.tiny.trigger.*")):  # the reference cell's first attempt
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.2)
        first = next(pids.glob("ref.tiny.trigger.*"))
        os.kill(int(first.name.rsplit(".", 1)[1]), signal.SIGKILL)  # its Ray worker, mid-task
        stdout, stderr = proc.communicate(timeout=1200)
    assert proc.returncode == 1, stdout[-3000:] + stderr[-3000:]
    # Ray's raylet prints its notice of the killed worker on the driver's stdout before the JSON
    cells = {c["target"]: c for c in json.loads(stdout[stdout.index('{\n  "verdict"'):])["cells"]}
    assert {t: c["status"] for t, c in cells.items()} == {"good": "PASS", "bad": "FAIL", "dead": "ERROR",
                                                          "ref": "PASS"}
    assert "round" in cells["bad"]["worst"] and "cannot reach" in cells["dead"]["worst"]
    assert len(list(pids.glob("ref.tiny.trigger.*"))) == 2  # killed once, run again by Ray
    rows = _rows(tmp_path / "history.sqlite")
    assert sorted(r[1] for r in rows) == sorted([good, bad, "reference:guarded"])  # each once
    assert {r[3] for r in rows} == {cells[t]["run_dir"] for t in ("good", "bad", "ref")}
    report = CliRunner().invoke(app, ["fleet", "report", str(out)])
    assert report.exit_code == 0, report.output
    page = (out / "fleet.html").read_text()
    assert "<script" not in page and page.count("<b>PASS</b>") == 2 and "<b>ERROR</b>" in page
    assert 'href="ref.tiny.trigger/report.html"' in page and "<svg" in page


@pytest.mark.slow
@needs_ray
def test_a_driver_killed_mid_run_resumes_without_duplicate_rows(tmp_path):
    fleet = _fleet(tmp_path, [{"name": f"ref{i}", "target": "reference:guarded", "suites": ["tiny.yaml"],
                               "num_cpus": 1} for i in range(3)])
    out, history = tmp_path / "run", tmp_path / "history.sqlite"
    proc = subprocess.Popen(_fleet_run(fleet, "--out", str(out)), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 900
    while not (history.is_file() and _rows(history)):  # one cell recorded, others not yet
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)  # the driver and the local Ray it started
    proc.wait()
    before = _rows(history)
    assert 1 <= len(before) < 3
    run = subprocess.run(_fleet_run(fleet, "--resume", str(out), "--json"), capture_output=True,
                         text=True, timeout=1200)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    cells = json.loads(run.stdout)["cells"]
    assert [c["status"] for c in cells] == ["PASS"] * 3
    assert sum(c["resumed"] for c in cells) == len(before)
    after = _rows(history)
    assert len(after) == 3 and len({r[3] for r in after}) == 3 and set(before) <= set(after)


@pytest.mark.vllm_live
@pytest.mark.slow
@needs_ray
def test_a_vllm_local_cell_starts_its_own_server(tmp_path):
    """A vllm-local target in a fleet: the driver starts real vLLM for the cell (pool sized
    from the suite), the cell passes, its vllm.log is kept, and no server outlives the run."""
    from kvdiag.errors import KvdiagError

    try:
        from kvdiag.engines.vllm.launcher import find_vllm_python

        find_vllm_python()
    except (ImportError, KvdiagError) as e:
        pytest.skip(f"no real vLLM here: {str(e).splitlines()[0]}")
    fleet = _fleet(tmp_path, [{"name": "cpu", "target": "vllm-local", "concurrency": 1,
                               "suites": [{"suite": "smoke", "cases": ["trigger"]}]}], time_limit=1500)
    run = subprocess.run(_fleet_run(fleet, "--out", str(tmp_path / "out"), "--json"),
                         capture_output=True, text=True, timeout=2400)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    (cell,) = json.loads(run.stdout)["cells"]
    assert cell["status"] == "PASS", cell
    assert (Path(cell["run_dir"]) / "vllm.log").stat().st_size > 0
    assert [r[2] for r in _rows(tmp_path / "history.sqlite")] == ["pass"]
    leftover = subprocess.run(["pgrep", "-f", "vllm.entrypoints.openai.api_server"], capture_output=True)
    assert leftover.returncode == 1, "a vLLM server outlived the fleet run"


@pytest.mark.slow
@needs_ray
def test_a_cell_that_never_reached_the_trigger_is_inconclusive_never_pass(tmp_path):
    """A fleet whose cells prove nothing: reference:buggy on a pool that never recycles, and a
    live server with a pool too big to recycle, read INCONCLUSIVE (cells.jsonl, JSON, the
    page, the history); a dead server stays ERROR, and so does the fleet (its worst cell);
    it exits 2."""
    from tests.kvdiag.commands.test_inconclusive import BIG_POOL
    from tests.kvdiag.schema_util import assert_valid_summary

    (tmp_path / "big.yaml").write_text(BIG_POOL)
    with served("--allocator", "guarded", "--max-model-len", "2048", "--num-blocks", "3000",
                timeout=600) as (url, _):
        fleet = _fleet(tmp_path, [
            {"name": "ref", "target": "reference:buggy", "suites": ["big.yaml"]},
            {"name": "live", "target": url, "model": "canary", "suites": ["big.yaml"]},
            {"name": "dead", "target": f"http://127.0.0.1:{free_port()}", "model": "canary",
             "suites": ["big.yaml"]}])
        run = subprocess.run(_fleet_run(fleet, "--out", str(tmp_path / "run"), "--json"),
                             capture_output=True, text=True, timeout=1800)
    assert run.returncode == 2, run.stdout[-3000:] + run.stderr[-3000:]
    data = json.loads(run.stdout[run.stdout.index('{\n  "verdict"'):])
    assert data["verdict"] == "error"  # the worst cell's: the dead server; never pass
    assert "2 inconclusive" in data["reason"] and "1 error" in data["reason"]
    cells = {c["target"]: c for c in data["cells"]}
    assert {t: c["status"] for t, c in cells.items()} == {"ref": "INCONCLUSIVE",
                                                          "live": "INCONCLUSIVE", "dead": "ERROR"}
    assert "not reached" in cells["ref"]["worst"] and "not reached" in cells["live"]["worst"]
    for name in ("ref", "live"):
        assert assert_valid_summary(Path(cells[name]["run_dir"]), "regress")["verdict"] == "inconclusive"
    assert sorted(r[2] for r in _rows(tmp_path / "history.sqlite")) == ["inconclusive", "inconclusive"]
    page = (tmp_path / "run" / "fleet.html").read_text()
    assert page.count("<b>INCONCLUSIVE</b>") == 2 and "<b>ERROR</b>" in page and "<b>PASS</b>" not in page
