"""summary.json's `sentinel` block, typed: what a sentinel inside the engine checked during a
run, and every bad read it saw, named by the client's request where the run sent it."""

from __future__ import annotations

from pydantic import BaseModel, Field

# what the sentinel cannot see, said wherever it passes (docs/sentinel.md)
TRUSTS = ("it trusts the workers to write where the scheduler told them: a kernel that writes "
          "elsewhere is the black-box probe's to catch")


class SentinelFinding(BaseModel):
    kind: str = Field(description="foreign (another prefix's K/V), unwritten (nobody's), or "
                      "overwrite (a write into a block another live request had computed)")
    step: int
    request: str = Field(description="the engine's request id")
    where: str | None = Field(None, description="the run's request it is: phase, session, round")
    index: int | None = Field(None, description="when that request landed among the run's "
                              "requests (rounds.jsonl's index; None: not one of the run's)")
    positions: list[list[int]] = Field(description="[start, end) ranges read wrong (the first 8)")
    count: int
    context_len: int
    writers: list[str] = Field(default_factory=list)
    writers_where: list[str | None] = Field(default_factory=list)
    context: list[str] = Field(default_factory=list, description="the reader's event")
    writer_context: list[str] = Field(default_factory=list, description="the writers' fate")


class SentinelRound(BaseModel):
    round: int
    requests: int = Field(description="shared requests of the round that read a slot wrong")
    bad_reads: int = Field(description="positions read foreign or unwritten")
    share: float = Field(description="the largest share of one request's context read wrong")


class SentinelBlock(BaseModel):
    source: str
    engine: str | None = None
    version: str | None = None
    starts: int = Field(description="server starts the file covers during the run")
    steps: int
    requests: int
    reads: int = Field(description="slot reads checked")
    writes: int
    unchecked: int = Field(description="request-steps it could not check (a KV cache group that "
                           "is not attention, token ids it did not have)")
    foreign: int
    unwritten: int
    overwrite: int
    groups: list[str] = Field(default_factory=list, description="the KV cache groups it followed "
                              "('full attention', 'sliding window N'; 'not followed' for another "
                              "kind); empty where the engine has one table per request")
    zeroed: int = Field(0, description="blocks the workers zeroed before a step")
    copies: int = Field(0, description="copy-on-write block copies it applied")
    shifted: int = Field(0, description="reads of KV cells llama.cpp's --cache-reuse moved, each judged "
                         "by the token its cell was written for, not by its prefix (its K/V were "
                         "computed after other tokens, by design)")
    attention: bool = Field(False, description="whether it weighed the attention each sampled "
                            "token paid to slots read wrong, every one (the rounds' attention_leakage)")
    leaked: int = Field(0, description="requests whose sampled tokens paid attention to slots "
                        "read wrong (weighed or not)")
    leakage_unweighed: int = Field(0, description="of those, requests with a wrong read whose "
                                   "attention could not be weighed: the run's leakage is then "
                                   "unmeasured (NaN in every round)")
    leakage_largest: float | None = Field(None, description="the largest of those requests' "
                                          "leakage: attention on wrong slots per sampled token, "
                                          "mean over layers and heads (None: none measured)")
    by_phase: dict[str, int] = Field(default_factory=dict, description="positions read foreign or "
                                     "unwritten, by the phase of the run's request that read them "
                                     "('unnamed': a request the run's records do not name), most first")
    isolated_bad: int = Field(0, description="of those, positions read wrong by requests sent "
                              "isolated: the ground truth the answers are compared with")
    findings: list[SentinelFinding] = Field(default_factory=list, description="the first 20")
    findings_total: int = 0
    rounds: list[SentinelRound] = Field(default_factory=list)
    trusts: str = TRUSTS
    unseen: list[str] = Field(default_factory=list, description="orders this engine version "
                              "hands its workers none of (a vLLM without preempted requests, "
                              "zeroed blocks or copy-on-write copies in its scheduler output), "
                              "so the sentinel cannot follow those events")

    @property
    def bad(self) -> int:
        return self.foreign + self.unwritten + self.overwrite
