"""One request: a prompt (the whole session history), its generated tokens, its block table
and the counters the engine keeps for it. Nothing else: the attention backend keeps its own
per-sequence state (paged_backend.SeqState), keyed by seq_id."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from enum import Enum

from reference_engine.provenance import Fingerprints


class SequenceStatus(Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass
class RequestStats:
    prompt_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens served from the prefix cache at first admission
    blocks_needed: int = 0  # blocks the prompt needs
    blocks_hit: int = 0  # of those, served from the prefix cache at first admission
    blocks_allocated: int = 0  # new blocks over the request's life (recompute included)
    preemptions: int = 0
    guard_rejections: int = 0
    foreign_slots: int = 0  # context positions read whose writer's prefix differs from ours
    unwritten_slots: int = 0  # context positions read that nobody wrote since allocation
    nonfinite_logits: int = 0  # sampled positions whose logits held NaN or Inf
    leakage_sum: float = 0.0  # sum over generated tokens of the mean over layers and heads
    leakage_max: float = 0.0  # max over generated tokens, layers and heads
    leakage_tokens: int = 0

    @property
    def block_reuse_rate(self) -> float:
        return self.blocks_hit / self.blocks_needed if self.blocks_needed else 0.0

    @property
    def attention_leakage(self) -> float:
        return self.leakage_sum / self.leakage_tokens if self.leakage_tokens else float("nan")


_ids = itertools.count()


@dataclass(eq=False)
class Sequence:
    prompt_ids: list[int]
    max_tokens: int
    stop_ids: frozenset[int] = frozenset()
    cache_salt: str | None = None
    lora_name: str | None = None  # an extra hash key only: the engine serves no adapters
    tag: object = None  # the caller's label (session, round, ...), returned untouched
    seq_id: int = field(default_factory=lambda: next(_ids))

    def __post_init__(self) -> None:
        self.token_ids: list[int] = list(self.prompt_ids)
        self.num_prompt_tokens = len(self.prompt_ids)
        self.status = SequenceStatus.WAITING
        self.num_computed_tokens = 0  # tokens whose K/V are in the cache for this sequence
        self.block_table: list[int] = []
        self.block_hashes: list[bytes] = []  # chained hashes of the full blocks, filled lazily
        self.num_cached_blocks = 0  # leading full blocks registered in the prefix cache
        self.finish_reason: str | None = None
        self.stats = RequestStats(prompt_tokens=self.num_prompt_tokens)
        self.fingerprints = Fingerprints(self.prompt_ids)
        self.first_admission = True

    @property
    def output_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:]

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    def stop_reason(self, max_model_len: int) -> str | None:
        """Why the token just appended ends the request ("stop", "length"), or None."""
        if self.token_ids[-1] in self.stop_ids:
            return "stop"
        if len(self.output_ids) >= self.max_tokens or self.num_tokens >= max_model_len:
            return "length"
        return None

    def append_token(self, token_id: int) -> None:
        self.token_ids.append(token_id)
        self.fingerprints.append(token_id)

    def reset_for_recompute(self) -> None:
        """Preempted: drop the block table; the prompt and tokens generated so far are
        recomputed on re-admission (vLLM's recompute preemption)."""
        self.status = SequenceStatus.WAITING
        self.num_computed_tokens = 0
        self.block_table = []
        self.num_cached_blocks = 0
        self.stats.preemptions += 1
