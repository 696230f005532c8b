"""What every command shares: option aliases (each defined once), the output object that
renders results, progress, and the error boundary that turns bad input into one line and
exit code 2 (ARCHITECTURE.md: 0 pass, 1 check failed, 2 the run could not be made)."""

from __future__ import annotations

import functools
import json
import sys
import time
from pathlib import Path
from typing import Annotated, Literal

import typer

from kvdiag.paths import CANARY

EXIT_PASS, EXIT_FAIL, EXIT_ERROR = 0, 1, 2
DEFAULT_MODEL = CANARY

ModelOpt = Annotated[Path | None, typer.Option(
    "--model", show_default=False, help="Local Hugging Face model directory (Qwen2, Qwen3 or "
    "Llama). Default: the suite's model, else the bundled canary.")]
DeviceOpt = Annotated[Literal["cpu", "cuda"], typer.Option("--device", help="Where the reference "
                                                          "engine runs.")]
DtypeOpt = Annotated[Literal["float32", "bfloat16", "float16"] | None, typer.Option(
    "--dtype", show_default=False, help="Weights and KV dtype. Default: float32 on CPU, bfloat16 "
    "on CUDA.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON on stdout.")]
AllocatorOpt = Annotated[str, typer.Option(
    "--allocator", help="Block allocator: prefix-cache, stale-hash (alias buggy), stale-bytes, "
    "unchained-hash, salt-collision, guarded, or guarded:NAME (the guard around NAME).")]
SuiteOpt = Annotated[str, typer.Option("--suite", help="Suite YAML file, or the name of a bundled "
                                       "suite: reproduce, smoke, weekly.")]
CaseOpt = Annotated[list[str] | None, typer.Option(
    "--case", show_default=False, help="Case to run; repeat it or separate names by commas; 'all' "
    "or 'ablations' select groups. Default: the suite's default cases.")]
OneCaseOpt = Annotated[str | None, typer.Option(
    "--case", show_default=False, help="Case to run. Default: the suite's first default case.")]
StyleOpt = Annotated[Literal["canary", "natural"] | None, typer.Option(
    "--style", show_default=False,
    help="Session style: canary (the canary model's fact lines) or natural (English, for real "
    "chat models). Default: the suite's.")]
OutOpt = Annotated[Path | None, typer.Option(
    "--out", show_default=False, help="New run directory (refused if it exists and is not "
    "empty). Default: reports/NAME-TIME.")]
ApiKeyOpt = Annotated[str | None, typer.Option(
    "--api-key", envvar="OPENAI_API_KEY", show_default=False,
    help="Bearer token for the server (never written to disk or reports).")]
HistoryOpt = Annotated[Path, typer.Option("--history", help="Run history (SQLite) that kvdiag "
                                          "regress appends to.")]
NoCacheOpt = Annotated[bool, typer.Option(
    "--no-reference-cache", help="Recompute the contiguous reference instead of reading it from "
    "the on-disk cache (keyed by prompts, weights, engine source, torch and settings).")]
CheckIntegrityOpt = Annotated[bool, typer.Option(
    "--check-integrity", help="Check every allocator invariant after every engine step (slow; "
    "a stale hash entry raises at once, naming block and generation).")]


def names(values: list[str] | str | None) -> list[str] | None:
    """A list option's values: repeated, comma-separated, or both. None when not given."""
    if not values:
        return None
    values = [values] if isinstance(values, str) else values
    out = [v.strip() for value in values for v in value.split(",") if v.strip()]
    return out or None


def check_allocators(given: list[str] | None) -> None:
    """Unknown allocator names fail here, before any work (the registry imports no torch)."""
    from kvdiag.errors import KvdiagError
    from reference_engine.allocators import canonical_name
    from reference_engine.errors import UnknownAllocatorError

    for name in given or []:
        try:
            canonical_name(name)
        except UnknownAllocatorError as e:
            raise KvdiagError(f"--allocator {name}: {e}") from None


def load_cases(suite: str, cases=None, style: str | None = None, *, one: bool = False):
    """(suite, [cases]) with `style` applied; KvdiagError when nothing is selected."""
    import dataclasses

    from kvdiag.errors import KvdiagError
    from kvdiag.suites import load_suite

    loaded = load_suite(suite)
    if style:
        loaded = dataclasses.replace(loaded, style=style)
    spec = ",".join(names(cases) or []) or None
    if one:
        return loaded, [loaded.case(spec) if spec else (loaded.select(None) or list(loaded.cases))[0]]
    chosen = loaded.select(spec)
    if not chosen:
        raise KvdiagError(f"{loaded.path}: no case selected by {spec!r}")
    return loaded, chosen


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

    def result(self, result) -> None:
        """A finished run: its summary as JSON, or its kind's terminal renderer."""
        if self.as_json:
            self.json(result.summary | {"run_dir": str(result.run_dir)})
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


class Progress:
    """One progress display for every long command: a bar with the time remaining on a
    terminal; on anything else (CI logs) a plain line every `every` seconds. Call it as
    update(advance=, completed=, total=, description=)."""

    def __init__(self, out: Output, description: str, total: int | None, every: float = 10.0) -> None:
        self.out, self.every = out, every
        self.state = {"description": description, "completed": 0, "total": total}
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
            self.task = self.bar.add_task(self.state["description"], total=self.state["total"])
        return self.update

    def __exit__(self, *exc) -> None:
        if self.bar is not None:
            self.bar.__exit__(*exc)

    def update(self, advance: int = 0, **fields) -> None:
        self.state.update({k: v for k, v in fields.items() if v is not None})
        self.state["completed"] += advance
        if self.bar is not None:
            self.bar.update(self.task, **{k: self.state[k] for k in ("description", "completed", "total")})
        elif not self.out.as_json and time.monotonic() - self.last >= self.every:
            self.last = time.monotonic()
            s = self.state
            of = f"/{s['total']}" if s["total"] else ""
            self.out.err.print(f"{s['description']}: {s['completed']}{of} "
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


def user_errors():
    """The exceptions that mean bad input or an unreachable target, never a bug."""
    from kvdiag.errors import KvdiagError
    from reference_engine.errors import EngineError

    return (EngineError, KvdiagError, FileNotFoundError, ValueError)


def handle_errors(fn):
    """Decorator: bad input becomes one line on stderr and exit 2, never a traceback."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except typer.Exit:
            raise
        except user_errors() as e:
            Output().error(str(e).splitlines()[0] if str(e) else type(e).__name__)
            raise typer.Exit(EXIT_ERROR) from None
        except KeyboardInterrupt:
            Output().error("interrupted")
            raise typer.Exit(EXIT_ERROR) from None

    return wrapper
