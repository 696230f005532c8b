"""The one lifecycle every kind of run goes through (ARCHITECTURE.md, "Targets and the run
lifecycle"):

    plan -> runner yields records -> metrics -> RunResult -> finish_run()
                                                   |           writes, in the run's .partial
    frame, summary (signature, verdict, rounds),   |           directory: results.parquet,
    kind (which renderer shows it)                 |           summary.json, report.html;
                                                   |           then renames it complete
                                                   v
                                  the CLI renders it, exits with exit_code(verdict)

A new kind of run adds a runner (returning a RunResult) and a renderer; nothing else.
History rows and exports read the finished directory, so they come last.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path

from kvdiag.runs import SCHEMA_VERSION, RunDir, Timer, command_line, now_iso, pause, write_run
from kvdiag.verdicts import exit_code


@dataclass
class RunResult:
    """What every runner returns. `summary` is summary.json (signature, suite, verdict,
    rounds, ...); `frame` its per-request records; `kind` names the run (reproduce, verify,
    probe, audit, isolation, regress) and so its renderer; `extra` holds what only the
    renderer needs (never written)."""

    kind: str
    frame: object  # pandas DataFrame of records
    summary: dict
    extra: dict = field(default_factory=dict)
    run_dir: Path | None = None  # set by finish_run

    @property
    def verdict(self) -> str:
        return self.summary.get("verdict", "fail")

    @property
    def signature(self) -> str:
        return self.summary.get("signature", "")

    @property
    def exit_code(self) -> int:
        return exit_code(self.verdict)

    def as_json(self) -> dict:
        """What --json prints: summary.json and where the run is."""
        return self.summary | {"run_dir": str(self.run_dir)}


def no_progress(description: str, total: int | None = None) -> AbstractContextManager:
    """The progress display of a run nobody watches. Runs take `progress` in this shape (the
    CLI passes Output.progress): a context manager giving update(advance=, completed=,
    total=, description=)."""
    return nullcontext(lambda **_: None)


def stamp(summary: dict, timer: Timer, kind: str, vllm_version: str | None = None) -> dict:
    """What every summary.json ends with: wall time, the (redacted) command, when, and how
    it was made."""
    from kvdiag.environment import describe_environment

    return summary | {"wall_seconds": round(timer.seconds, 2), "command": command_line(),
                      "created": now_iso(), "schema_version": SCHEMA_VERSION, "kind": kind,
                      "environment": describe_environment(vllm_version=vllm_version)}


def finish_run(result: RunResult, run: RunDir, timer: Timer, *, history=None,
               before_report: Callable[[Path], None] | None = None) -> RunResult:
    """Stamp the summary, write results.parquet, summary.json and report.html into the
    run's temporary directory, then rename it complete. `history`: the runs the report's
    trend shows (a DataFrame, or a function of the stamped summary that returns one).
    `before_report`: extra files to write into the run directory first."""
    from kvdiag.report.html import write_report

    vllm = (result.summary.get("server") or {}).get("vllm_version") or result.summary.get("vllm_version")
    result.summary = stamp(result.summary, timer, result.kind, vllm)
    write_run(run.path, result.frame, result.summary)
    pause("summary")  # test hook: a kill here leaves an unfinished (.partial) run
    if before_report is not None:
        before_report(run.path)
    trend = history(result.summary) if callable(history) else history
    write_report(run.path, history=trend)
    pause("report")
    result.run_dir = run.commit()
    pause("commit")
    return result
