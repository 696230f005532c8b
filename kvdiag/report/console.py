"""The terminal side of every command: one Output object that renders results (by their
kind's renderer in kvdiag.report.terminal), warnings and errors, for people (Rich; progress
and logs on stderr) or machines (--json); one progress display; the engine's log lines."""

from __future__ import annotations

import dataclasses
import json
import sys
import time

import typer


class Output:
    """Renders for people (Rich; progress and logs on stderr) or machines (--json)."""

    def __init__(self, as_json: bool = False) -> None:
        from rich.console import Console

        self.as_json = as_json
        self.out = Console(highlight=False, soft_wrap=True)
        self.err = Console(stderr=True, highlight=False, soft_wrap=True)

    def json(self, data) -> None:
        sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")

    def info(self, message: str) -> None:
        self.err.print(message)

    def warn(self, message: str) -> None:
        self.err.print(f"[yellow]warning:[/] {message}")

    def error(self, message: str) -> None:
        self.err.print(f"[bold red]error:[/] {message}", markup=True)

    def show(self, data, *lines) -> None:
        """`data` as JSON with --json, else `lines` (text, never read as markup, or tables)."""
        if self.as_json:
            self.json(data)
            return
        for line in lines:
            self.out.print(line, markup=False)

    def key_mismatch(self, e) -> None:
        """A regression run refused on a baseline key mismatch (kvdiag.regress.baselines
        KeyMismatch): the keys' differences, never compared."""
        from kvdiag.verdicts import judge_unmeasured

        if self.as_json:
            verdict = judge_unmeasured("baseline key mismatch").verdict
            self.json({"verdict": verdict.value, "error": "key mismatch", "differences": e.differences,
                       "key": e.key.as_dict(), "baseline_key": e.nearest.as_dict()})
        self.error(f"{e.path}: the baseline of suite {e.key.suite} has another key; nothing "
                   "compared:")
        for line in e.differences:
            self.err.print(f"  {line}")

    def result(self, result) -> None:
        """A finished run: as JSON (its as_json()), or by its kind's terminal renderer."""
        if self.as_json:
            self.json(result.as_json())
            return
        from kvdiag.report.terminal import render

        for line in render(result):
            self.out.print(line)

    def finish(self, result) -> None:
        """Render `result` and exit with its verdict's code."""
        self.result(result)
        raise typer.Exit(result.exit_code)

    def progress(self, description: str, total: int | None = None):
        return Progress(self, description, total)


@dataclasses.dataclass
class ProgressState:
    """Where a progress display stands: what runs, how far it got, of how much (None: unknown)."""

    description: str
    completed: int
    total: int | None


class Progress:
    """One progress display for every long command: a bar with the time remaining on a
    terminal; on anything else (CI logs) a plain line every `every` seconds. Call it as
    update(advance=, completed=, total=, description=)."""

    def __init__(self, out: Output, description: str, total: int | None, every: float = 10.0) -> None:
        self.out, self.every = out, every
        self.state = ProgressState(description, 0, total)
        self.bar = self.task = None
        self.last = time.monotonic()
        self.start = self.last

    def __enter__(self):
        if self.out.as_json:
            return self.update
        if self.out.err.is_terminal:
            import rich.progress as rp

            self.bar = rp.Progress(rp.TextColumn("{task.description}"), rp.BarColumn(),
                                   rp.MofNCompleteColumn(), rp.TimeElapsedColumn(),
                                   rp.TimeRemainingColumn(), console=self.out.err, transient=True)
            self.bar.__enter__()
            self.task = self.bar.add_task(self.state.description, total=self.state.total)
        return self.update

    def __exit__(self, *exc) -> None:
        if self.bar is not None:
            self.bar.__exit__(*exc)

    def update(self, advance: int = 0, *, completed: int | None = None, total: int | None = None,
               description: str | None = None) -> None:
        s = self.state
        if description is not None:
            s.description = description
        if total is not None:
            s.total = total
        s.completed = (s.completed if completed is None else completed) + advance
        if self.bar is not None:
            self.bar.update(self.task, **dataclasses.asdict(s))
        elif not self.out.as_json and time.monotonic() - self.last >= self.every:
            self.last = time.monotonic()
            of = f"/{s.total}" if s.total else ""
            self.out.err.print(f"{s.description}: {s.completed}{of} "
                               f"({self.last - self.start:.0f} s)", markup=False)


def enable_engine_log() -> None:
    """Show the engine's start-up lines (block size, guard) on stderr, as vLLM does."""
    import logging

    class StderrHandler(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            sys.stderr.write(f"INFO {record.getMessage()}\n")

    logger = logging.getLogger("reference_engine")
    if not any(type(h).__name__ == "StderrHandler" for h in logger.handlers):
        logger.addHandler(StderrHandler(logging.INFO))
    logger.setLevel(logging.INFO)


