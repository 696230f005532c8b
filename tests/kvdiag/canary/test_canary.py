"""The canary checkpoint: deterministic build, loads unchanged in HF transformers, answers
its sessions exactly, and loses a fact whose block is overwritten by another session's K/V."""

from __future__ import annotations

import hashlib
import json
import random
import time
from pathlib import Path

import numpy as np
import pytest

from kvdiag.canary import build_canary
from tests.kvdiag.canary.hf_kv import BLOCK, greedy, session, with_block_from

CANARY = Path(__file__).resolve().parents[3] / "fixtures" / "canary"


def test_build_is_deterministic_fast_and_matches_fixture(tmp_path):
    t0 = time.perf_counter()
    a = build_canary(tmp_path / "a")
    elapsed = time.perf_counter() - t0
    b = build_canary(tmp_path / "b")
    assert a == b
    assert elapsed < 60
    assert set(a) == {"config.json", "generation_config.json", "model.safetensors",
                      "tokenizer.json", "tokenizer_config.json"}
    fixture = {name: hashlib.sha256((CANARY / name).read_bytes()).hexdigest() for name in a}
    assert fixture == a, "fixtures/canary is stale: python -m kvdiag.canary.build fixtures/canary"


def test_weights_are_stored_in_bf16_and_small():
    """bf16 on disk keeps the fixture under the 8 MiB tracked-file limit ("a few MB")."""
    path = CANARY / "model.safetensors"
    assert path.stat().st_size < 5_000_000
    raw = path.read_bytes()
    header = json.loads(raw[8:8 + int.from_bytes(raw[:8], "little")])
    assert header.pop("__metadata__") == {"format": "pt"}
    assert {t["dtype"] for t in header.values()} == {"BF16"}
    cfg = json.loads((CANARY / "config.json").read_text())
    assert cfg["torch_dtype"] == cfg["dtype"] == "bfloat16"


def test_bf16_rounding_matches_torch():
    from kvdiag.canary.circuit import bf16_bits, bf16_round

    torch = pytest.importorskip("torch")
    x = np.concatenate([np.random.default_rng(0).standard_normal(100_000) * 300,
                        [0.0, -0.0, 1.00390625, 1.01171875, -2.0 ** -130]]).astype(np.float32)
    want = torch.from_numpy(x).to(torch.bfloat16)
    assert (bf16_bits(x) == want.view(torch.int16).numpy().view(np.uint16)).all()
    assert (bf16_round(x) == want.float().numpy()).all()


def test_config_fields():
    cfg = json.loads((CANARY / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen2ForCausalLM"]
    assert cfg["rope_theta"] == cfg["rope_parameters"]["rope_theta"] == 1e7
    assert cfg["num_key_value_heads"] == 1 and cfg["num_hidden_layers"] == 2
    gen = json.loads((CANARY / "generation_config.json").read_text())
    tok = json.loads((CANARY / "tokenizer.json").read_text())
    ids = {t["content"]: t["id"] for t in tok["added_tokens"]}
    assert gen["eos_token_id"] == [ids["<|im_end|>"], ids["<|endoftext|>"]]


# ---- Hugging Face transformers (the correctness anchor) ------------------------------------

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def hf():
    torch.set_num_threads(1)
    tok = transformers.AutoTokenizer.from_pretrained(CANARY)
    model = transformers.AutoModelForCausalLM.from_pretrained(CANARY, dtype=torch.float32).eval()
    return tok, model


def test_hf_loads_the_fixture_unchanged(hf):
    from kvdiag.canary.vocab import canary_words

    tok, model = hf
    assert model.config.rope_parameters["rope_theta"] == 1e7
    assert model.dtype == torch.float32  # bf16 on disk, upcast exactly on request
    default = transformers.AutoModelForCausalLM.from_pretrained(CANARY)
    assert default.dtype == torch.bfloat16  # the dtype config.json names
    assert type(default).__name__ == "Qwen2ForCausalLM"
    words = canary_words()
    enc = tok([" " + w for w in words], add_special_tokens=False)["input_ids"]
    assert all(len(e) == 1 for e in enc), [w for w, e in zip(words, enc) if len(e) != 1][:5]
    assert tok.decode(enc[5] + enc[6]) == " " + words[5] + " " + words[6]


def test_hf_greedy_answers_sessions_exactly(hf):
    """model.generate (greedy, generation_config eos ids) on every round of three sessions."""
    tok, model = hf
    lengths = [400, 417, 600, 617, 900, 1000, 1017, 1200]
    for i in range(3):
        s = session(tok, i, lengths)
        for r, rnd in enumerate(s.rounds):
            ids = tok.apply_chat_template(s.messages(r), add_generation_prompt=True, tokenize=True,
                                          return_dict=False)
            assert len(ids) == lengths[r]
            out = model.generate(torch.tensor([ids]), max_new_tokens=48, do_sample=False)[0, len(ids):]
            text = tok.decode(out, skip_special_tokens=True)
            assert text == " " + rnd.expected, (i, r, rnd.kind)
            assert tok.convert_ids_to_tokens(int(out[-1])) == "<|im_end|>"


def _teacher_forced(tok, model, s):
    """Min logit margin over every answer token (and <|im_end|>) of a session, one forward."""
    last = len(s.rounds) - 1
    ids = tok.apply_chat_template(s.messages(last), add_generation_prompt=True, tokenize=True,
                                  return_dict=False)
    end = tok.convert_tokens_to_ids("<|im_end|>")
    spans = []
    for r, rnd in enumerate(s.rounds):
        plen = len(tok.apply_chat_template(s.messages(r), add_generation_prompt=True, tokenize=True,
                                           return_dict=False))
        spans.append((plen, tok(" " + rnd.expected, add_special_tokens=False)["input_ids"] + [end]))
    ids = ids + spans[-1][1]
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].float()
    margin = float("inf")
    for plen, ans in spans:
        lg = logits[plen - 1:plen - 1 + len(ans)]
        want = torch.tensor(ans)
        top = lg.gather(1, want[:, None])[:, 0]
        other = lg.scatter(1, want[:, None], float("-inf")).max(-1).values
        margin = min(margin, float((top - other).min()))
    return margin


def test_hf_teacher_forced_margins_mid_length(hf):
    tok, model = hf
    rng = random.Random(0)
    lengths = sorted({rng.randrange(300, 3000) for _ in range(10)} | {2047, 2064})
    assert _teacher_forced(tok, model, session(tok, 7, lengths)) >= 25


@pytest.mark.slow
def test_hf_teacher_forced_margins_at_8704(hf):
    tok, model = hf
    for i in range(3):
        lengths = [700, 1500, 3000, 4095, 4112, 6000, 8191, 8208, 8704]
        assert _teacher_forced(tok, model, session(tok, 20 + i, lengths)) >= 25


def test_hf_bf16_answers_at_8704():
    tok = transformers.AutoTokenizer.from_pretrained(CANARY)
    model = transformers.AutoModelForCausalLM.from_pretrained(CANARY, dtype=torch.bfloat16).eval()
    lengths = [700, 3000, 4095, 4112, 8704]
    assert _teacher_forced(tok, model, session(tok, 30, lengths)) >= 15


@pytest.mark.filterwarnings("ignore:`past_key_values` is deprecated:FutureWarning")
def test_corrupted_block_loses_its_fact_only(hf):
    """Overwrite the K/V of one fact's block with another session's; ask every fact."""
    tok, model = hf
    lengths = [900, 917, 1400, 1417, 1800, 1817]
    s, donor = session(tok, 40, lengths), session(tok, 41, lengths)
    last = len(s.rounds) - 1
    ids = tok.apply_chat_template(s.messages(last), add_generation_prompt=True, tokenize=True,
                                  return_dict=False)
    dids = tok.apply_chat_template(donor.messages(last), add_generation_prompt=True, tokenize=True,
                                   return_dict=False)
    prefix, suffix = ids[:-5], ids[-5:]  # suffix: ask KEY <|im_end|><|im_start|>assistant
    asked = {f for r in s.rounds for f in r.asked}
    where = {f: off for r in s.rounds for f, off in zip(r.stated, r.stated_offsets)}
    targets = [f for f, off in where.items() if off % BLOCK == 0 and f not in asked][:3]
    assert targets
    end_ids = {tok.convert_tokens_to_ids("<|im_end|>"), tok.convert_tokens_to_ids("<|endoftext|>")}
    sink = tok.convert_tokens_to_ids("Ġunknown")
    clean = transformers.DynamicCache()
    donor_cache = transformers.DynamicCache()
    with torch.no_grad():
        model(torch.tensor([prefix]), past_key_values=clean)
        model(torch.tensor([dids[:len(prefix)]]), past_key_values=donor_cache)
    wrong = right = untouched = 0
    for target in targets:
        b = where[target] // BLOCK
        cache = with_block_from(clean, donor_cache, b)
        for f, off in where.items():
            key = tok.convert_tokens_to_ids("Ġ" + f.key_token)
            out = greedy(model, cache, [suffix[0], key, *suffix[2:]], end_ids)
            want = tok(" " + " ".join(f.value_tokens), add_special_tokens=False)["input_ids"]
            if f is target:
                wrong += out == [sink]
            elif off // BLOCK != b:
                untouched += 1
                right += out == want
    assert wrong == len(targets)
    assert right == untouched
