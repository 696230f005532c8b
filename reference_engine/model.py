"""Qwen2 / Qwen3 / Llama decoder over a pluggable attention backend.

Module names match Hugging Face's (model.layers.N.self_attn.q_proj, ...), so a checkpoint's
state dict loads as is. Shapes: N = tokens in the step (all sequences, flattened),
H = query heads, KVH = key/value heads, D = head_dim.
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import nn

from reference_engine.config import ModelConfig


class AttentionBackend(Protocol):
    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Store k, v [N, KVH, D] for this step's tokens and return attention out [N, H, D]."""


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype  # as HF: normalise in fp32, scale in the input dtype (one fused kernel)
        x = nn.functional.rms_norm(x.float(), (x.shape[-1],), eps=self.eps)
        return self.weight * x.to(dtype)


class Rotary:
    """cos/sin tables computed in fp32 from HF's inv_freq; rotate_half pairs d with d + D/2."""

    def __init__(self, head_dim: int, theta: float, device) -> None:
        exps = torch.arange(0, head_dim, 2, dtype=torch.int64).to(device=device, dtype=torch.float)
        self.inv_freq = 1.0 / (theta ** (exps / head_dim))
        self.cos = self.sin = torch.empty(0, head_dim, device=device)

    def tables(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        need = int(positions.max()) + 1
        if need > self.cos.shape[0]:
            n = max(need, 2 * self.cos.shape[0], 1024)
            freqs = torch.arange(n, device=self.inv_freq.device, dtype=torch.float)[:, None] * self.inv_freq
            emb = torch.cat((freqs, freqs), dim=-1)
            self.cos, self.sin = emb.cos(), emb.sin()
        return self.cos[positions].to(dtype)[:, None], self.sin[positions].to(dtype)[:, None]


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


def _fuse(*linears: nn.Linear) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Concatenate linears' weights (and biases) along the output dimension and point each
    linear at its slice of the result."""
    w = torch.cat([lin.weight for lin in linears])
    b = torch.cat([lin.bias for lin in linears]) if linears[0].bias is not None else None
    start = 0
    for lin in linears:
        end = start + lin.out_features
        lin.weight = nn.Parameter(w[start:end], requires_grad=False)
        if b is not None:
            lin.bias = nn.Parameter(b[start:end], requires_grad=False)
        start = end
    return w, b


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int) -> None:
        super().__init__()
        d, h, kv = cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads
        self.layer, self.num_heads, self.num_kv_heads, self.head_dim = layer, h, kv, d
        self.q_proj = nn.Linear(cfg.hidden_size, h * d, bias=cfg.qkv_bias)
        self.k_proj = nn.Linear(cfg.hidden_size, kv * d, bias=cfg.qkv_bias)
        self.v_proj = nn.Linear(cfg.hidden_size, kv * d, bias=cfg.qkv_bias)
        self.o_proj = nn.Linear(h * d, cfg.hidden_size, bias=cfg.o_bias)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(d, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(d, cfg.rms_norm_eps)
        self.qk_norm = cfg.qk_norm
        self.qkv: tuple[torch.Tensor, torch.Tensor | None] | None = None  # fused after loading

    def fuse(self) -> None:
        """One [H*D + 2*KVH*D, hidden] projection instead of three (fewer, larger matmuls);
        q/k/v_proj then hold views into it, so nothing is stored twice."""
        self.qkv = _fuse(self.q_proj, self.k_proj, self.v_proj)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                backend: AttentionBackend) -> torch.Tensor:
        n, d = x.shape[0], self.head_dim
        qkv = nn.functional.linear(x, *self.qkv)
        q, k, v = qkv.split([self.num_heads * d, self.num_kv_heads * d, self.num_kv_heads * d], -1)
        q = q.view(n, self.num_heads, d)  # [N, H, D]
        k = k.view(n, self.num_kv_heads, d)  # [N, KVH, D]
        v = v.view(n, self.num_kv_heads, d)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        out = backend.attend(self.layer, q, k, v)  # [N, H, D]
        return self.o_proj(out.reshape(n, -1))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=cfg.mlp_bias)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=cfg.mlp_bias)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=cfg.mlp_bias)
        self.gate_up: tuple[torch.Tensor, torch.Tensor | None] | None = None  # fused after loading

    def fuse(self) -> None:
        self.gate_up = _fuse(self.gate_proj, self.up_proj)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = nn.functional.linear(x, *self.gate_up).chunk(2, -1)
        return self.down_proj(nn.functional.silu(gate) * up)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg, layer)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x, cos, sin, backend):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, backend)
        return x + self.mlp(self.post_attention_layernorm(x))


class Transformer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        # weights come from load_state_dict: an explicit empty _weight skips the random init,
        # whose normal_ on the meta device imports torch._dynamo (2.8 s on first use)
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size,
                                         _weight=torch.empty(cfg.vocab_size, cfg.hidden_size))
        self.layers = nn.ModuleList(DecoderLayer(cfg, i) for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class CausalLM(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.config = cfg
        self.model = Transformer(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.rotary: Rotary | None = None

    @classmethod
    def from_weights(cls, cfg: ModelConfig, weights: dict, device: str, dtype: torch.dtype) -> CausalLM:
        with torch.device("meta"):
            model = cls(cfg)
        if cfg.tie_word_embeddings:
            weights = dict(weights, **{"lm_head.weight": weights["model.embed_tokens.weight"]})
        model.load_state_dict(weights, strict=True, assign=True)
        model = model.to(device=device, dtype=dtype).eval().requires_grad_(False)
        if cfg.tie_word_embeddings:
            model.lm_head.weight = model.model.embed_tokens.weight
        for layer in model.model.layers:
            layer.self_attn.fuse()
            layer.mlp.fuse()
        model.rotary = Rotary(cfg.head_dim, cfg.rope_theta, device)
        return model

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                backend: AttentionBackend) -> torch.Tensor:
        """input_ids, positions: [N]. Returns final hidden states [N, hidden] (normed)."""
        x = self.model.embed_tokens(input_ids)
        cos, sin = self.rotary.tables(positions, x.dtype)
        for layer in self.model.layers:
            x = layer(x, cos, sin, backend)
        return self.model.norm(x)

    @torch.inference_mode()
    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden).float()
