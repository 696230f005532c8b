"""The Mamba hybrid: a tiny NemotronH (a Mamba2 layer, an attention layer, an MLP layer) on
the canary's tokenizer, with seeded random weights. vLLM serves a model with a Mamba state
group in "align" mode, and only there serves prefix-cache hits that end inside a block
(`--prefix-match-unit` below the block size): a hit at token 48 of a 32-token block shares
the block's first 16 slots, and the new request's writes go to a copy (copy-on-write). So
this model puts those hits and their copies in front of the sentinel (docs/sentinel.md).

    build_mamba_hybrid(out_dir)     # config.json, model.safetensors, the canary's tokenizer

Its answers are no circuit's: random weights answer the same prompt the same way, so the
probe judges it against its isolated twins, as it judges any model. The weights come from a
seeded generator, parameter by parameter in name order, not from a library's initializer:
two builds are byte-identical. vLLM 0.32 runs Mamba2 prefix caching on a CPU only with
kvdiag's plugin (kvdiag/engines/vllm/cpu_mamba.py), which its launcher arms for such a model.
"""

from __future__ import annotations

import hashlib
import json
import math
import shutil
from pathlib import Path

SEED = 20261206
COPIED = ("tokenizer.json", "tokenizer_config.json", "generation_config.json")
LAYERS = ["mamba", "attention", "mlp"]


def config(vocab_size: int, bos, eos) -> dict:
    """NemotronH's config, every size small: head_dim 32 (vLLM's CPU attention takes it),
    Mamba2 chunks of 32 tokens (one CPU block)."""
    return {"architectures": ["NemotronHForCausalLM"], "model_type": "nemotron_h",
            "vocab_size": vocab_size, "hidden_size": 64, "intermediate_size": 128,
            "layers_block_type": LAYERS, "num_attention_heads": 2, "num_key_value_heads": 1,
            "head_dim": 32, "attention_bias": False, "mlp_bias": False, "mlp_hidden_act": "relu2",
            "mamba_num_heads": 4, "mamba_head_dim": 32, "n_groups": 1, "ssm_state_size": 16,
            "conv_kernel": 4, "expand": 2, "chunk_size": 32, "use_conv_bias": True,
            "mamba_proj_bias": False, "mamba_hidden_act": "silu", "layer_norm_epsilon": 1e-5,
            "residual_in_fp32": False,
            "max_position_embeddings": 8192, "tie_word_embeddings": False, "use_cache": True,
            "bos_token_id": bos, "eos_token_id": eos, "dtype": "float32"}


def _weights(cfg: dict) -> dict:
    """Every parameter NemotronH's HF model names, seeded: norms 1, Mamba's D 1 and A_log
    log(1..heads) (decays of every speed), dt_bias a small positive step, the rest N(0, 0.05)."""
    import torch
    from transformers import NemotronHConfig, NemotronHForCausalLM

    with torch.device("meta"):
        shapes = {k: tuple(v.shape) for k, v in
                  NemotronHForCausalLM(NemotronHConfig(**cfg)).state_dict().items()}
    gen = torch.Generator().manual_seed(SEED)
    out = {}
    for name in sorted(shapes):
        shape = shapes[name]
        if name.endswith("norm.weight") or name.endswith(".D"):
            t = torch.ones(shape)
        elif name.endswith("A_log"):
            t = torch.log(torch.arange(1, shape[0] + 1, dtype=torch.float32))
        elif name.endswith("dt_bias"):
            t = torch.full(shape, math.log(math.expm1(0.05)))  # softplus of it: a step of 0.05
        elif name.endswith("bias"):
            t = torch.zeros(shape)
        else:
            t = torch.randn(shape, generator=gen) * 0.05
        out[name] = t.contiguous()
    return out


def build_mamba_hybrid(out_dir: Path, canary: Path | None = None) -> dict[str, str]:
    """Write the Mamba hybrid into out_dir, on the canary's tokenizer (default: the bundled
    canary); return {file name: sha256 hex}. Needs transformers (its NemotronH names the
    parameters) and safetensors."""
    from safetensors.torch import save_file

    from kvdiag.paths import CANARY

    canary = Path(canary or CANARY)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    base = json.loads((canary / "config.json").read_text())
    cfg = config(base["vocab_size"], base.get("bos_token_id"), base.get("eos_token_id"))
    save_file(_weights(cfg), str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    (out_dir / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    for name in COPIED:
        if (canary / name).exists():
            shutil.copyfile(canary / name, out_dir / name)
    names = ["config.json", "model.safetensors", *(n for n in COPIED if (out_dir / n).exists())]
    return {name: hashlib.sha256((out_dir / name).read_bytes()).hexdigest() for name in names}
