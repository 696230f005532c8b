"""ModelConfig (read from a Hugging Face config.json) and EngineConfig (how to run it)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from reference_engine.errors import InvalidRequestError, MissingFileError, UnsupportedModelError

SUPPORTED_ARCHITECTURES = ("Qwen2ForCausalLM", "Qwen3ForCausalLM", "LlamaForCausalLM")


@dataclass(frozen=True)
class ModelConfig:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rope_theta: float
    rms_norm_eps: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool  # Qwen2: always; Llama/Qwen3: config.attention_bias
    o_bias: bool  # Llama/Qwen3 attention_bias also biases o_proj; Qwen2 never
    qk_norm: bool  # Qwen3: RMSNorm over head_dim on q and k before RoPE
    mlp_bias: bool = False
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()

    @classmethod
    def from_dict(cls, d: dict, source: str = "config.json") -> ModelConfig:
        archs = d.get("architectures") or []
        arch = archs[0] if archs else None
        if arch not in SUPPORTED_ARCHITECTURES:
            raise UnsupportedModelError(
                f"{source}: architecture {arch!r} is not supported "
                f"(supported: {', '.join(SUPPORTED_ARCHITECTURES)})"
            )
        if d.get("hidden_act", "silu") != "silu":
            raise UnsupportedModelError(f"{source}: hidden_act {d['hidden_act']!r} (only silu)")
        rope = d.get("rope_parameters") or d.get("rope_scaling") or {}
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type not in ("default", None):
            raise UnsupportedModelError(f"{source}: rope_type {rope_type!r} (only default RoPE)")
        # transformers 5 writes rope_theta inside rope_parameters; older files at top level.
        rope_theta = d.get("rope_theta", rope.get("rope_theta", 10000.0))
        if arch == "Qwen2ForCausalLM" and d.get("use_sliding_window"):
            raise UnsupportedModelError(f"{source}: use_sliding_window is not supported")
        try:
            hidden = int(d["hidden_size"])
            heads = int(d["num_attention_heads"])
            cfg = cls(
                architecture=arch,
                vocab_size=int(d["vocab_size"]),
                hidden_size=hidden,
                intermediate_size=int(d["intermediate_size"]),
                num_hidden_layers=int(d["num_hidden_layers"]),
                num_attention_heads=heads,
                num_key_value_heads=int(d.get("num_key_value_heads") or heads),
                head_dim=int(d.get("head_dim") or hidden // heads),
                rope_theta=float(rope_theta),
                rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
                max_position_embeddings=int(d.get("max_position_embeddings", 32768)),
                tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
                qkv_bias=True if arch == "Qwen2ForCausalLM" else bool(d.get("attention_bias", False)),
                o_bias=False if arch == "Qwen2ForCausalLM" else bool(d.get("attention_bias", False)),
                qk_norm=arch == "Qwen3ForCausalLM",
                mlp_bias=bool(d.get("mlp_bias", False)),
                bos_token_id=d.get("bos_token_id"),
                eos_token_ids=_as_ids(d.get("eos_token_id")),
            )
        except KeyError as e:
            raise UnsupportedModelError(f"{source}: missing key {e.args[0]!r}") from None
        if cfg.num_attention_heads % cfg.num_key_value_heads:
            raise UnsupportedModelError(
                f"{source}: num_attention_heads {cfg.num_attention_heads} is not a multiple of "
                f"num_key_value_heads {cfg.num_key_value_heads}"
            )
        return cfg

    @classmethod
    def from_dir(cls, model_dir: str | Path) -> ModelConfig:
        path = Path(model_dir) / "config.json"
        if not path.is_file():
            raise MissingFileError(f"{path}: no config.json in the model directory")
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise UnsupportedModelError(f"{path}: not valid JSON ({e.msg} at line {e.lineno})") from None
        return cls.from_dict(data, source=str(path))


def _as_ids(value) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, int):
        return (value,)
    return tuple(int(v) for v in value)


@dataclass(frozen=True)
class EngineConfig:
    """How the engine runs a model. Every field has a default that suits a small CPU run.

    num_blocks=None sizes the pool so that max_num_seqs requests of max_model_len tokens
    fit at once (no pressure); set it lower to force recycling and preemption.
    """

    block_size: int = 16
    num_blocks: int | None = None
    max_num_seqs: int = 32
    max_model_len: int | None = None  # None: the model's max_position_embeddings
    max_num_batched_tokens: int = 8192  # prefill tokens per step (chunked prefill)
    # vLLM's --long-prefill-token-threshold: at most this many of one request's prompt tokens
    # per step (None: the whole budget), so a request arriving mid-prefill is admitted while
    # the long prefill still has chunks to write
    long_prefill_token_threshold: int | None = None
    enable_prefix_caching: bool = True
    allocator: str = "prefix-cache"
    device: str = "cpu"
    dtype: str | None = None  # None: float32 on CPU, bfloat16 on CUDA
    capture_attention: bool = False  # compute per-token attention leakage
    keep_attention: bool = False  # also keep the probabilities themselves (tests, small runs)
    # Models memory shared with another tenant (the hybrid models' Mamba state, vLLM #35138):
    # a recycled block handed out for new K/V holds this value in every slot before the
    # allocator may zero it. float('nan') reproduces the fault; None leaves bytes as they are.
    recycled_block_fill: float | None = None
    # Debug: run the allocator's check_integrity() after every scheduling step, raising
    # RuntimeError at the first broken invariant (as vLLM's debug asserts do). Changes no
    # output; costs time.
    check_integrity: bool = field(default=False, compare=False)
    # Load no tokenizer (vLLM's skip_tokenizer_init): requests are token ids only, stop ids
    # come from generation_config.json / config.json, and engine.tokenizer is None.
    skip_tokenizer_init: bool = False

    def __post_init__(self) -> None:
        if self.block_size < 1 or self.block_size & (self.block_size - 1):
            raise InvalidRequestError(f"block_size must be a power of two, got {self.block_size}")
        if self.num_blocks is not None and self.num_blocks < 1:
            raise InvalidRequestError(f"num_blocks must be positive, got {self.num_blocks}")
        if self.max_num_seqs < 1:
            raise InvalidRequestError(f"max_num_seqs must be positive, got {self.max_num_seqs}")
        if self.max_num_batched_tokens < self.block_size:
            raise InvalidRequestError(
                f"max_num_batched_tokens must be at least block_size, got {self.max_num_batched_tokens}"
            )
        if self.device not in ("cpu", "cuda") and not self.device.startswith("cuda:"):
            raise InvalidRequestError(f"device must be cpu or cuda, got {self.device!r}")
        if self.dtype not in (None, "float32", "bfloat16", "float16"):
            raise InvalidRequestError(f"dtype must be float32, bfloat16 or float16, got {self.dtype!r}")

    def resolved_max_model_len(self, model: ModelConfig) -> int:
        return min(self.max_model_len or model.max_position_embeddings, model.max_position_embeddings)

    def resolved_num_blocks(self, model: ModelConfig) -> int:
        if self.num_blocks is not None:
            return self.num_blocks
        return self.max_num_seqs * math.ceil(self.resolved_max_model_len(model) / self.block_size)

    def torch_dtype(self):
        import torch

        name = self.dtype or ("float32" if self.device == "cpu" else "bfloat16")
        return getattr(torch, name)
