"""kvdiag isolation: the rank test against brute force, the verdict rules, the page, bad input
(exit 2, one line), and the audit against real `kvdiag serve` subprocesses on loopback:
guarded is isolated under salts while its unsalted exposure leaks, caching switched off is
"cannot tell", and salt-collision is caught where the server can serve an adapter name."""

from __future__ import annotations

import itertools
import json
import math
import random
import re
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from kvdiag.cli import app
from kvdiag.errors import KvdiagError
from kvdiag.metrics.auc import bootstrap_ci, rank_test, roc_auc
from kvdiag.record.isolation_rows import IsolationCell, IsolationPlanBlock
from kvdiag.report.isolation import page
from kvdiag.runners.live.isolation_plan import IsolationPlan, parse_lengths
from kvdiag.verdicts import Verdict, judge_isolation
from tests.kvdiag import summaries
from tests.kvdiag.serving import free_port, served

pytestmark = pytest.mark.e2e  # starts a server, a CLI subprocess or a browser

LENGTHS = "16,256,2048"  # one block, a few, and a prefix whose cached prefill is much faster


# --- the statistics ------------------------------------------------------------------------
def _pairs_auc(a, b) -> float:
    return sum(1.0 if x < y else 0.5 if x == y else 0.0 for x in a for y in b) / (len(a) * len(b))


def test_auc_is_the_pair_count_with_ties_as_half():
    rng = random.Random(3)
    for _ in range(50):
        a = [rng.choice(range(12)) for _ in range(rng.randint(1, 9))]
        b = [rng.choice(range(12)) for _ in range(rng.randint(1, 9))]
        assert roc_auc(a, b) == pytest.approx(_pairs_auc(a, b))


def test_exact_p_equals_a_full_permutation_test():
    rng = random.Random(5)
    a = [rng.random() for _ in range(5)]
    b = [rng.random() + 0.4 for _ in range(6)]
    test = rank_test(a, b)
    values, dist = a + b, abs(test.auc - 0.5)
    splits = list(itertools.combinations(range(len(values)), len(a)))
    extreme = 0
    for idx in splits:
        x = [values[i] for i in idx]
        y = [values[i] for i in range(len(values)) if i not in idx]
        extreme += abs(_pairs_auc(x, y) - 0.5) >= dist - 1e-12
    assert test.exact and test.p_value == pytest.approx(extreme / len(splits))


def test_tied_samples_use_the_corrected_normal_approximation():
    same = rank_test([1.0] * 6, [1.0] * 6)
    assert same.auc == 0.5 and same.p_value == 1.0 and not same.exact
    apart = rank_test([1.0, 1.0, 2.0, 2.0, 3.0, 3.0] * 2, [7.0, 8.0, 8.0, 9.0, 9.0, 9.0] * 2)
    assert apart.auc == 1.0 and apart.p_value < 1e-3 and not apart.exact


def test_bootstrap_interval_holds_the_auc_and_narrows_with_separation():
    rng = random.Random(7)
    a, b = [rng.random() for _ in range(8)], [rng.random() + 0.2 for _ in range(8)]
    lo, hi = bootstrap_ci(a, b)
    assert lo <= roc_auc(a, b) <= hi and hi - lo > 0.2  # 8 + 8 probes: a wide interval
    assert bootstrap_ci([1.0] * 8, [2.0] * 8) == (1.0, 1.0)


# --- the verdict rules ----------------------------------------------------------------------
def _cell(config, length, correct, wrong, auc=0.5, p=1.0):
    return IsolationCell(config=config, length=length, trials=8, cached_correct_mean=correct,
                         cached_wrong_mean=wrong, cached_correct_max=correct, cached_wrong_max=wrong,
                         cached_correct_median=correct, block_size=16, ttft_correct_median_s=0.1,
                         ttft_wrong_median_s=0.1, auc=auc, auc_ci95=[auc - 0.2, min(1.0, auc + 0.2)],
                         p_value=p, exact_p=True)


def _cells(per_tenant_cached=0, control_cached=64, per_tenant_auc=0.5, per_tenant_p=1.0):
    return [_cell("no-salt", 64, 64, 0, 1.0, 1e-4), _cell("same-salt", 64, control_cached, 0),
            _cell("per-tenant", 64, per_tenant_cached, 0, per_tenant_auc, per_tenant_p)]


def _judge(cells, error=None):
    return judge_isolation(cells, IsolationPlanBlock(lengths=[64]), error)


def test_verdicts_follow_the_per_tenant_configuration_and_the_control():
    assert _judge(_cells()).verdict is Verdict.PASS
    judged = _judge(_cells(per_tenant_cached=64))
    assert judged.verdict is Verdict.FAIL and "64-token" in judged.reason
    assert judged.details.leaks[0].config == "per-tenant"
    assert _judge(_cells(per_tenant_auc=0.95, per_tenant_p=1e-4)).verdict is Verdict.FAIL
    # a significant but small timing difference is not a leak (min_auc), nor a large but noisy one
    assert _judge(_cells(per_tenant_auc=0.6, per_tenant_p=1e-4)).verdict is Verdict.PASS
    assert _judge(_cells(per_tenant_auc=0.9, per_tenant_p=0.05)).verdict is Verdict.PASS
    judged = _judge(_cells(control_cached=0))
    assert judged.verdict is Verdict.INCONCLUSIVE and "positive control" in judged.reason
    assert _judge(_cells(), "stopped at --max-seconds 5").verdict is Verdict.INCONCLUSIVE


def test_page_draws_one_plot_per_configuration_and_no_scripts():
    cells = _judge(_cells()).details.cells
    html = page(summaries.isolation(reason="r", isolation={"cells": cells}))
    assert html.count("<svg") == 3 and "<script" not in html.lower()
    assert html.count('class="fail"') == 1  # the unsalted exposure, told apart by timing


def test_bad_plans_are_refused():
    with pytest.raises(KvdiagError, match="'x16'"):
        parse_lengths("16,x16")
    with pytest.raises(KvdiagError, match="--trials"):
        IsolationPlan(trials=0)


# --- the command: bad input -----------------------------------------------------------------
@pytest.mark.parametrize("extra, message", [
    (["--lengths", "16,abc"], "'abc' is not a whole number"),
    (["--trials", "0"], "--trials must be at least 1"),
    ([], "cannot reach"),
    (["--sentinel", "no-such-dir/sentinel.jsonl"], "--sentinel no-such-dir/sentinel.jsonl: "),
])
def test_bad_input_exits_2_with_one_line(extra, message):
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    result = CliRunner().invoke(app, ["isolation", "--base-url", url, "--model", "canary", *extra])
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_an_unwritable_sentinel_exits_2_before_the_server_starts(tmp_path):
    blocked = tmp_path / "file"
    blocked.write_text("")  # a file where a directory would have to be
    result = CliRunner().invoke(app, ["isolation", "--target", "reference:guarded", "--sentinel",
                                      str(blocked / "sentinel.jsonl")])
    assert result.exit_code == 2 and "--sentinel" in result.output, result.output
    assert "starting" not in result.output and "Traceback" not in result.output


# --- against real servers -------------------------------------------------------------------
def _audit(url: str, out, *extra: str) -> tuple[int, dict]:
    run = subprocess.run([sys.executable, "-m", "kvdiag", "isolation", "--base-url", url, "--model",
                          "canary", "--out", str(out), "--json", *extra],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode in (0, 1, 2), run.stderr[-2000:]
    assert "Traceback" not in run.stderr, run.stderr[-2000:]
    return run.returncode, json.loads((out / "summary.json").read_text()) if (out / "summary.json").exists() else {}


def _by(summary: dict, config: str) -> dict[int, dict]:
    return {c["length"]: c for c in summary["isolation"]["cells"] if c["config"] == config}


@pytest.mark.slow
def test_guarded_is_isolated_under_salts_and_its_unsalted_exposure_leaks(tmp_path):
    with served() as (url, _):
        code, summary = _audit(url, tmp_path, "--lengths", LENGTHS, "--trials", "6", "--warmup", "1")
    assert code == 0 and summary["verdict"] == "pass", summary.get("reason")
    lengths = [int(n) for n in LENGTHS.split(",")]
    per_tenant, control, shared = (_by(summary, c) for c in ("per-tenant", "same-salt", "no-salt"))
    for n in lengths:
        assert per_tenant[n]["cached_correct_max"] == 0 and not per_tenant[n]["leaks"]
        assert control[n]["hit"] and control[n]["cached_correct_mean"] == n
        assert shared[n]["content_leak"] and shared[n]["cached_correct_mean"] == n
    assert summary["isolation"]["exposure_leaks"]
    # fresh secrets and guesses per cell: no probe was warmed by an earlier one
    assert all(c["cached_wrong_max"] == 0 for c in summary["isolation"]["cells"])
    # timing alone tells a cached 2k-token prefix apart on the reference server
    assert shared[2048]["auc"] >= 0.9 and shared[2048]["timing_leak"]
    assert (tmp_path / "report.html").read_text().count("<svg") == 3


@pytest.mark.slow
def test_caching_off_cannot_tell_rather_than_isolated(tmp_path):
    with served("--no-prefix-caching") as (url, _):
        code, summary = _audit(url, tmp_path, "--lengths", "16,64", "--trials", "3", "--warmup", "0")
    assert code == 2 and summary["verdict"] == "inconclusive"
    assert "positive control" in summary["reason"]
    assert all(c["cached_correct_max"] == 0 for c in summary["isolation"]["cells"])


def test_salt_collision_is_caught_through_an_adapter_named_like_a_salt(tmp_path):
    """--target reference:salt-collision: kvdiag serves the fault itself, with the adapter
    name as a --lora-modules entry, and stops it; a salt equal to the adapter's name shares
    the adapter's blocks (vLLM #44701)."""
    run = subprocess.run([sys.executable, "-m", "kvdiag", "isolation", "--target",
                          "reference:salt-collision", "--adapter", "tenant-x", "--lengths", "16,64",
                          "--trials", "4", "--out", str(tmp_path / "run"), "--json",
                          "--history", str(tmp_path / "h.sqlite")],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 1, run.stderr[-2000:]
    from tests.kvdiag.schema_util import assert_valid_summary

    summary = assert_valid_summary(tmp_path / "run", "isolation")
    assert summary["verdict"] == "fail" and summary["kind"] == "isolation"
    assert {c["config"] for c in summary["leaks"]} == {"adapter"}
    # the sentinel inside kvdiag serve (on by default for a server the audit starts) saw the
    # salted base request read the adapter's K/V: one block per collision, never unwritten
    sentinel = summary["sentinel"]
    assert sentinel["foreign"] > 0 and sentinel["foreign"] % 16 == 0 and sentinel["unwritten"] == 0
    assert sentinel["findings"][0]["positions"][0] == [0, 16]
    assert "; sentinel: " in summary["reason"]
    # the salt and the adapter name collide in the first block's key only (later blocks carry
    # the adapter's name alone), so exactly one block, 16 tokens, is shared at every length
    adapter = _by(summary, "adapter")
    assert math.isclose(adapter[16]["cached_correct_mean"], 16)
    assert math.isclose(adapter[64]["cached_correct_mean"], 16)
    assert (tmp_path / "run" / "report.html").read_text().count("<svg") >= 3
    rebuilt = subprocess.run([sys.executable, "-m", "kvdiag", "report", str(tmp_path / "run"), "-o",
                              str(tmp_path / "again.html")], capture_output=True, text=True, timeout=120)
    assert rebuilt.returncode == 0, rebuilt.stderr  # `kvdiag report` draws the isolation page
    assert "tenant isolation" in (tmp_path / "again.html").read_text()
    # the audit is in the history, and the Prometheus export publishes it
    from kvdiag.export.prometheus import render

    text = render(tmp_path / "h.sqlite").decode()
    assert re.search(r'kvdiag_isolation_passed\{model_name="canary",target="http://127\.0\.0\.1:\d+"\} 0\.0', text), text
    cached = [line for line in text.splitlines() if line.startswith("kvdiag_isolation_cached_tokens{")
              and all(f in line for f in ('config="adapter"', 'length="64"', 'guess="correct"'))]
    assert len(cached) == 1 and cached[0].endswith(" 16.0"), cached
    assert 'kvdiag_history_present{history="' in text and "} 1.0" in text


def test_the_sentinel_in_kvdiag_serve_reads_nothing_wrong_where_the_server_is_isolated(tmp_path):
    """The same audit of reference:guarded (salts and adapters keyed apart): the sentinel
    checked the audit's reads and found none wrong, and the PASS names what it checked."""
    run = subprocess.run([sys.executable, "-m", "kvdiag", "isolation", "--target",
                          "reference:guarded", "--adapter", "tenant-x", "--lengths", "16,64",
                          "--trials", "4", "--out", str(tmp_path / "run"), "--json"],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    summary = json.loads(run.stdout)
    sentinel = summary["sentinel"]
    assert summary["verdict"] == "pass" and sentinel["reads"] > 0 and sentinel["requests"] > 0
    assert sentinel["foreign"] == sentinel["unwritten"] == sentinel["overwrite"] == 0
    assert f"sentinel: {sentinel['steps']} steps" in summary["reason"]


# --- against real vLLM on CPU (kvdiag/vllm_local; skipped without its env) ------------------
def _vllm_local():
    from kvdiag.errors import KvdiagError

    try:
        from kvdiag.engines.vllm.launcher import VllmLocal, find_vllm_python

        find_vllm_python()
    except (ImportError, KvdiagError) as e:
        pytest.skip(f"no real vLLM here: {str(e).splitlines()[0]}")
    return VllmLocal


@pytest.mark.vllm_live
@pytest.mark.slow
def test_real_vllm_is_isolated_under_salts_and_its_unsalted_timing_leaks(tmp_path):
    from kvdiag.paths import CANARY

    with _vllm_local()(CANARY) as server:
        code, summary = _audit(server.base_url, tmp_path, "--lengths", "32,2048", "--trials", "8")
    assert code == 0 and summary["verdict"] == "pass", summary.get("reason")
    assert summary["isolation"]["server"]["block_size_source"] == "vllm:cache_config_info"
    assert summary["isolation"]["server"]["cached_tokens_source"] == "usage"
    longest = _by(summary, "no-salt")[2048]
    assert longest["cached_correct_mean"] == 2048 and longest["auc"] >= 0.95


@pytest.mark.vllm_live
@pytest.mark.slow
def test_real_vllm_with_salt_ignored_planted_leaks_across_salts(tmp_path):
    from kvdiag.paths import CANARY

    with _vllm_local()(CANARY, fault="salt-ignored") as server:
        code, summary = _audit(server.base_url, tmp_path, "--lengths", "32,512", "--trials", "4")
    assert code == 1 and summary["verdict"] == "fail"
    assert "per-tenant" in {c["config"] for c in summary["leaks"]}
    assert _by(summary, "per-tenant")[512]["cached_correct_mean"] == 512


@pytest.mark.vllm_live
@pytest.mark.slow
@pytest.mark.parametrize("fault", [None, "tags-dropped"])
def test_the_sentinel_in_real_vllm_judges_the_salt_named_like_an_adapter(tmp_path, fault):
    """--target vllm-local[:tags-dropped] --adapter canary-lora: the sentinel inside vLLM (on by
    default) reads nothing wrong on the healthy server, and with the salt and the adapter's
    name folded into one untagged key it sees the salted base request read the adapter's K/V:
    FAIL by the tenants' cached tokens and by the sentinel, which names the first block."""
    _vllm_local()
    target = "vllm-local" + (f":{fault}" if fault else "")
    run = subprocess.run([sys.executable, "-m", "kvdiag", "isolation", "--target", target,
                          "--adapter", "canary-lora", "--lengths", "32,512", "--trials", "4",
                          "--out", str(tmp_path / "run"), "--json"],
                         capture_output=True, text=True, timeout=1800)
    summary = json.loads(run.stdout)
    sentinel = summary["sentinel"]
    assert sentinel["engine"] == "vllm" and sentinel["reads"] > 0, run.stderr[-2000:]
    if fault is None:
        assert run.returncode == 0 and summary["verdict"] == "pass", summary["reason"]
        assert sentinel["foreign"] == sentinel["unwritten"] == 0
        return
    assert run.returncode == 1 and summary["verdict"] == "fail"
    assert {c["config"] for c in summary["leaks"]} == {"adapter"}
    assert sentinel["foreign"] > 0 and "; sentinel: " in summary["reason"]
    assert sentinel["findings"][0]["positions"][0][0] == 0  # the first block, where keys collide
