"""The probe plans for the server it meets (`kvdiag serve` as a real subprocess): it reads the
block size and pool from vllm:cache_config_info; a pool too big for the suite to recycle,
without pressure, ends `inconclusive` (never pass); with planned pressure the buggy server
at its default pool fails (slow: ~70 sessions through the reference engine)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml

from kvdiag.commands.probe import judge
from kvdiag.paths import SUITES
from kvdiag.planning.suites import load_suite
from kvdiag.runners.live.phases import ProbeSettings
from kvdiag.runners.live.probe_run import run_probe
from kvdiag.verdicts import Verdict
from tests.kvdiag.serving import served

pytestmark = pytest.mark.e2e  # starts a server, a CLI subprocess or a browser


def _tiny_suite(tmp_path):
    """The smoke trigger cut to 2 sessions x 3 rounds: nothing it does can fill a big pool."""
    data = yaml.safe_load((SUITES / "smoke.yaml").read_text())
    data["name"] = "tiny"
    data["defaults"] |= {"sessions": 2, "rounds": 3, "pressure_round": 1}
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(data))
    return load_suite(path)


@pytest.mark.slow  # over 30 s on 2 cores
def test_without_recycling_the_verdict_is_inconclusive_not_pass(tmp_path):
    suite = _tiny_suite(tmp_path)
    (tmp_path / "run").mkdir()
    with served("--allocator", "guarded", "--max-model-len", "2048", "--num-blocks", "3000",
                timeout=600) as (url, _):
        run = run_probe(url, "canary", suite, suite.cases[0], tmp_path / "run",
                        settings=ProbeSettings(max_pressure_sessions=0, floor_sessions=1))
    assert run.server.source == "cache_config_info"
    assert run.server.num_blocks == 3000 and run.server.block_size == 16
    assert run.recycling.model_dump() == {"observed": False, "how": "not observed", "evictions": 0.0,
                                          "requests_with_recycled_prefix": 0, "slot_handovers": 0,
                                          "pressure_sessions": 0}
    assert run.ground_truth.isolated > 0 and run.ground_truth.contaminated == 0
    judged = judge(run)
    assert run.count("corruption") == judged.details.corrupted == 0
    assert judged.verdict is Verdict.INCONCLUSIVE and judged.reason.startswith("trigger not reached")


@pytest.mark.slow
def test_pressure_makes_the_buggy_server_fail_at_its_default_pool(tmp_path):
    """Before pressure this run passed: the default pool never recycled the smoke suite."""
    with served("--allocator", "buggy", "--max-model-len", "2048", "--recycled-block-fill", "nan",
                timeout=600) as (url, _):
        run = subprocess.run([sys.executable, "-m", "kvdiag", "probe", "--base-url", url, "--model", "canary",
                              "--suite", "smoke", "--out", str(tmp_path / "p"), "--json"],
                             capture_output=True, text=True, timeout=3600)
    assert run.returncode == 1, run.stderr[-2000:]
    summary = json.loads(run.stdout)
    assert summary["recycling"]["pressure_sessions"] > 0 and summary["recycling"]["observed"]
    assert summary["server"]["num_blocks"] > summary["server"]["suite_pool"]
    assert summary["verdict"] == "fail" and summary["first_divergences"]
