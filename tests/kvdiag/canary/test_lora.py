"""The canary LoRA adapter: deterministic PEFT files, answers exactly like the base model
(merged into HF transformers' weights), and K/V written by the other model loses a fact."""

from __future__ import annotations

import copy
import json
import time
from pathlib import Path

import numpy as np
import pytest

from kvdiag.canary.lora import (
    ADAPTER_FILES,
    LAYER,
    RANK,
    build_lora,
    flip_dims,
    lora_deltas,
    read_tensors,
)
from tests.kvdiag.canary.hf_kv import BLOCK, chat_ids, greedy, session, with_block_from

CANARY = Path(__file__).resolve().parents[3] / "fixtures" / "canary"


@pytest.fixture(scope="module")
def adapter(tmp_path_factory) -> Path:
    return build_lora(CANARY, tmp_path_factory.mktemp("lora"))


def test_build_is_deterministic_small_and_peft_shaped(adapter, tmp_path):
    t0 = time.perf_counter()
    again = build_lora(CANARY, tmp_path, name="again")
    assert time.perf_counter() - t0 < 10
    for name in ADAPTER_FILES:
        assert (adapter / name).read_bytes() == (again / name).read_bytes(), name
    assert (adapter / "adapter_model.safetensors").stat().st_size < 300_000
    cfg = json.loads((adapter / "adapter_config.json").read_text())
    assert (cfg["peft_type"], cfg["r"], cfg["lora_alpha"], cfg["bias"]) == ("LORA", RANK, RANK, "none")
    assert sorted(cfg["target_modules"]) == ["k_proj", "q_proj", "v_proj"]
    # the names vLLM's parse_fine_tuned_lora_name and peft expect
    prefix = f"base_model.model.model.layers.{LAYER}.self_attn."
    want = {prefix + f"{p}.lora_{ab}.weight" for p in ("q_proj", "k_proj", "v_proj") for ab in "AB"}
    raw = (adapter / "adapter_model.safetensors").read_bytes()
    header = json.loads(raw[8:8 + int.from_bytes(raw[:8], "little")])
    assert header.pop("__metadata__") == {"format": "pt"}
    assert set(header) == want
    assert header[prefix + "q_proj.lora_A.weight"]["shape"] == [RANK, 384]
    assert header[prefix + "q_proj.lora_B.weight"]["shape"] == [384, RANK]
    assert header[prefix + "k_proj.lora_B.weight"]["shape"] == [128, RANK]
    assert header[prefix + "v_proj.lora_B.weight"]["shape"] == [128, RANK]


def test_delta_flips_bias_free_rows_exactly(adapter):
    """W + B @ A == W with the flipped rows negated, bit for bit; those rows carry no bias."""
    deltas = lora_deltas(adapter)
    rows = flip_dims()
    # whole RoPE pairs (HF's rotate_half pairs f with f + 64): layer 2's match pairs 47..62
    assert sorted(rows) == sorted([*range(47, 63), *range(47 + 64, 63 + 64)])
    for proj in ("q_proj", "k_proj"):
        name = f"model.layers.{LAYER}.self_attn.{proj}"
        base = read_tensors(CANARY / "model.safetensors", [name + ".weight", name + ".bias"])
        w, want = base[name + ".weight"], base[name + ".weight"].copy()
        want[rows] *= -1
        assert np.array_equal(w + deltas[name + ".weight"], want)
        assert not base[name + ".bias"][rows].any()
    assert not deltas[f"model.layers.{LAYER}.self_attn.v_proj.weight"].any()  # V untouched


# ---- Hugging Face transformers, the adapter merged into the weights -------------------------

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def models(adapter):
    tok = transformers.AutoTokenizer.from_pretrained(CANARY)
    base = transformers.AutoModelForCausalLM.from_pretrained(CANARY, dtype=torch.float32).eval()
    lora = copy.deepcopy(base)
    params = dict(lora.named_parameters())
    with torch.no_grad():
        for name, delta in lora_deltas(adapter).items():
            params[name] += torch.from_numpy(delta)
    return tok, base, lora


@torch.no_grad()
def _margins(tok, model, s) -> tuple[int, int, float]:
    """(answers right, answers, min logit margin) over every round of a session, teacher-forced."""
    end = tok.convert_tokens_to_ids("<|im_end|>")
    spans = [(len(chat_ids(tok, s.messages(r))), tok(" " + rnd.expected, add_special_tokens=False)["input_ids"] + [end])
             for r, rnd in enumerate(s.rounds)]
    ids = chat_ids(tok, s.messages(len(s.rounds) - 1)) + spans[-1][1]
    logits = model(torch.tensor([ids])).logits[0]
    right, margin = 0, float("inf")
    for plen, ans in spans:
        lg, want = logits[plen - 1:plen - 1 + len(ans)], torch.tensor(ans)
        top = lg.gather(1, want[:, None])[:, 0]
        other = lg.scatter(1, want[:, None], float("-inf")).max(-1).values
        right += bool((top > other).all())
        margin = min(margin, float((top - other).min()))
    return right, len(spans), margin


def test_adapter_answers_like_the_base(models):
    tok, base, lora = models
    for i, lengths in enumerate(([300, 317, 700, 1023, 1040, 1500], [900, 1400, 2047, 2064])):
        s = session(tok, 50 + i, lengths)
        right, n, margin = _margins(tok, lora, s)
        assert right == n and margin >= 20, (i, right, n, margin)
        assert abs(margin - _margins(tok, base, s)[2]) < 1e-3


@pytest.mark.filterwarnings("ignore:`past_key_values` is deprecated:FutureWarning")
def test_other_models_kv_loses_the_fact_only(models):
    """Each model reads its own cache of one prompt, except one fact's block, whose K/V the
    other model computed for the same tokens: that fact answers `unknown`, the rest stay right.
    (As the canary's own corruption test does, the swapped fact is one never asked before: an
    answer in the history is a second copy of the value.)"""
    tok, base, lora = models
    s = session(tok, 60, [900, 917, 1300, 1317], first_round_facts=24)
    last = len(s.rounds) - 1
    ids = chat_ids(tok, s.messages(last))
    prefix, suffix = ids[:-5], ids[-5:]  # suffix: ask KEY <|im_end|><|im_start|>assistant
    where = {f: off for r in s.rounds for f, off in zip(r.stated, r.stated_offsets)}
    asked = {f for r in s.rounds for f in r.asked}  # an answer in the history is a second copy
    cands = [f for f, off in where.items() if off % BLOCK == 0 and f not in asked]
    assert len(cands) >= 2, len(cands)
    caches = {}
    with torch.no_grad():
        for name, model in (("base", base), ("lora", lora)):
            caches[name] = transformers.DynamicCache()
            model(torch.tensor([prefix]), past_key_values=caches[name])
    b_layers, l_layers = caches["base"].layers, caches["lora"].layers
    assert torch.equal(b_layers[0].keys, l_layers[0].keys)  # layer 1 and every V: identical
    assert all(torch.equal(b.values, v.values) for b, v in zip(b_layers, l_layers))
    assert not torch.equal(b_layers[1].keys, l_layers[1].keys)  # layer 2's K differs
    end_ids = {tok.convert_tokens_to_ids("<|im_end|>"), tok.convert_tokens_to_ids("<|endoftext|>")}
    sink = tok.convert_tokens_to_ids("Ġunknown")
    for reader, writer, target in (("lora", "base", cands[0]), ("base", "lora", cands[-1])):
        b = where[target] // BLOCK
        cache = with_block_from(caches[reader], caches[writer], b)
        model = lora if reader == "lora" else base
        untouched = right = 0
        for f, off in where.items():
            key = tok.convert_tokens_to_ids("Ġ" + f.key_token)
            out = greedy(model, cache, [suffix[0], key, *suffix[2:]], end_ids)
            want = tok(" " + " ".join(f.value_tokens), add_special_tokens=False)["input_ids"]
            if f is target:
                assert out == [sink], (reader, f.key_token)
            elif off // BLOCK != b:
                untouched += 1
                right += out == want
        assert right == untouched > 10, (reader, right, untouched)
