"""One round of one session as the vLLM replay (vllm.py) holds it: the vLLM Request and what
the audit keeps beside it."""

from __future__ import annotations

from dataclasses import dataclass, field

from kvdiag.runners.replay.shadow import ReadLog


@dataclass(eq=False)
class VllmTurn:
    """One round of one session: the vLLM Request plus what the audit keeps beside it."""

    tag: object  # reference_engine.sessions.TurnRequest
    request: object  # vllm.v1.request.Request
    teacher: list[int]  # the reference's tokens, fed in order
    fingerprints: object  # reference_engine.kv_cache.Fingerprints of all its tokens
    stats: object  # reference_engine.sequence.RequestStats
    reads: ReadLog = field(default_factory=ReadLog)
    first_admission: bool = True
    hashed_blocks: int = 0  # block hashes already entered in the audit's hash -> prefix map
    tenant: int = 0  # shadow.tenant_of(its cache_salt)
    admitted: int = -1  # how many requests were admitted before it (its first admission)
    hit_blocks: list = field(default_factory=list)  # its first admission's cache hits, checked
    # once the step that admitted it has written (blocks cached in that step are written then)

    @property
    def label(self) -> str:
        return f"{self.tag.session} round {self.tag.round + 1}"
