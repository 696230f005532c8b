"""Contiguous reference mode: the ground truth every paged run is compared with.

Same weights and model code, but each session keeps a plain contiguous K/V tensor per layer:
no block table, no prefix cache, no sharing, nothing recycled. A session's next turn extends
its own tensor (the K/V of a prefix depend on that prefix only), so a 12-round session costs
one pass over its history, as it would with a cache, without any of a cache's machinery.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from pathlib import Path

import torch

from reference_engine.attention import prefill_attention
from reference_engine.config import EngineConfig
from reference_engine.engine import ModelRunner, generate, load_model, validate_request
from reference_engine.errors import InvalidRequestError
from reference_engine.loader import Checkpoint, load_checkpoint
from reference_engine.scheduler import ScheduledSeq
from reference_engine.sequence import Sequence, SequenceStatus


class ContiguousKV:
    """One session's K/V: per layer [capacity, KVH, D], valid up to `len(token_ids)`."""

    def __init__(self, num_layers: int, kv_heads: int, head_dim: int, dtype, device) -> None:
        self.k = [torch.empty(0, kv_heads, head_dim, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v = [t.clone() for t in self.k]
        self.token_ids: list[int] = []
        self.busy = False

    def reserve(self, n: int) -> None:
        if n <= self.k[0].shape[0]:
            return
        cap = max(n, 2 * self.k[0].shape[0], 256)
        for kv in (self.k, self.v):
            for i, t in enumerate(kv):
                grown = t.new_empty(cap, *t.shape[1:])
                grown[: t.shape[0]] = t
                kv[i] = grown

    def reuse_prefix(self, prompt_ids: list[int]) -> int:
        """Keep the longest common prefix with the new prompt (never all of it)."""
        n = 0
        limit = min(len(self.token_ids), len(prompt_ids) - 1)
        while n < limit and self.token_ids[n] == prompt_ids[n]:
            n += 1
        del self.token_ids[n:]
        return n


class ContiguousBackend:
    def __init__(self, batch: list[ScheduledSeq], stores: dict[Sequence, ContiguousKV], scale: float) -> None:
        self.items, row = [], 0
        for s in batch:
            start = s.seq.num_computed_tokens
            self.items.append((stores[s.seq], row, start, start + s.num_tokens))
            stores[s.seq].reserve(start + s.num_tokens)
            row += s.num_tokens
        self.scale = scale

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(q)
        for store, row, start, ctx in self.items:
            r1 = row + ctx - start
            store.k[layer][start:ctx] = k[row:r1]
            store.v[layer][start:ctx] = v[row:r1]
            out[row:r1], _ = prefill_attention(q[row:r1], store.k[layer][:ctx], store.v[layer][:ctx],
                                               start, ctx, "additive", self.scale, False)
        return out


class ContiguousEngine:
    """Runs requests concurrently (batched linear layers, per-sequence attention)."""

    def __init__(self, model: str | Path | Checkpoint, config: EngineConfig | None = None) -> None:
        self.config = config = config or EngineConfig()
        self.checkpoint = model if isinstance(model, Checkpoint) else load_checkpoint(model)
        self.tokenizer = self.checkpoint.tokenizer
        self.max_model_len = config.resolved_max_model_len(self.checkpoint.config)
        self.model = load_model(self.checkpoint, config)
        self.runner = ModelRunner(self.model, config.device)
        self.sessions: dict[Hashable, ContiguousKV] = {}
        self.stores: dict[Sequence, ContiguousKV] = {}
        self.waiting: list[Sequence] = []
        self.running: list[Sequence] = []

    def _new_store(self) -> ContiguousKV:
        c = self.checkpoint.config
        return ContiguousKV(c.num_hidden_layers, c.num_key_value_heads, c.head_dim,
                            self.config.torch_dtype(), self.config.device)

    def add_request(self, prompt_ids: list[int], max_tokens: int = 64,
                    stop_ids: Iterable[int] | None = None, session: Hashable | None = None,
                    tag: object = None, **_ignored) -> Sequence:
        validate_request(prompt_ids, max_tokens, vocab_size=self.checkpoint.config.vocab_size,
                         max_model_len=self.max_model_len, block_size=self.config.block_size)
        stops = self.tokenizer.stop_token_ids if stop_ids is None else tuple(stop_ids)
        seq = Sequence(list(prompt_ids), max_tokens, frozenset(stops), tag=tag)
        store = self._new_store() if session is None else self.sessions.setdefault(session, self._new_store())
        if store.busy:
            raise InvalidRequestError(f"session {session!r} already has a request in flight")
        store.busy = True
        seq.num_computed_tokens = store.reuse_prefix(seq.token_ids)
        seq.stats.cached_tokens = seq.num_computed_tokens
        self.stores[seq] = store
        self.waiting.append(seq)
        return seq

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def step(self) -> list[Sequence]:
        while self.waiting and len(self.running) < self.config.max_num_seqs:
            seq = self.waiting.pop(0)
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
        batch, budget = [], self.config.max_num_batched_tokens
        for seq in self.running:
            n = min(seq.num_tokens - seq.num_computed_tokens, budget)
            if n <= 0:
                break
            batch.append(ScheduledSeq(seq, n))
            budget -= n
        backend = ContiguousBackend(batch, self.stores, self.runner.scale)
        ids, pos = self.runner.inputs(batch)
        hidden = self.model(ids, pos, backend)
        sampled = self.runner.sample(hidden, batch)
        finished = []
        for s in batch:
            seq, store = s.seq, self.stores[s.seq]
            start = seq.num_computed_tokens
            store.token_ids.extend(seq.token_ids[start:start + s.num_tokens])
            seq.num_computed_tokens += s.num_tokens
            token = sampled.get(seq)
            if token is None:
                continue
            seq.append_token(token)
            if (reason := seq.stop_reason(self.max_model_len)) is not None:
                seq.status, seq.finish_reason = SequenceStatus.FINISHED, reason
                self.running.remove(seq)
                self.stores.pop(seq).busy = False
                finished.append(seq)
        return finished

    generate = generate

