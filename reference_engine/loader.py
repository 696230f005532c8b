"""Read a local Hugging Face model directory: config.json, safetensors weights (one file or a
sharded index), tokenizer.json and tokenizer_config.json. No hub, no network."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from reference_engine.config import ModelConfig
from reference_engine.errors import MissingFileError, ShapeMismatchError, UnsupportedModelError
from reference_engine.tokenizer import Tokenizer, _read_json


@dataclass
class Checkpoint:
    path: Path
    config: ModelConfig
    tokenizer: Tokenizer | None  # None: loaded with tokenizer=False (vLLM's skip_tokenizer_init)
    weights: dict  # name -> torch.Tensor, as stored

    @property
    def stop_token_ids(self) -> tuple[int, ...]:
        """The tokenizer's stop ids; without one, generation_config.json's eos_token_id,
        else config.json's."""
        if self.tokenizer is not None:
            return self.tokenizer.stop_token_ids
        gen = _read_json(self.path / "generation_config.json").get("eos_token_id")
        ids = [gen] if isinstance(gen, int) else list(gen or [])
        return tuple(dict.fromkeys(int(i) for i in ids)) or self.config.eos_token_ids

    @property
    def model_hash(self) -> str:
        """sha256 over config.json and the weight files, first 8 hex digits (for signatures)."""
        return model_hash(self.path)


def weight_files(model_dir: Path) -> list[Path]:
    single = model_dir / "model.safetensors"
    index = model_dir / "model.safetensors.index.json"
    if single.is_file():
        return [single]
    if index.is_file():
        try:
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (json.JSONDecodeError, KeyError):
            raise UnsupportedModelError(f"{index}: not a safetensors index (no weight_map)") from None
        missing = [s for s in shards if not (model_dir / s).is_file()]
        if missing:
            raise MissingFileError(f"{model_dir / missing[0]}: shard named in the index is missing")
        return [model_dir / s for s in shards]
    raise MissingFileError(f"{model_dir}: no model.safetensors or model.safetensors.index.json")


def model_hash(model_dir: str | Path) -> str:
    model_dir = Path(model_dir)
    h = hashlib.sha256()
    for p in [model_dir / "config.json", *weight_files(model_dir)]:
        with open(p, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()[:8]


def has_tokenizer(model_dir: str | Path) -> bool:
    """Whether the directory holds the tokenizer load_checkpoint would read."""
    return (Path(model_dir) / "tokenizer.json").is_file()


def load_checkpoint(model_dir: str | Path, *, tokenizer: bool = True) -> Checkpoint:
    """tokenizer=False skips the tokenizer (as vLLM's skip_tokenizer_init): requests are then
    token ids only, and Checkpoint.tokenizer is None."""
    from safetensors.torch import load_file

    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise MissingFileError(f"{model_dir}: model directory does not exist")
    config = ModelConfig.from_dir(model_dir)
    weights: dict = {}
    for f in weight_files(model_dir):
        try:
            weights.update(load_file(str(f)))
        except Exception as e:  # safetensors raises its own SafetensorError
            raise UnsupportedModelError(f"{f}: cannot be read ({str(e).splitlines()[0]})") from None
    tok = Tokenizer.from_dir(model_dir, config_eos=config.eos_token_ids) if tokenizer else None
    return Checkpoint(path=model_dir, config=config, tokenizer=tok, weights=weights)


def expected_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every weight the decoder needs, with its shape, under Hugging Face's names."""
    h, d, q, kv = cfg.hidden_size, cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads
    shapes = {"model.embed_tokens.weight": (cfg.vocab_size, h), "model.norm.weight": (h,)}
    if not cfg.tie_word_embeddings:
        shapes["lm_head.weight"] = (cfg.vocab_size, h)
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        shapes |= {
            p + "input_layernorm.weight": (h,),
            p + "post_attention_layernorm.weight": (h,),
            p + "self_attn.q_proj.weight": (q * d, h),
            p + "self_attn.k_proj.weight": (kv * d, h),
            p + "self_attn.v_proj.weight": (kv * d, h),
            p + "self_attn.o_proj.weight": (h, q * d),
            p + "mlp.gate_proj.weight": (cfg.intermediate_size, h),
            p + "mlp.up_proj.weight": (cfg.intermediate_size, h),
            p + "mlp.down_proj.weight": (h, cfg.intermediate_size),
        }
        if cfg.qkv_bias:
            shapes |= {p + "self_attn.q_proj.bias": (q * d,), p + "self_attn.k_proj.bias": (kv * d,),
                       p + "self_attn.v_proj.bias": (kv * d,)}
        if cfg.o_bias:
            shapes[p + "self_attn.o_proj.bias"] = (h,)
        if cfg.qk_norm:
            shapes |= {p + "self_attn.q_norm.weight": (d,), p + "self_attn.k_norm.weight": (d,)}
        if cfg.mlp_bias:
            shapes |= {p + "mlp.gate_proj.bias": (cfg.intermediate_size,),
                       p + "mlp.up_proj.bias": (cfg.intermediate_size,), p + "mlp.down_proj.bias": (h,)}
    return shapes


def check_weights(cfg: ModelConfig, weights: dict, source: str) -> dict:
    """Validate names and shapes; return the weights the decoder uses (tied head resolved)."""
    weights = dict(weights)
    if cfg.tie_word_embeddings:
        weights.pop("lm_head.weight", None)
    weights = {k: v for k, v in weights.items() if not k.endswith("rotary_emb.inv_freq")}
    need = expected_shapes(cfg)
    for name, shape in need.items():
        if name not in weights:
            raise ShapeMismatchError(f"{source}: weight {name} is missing")
        if tuple(weights[name].shape) != shape:
            raise ShapeMismatchError(
                f"{source}: weight {name} has shape {tuple(weights[name].shape)}, config.json implies {shape}"
            )
    extra = sorted(set(weights) - set(need))
    if extra:
        raise ShapeMismatchError(f"{source}: unexpected weight {extra[0]} ({len(extra)} unexpected in all)")
    return weights
