"""The model-free vLLM audit's section of summary.json (`vllm_audit`), typed: a trace replayed
through the installed vLLM's own KVCacheManager (kvdiag.runners.replay.audit.vllm_section
builds it), its counters, the reads per round, the twins' reads, the epilogue's phases and
differential rows, and the comparison with one allocator of ours. The counters are the
replay's own (vLLM's PrefixCacheStats, kvdiag's shadow map); the audit's judge
(kvdiag.commands.audit.judge, kvdiag.verdicts.judge_audit) and console read them by attribute.

Every field has a default and a key not declared here is ignored on load (as the probe's
blocks, kvdiag.record.evidence.Block), so a section an older kvdiag wrote still loads.
"""

from __future__ import annotations

from pydantic import Field

from kvdiag.record.evidence import Block
from kvdiag.record.summary_rows import Num


class AuditRound(Block):
    """One round of the trace (twins aside), summed over its sessions: the tokens vLLM served
    from its cache (`hit_tokens`) of the prompt tokens (`query_tokens`), the slots read that
    another session wrote (foreign) or that nothing wrote (unwritten), the sessions that read
    one, and vLLM's hit rate (hit / query tokens; 0 for none)."""

    round: int = 0
    hit_tokens: int = 0
    query_tokens: int = 0
    foreign_slots: int = 0
    unwritten_slots: int = 0
    sessions_with_foreign_reads: list[str] = Field(default_factory=list)
    vllm_hit_rate: float = 0.0


class AuditTwins(Block):
    """The twins (prompt-logprob requests of the live probe's traffic): how many, and the
    foreign and unwritten slots they read (their rounds count as corrupted too)."""

    requests: int = 0
    foreign_slots: int = 0
    unwritten_slots: int = 0


class EpiloguePhase(Block):
    """One phase of the epilogue (kvdiag.runners.replay.epilogue: after reset, salt a, salt b,
    adapter, salt = adapter name): its requests, the tokens they hit, the slots read that were
    written before the reset or under other weights, and hits on another cache_salt's blocks."""

    phase: str = ""
    requests: int = 0
    hit_tokens: int = 0
    foreign_slots: int = 0
    unwritten_slots: int = 0
    cross_tenant_hits: int = 0


class DifferentialRow(Block):
    """One request of the differential phase (kvdiag.runners.replay.differential): its pair's
    name and family, the tokens vLLM reported cached, the most it could have (the oracle's)."""

    name: str | None = None
    family: str | None = None
    cached: int | None = None
    bound: int | None = None


class AuditDifferential(Block):
    """The differential phase: requests sent, the block size its bounds count in (`unit`), a
    row per request, slots read that nothing wrote or another wrote, why it could not run
    (`skipped`, None: it ran), and the judge's count of over-hits (None, and left out of the
    file: not judged yet; kvdiag.verdicts.differential_over_hits, whose finding the audit's
    judge adds to the epilogue's)."""

    requests: int = 0
    unit: int | None = None
    rows: list[DifferentialRow] = Field(default_factory=list)
    foreign_slots: int = 0
    unwritten_slots: int = 0
    skipped: str | None = None
    over_hits: int | None = Field(None, exclude_if=lambda v: v is None)


class Epilogue(Block):
    """The checks after the trace, on the same manager: whether vLLM reset its prefix cache,
    each phase, the differential phase, and one line per wrong hit found (`findings`)."""

    reset: bool = False
    phases: list[EpiloguePhase] = Field(default_factory=list)
    differential: AuditDifferential = Field(default_factory=AuditDifferential)
    findings: list[str] = Field(default_factory=list)


class CompareStage(Block):
    """One step of kvdiag.runners.replay.hit_diff's explanation of the allocators' hit counts:
    the requests still differing once it is applied, and each side's blocks hit."""

    stage: str = ""
    requests_differing: int = 0
    blocks_hit: int = 0
    vllm_blocks_hit: int = 0


class AuditCompare(Block):
    """vLLM's hits beside one allocator of ours on the same trace: blocks hit by each, the
    requests whose counts differ, our allocator's invariant messages, and the stages that
    explain the difference (`explained`; its first is the raw comparison)."""

    allocator: str = ""
    blocks_hit: int = 0
    vllm_blocks_hit: int = 0
    requests_differing: int = 0
    requests: int = 0
    invariant_messages: list[str] = Field(default_factory=list)
    explained: list[CompareStage] = Field(default_factory=list)


class AuditSection(Block):
    """summary.json's `vllm_audit` (a reproduce run: one per case that names the `vllm`
    allocator). `target`: vllm-<version>; the prefix_cache_* and preempted_* counters are
    vLLM's PrefixCacheStats over the run; `invariant_violations` counts the pool invariants
    broken (`invariant_messages`: the first ones); `recycled_blocks`: cached blocks the
    replay reused for other content (the trigger reached); `cross_tenant_hits`: hits on
    blocks another cache_salt wrote; `prompt_logprob_hits`: prompt-logprob requests served
    from the cache; `corrupted_rounds`: rounds where a request (twins included) read a
    foreign or unwritten slot, `corrupted` that or a broken invariant. `epilogue`: None where
    it did not run; `compare` is left out of the file where no allocator of ours ran."""

    target: str = ""
    vllm_version: str | None = None
    prefix_cache_requests: int = 0
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    prefix_cache_hit_rate: float = 0.0
    preempted_requests: int = 0
    preempted_queries: int = 0
    preempted_hits: int = 0
    preemptions: int = 0
    manager_seconds: Num = 0.0
    invariant_violations: int = 0
    recycled_blocks: int = 0
    cross_tenant_hits: int = 0
    prompt_logprob_hits: int = 0
    epilogue: Epilogue | None = None
    steps: int = 0
    replay_seconds: Num = 0.0
    invariant_messages: list[str] = Field(default_factory=list)
    rounds: list[AuditRound] = Field(default_factory=list)
    twins: AuditTwins = Field(default_factory=AuditTwins)
    corrupted_rounds: list[int] = Field(default_factory=list)
    corrupted: bool = False
    compare: AuditCompare | None = Field(None, exclude_if=lambda v: v is None)
