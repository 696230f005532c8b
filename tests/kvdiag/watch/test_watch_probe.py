"""kvdiag watch with kvdiag's own traffic sent through it as a client: `kvdiag probe` (its
suite, then a user's sessions file) against a healthy `kvdiag serve --allocator guarded`
behind the proxy, the proxy's twins sampling beside it. Neither judge may see what is not
there: the probe passes, and the watch counts 0 over-hits and 0 twin departures in traffic
it did not write (resets, fresh salts per isolated request, cancels, token-id prompts).
`probe_through` and `assert_watched_clean` serve the same check in front of real vLLM and
SGLang (tests/kvdiag/engines/test_watch_live.py, their CI slots)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.kvdiag.commands.test_probe_sessions import conversations
from tests.kvdiag.serving import served, smoke_pool
from tests.kvdiag.watch.test_watch_e2e import settle, watch_metrics, watch_report, watching

pytestmark = pytest.mark.e2e  # starts a server, a CLI subprocess or a browser


def probe_through(upstream: str, tmp_path, traffic: str, model: str = "canary"):
    """`kvdiag probe` (the smoke suite, or a sessions file) against a watch in front of
    `upstream`, twins sampled beside it: the probe's exit and summary, the watch's metrics,
    its report and findings."""
    extra = ["--suite", "smoke"]
    if traffic == "sessions":
        sessions = tmp_path / "mine.jsonl"
        sessions.write_text("".join(json.dumps({"messages": c}) + "\n" for c in conversations()))
        extra += ["--sessions", str(sessions)]
    path = tmp_path / "watch.jsonl"
    with watching(upstream, path, "--sample", "0.2", "--budget", "20", "--seed", "1") as url:
        run = subprocess.run([sys.executable, "-m", "kvdiag", "probe", "--base-url", url,
                              "--model", model, *extra, "--out", str(tmp_path / "run"), "--json"],
                             capture_output=True, text=True, timeout=1800)
        settle(url, timeout=120)
        m = watch_metrics(url)
    findings = [json.loads(line) for line in path.read_text().splitlines() if '"finding"' in line]
    return run, m, watch_report(path), findings


def assert_watched_clean(run, m, report, findings) -> None:
    """Neither judge sees what is not there: the probe passes (its server's pool recycles),
    and the watch judged its traffic, 0 over-hits, 0 departures."""
    assert run.returncode == 0, run.stderr[-2000:]
    assert json.loads(run.stdout)["verdict"] == "pass"
    assert m["kvdiag_watch_requests_total"] > 50 and m["kvdiag_watch_judged_total"] > 50
    assert m["kvdiag_watch_over_hits_total"] == 0
    assert m["kvdiag_watch_twins_reached_total"] > 0 and m["kvdiag_watch_twin_departures_total"] == 0
    code, out = report
    assert code == 0 and out["verdict"] == "pass", out
    assert not [f for f in findings if f["kind"] in ("over_hit", "departure")], findings[:3]


@pytest.mark.slow  # a probe through the proxy: about a minute each on 2 cores
@pytest.mark.parametrize("traffic", ["suite", "sessions"])
def test_the_probes_own_traffic_through_a_watch_finds_nothing_on_a_healthy_server(tmp_path, traffic):
    serve = ("--allocator", "guarded", "--num-blocks", str(smoke_pool()), "--max-num-seqs", "16",
             "--max-model-len", "2048")
    with served(*serve) as (upstream, _):
        assert_watched_clean(*probe_through(upstream, tmp_path, traffic))
