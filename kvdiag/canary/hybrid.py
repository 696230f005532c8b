"""The hybrid canary: the canary with its first layer made a sliding-window layer beside the
full-attention second, so vLLM serves it with two KV cache groups (a sliding window's and full
attention's), as it serves this year's hybrid models: blocks that leave the window are freed
early and a null block stands in. (vLLM 0.32 accepts `--prefix-match-unit` below the block
size for it, but serves sub-block hits, and their copy-on-write, only beside a Mamba group:
kvdiag.canary.mamba_hybrid.)

    build_hybrid_canary(out_dir)          # the canary's weights, a config naming the window

Its weights are the canary's, byte for byte. Layer 1's heads look back at most 10 tokens
(kvdiag.canary.circuit), so a window of WINDOW tokens changes no answer; its clean output is
still known: by the same server's isolated twins in a probe, and by HF transformers' Qwen2,
which reads the same `layer_types`. vLLM runs it as its Llama model, which takes a window per
layer from `layer_types` and q/k/v biases from `qkv_bias` (its Qwen2 applies one window to
every layer); the config keeps model_type qwen2, so both read the same fields.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

from kvdiag.errors import KvdiagError

WINDOW = 32  # tokens; at least 11 (layer 1 looks back 10) and one vLLM CPU block
COPIED = ("model.safetensors", "tokenizer.json", "tokenizer_config.json", "generation_config.json")


def build_hybrid_canary(out_dir: Path, window: int = WINDOW, canary: Path | None = None) -> dict[str, str]:
    """Write the hybrid canary into out_dir from the canary (default: the bundled one); return
    {file name: sha256 hex}. KvdiagError (exit 2) for a window the circuit cannot keep."""
    from kvdiag.paths import CANARY

    if window < 11:
        raise KvdiagError(f"window {window}: the canary's first layer looks back 10 tokens, so a "
                          "window under 11 changes its answers")
    canary = Path(canary or CANARY)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for name in COPIED:
        shutil.copyfile(canary / name, out_dir / name)
    config = json.loads((canary / "config.json").read_text())
    layers = config["num_hidden_layers"]
    config.update(architectures=["LlamaForCausalLM"], use_sliding_window=True, sliding_window=window,
                  max_window_layers=layers, qkv_bias=True,
                  layer_types=["sliding_attention"] + ["full_attention"] * (layers - 1))
    (out_dir / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return {name: hashlib.sha256((out_dir / name).read_bytes()).hexdigest()
            for name in ("config.json", *COPIED)}

