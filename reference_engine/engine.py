"""The step loop: schedule, prepare new blocks, run the model over the paged cache, sample
greedily, register full blocks, finish sequences."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import Path

import torch

from reference_engine import allocators
from reference_engine.config import EngineConfig
from reference_engine.errors import InvalidRequestError, PoolTooSmallError, PromptTooLongError
from reference_engine.kv_cache import PagedKVCache
from reference_engine.loader import Checkpoint, check_weights, has_tokenizer, load_checkpoint
from reference_engine.log_lines import GUARD_LOG_LINE, PAGED_ATTENTION_LINE
from reference_engine.model import CausalLM
from reference_engine.paged_backend import PagedBackend, SeqState
from reference_engine.scheduler import ScheduledSeq, Scheduler
from reference_engine.sequence import Sequence
from reference_engine.util import cdiv

log = logging.getLogger("reference_engine")


def load_model(ckpt: Checkpoint, config: EngineConfig) -> CausalLM:
    if config.device.startswith("cuda") and not torch.cuda.is_available():
        raise InvalidRequestError("device cuda requested but torch sees no CUDA device")
    weights = check_weights(ckpt.config, ckpt.weights, str(ckpt.path))
    return CausalLM.from_weights(ckpt.config, weights, config.device, config.torch_dtype())


def validate_request(prompt_ids: list[int], max_tokens: int, cache_salt: str | None = None, *,
                     vocab_size: int, max_model_len: int, block_size: int,
                     num_blocks: int | None = None) -> None:
    """Raise a typed, one-line error for a request no engine could serve."""
    if not prompt_ids:
        raise InvalidRequestError("the prompt is empty")
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise InvalidRequestError(f"max_tokens must be a positive integer, got {max_tokens!r}")
    bad = next((t for t in prompt_ids if not isinstance(t, int) or not 0 <= t < vocab_size), None)
    if bad is not None:
        raise InvalidRequestError(f"token id {bad!r} is outside the vocabulary (size {vocab_size})")
    if cache_salt is not None and (not isinstance(cache_salt, str) or not cache_salt):
        raise InvalidRequestError("cache_salt must be a non-empty string")
    total = len(prompt_ids) + max_tokens
    if total > max_model_len:
        raise PromptTooLongError(
            f"prompt ({len(prompt_ids)} tokens) + max_tokens ({max_tokens}) = {total} "
            f"exceeds max_model_len {max_model_len}"
        )
    need = cdiv(total, block_size)
    if num_blocks is not None and need > num_blocks:
        raise PoolTooSmallError(
            f"a request of {total} tokens needs {need} blocks; the pool has {num_blocks} "
            f"(raise num_blocks)"
        )


def generate(engine, prompts: list[list[int]], max_tokens: int = 64, **kw) -> list[Sequence]:
    """Every prompt queued, then steps until all finish (LLMEngine.generate and
    ContiguousEngine.generate: the same loop over either engine)."""
    seqs = [engine.add_request(p, max_tokens, **kw) for p in prompts]
    while engine.has_unfinished():
        engine.step()
    return seqs


class ModelRunner:
    """Runs one scheduled batch through the model and returns the sampled tokens."""

    def __init__(self, model: CausalLM, device: str) -> None:
        self.model, self.device = model, device
        self.last_logits: dict[Sequence, torch.Tensor] = {}
        self.scale = model.config.head_dim ** -0.5

    def inputs(self, batch: list[ScheduledSeq]) -> tuple[torch.Tensor, torch.Tensor]:
        ids, pos = [], []
        for s in batch:
            start = s.seq.num_computed_tokens
            ids.extend(s.seq.token_ids[start:start + s.num_tokens])
            pos.extend(range(start, start + s.num_tokens))
        return (torch.tensor(ids, dtype=torch.long, device=self.device),
                torch.tensor(pos, dtype=torch.long, device=self.device))

    def sample(self, hidden: torch.Tensor, batch: list[ScheduledSeq]) -> dict[Sequence, int]:
        rows, seqs, row = [], [], 0
        for s in batch:
            row += s.num_tokens
            if s.samples:
                rows.append(row - 1)
                seqs.append(s.seq)
        if not rows:
            return {}
        logits = self.model.logits(hidden[torch.tensor(rows, device=hidden.device)])
        self.last_logits = dict(zip(seqs, logits.unbind(0)))  # kept for tests and logprobs
        # a row sum in fp64 is finite iff every logit of the row is (no overflow at 2e308)
        finite = torch.isfinite(logits.sum(-1, dtype=torch.float64)).tolist()
        tokens = logits.argmax(-1).tolist()
        for seq, ok in zip(seqs, finite):
            seq.stats.nonfinite_logits += not ok
        return dict(zip(seqs, tokens))


class LLMEngine:
    def __init__(self, model: str | Path | Checkpoint, config: EngineConfig | None = None) -> None:
        self.config = config = config or EngineConfig()
        self.checkpoint = (model if isinstance(model, Checkpoint) else
                           load_checkpoint(model, tokenizer=not config.skip_tokenizer_init))
        mcfg = self.checkpoint.config
        self.tokenizer = self.checkpoint.tokenizer
        self.max_model_len = config.resolved_max_model_len(mcfg)
        num_blocks = config.resolved_num_blocks(mcfg)
        self.allocator = allocators.create(config.allocator, num_blocks, config.block_size,
                                           config.enable_prefix_caching)
        self.model = load_model(self.checkpoint, config)
        self.cache = PagedKVCache(num_layers=mcfg.num_hidden_layers, num_blocks=num_blocks,
                                  block_size=config.block_size,
                                  num_kv_heads=mcfg.num_key_value_heads, head_dim=mcfg.head_dim,
                                  dtype=config.torch_dtype(), device=config.device)
        self.scheduler = Scheduler(self.allocator, max_num_seqs=config.max_num_seqs,
                                   max_num_batched_tokens=config.max_num_batched_tokens,
                                   long_prefill_token_threshold=config.long_prefill_token_threshold)
        self.runner = ModelRunner(self.model, config.device)
        self.seq_states: dict[int, SeqState] = {}  # the backend's per-sequence state, by seq_id
        # watchers of every step from outside (kvdiag's sentinel): scheduled(out, zeroed)
        # before the forward pass, finished(seq, cancelled) when a sequence leaves, reset()
        # after the prefix cache reports itself reset
        self.observers: list = []
        log.info(PAGED_ATTENTION_LINE.format(block_size=config.block_size))
        if self.allocator.guarded:
            log.info(GUARD_LOG_LINE)

    # --- requests ----------------------------------------------------------------------
    def add_request(self, prompt_ids: list[int], max_tokens: int = 64,
                    stop_ids: Iterable[int] | None = None, cache_salt: str | None = None,
                    lora_name: str | None = None, tag: object = None, session=None) -> Sequence:
        """Queue a request. `session` is accepted for symmetry with ContiguousEngine and
        ignored: the paged engine finds a session's history through the prefix cache."""
        self.validate(prompt_ids, max_tokens, cache_salt)
        stops = self.checkpoint.stop_token_ids if stop_ids is None else tuple(stop_ids)
        seq = Sequence(list(prompt_ids), max_tokens, frozenset(stops), cache_salt, lora_name, tag)
        self.scheduler.add(seq)
        return seq

    def validate(self, prompt_ids: list[int], max_tokens: int, cache_salt: str | None = None) -> None:
        validate_request(prompt_ids, max_tokens, cache_salt, vocab_size=self.checkpoint.config.vocab_size,
                         max_model_len=self.max_model_len, block_size=self.config.block_size,
                         num_blocks=self.allocator.num_blocks)

    def abort_request(self, seq: Sequence) -> None:
        """Drop seq before it finishes and free its blocks; finish_reason becomes "abort"."""
        if not seq.is_finished:
            self.scheduler.abort(seq)
            self._forget(seq)
            for o in self.observers:
                o.finished(seq, cancelled=True)

    def reset_prefix_cache(self) -> bool:
        """Empty the prefix cache: False (nothing done) while a request is unfinished."""
        done = not self.has_unfinished() and self.allocator.reset_prefix_cache()
        if done:
            for o in self.observers:
                o.reset()
        return done

    def attention(self, seq: Sequence) -> list[dict]:
        """The attention records the backend kept for seq, one per sampled token (only with
        EngineConfig.keep_attention; otherwise empty)."""
        state = self.seq_states.get(seq.seq_id)
        return state.attention if state is not None else []

    def _forget(self, seq: Sequence) -> None:
        if not self.config.keep_attention:  # tests read the records after the sequence ends
            self.seq_states.pop(seq.seq_id, None)

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    # --- the step ----------------------------------------------------------------------
    def step(self) -> list[Sequence]:
        out = self.scheduler.schedule()
        if self.config.check_integrity:  # after every recycle and hit, before the forward pass
            self.allocator.check_integrity()
        for new in out.new_blocks:
            self.cache.prepare_new_blocks(new.new_block_ids, new.recycled,
                                          zero=self.allocator.zero_new_blocks,
                                          recycled_fill=self.config.recycled_block_fill)
        for o in self.observers:
            o.scheduled(out, zeroed=self.allocator.zero_new_blocks)
        if not out.scheduled:
            if self.scheduler.has_unfinished() and not out.preempted:
                raise PoolTooSmallError("no request can be scheduled: the pool is too small")
            return []
        backend = PagedBackend(self.cache, out.scheduled, self.seq_states, mode=self.allocator.attention_mask,
                               scale=self.runner.scale,
                               capture=self.config.capture_attention or self.config.keep_attention,
                               keep=self.config.keep_attention, device=self.config.device)
        ids, pos = self.runner.inputs(out.scheduled)
        hidden = self.model(ids, pos, backend)
        sampled = self.runner.sample(hidden, out.scheduled)
        backend.record_leakage()
        finished = []
        for s in out.scheduled:
            seq = s.seq
            seq.num_computed_tokens += s.num_tokens
            self.allocator.cache_full_blocks(seq, seq.num_computed_tokens)
            token = sampled.get(seq)
            if token is None:
                continue
            seq.append_token(token)
            if (reason := seq.stop_reason(self.max_model_len)) is not None:
                self.scheduler.finish(seq, reason)
                self._forget(seq)
                for o in self.observers:
                    o.finished(seq, cancelled=False)
                finished.append(seq)
        return finished

    generate = generate


def complete(model: str | Path, prompt: str | list[int], *, chat: bool = False,
             max_tokens: int = 64, **config) -> tuple[list[int], str | None]:
    """One greedy completion on a fresh engine (EngineConfig(**config), one sequence at a
    time): the generated ids and their text, None without a tokenizer. `prompt`: text
    (encoded as is, or as one user message in the chat template with `chat`), or token ids,
    which need no tokenizer (vLLM's skip_tokenizer_init)."""
    ids = None if isinstance(prompt, str) else list(prompt)
    skip_tokenizer = ids is not None and not has_tokenizer(model)
    engine = LLMEngine(Path(model), EngineConfig(max_num_seqs=1, skip_tokenizer_init=skip_tokenizer,
                                                 **config))
    tok = engine.tokenizer
    if ids is None:
        ids = tok.encode_chat([{"role": "user", "content": prompt}]) if chat else tok.encode(prompt)
    (seq,) = engine.generate([ids], max_tokens=max_tokens)
    return seq.output_ids, None if tok is None else tok.decode(seq.output_ids)
