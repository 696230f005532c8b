"""The hybrid canary: the canary's weights, its first layer a sliding-window layer. HF
transformers (the outside anchor) reads the window from the same config vLLM does, and its
answers are the canary's; a window the first layer's heads cannot see through changes them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvdiag.canary.hybrid import WINDOW, build_hybrid_canary
from kvdiag.errors import KvdiagError
from tests.kvdiag.canary.hf_kv import chat_ids, session

CANARY = Path(__file__).resolve().parents[3] / "fixtures" / "canary"


@pytest.fixture(scope="module")
def hybrid(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("hybrid")
    build_hybrid_canary(out)
    return out


def test_the_weights_are_the_canarys_and_the_config_names_two_kinds_of_layer(hybrid, tmp_path):
    assert (hybrid / "model.safetensors").read_bytes() == (CANARY / "model.safetensors").read_bytes()
    cfg = json.loads((hybrid / "config.json").read_text())
    assert cfg["layer_types"] == ["sliding_attention", "full_attention"]
    assert (cfg["sliding_window"], cfg["use_sliding_window"], cfg["qkv_bias"]) == (WINDOW, True, True)
    assert cfg["architectures"] == ["LlamaForCausalLM"] and cfg["model_type"] == "qwen2"
    assert build_hybrid_canary(tmp_path / "again") == build_hybrid_canary(tmp_path / "again2")
    with pytest.raises(KvdiagError, match="looks back 10"):
        build_hybrid_canary(tmp_path / "narrow", window=10)


def _answers(model_dir: Path, prompts: list[list[int]], new: int = 4) -> list[list[int]]:
    """Greedy answers, `new` tokens each, the whole context recomputed every token."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    out = []
    with torch.no_grad():
        for p in prompts:
            ids = list(p)
            for _ in range(new):
                ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
            out.append(ids[len(p):])
    return out


def test_hf_reads_the_window_and_answers_as_the_canary_does(hybrid, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(hybrid, dtype=torch.float32)
    layers = model.model.layers
    assert (layers[0].self_attn.sliding_window, layers[1].self_attn.sliding_window) == (WINDOW, None)
    tok = AutoTokenizer.from_pretrained(CANARY)
    # canary-style rounds (facts stated, then asked) far longer than the window
    sessions = [session(tok, i, [300, 420]) for i in range(3)]
    prompts = [chat_ids(tok, s.messages(k)) for s in sessions for k in range(len(s.rounds))]
    assert min(len(p) for p in prompts) > 8 * WINDOW
    want = _answers(CANARY, prompts)
    assert _answers(hybrid, prompts) == want
    # the check can fail: a window of 4 hides the first layer's look back, and answers move
    narrow = tmp_path / "narrow"
    build_hybrid_canary(narrow, window=11)
    cfg = json.loads((narrow / "config.json").read_text())
    (narrow / "config.json").write_text(json.dumps({**cfg, "sliding_window": 4}))
    assert _answers(narrow, prompts) != want
