"""Random small checkpoints of each architecture, saved with transformers' own
save_pretrained (transformers is a test dependency only)."""

from __future__ import annotations

import json
from pathlib import Path

ARCHS = ("qwen2", "qwen3", "llama")


def write_tokenizer(path: Path, vocab_size: int, eos_id: int = 1) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"<unk>": 0, "<eos>": 1} | {f"w{i}": i for i in range(2, vocab_size)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(["<eos>"])
    tok.save(str(path / "tokenizer.json"))
    template = ("{% for m in messages %}{{ m['role'] }} : {{ m['content'] }} <eos> {% endfor %}"
                "{% if add_generation_prompt %}assistant : {% endif %}")
    (path / "tokenizer_config.json").write_text(json.dumps(
        {"eos_token": "<eos>", "chat_template": template, "tokenizer_class": "PreTrainedTokenizerFast"}))


def make_checkpoint(path: Path, arch: str = "qwen2", *, tied: bool = False, kv_heads: int = 2,
                    heads: int = 4, layers: int = 2, hidden: int = 64, vocab: int = 128,
                    seed: int = 0, init_range: float = 0.2, max_pos: int = 8192,
                    bias: bool = True) -> Path:
    import torch
    from transformers import (
        LlamaConfig,
        LlamaForCausalLM,
        Qwen2Config,
        Qwen2ForCausalLM,
        Qwen3Config,
        Qwen3ForCausalLM,
    )

    common = dict(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden,
                  num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                  max_position_embeddings=max_pos, tie_word_embeddings=tied,
                  initializer_range=init_range, eos_token_id=1, rope_theta=10000.0)
    if arch == "qwen2":
        cfg, cls = Qwen2Config(**common), Qwen2ForCausalLM
    elif arch == "qwen3":
        cfg, cls = Qwen3Config(**common, head_dim=hidden // heads * 2, attention_bias=bias), Qwen3ForCausalLM
    elif arch == "llama":
        cfg, cls = LlamaConfig(**common, attention_bias=bias), LlamaForCausalLM
    else:
        raise ValueError(arch)
    torch.manual_seed(seed)
    model = cls(cfg)
    with torch.no_grad():  # HF zero-inits biases and ones-inits norms; randomise them too
        for name, p in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.add_(torch.randn_like(p) * init_range)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    write_tokenizer(path, vocab)
    return path
