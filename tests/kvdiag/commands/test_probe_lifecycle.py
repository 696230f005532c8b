"""The lifecycle family against real `kvdiag serve` subprocesses: members no catalog of a real
engine names (a hit that takes no reference, blocks published before they are written) are
caught by the lifecycle phase's traffic, and every run carries the coverage table."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from kvdiag.vocab import BLOCK_EVENTS
from tests.kvdiag.serving import served, smoke_pool

pytestmark = pytest.mark.e2e  # starts a server, a CLI subprocess or a browser

CHUNK = 128  # one request's prefill chunk on these servers (a step's budget is 512)


def _server(allocator: str) -> list[str]:
    return ["--allocator", allocator, "--num-blocks", str(smoke_pool()), "--max-num-seqs", "16",
            "--recycled-block-fill", "nan", "--max-model-len", "2048",
            "--max-num-batched-tokens", "512", "--long-prefill-token-threshold", str(CHUNK)]


def _probe(url: str, out, *extra: str) -> tuple[subprocess.CompletedProcess, dict]:
    run = subprocess.run([sys.executable, "-m", "kvdiag", "probe", "--base-url", url, "--model",
                          "canary", "--suite", "smoke", "--out", str(out), "--json", *extra],
                         capture_output=True, text=True, timeout=900)
    return run, json.loads(run.stdout) if run.stdout.strip() else {}


@pytest.mark.slow  # over 30 s on 2 cores each
@pytest.mark.parametrize("allocator,lifecycle", [("ref-undercount", False), ("publish-early", True)])
def test_lifecycle_faults_fail_with_every_event_reached(tmp_path, allocator, lifecycle):
    with served(*_server(allocator)) as (url, _):
        run, summary = _probe(url, tmp_path / "p", "--no-differential", "--require", "all")
    assert run.returncode == 1, run.stderr[-2000:]
    assert summary["verdict"] == "fail"
    assert summary["corrupted_requests"] + summary["topk"]["departed"] >= 1
    events = {r["event"]: r for r in summary["events"]}
    assert list(events) == list(BLOCK_EVENTS)  # a paged engine's table
    assert all(r["reached"] for r in events.values()), summary["events"]
    chunked = re.match(rf"a prompt of (\d+) tokens, the server's prefill chunk {CHUNK};",
                       events["chunked-prefill"]["evidence"])
    assert chunked and int(chunked.group(1)) > 2 * CHUNK  # three steps at least
    if lifecycle:  # only the lifecycle phase's traffic (a chunked prefill, a cancel) reaches it
        assert "lifecycle " in summary["reason"], summary["reason"]


@pytest.mark.slow  # over 30 s on 2 cores
def test_a_required_event_the_server_cannot_reach_makes_the_run_inconclusive(tmp_path):
    # the default chunk (8192 tokens) is longer than this server's context: no chunked prefill
    args = _server("prefix-cache")[:-4]
    with served(*args) as (url, _):
        run, summary = _probe(url, tmp_path / "p", "--no-differential", "--no-twins",
                              "--require", "chunked-prefill,backlog")
    assert run.returncode == 2, run.stderr[-2000:]
    assert summary["verdict"] == "inconclusive"
    assert summary["reason"].startswith("required events not reached: chunked-prefill (not driven: "
                                        "the server's prefill chunk (8192 tokens)")
    assert "backlog" not in summary["reason"]  # reached: only the missing ones are named
    assert summary["lifecycle"]["missing"] == ["early-free", "chunked-prefill"]
