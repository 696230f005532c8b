"""Run directories: reports/<run-id>/ with results.parquet, summary.json and report.html,
and the signature every result carries (as sacrebleu's scores do)."""

from __future__ import annotations

import json
import shlex
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from kvdiag import __version__
from kvdiag.paths import REPORTS


def signature(*, engine: str, allocators: list[str], block_size: int, model: str, suite: str,
              seed: int) -> str:
    return (f"kvdiag:{__version__}|engine:{engine}|alloc:{','.join(allocators)}|bs:{block_size}"
            f"|model:{model}|suite:{suite}|seed:{seed}")


def model_label(model_dir: Path) -> str:
    from reference_engine.loader import model_hash

    return f"{Path(model_dir).name}-{model_hash(model_dir)}"


def new_run_dir(out: Path | None, suite: str) -> Path:
    """`out` as given, or reports/<suite>-<UTC time>; never an existing directory's files."""
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        return out
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    for n in range(100):
        run = REPORTS / (f"{suite}-{stamp}" + (f"-{n}" if n else ""))
        try:
            run.mkdir(parents=True)
            return run
        except FileExistsError:
            continue
    raise RuntimeError("could not create a run directory")


def command_line() -> str:
    """The command that reruns this run: rebuilt from the running CLI command's parsed
    options (so it reads the same from a shell, a test runner or a subprocess)."""
    import click

    ctx = click.get_current_context(silent=True)
    if ctx is None:
        return shlex.join([Path(sys.argv[0]).name if sys.argv else "kvdiag", *sys.argv[1:]])
    words = ["kvdiag", ctx.info_name or ""]
    for param in ctx.command.params:
        value = ctx.params.get(param.name)
        if value is None or value == param.default or not param.opts:
            if isinstance(param, click.Argument) and value is not None:
                words.append(str(value))
            continue
        flag = max(param.opts, key=len)
        if isinstance(value, bool):
            if value:
                words.append(flag)
        else:
            words += [flag, str(value)]
    return shlex.join(words)


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def write_run(run_dir: Path, frame, summary: dict) -> None:
    """results.parquet and summary.json, each written to a temporary name then renamed, so a
    run killed mid-write never leaves a half file under the final name."""
    tmp = run_dir / "results.parquet.tmp"
    frame.to_parquet(tmp, index=False)
    tmp.replace(run_dir / "results.parquet")
    tmp = run_dir / "summary.json.tmp"
    tmp.write_text(json.dumps(summary, indent=2, default=str) + "\n")
    tmp.replace(run_dir / "summary.json")


def read_summary(run_dir: Path) -> dict:
    """RUN_DIR/summary.json; FileNotFoundError / ValueError name the bad file."""
    path = Path(run_dir) / "summary.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: not found (is {run_dir} a kvdiag run directory?)")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON ({exc})") from None


class Timer:
    def __init__(self) -> None:
        self.start = time.perf_counter()

    @property
    def seconds(self) -> float:
        return time.perf_counter() - self.start
