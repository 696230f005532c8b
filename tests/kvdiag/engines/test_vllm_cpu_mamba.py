"""kvdiag's CPU pieces for vLLM's Mamba2 prefix caching (kvdiag/engines/vllm/cpu_mamba.py),
held to a plain recurrence: the chunk scan run chunk by chunk gives every token the output
and every chunk's end the state that one pass over the whole sequence gives; the checkpoint's
store writes the conv window and the chunk's state into the row's block, and nothing where
a row has no checkpoint. The live run (a probe on the Mamba hybrid, copy-on-write reached) is
tests/kvdiag/engines/test_vllm_lifecycle_live.py's."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from kvdiag.engines.vllm.cpu_mamba import chunk_scan, store_prefill_checkpoint
from kvdiag.engines.vllm.launcher import has_mamba


def _scan(x, dt, A, B, C, chunk_size, out, D=None, z=None, dt_bias=None, initial_states=None,
          return_intermediate_states=False, seq_idx=None, cu_seqlens=None, cu_chunk_seqlens=None,
          **kwargs):
    """vLLM's CPU chunk scan as the wrapper sees it: per sequence of `cu_seqlens`, a state
    h = exp(dt A) h + dt B x, y = C h (+ D x), from `initial_states`; one final state each."""
    batch, (_, heads, dim), (_, _, dstate) = cu_seqlens.numel() - 1, x.shape, B.shape
    states = torch.zeros(batch, heads, dim, dstate)
    if initial_states is not None:
        states.copy_(initial_states)
    bounds = cu_seqlens.tolist()
    for s, (a, b) in enumerate(zip(bounds, bounds[1:])):
        h = states[s]
        for t in range(a, b):
            decay = torch.exp(dt[t] * A)[:, None, None]
            h = decay * h + dt[t][:, None, None] * x[t][:, :, None] * B[t, 0][None, None, :]
            out[t] = (h * C[t, 0][None, None, :]).sum(-1) + (D[:, None] * x[t] if D is not None else 0)
        states[s] = h
    return states


def _inputs(tokens: int, heads: int = 2, dim: int = 3, dstate: int = 4):
    g = torch.Generator().manual_seed(0)
    return (torch.randn(tokens, heads, dim, generator=g), torch.rand(tokens, heads, generator=g) * 0.5,
            -torch.rand(heads, generator=g), torch.randn(tokens, 1, dstate, generator=g),
            torch.randn(tokens, 1, dstate, generator=g))


def test_chunk_by_chunk_gives_one_pass_outputs_and_every_chunks_end_state():
    x, dt, A, B, C = _inputs(11)
    D = torch.ones(2)
    whole = torch.zeros(11, 2, 3)
    # two sequences, 7 and 4 tokens; chunks of at most 3 that never cross a sequence
    cu = torch.tensor([0, 7, 11])
    _scan(x, dt, A, B, C, 3, whole, D=D, cu_seqlens=cu)
    chunks = torch.tensor([0, 3, 6, 7, 10, 11])
    owner = torch.tensor([0, 0, 0, 1, 1])
    out = torch.zeros(11, 2, 3)
    states = chunk_scan(_scan)(x, dt, A, B, C, 3, out, D=D, cu_seqlens=cu, cu_chunk_seqlens=chunks,
                               seq_idx=owner, return_intermediate_states=True)
    assert torch.allclose(out, whole, atol=1e-6)
    assert states.shape == (5, 2, 3, 4)
    for c, end in enumerate(chunks.tolist()[1:]):  # each chunk's end: the prefix's final state
        s = owner[c].item()
        start = cu[s].item()
        ref = _scan(x[start:end], dt[start:end], A, B[start:end], C[start:end], 3,
                    torch.zeros(end - start, 2, 3), D=D, cu_seqlens=torch.tensor([0, end - start]))
        assert torch.allclose(states[c], ref[0], atol=1e-6), c
    plain = torch.zeros(11, 2, 3)  # not asked for chunk states: vLLM's function, untouched
    assert chunk_scan(_scan)(x, dt, A, B, C, 3, plain, D=D, cu_seqlens=cu).shape == (2, 2, 3, 4)


def test_an_initial_state_starts_its_sequences_first_chunk_only():
    x, dt, A, B, C = _inputs(6)
    init = torch.randn(1, 2, 3, 4, generator=torch.Generator().manual_seed(1))
    whole = torch.zeros(6, 2, 3)
    final = _scan(x, dt, A, B, C, 3, whole, initial_states=init, cu_seqlens=torch.tensor([0, 6]))
    out = torch.zeros(6, 2, 3)
    states = chunk_scan(_scan)(x, dt, A, B, C, 3, out, initial_states=init, cu_seqlens=torch.tensor([0, 6]),
                               cu_chunk_seqlens=torch.tensor([0, 3, 6]), seq_idx=torch.tensor([0, 0]),
                               return_intermediate_states=True)
    assert torch.allclose(out, whole, atol=1e-6) and torch.allclose(states[-1], final[0], atol=1e-6)


def test_the_checkpoint_store_writes_the_window_and_the_chunks_state_into_the_rows_block():
    dim, state_len, tokens = 3, 2, 10
    x = torch.arange(dim * tokens, dtype=torch.float32).reshape(dim, tokens)
    conv = torch.full((4, dim, state_len + 1), -1.0)
    chunk_states = torch.arange(3 * 2 * 5, dtype=torch.float32).reshape(3, 2, 5)
    ssm = torch.full((4, 2, 5), -1.0)
    rows = SimpleNamespace(checkpoint_offsets=torch.tensor([4, 0]), state_indices=torch.tensor([2, 3]))
    store_prefill_checkpoint(rows, torch.tensor([1, 2]), x, conv, chunk_states, ssm,
                             torch.tensor([0, 6, 10]), state_len=state_len)
    assert torch.equal(conv[2, :, :state_len], x[:, 2:4])  # the 2 inputs before token 4
    assert torch.equal(ssm[2], chunk_states[1])
    assert (conv[3] == -1).all() and (ssm[3] == -1).all()  # offset 0: no checkpoint, nothing
    assert (conv[2, :, state_len:] == -1).all()  # the spec-widened slots are not the window's


def test_the_launcher_knows_a_mamba_model_from_its_config(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"mamba_num_heads": 4, "hidden_size": 8}))
    assert has_mamba(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 8, "num_attention_heads": 2}))
    assert not has_mamba(tmp_path)
    assert not has_mamba(tmp_path / "missing")


@pytest.mark.e2e
def test_the_mamba_hybrid_builds_byte_identical_and_transformers_runs_it(tmp_path):
    pytest.importorskip("transformers")
    from transformers import AutoModelForCausalLM

    from kvdiag.canary.mamba_hybrid import LAYERS, build_mamba_hybrid

    first = build_mamba_hybrid(tmp_path / "a")
    assert first == build_mamba_hybrid(tmp_path / "b")
    assert has_mamba(tmp_path / "a")
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "a").eval()
    mixers = [type(layer.mixer).__name__ for layer in model.model.layers]
    assert len(mixers) == len(LAYERS) and "Mamba" in mixers[0] and "Attention" in mixers[1], mixers
    with torch.no_grad():
        logits = model(torch.tensor([list(range(300, 340))])).logits
    assert torch.isfinite(logits).all() and logits.shape[-1] == model.config.vocab_size
