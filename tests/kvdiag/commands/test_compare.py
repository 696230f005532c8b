"""kvdiag compare against two `kvdiag serve` subprocesses on the same sessions file: a healthy
prefix cache and the unchained-hash allocator, each judged against its own isolated twin; one
page with both decay curves and both verdicts, exit 1. Bad input is refused before any server.

unchained-hash, not stale-hash: on a file this small (3 conversations x 4 rounds of ~100
tokens) the stale-hash fault's jump path never reaches a recycled cached block, and the probe
passes it (measured: pools of 48, 96 and 805 blocks); the differential phase catches an
unchained hash in seconds (an over-hit), whatever the sessions."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from kvdiag.cli import app
from kvdiag.verdicts import Verdict, judge_compare
from tests.kvdiag.commands.test_probe import _server_args
from tests.kvdiag.commands.test_probe_sessions import conversations
from tests.kvdiag.schema_util import assert_valid_summary
from tests.kvdiag.serving import served

pytestmark = pytest.mark.e2e  # starts a server, a CLI subprocess or a browser


def test_the_worst_target_decides_and_nothing_measured_is_an_error():
    assert judge_compare([("a", Verdict.PASS), ("b", Verdict.FAIL)]).verdict is Verdict.FAIL
    assert judge_compare([("a", Verdict.PASS), ("b", Verdict.ERROR)]).verdict is Verdict.ERROR
    assert judge_compare([("a", Verdict.PASS), ("b", Verdict.PASS)]).verdict is Verdict.PASS
    assert judge_compare([]).verdict is Verdict.ERROR


def test_bad_targets_are_refused_before_any_server(tmp_path):
    path = tmp_path / "mine.jsonl"
    path.write_text(json.dumps({"messages": conversations()[0]}) + "\n")
    for args, said in ((["--target", "vllm-local"], "two targets or more"),
                       (["--target", "http://127.0.0.1:9", "--target", "vllm-local"], "needs --model"),
                       (["--target", "reference:buggy", "--target", "vllm-local"], "kvdiag serve --allocator"),
                       (["--target", "vllm-local:no-such-fault", "--target", "vllm-local"], "no-such-fault")):
        result = CliRunner().invoke(app, ["compare", *args, "--sessions", str(path),
                                          "--out", str(tmp_path / "never")])
        assert result.exit_code == 2 and said in " ".join(result.output.split()), result.output
    assert not (tmp_path / "never").exists()


@pytest.mark.slow  # 18-28 s on 2 cores: make test stays near 400 s
def test_healthy_and_faulty_on_one_page(tmp_path):
    path = tmp_path / "mine.jsonl"
    path.write_text("".join(json.dumps({"messages": c}) + "\n" for c in conversations()))
    out = tmp_path / "cmp"
    with served(*_server_args("prefix-cache")) as (healthy, _), served(*_server_args("unchained-hash")) as (buggy, _):
        run = subprocess.run([sys.executable, "-m", "kvdiag", "compare", "--target", healthy,
                              "--target", buggy, "--model", "canary", "--suite", "smoke",
                              "--sessions", str(path), "--no-lifecycle",
                              "--out", str(out), "--json"], capture_output=True, text=True, timeout=900)
    assert run.returncode == 1, run.stderr[-3000:]
    summary = json.loads(run.stdout)
    assert summary["verdict"] == "fail" and summary["sessions_file"] == "mine.jsonl"
    (a, b) = summary["targets"]
    assert (a["target"], a["verdict"]) == (healthy, "pass"), a["reason"]
    assert (b["target"], b["verdict"]) == (buggy, "fail"), b["reason"]
    # each target its own probe run, in its own directory, judged by itself
    for t in (a, b):
        inner = assert_valid_summary(out / t["run_dir"], "probe")
        assert inner["verdict"] == t["verdict"] and inner["sessions_file"]["sessions"] == 3
    assert_valid_summary(out, "compare")
    rounds = {t: [r["round"] for r in summary["rounds"] if r["target"] == t] for t in (healthy, buggy)}
    assert rounds[healthy] == rounds[buggy] == [1, 2, 3, 4]
    assert all(r["bleu4"] is not None for r in summary["rounds"])
    page = (out / "report.html").read_text()
    assert page.count("<svg") == 1 and "BLEU-4" in page and "fact-check pass rate" in page
    assert "PASS" in page and page.count(">FAIL<") >= 2  # the overall badge and the faulty row
    assert f'href="{b["run_dir"]}/report.html"' in page and 'id="T_rounds"' in page
    assert (out / "results.parquet").is_file() and not list(out.glob("*.partial"))
