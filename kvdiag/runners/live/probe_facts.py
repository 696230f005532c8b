"""What one probe measured (ProbeRun): the frame of its answers and the facts its judge and
its summary read, with the one place the judge's labels are written back into them."""

from __future__ import annotations

from dataclasses import dataclass, field

from kvdiag.record import evidence as E
from kvdiag.runners.live import compare as C
from kvdiag.runners.live import phases as P
from kvdiag.runners.live.pressure import ServerCache
from kvdiag.runners.live.store import RoundStore


@dataclass
class ProbeRun:
    """What a probe measured. `frame`: one record per (phase, session, round); the rest are
    the facts its judge and its summary read."""

    frame: object  # pandas DataFrame
    plan: object  # kvdiag.planning.plan.CasePlan
    model_label: str  # the served model with a digest of its /v1/models entry
    server: ServerCache
    engine: dict  # {"name", "version"} as the server says
    salted: bool
    pressure: list[int]
    recycling: E.Recycling
    noise_floor: E.NoiseFloor
    ground_truth: E.GroundTruth
    prefix_cache: dict  # the server's own hit counters over the shared phase
    prompt_logprobs: E.PromptLogprobs  # twins' prompt logprobs against their isolated rounds'
    traffic: E.Traffic = field(default_factory=E.Traffic)  # what reached which class
    # the over-hit oracle and the differential phase (coverage.key_coverage): the judge decides
    key_coverage: E.KeyCoverage = field(default_factory=E.KeyCoverage)
    first_divergences: list[E.FirstDivergence] = field(default_factory=list)
    by_request: list[dict] = field(default_factory=list)
    # the lifecycle phase: the events table (events.coverage), every request's divergence from
    # its twin, and how the phase was sized; and the second channel (compare.topk_channel)
    lifecycle: E.Lifecycle = field(default_factory=E.Lifecycle)
    topk: E.TopK = field(default_factory=E.TopK)
    sentinel: object = None  # kvdiag.record.sentinel.SentinelBlock, where a sentinel watched

    store: RoundStore | None = None  # every answer measured (rounds.jsonl), for label()

    @property
    def shared(self):
        return self.frame[self.frame["allocator"] == P.SHARED]

    @property
    def departed(self):
        """The shared rows whose answer left its isolated twin's, in frame order: the rows
        the judge labels (kvdiag.verdicts.ProbeDetails.labels)."""
        shared = self.shared
        return shared[shared["first_divergence"].notna()]

    def label(self, labels: list[str]) -> None:
        """The judge's labels of `departed`, in its order, written into the frame (every other
        shared row: match); the first divergences and the by-request windows follow them, so
        every count of the run rests on the judge's one labelling."""
        frame = self.frame
        frame.loc[frame["allocator"] == P.SHARED, "classification"] = "match"
        frame.loc[self.departed.index, "classification"] = list(labels)
        if self.traffic.differential_only or self.store is None:
            return
        corrupt = self.shared[self.shared["classification"] == "corruption"]
        self.first_divergences = C.first_divergences(self.plan, self.store, corrupt, self.pressure)
        self.by_request = C.by_request_index(self.plan, self.store, frame, self.pressure)

    def count(self, label: str) -> int:
        return int((self.shared["classification"] == label).sum())

    @property
    def corruption_rounds(self) -> list[int]:
        bad = self.shared[self.shared["classification"] == "corruption"]
        return sorted({int(x) for x in bad["round"]})
