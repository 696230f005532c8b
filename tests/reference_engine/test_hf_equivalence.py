"""Our logits against HF transformers', for every architecture, prefill and every decode
step, single and batched; and identical 64-token greedy continuations."""

import pytest
import torch

from reference_engine.config import EngineConfig
from reference_engine.contiguous import ContiguousEngine
from reference_engine.engine import LLMEngine
from tests.checkpoints import make_checkpoint

CASES = [  # (arch, tied, kv_heads): GQA (4 q / 2 kv), MQA-like (4 / 1) and MHA (4 / 4)
    ("qwen2", False, 2), ("qwen2", True, 1), ("qwen3", False, 2), ("qwen3", True, 4),
    ("llama", False, 2), ("llama", True, 1),
]


def _hf(path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


@pytest.mark.parametrize("arch,tied,kv_heads", CASES)
def test_logits_and_greedy_match_transformers(tmp_path, arch, tied, kv_heads):
    path = make_checkpoint(tmp_path / arch, arch, tied=tied, kv_heads=kv_heads, seed=3)
    hf = _hf(path)
    g = torch.Generator().manual_seed(7)
    prompts = [torch.randint(2, 128, (n,), generator=g).tolist() for n in (5, 37, 16, 70)]
    engine = LLMEngine(path, EngineConfig(num_blocks=128, max_num_batched_tokens=64))
    seqs = [engine.add_request(p, max_tokens=64, stop_ids=()) for p in prompts]
    ours = {s: [] for s in seqs}
    while engine.has_unfinished():
        engine.step()
        for s, logits in engine.runner.last_logits.items():
            ours[s].append(logits)
    for s in seqs:
        with torch.no_grad():
            ref = hf(torch.tensor([s.token_ids])).logits[0]
        n = s.num_prompt_tokens
        assert len(ours[s]) == 64
        for i, logits in enumerate(ours[s]):  # i == 0: prefill; then every decode step
            torch.testing.assert_close(logits, ref[n - 1 + i], atol=1e-4, rtol=0)
        with torch.no_grad():
            greedy = hf.generate(torch.tensor([s.prompt_ids]), max_new_tokens=64, min_new_tokens=64,
                                 do_sample=False, eos_token_id=None, pad_token_id=0)
        assert greedy[0, n:].tolist() == s.output_ids


def test_contiguous_mode_matches_transformers(tmp_path):
    path = make_checkpoint(tmp_path / "q", "qwen2", seed=5)
    hf = _hf(path)
    engine = ContiguousEngine(path)
    prompt = list(range(2, 60))
    first = engine.add_request(prompt, max_tokens=16, stop_ids=(), session="s")
    while engine.has_unfinished():
        engine.step()
    # The next turn extends the session's own contiguous K/V.
    second = engine.add_request(first.token_ids + [5, 6, 7], max_tokens=16, stop_ids=(), session="s")
    assert second.num_computed_tokens == len(first.token_ids) - 1  # all but the last token
    while engine.has_unfinished():
        engine.step()
    for s in (first, second):
        with torch.no_grad():
            greedy = hf.generate(torch.tensor([s.prompt_ids]), max_new_tokens=16, min_new_tokens=16,
                                 do_sample=False, eos_token_id=None, pad_token_id=0)
        assert greedy[0, s.num_prompt_tokens:].tolist() == s.output_ids
