"""What every command shares: option aliases, the output object, and the error boundary
that turns bad input into one line and exit code 2 (ARCHITECTURE.md: 0 pass, 1 check
failed, 2 the run could not be made)."""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from kvdiag.paths import CANARY

EXIT_PASS, EXIT_FAIL, EXIT_ERROR = 0, 1, 2

ModelOpt = Annotated[Path, typer.Option("--model", show_default="fixtures/canary",
                                        help="Local Hugging Face model directory (Qwen2, Qwen3 or "
                                        "Llama). Default: the bundled canary.")]
DeviceOpt = Annotated[str, typer.Option("--device", help="cpu or cuda.")]
DtypeOpt = Annotated[str | None, typer.Option(
    "--dtype", help="float32, bfloat16 or float16 (default: float32 on CPU, bfloat16 on CUDA).")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON on stdout.")]
AllocatorOpt = Annotated[str, typer.Option(
    "--allocator", help="Block allocator: prefix-cache, stale-hash (buggy), stale-bytes, "
    "unchained-hash, salt-collision, guarded, or guarded:NAME.")]

DEFAULT_MODEL = CANARY


class Output:
    """Renders for people (Rich, on stderr for progress and logs) or machines (--json)."""

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


def enable_engine_log() -> None:
    """Show the engine's start-up lines (block size, guard) on stderr."""
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
