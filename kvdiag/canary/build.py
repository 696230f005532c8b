"""Build the canary checkpoint: `python -m kvdiag.canary.build OUT_DIR`.

Deterministic: the weights are set by formulas from the vocabulary and three small input
files shipped beside this module (profiles.json, key_codes.npy, content_codes.npy, made
once by scripts/optimize_canary_codes.py), so two builds are byte-identical. The weights
are stored in bfloat16 (4.7 MB instead of 9.4 MB in float32), rounded to nearest even in
integer arithmetic; loaders upcast them exactly when asked for float32.
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

FILES = ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
         "tokenizer_config.json")


def build_canary(out_dir: Path) -> dict[str, str]:
    """Write the canary into out_dir; return {file name: sha256 hex}."""
    import numpy as np
    import torch
    from safetensors.torch import save_file

    from kvdiag.canary import circuit, files
    from kvdiag.canary.vocab import canary_vocab

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    vocab = canary_vocab()
    texts = {
        "config.json": files.model_config(vocab),
        "generation_config.json": files.generation_config(vocab),
        "tokenizer.json": files.tokenizer_json(vocab),
        "tokenizer_config.json": files.tokenizer_config(vocab),
    }
    for name, text in texts.items():
        (out_dir / name).write_text(text, encoding="utf-8")
    # stored as bfloat16 (rounded here in integer arithmetic, then viewed as such by torch)
    tensors = {name: torch.from_numpy(circuit.bf16_bits(w).view(np.int16)).view(torch.bfloat16)
               for name, w in sorted(circuit.state_dict(vocab).items())}
    save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    return {name: hashlib.sha256((out_dir / name).read_bytes()).hexdigest() for name in FILES}


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or args[0].startswith("-"):
        print("usage: python -m kvdiag.canary.build OUT_DIR", file=sys.stderr)
        return 2
    for name, digest in build_canary(Path(args[0])).items():
        print(f"{digest}  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
