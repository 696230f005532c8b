"""kvdiag reproduce: a suite's cases through the contiguous reference and the paged engine
under each allocator.

    plan     allocator names, cases and model checked before any work; the run directory
    measure  kvdiag.runners.suite.run_suite: records, engine log, recycling
    judge    kvdiag.verdicts.judge_reference
    finish   ReproduceSummary, kvdiag.commands.lifecycle.finish_run
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from kvdiag.commands.lifecycle import finish_run, no_progress
from kvdiag.errors import KvdiagError
from kvdiag.paths import CANARY
from kvdiag.planning.suites import Case, Suite, load_cases, names
from kvdiag.record.results import RunExtras, RunResult, Signature, model_label
from kvdiag.record.summary import ReproduceSummary
from kvdiag.runners.suite import SuiteRun, run_suite, total_requests
from kvdiag.targets import check_allocator
from kvdiag.verdicts import Judgement, judge_reference
from kvdiag.vocab import VLLM


@dataclass
class Measured:
    """A suite run and what every judge of it reads: the records' frame and metrics."""

    suite: Suite
    cases: list[Case]
    run: SuiteRun
    model_dir: Path
    device: str
    frame: object  # pandas DataFrame of the records
    metrics: dict  # kvdiag.metrics.decay.summarize of the frame

    @property
    def rounds(self) -> list[dict]:
        return self.metrics.rounds

    def judge(self) -> Judgement:
        return judge_reference(self.rounds, [(c.name, c.ablation) for c in self.cases],
                               self.run.recycled, vllm_corrupted=self.run.vllm_corrupted)

    def fields(self, verdict: Judgement) -> dict:
        """ReproduceSummary's fields (verify's and regress's build on them)."""
        signature = Signature(engine="reference", allocators=tuple(self.run.allocators),
                              block_size=self.suite.block_size, model=model_label(self.model_dir),
                              suite=self.suite.name, seed=self.suite.seed)
        return self.metrics.fields() | {
            "signature": signature.format(), "suite": self.suite.name,
            "suite_path": str(self.suite.path), "cases": [c.name for c in self.cases],
            "targets": ["reference"], "allocators": self.run.allocators,
            "model": str(self.model_dir), "device": self.device, "engine_log": self.run.engine_log,
            "seconds": self.run.seconds, "vllm_audit": self.run.vllm_audit or None,
            "verdict": verdict.verdict, "reason": verdict.reason, "recycled": self.run.recycled,
            **verdict.details}


def check_engine_run(allocators: list[str] | None, model: Path | None) -> None:
    """Before any work: every allocator name and the model directory."""
    from kvdiag.runners.reference.engine import workers_setting

    for name in allocators or []:
        if name != VLLM:
            check_allocator(name)
    workers_setting()  # a bad KVDIAG_ALLOCATOR_WORKERS fails here, before any work
    if model is not None and not Path(model).is_dir():
        raise KvdiagError(f"--model {model}: not a model directory")


def measure(suite: Suite, cases: list[Case], *, allocators: list[str] | None = None,
            model: Path | None = None, device: str = "cpu", progress=no_progress,
            **options) -> Measured:
    """run_suite under a progress display, and the metrics of what it measured. `options`:
    dtype, spacy_model, use_cache, check_integrity as run_suite takes them."""
    import pandas as pd

    from kvdiag.metrics.decay import summarize

    model_dir = Path(model or suite.model or CANARY)
    with progress("running", total_requests(suite, cases, allocators)) as update:
        run = run_suite(suite, cases, model_dir, allocators=allocators, device=device,
                        progress=lambda n: update(advance=n),
                        on_case=lambda name: update(description=f"case {name}"), **options)
    frame = pd.DataFrame(run.records)
    return Measured(suite, cases, run, model_dir, device, frame, summarize(frame))


def reproduce(suite: str, cases: list[str] | None = None, allocators: list[str] | None = None, *,
              model: Path | None = None, out_dir: Path | None = None, progress=no_progress,
              **options) -> RunResult:
    """kvdiag reproduce, start to finish. `options`: device, dtype, spacy_model, use_cache,
    check_integrity. `progress`: see kvdiag.commands.lifecycle.no_progress."""
    from kvdiag.record.rundir import RunDir, Timer

    timer = Timer()
    allocators = names(allocators)
    check_engine_run(allocators, model)
    loaded, chosen = load_cases(suite, cases)
    with RunDir.begin(out_dir, loaded.name) as run_dir:
        measured = measure(loaded, chosen, allocators=allocators, model=model, progress=progress,
                           **options)
    summary = ReproduceSummary(**measured.fields(measured.judge()))
    result = RunResult("reproduce", measured.frame, summary,
                       extra=RunExtras(engine_log=measured.run.engine_log))
    return finish_run(result, run_dir, timer)
