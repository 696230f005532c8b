"""What every run returns and writes: the Signature that says how a result was made (as
sacrebleu's scores carry theirs), and RunResult, which holds the typed summary.json of its
kind (kvdiag.record.summary).

    Signature(engine="reference", allocators=("buggy", "guarded"), block_size=16,
              model="canary-397f8e10", suite="reproduce", seed=0).format()
    -> "kvdiag:0.1.0|engine:reference|alloc:buggy,guarded|bs:16|model:canary-397f8e10|suite:reproduce|seed:0"

`model` always carries a digest: `<dir>-<sha8 of config.json + weights>` for a model kvdiag
loads or starts a server on, `<served name>@<sha8 of the server's /v1/models entry>` for a
server somebody else runs (weights cannot be hashed from outside), `trace-<sha8>` for a
recorded trace with no model named.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from kvdiag.verdicts import Judgement, Verdict

if TYPE_CHECKING:
    from kvdiag.record.summary import Summary


@dataclass(frozen=True)
class Signature:
    engine: str
    allocators: tuple[str, ...]
    block_size: int
    model: str
    suite: str
    seed: int
    version: str = field(default_factory=lambda: _version())

    def format(self) -> str:
        return (f"kvdiag:{self.version}|engine:{self.engine}|alloc:{','.join(self.allocators)}"
                f"|bs:{self.block_size}|model:{self.model}|suite:{self.suite}|seed:{self.seed}")

    def __str__(self) -> str:
        return self.format()

    @classmethod
    def parse(cls, text: str) -> Signature:
        """The inverse of format(); ValueError names a malformed signature."""
        parts = dict(p.split(":", 1) for p in text.split("|") if ":" in p)
        try:
            return cls(engine=parts["engine"], allocators=tuple(filter(None, parts["alloc"].split(","))),
                       block_size=int(parts["bs"]), model=parts["model"], suite=parts["suite"],
                       seed=int(parts["seed"]), version=parts["kvdiag"])
        except (KeyError, ValueError):
            raise ValueError(f"not a kvdiag signature: {text!r}") from None


def _version() -> str:
    from kvdiag import __version__

    return __version__


def model_label(model_dir: Path) -> str:
    """`<dir>-<sha8>` of a local model directory (config.json and weights), or
    `<file>-<sha8>` of a single model file (a GGUF)."""
    from reference_engine.loader import model_hash

    model_dir = Path(model_dir)
    if model_dir.is_file():
        from kvdiag.models.gguf_import import file_sha256

        return f"{model_dir.stem}-{file_sha256(model_dir)[:8]}"
    return f"{model_dir.name}-{model_hash(model_dir)}"


@dataclass
class RunExtras:
    """What a run keeps beside its summary for the console only (never written): each kind
    sets its own fields, the others stay at their defaults."""

    # reproduce, verify: "case/allocator" -> the engine's lines
    engine_log: dict[str, list[str]] = field(default_factory=dict)
    vllm: object = None  # audit: vLLM's replay (kvdiag.runners.replay.drive.ReplayResult)
    ours: object = None  # audit: the replay through one allocator of ours, or None
    stages: list = field(default_factory=list)  # audit: kvdiag.runners.replay.hit_diff's stages
    isolation: object = None  # isolation: what it measured (kvdiag.runners.live.isolation.IsolationResult)
    judgement: Judgement | None = None  # isolation: the judge's, its details the cells judged
    checks: list = field(default_factory=list)  # regress: every check against the baseline
    ground_truth: Judgement | None = None  # regress: the run's own verdict on its series
    run_id: str = ""  # regress: the run's id in the history
    junit: Path | None = None  # regress --junit: the file written


@dataclass
class RunResult:
    """What a command's measure step and judge step make of a run. `summary` is the typed
    summary.json of its kind (kvdiag.record.summary); `frame` its per-request records; `kind`
    names the renderer; `extra` holds what only the renderer needs (RunExtras, never written)."""

    kind: str
    frame: object  # pandas DataFrame of records
    summary: Summary
    extra: RunExtras = field(default_factory=RunExtras)
    run_dir: Path | None = None  # set by finish_run

    @property
    def verdict(self) -> Verdict:
        return self.summary.verdict

    @property
    def signature(self) -> str:
        return self.summary.signature

    @property
    def exit_code(self) -> int:
        return self.verdict.exit_code

    def as_json(self) -> dict:
        """What --json prints: summary.json and where the run is; for a regression run its
        comparison with the baseline (summary.json's `regress`) at the top level."""
        data = self.summary.as_dict()
        if self.kind == "regress":
            return {"verdict": data["verdict"], "reason": data["reason"],
                    "run_dir": str(self.run_dir), "cold_cache": data["cold_cache"],
                    **{k: v for k, v in data["regress"].items() if k not in ("verdict", "reason")},
                    # a live run's lifecycle coverage, as the history keeps it beside the verdict
                    **({"events": data["events"]} if data.get("events") else {})}
        return data | {"run_dir": str(self.run_dir)}
