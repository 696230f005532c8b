"""The one lifecycle every kind of run goes through (docs/architecture.md, "The run
lifecycle"), each step in its own place:

    plan      the command checks its input and opens a run directory (kvdiag.record.rundir)
    measure   a runner returns records and raw facts (kvdiag.runners.*)
    judge     the judge of its kind decides the Verdict (kvdiag.verdicts)
    finish    finish_run() stamps the typed summary (kvdiag.record.summary) and writes, in the
              run's .partial directory, results.parquet, summary.json and report.html,
              then renames it complete; the CLI renders it and exits with its verdict's code

One module per command holds the first three (kvdiag.commands). History rows and exports
read the finished directory, so they come last.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path

from kvdiag.record.results import RunResult
from kvdiag.record.rundir import RunDir, Timer, now_iso, pause, write_run
from kvdiag.record.summary import (
    SCHEMA_VERSION,
    AuditSummary,
    ProbeSummary,
    ReproduceSummary,
    Summary,
)


def no_progress(description: str, total: int | None = None) -> AbstractContextManager:
    """The progress display of a run nobody watches. Runs take `progress` in this shape (the
    CLI passes Output.progress): a context manager giving update(advance=, completed=,
    total=, description=)."""
    return nullcontext(lambda **_: None)


def forwarding(update: Callable[..., None]) -> Callable[..., AbstractContextManager]:
    """A `progress` of no_progress's shape that reports into a display already open (its
    update function), for a run inside another run's progress."""

    @contextmanager
    def progress(description: str, total: int | None = None):
        update(description=description, total=total, completed=0)
        yield update

    return progress


def stamp(summary: Summary, timer: Timer, engine: tuple[str, str] | None = None) -> None:
    """What every summary.json ends with: wall time, the (redacted) command, when, and how
    it was made."""
    from kvdiag.record.cmdline import command_line
    from kvdiag.record.environment import describe_environment

    summary.wall_seconds = round(timer.seconds, 2)
    summary.command = command_line()
    summary.created = now_iso()
    summary.schema_version = SCHEMA_VERSION
    summary.environment = describe_environment(engine=engine)


def _engine_version(summary: Summary) -> tuple[str, str] | None:
    """(engine, version) a run measured: the live server's, or the in-process vLLM audit's."""
    if isinstance(summary, ProbeSummary) and summary.server.engine and summary.server.engine_version:
        return summary.server.engine, summary.server.engine_version
    sections = ([summary.vllm_audit] if isinstance(summary, AuditSummary)
                else list((summary.vllm_audit or {}).values()) if isinstance(summary, ReproduceSummary)
                else [])
    version = next((s.vllm_version for s in sections if s.vllm_version), None)
    return ("vllm", version) if version else None


def finish_run(result: RunResult, run: RunDir, timer: Timer, *, history=None,
               before_report: Callable[[Path], None] | None = None) -> RunResult:
    """Stamp the summary, write results.parquet, summary.json and report.html into the
    run's temporary directory, then rename it complete. `history`: the runs the report's
    trend shows (a DataFrame, or a function of the stamped summary that returns one).
    `before_report`: extra files to write into the run directory first."""
    from kvdiag.report.html import write_report

    stamp(result.summary, timer, _engine_version(result.summary))
    write_run(run.path, result.frame, result.summary)
    pause("summary")  # test hook: a kill here leaves an unfinished (.partial) run
    if before_report is not None:
        before_report(run.path)
    trend = history(result.summary) if callable(history) else history
    write_report(run.path, history=trend, summary=result.summary)  # the summary as built, not re-read
    pause("report")
    result.run_dir = run.commit()
    pause("commit")
    return result
