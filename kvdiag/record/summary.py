"""summary.json, typed: one pydantic model per kind of run, built once by its command (never
grown key by key) and written in a fixed key order. `kvdiag schema` prints the JSON schema
of all of them (docs/summary.schema.json holds it); the tests validate every kind of run
against it.

Pydantic rather than dataclasses: the schema is generated from the same classes that build
the summary, so the published schema cannot drift from what runs write, and validation
errors name the field. Readers never take the JSON as a dict: kvdiag.record.rundir.load_summary
(parse_summary, in kvdiag.record.kinds) returns the class of its kind, picked by `kind` (both regress classes write
"regress"; a probe's `style` tells the live one apart), verdicts as Verdicts.

Contract (docs/architecture.md): `signature`, `suite`, `verdict`, `rounds` (each with
target, allocator, round, block_reuse_rate, attention_leakage, bleu4, fact_check_pass_rate,
foreign_slots, guard_rejections), `sqdr`, `brai`, `wall_seconds`. Fields may be added, none
renamed; SCHEMA_VERSION counts the additions.

    schema  adds
    2       schema_version, kind, environment, verdict "inconclusive"
    3       verdict "error", reason (one sentence: why this verdict), recycled (reproduce,
            verify), ground_truth, divergence_by_request and traffic (probe), server.engine,
            fault (audit), the detection matrix
"""

from __future__ import annotations

import json
from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from kvdiag.record.audit_section import AuditSection
from kvdiag.record.environment import Environment
from kvdiag.record.evidence import (
    FirstDivergence,
    GroundTruth,
    KeyCoverage,
    Lifecycle,
    NoiseFloor,
    PromptLogprobs,
    Recycling,
    ServerBlock,
    SessionsFile,
    TopK,
    Traffic,
)
from kvdiag.record.isolation_rows import IsolationBlock, IsolationLeak
from kvdiag.record.sentinel import SentinelBlock
from kvdiag.record.summary_rows import (
    CaseMetrics,
    CompareTarget,
    EventRow,
    MatrixRow,
    Num,
    Opt,
    RegressBlock,
    RoundRow,
    SeriesGate,
    VerifyGate,
)
from kvdiag.verdicts import Verdict

SCHEMA_VERSION = 3
STAMP = ("wall_seconds", "command", "created", "schema_version", "kind", "environment")


class Summary(BaseModel):
    """What every kind writes. Subclasses add their fields; ORDER is the key order on disk.

    `environment` is typed too (kvdiag.record.environment.Environment: packages, spaCy models,
    Python, platform, CPU, git commit), read by attribute; as provenance it keeps any key it
    does not declare, and its packages are keyed by whatever is installed."""

    model_config = ConfigDict(extra="forbid", use_enum_values=False)
    ORDER: ClassVar[tuple[str, ...]] = ()
    OMIT_NONE: ClassVar[frozenset[str]] = frozenset()

    kind: str
    signature: str = Field(description="How the result was made, model digest included "
                           "(kvdiag.record.results.Signature)")
    suite: str
    verdict: Verdict
    reason: str = Field("", description="One sentence: why this verdict")
    rounds: list[RoundRow] = Field(default_factory=list)
    sqdr: dict[str, Opt] = Field(default_factory=dict)
    brai: dict[str, Opt] = Field(default_factory=dict)
    main_case: str | None = None
    by_case: dict[str, CaseMetrics] = Field(default_factory=dict, description="case -> its "
                                            "SQDR and BRAI per series (sqdr/brai: the main case's)")
    bleu_signature: str | None = None
    # the stamp finish_run adds (kvdiag.commands.lifecycle.stamp)
    wall_seconds: Num = 0.0
    command: str | None = None
    created: str | None = None
    schema_version: int = SCHEMA_VERSION
    environment: Environment = Field(default_factory=Environment)

    def as_dict(self) -> dict:
        """The JSON-ready dict, keys in ORDER (then any other field, then the stamp); a NaN
        or infinity (a margin where two answers never parted) is null, as JSON has no NaN."""
        data = json.loads(self.model_dump_json())
        for key in self.OMIT_NONE:
            if data.get(key) is None:
                data.pop(key, None)
        first = [k for k in self.ORDER if k in data]
        rest = [k for k in data if k not in first and k not in STAMP]
        return {k: data[k] for k in (*first, *rest, *(s for s in STAMP if s in data))}

    def to_json(self) -> str:
        return json.dumps(self.as_dict(), indent=2, default=str, allow_nan=False) + "\n"

    def round_dicts(self) -> list[dict]:
        return [r.model_dump(mode="json", exclude_none=False) for r in self.rounds]


METRICS_ORDER = ("rounds", "sqdr", "brai", "main_case", "by_case", "bleu_signature", "signature",
                 "suite")


class ReproduceSummary(Summary):
    """kvdiag reproduce: the suite's cases through the contiguous reference and each allocator.

    `vllm_audit`: case -> vLLM's own KVCacheManager's replay of it (kvdiag.record.audit_section),
    for the cases that name the `vllm` allocator; None where none does."""

    ORDER = (*METRICS_ORDER, "suite_path", "cases", "targets", "allocators", "model", "device",
             "engine_log", "seconds", "vllm_audit", "verdict", "gates", "faults")
    OMIT_NONE = frozenset({"vllm_audit"})
    kind: Literal["reproduce"] = "reproduce"
    suite_path: str
    cases: list[str]
    targets: list[str]
    allocators: list[str]
    model: str
    device: str
    engine_log: dict[str, list[str]]
    seconds: dict[str, dict[str, Num]]
    vllm_audit: dict[str, AuditSection] | None = None
    gates: dict[str, SeriesGate]
    faults: dict[str, list[str]]
    recycled: dict[str, dict[str, int]] = Field(
        default_factory=dict, description="case -> allocator -> cached blocks recycled")


class VerifySummary(ReproduceSummary):
    """kvdiag verify: a reproduce run whose verdict is the gate's (`run_verdict`: the run's own)."""

    ORDER = (*ReproduceSummary.ORDER, "gate", "run_verdict")
    kind: Literal["verify"] = "verify"
    gate: VerifyGate
    run_verdict: Verdict


class ProbeSummary(Summary):
    """kvdiag probe: a live server, shared vs cache-isolated runs of the same requests."""

    ORDER = (*METRICS_ORDER, "cases", "style", "targets", "model", "verdict", "corruption_rounds",
             "corruption_where", "corrupted_requests", "numerics_requests", "noise_floor", "isolation",
             "server_prefix_cache", "server", "recycling", "first_divergences",
             "inconclusive_reason", "ground_truth", "divergence_by_request", "traffic",
             "prompt_logprobs", "key_coverage", "target_spec", "events", "lifecycle", "topk", "sentinel")
    OMIT_NONE = frozenset({"first_divergences", "inconclusive_reason", "target_spec", "sentinel",
                           "corruption_where"})
    kind: Literal["probe"] = "probe"
    cases: list[str]
    style: str
    targets: list[str]
    model: str
    corruption_rounds: list[int]
    corruption_where: str | None = Field(None, description="where the judge found the corrupted "
                                         "requests: 'rounds 2, 5; lifecycle flood, differential'")
    corrupted_requests: int
    numerics_requests: int
    noise_floor: NoiseFloor = Field(default_factory=NoiseFloor)
    isolation: Literal["cache_salt", "cache_prompt", "reset_prefix_cache"]
    server_prefix_cache: dict[str, Opt]
    server: ServerBlock
    recycling: Recycling = Field(default_factory=Recycling)
    first_divergences: list[FirstDivergence] | None = None
    inconclusive_reason: str | None = None
    ground_truth: GroundTruth = Field(default_factory=GroundTruth)
    divergence_by_request: list[dict[str, Num]] = Field(
        default_factory=list, description="divergence rate by request index, in windows, so slow "
        "decay over a long run shows")
    traffic: Traffic = Field(default_factory=Traffic)
    prompt_logprobs: PromptLogprobs = Field(default_factory=PromptLogprobs)
    key_coverage: KeyCoverage = Field(default_factory=KeyCoverage)
    target_spec: str | None = None
    events: list[EventRow] = Field(
        default_factory=list, description="the coverage table: one row per event of a block's "
        "life, reached or not, with the server's evidence and the requests exposed "
        "(kvdiag.runners.live.events)")
    lifecycle: Lifecycle = Field(default_factory=Lifecycle)
    topk: TopK = Field(default_factory=TopK)
    sessions_file: SessionsFile | None = None
    text: Literal["kept", "withheld"] = Field("kept", description="withheld: --no-text")
    sentinel: SentinelBlock | None = Field(None, description="what a sentinel inside the server "
                                           "checked, and every bad read it saw (kvdiag.sentinel)")


class AuditSummary(Summary):
    """kvdiag audit-vllm: a trace replayed through vLLM's own KVCacheManager, model-free.

    `vllm_audit`: the replay's section (kvdiag.record.audit_section.AuditSection), which
    kvdiag.commands.audit.judge and the audit console read by attribute."""

    ORDER = (*METRICS_ORDER, "cases", "targets", "allocators", "model", "fault", "vllm_audit",
             "verdict", "gates", "faults")
    OMIT_NONE = frozenset({"fault"})
    kind: Literal["audit"] = "audit"
    cases: list[str]
    targets: list[str]
    allocators: list[str]
    model: str
    fault: str | None = Field(None, description="the fault planted into vLLM in-process, if any")
    vllm_audit: AuditSection
    gates: dict[str, SeriesGate] = Field(default_factory=dict)
    faults: dict[str, list[str]] = Field(default_factory=dict)


class IsolationSummary(Summary):
    """kvdiag isolation: can one tenant tell another's prefix from the cache?"""

    ORDER = ("signature", "suite", "verdict", "reason", "target", "model", "rounds", "sqdr",
             "brai", "requests", "leaks", "isolation", "sentinel")
    OMIT_NONE = frozenset({"sentinel"})
    kind: Literal["isolation"] = "isolation"
    target: str
    model: str
    requests: int
    leaks: list[IsolationLeak] = Field(description="the judged configurations' leaking cells")
    isolation: IsolationBlock = Field(description="the server facts, the plan and every "
                                      "judged cell (kvdiag.record.isolation_rows)")
    sentinel: SentinelBlock | None = Field(None, description="what a sentinel inside the server "
                                           "checked while the audit ran (kvdiag.sentinel)")


class RegressReferenceSummary(ReproduceSummary):
    """kvdiag regress on the reference engine (a fleet cell too): the reproduce run measured,
    its comparison with the baseline in `regress`."""

    ORDER = (*ReproduceSummary.ORDER, "cold_cache", "regress")
    kind: Literal["regress"] = "regress"
    cold_cache: bool
    regress: RegressBlock


class RegressProbeSummary(ProbeSummary):
    """kvdiag regress on a live server (a fleet cell too): the probe measured, compared."""

    ORDER = (*ProbeSummary.ORDER, "cold_cache", "regress")
    kind: Literal["regress"] = "regress"
    cold_cache: bool
    regress: RegressBlock


RegressRun = RegressReferenceSummary | RegressProbeSummary  # either: what a regress run writes


class MatrixSummary(Summary):
    """kvdiag detect: healthy and every planted fault, through the audit and the live probe."""

    ORDER = ("signature", "suite", "verdict", "reason", "engine", "paths", "matrix", "rounds",
             "sqdr", "brai")
    kind: Literal["matrix"] = "matrix"
    engine: str
    paths: list[str]
    matrix: list[MatrixRow]


class CompareSummary(Summary):
    """kvdiag compare: targets probed on the same sessions, each judged against its own isolated
    twin; `rounds` holds each one's shared series (target: its spec), the verdict the worst."""

    ORDER = ("signature", "suite", "verdict", "reason", "sessions_file", "targets", "rounds", "sqdr")
    kind: Literal["compare"] = "compare"
    sessions_file: str | None = None
    targets: list[CompareTarget]
