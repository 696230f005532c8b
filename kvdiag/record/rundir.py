"""Run directories: reports/<run-id>/ with results.parquet, summary.json and report.html.

A run directory is written atomically. While a run works it lives under a temporary name,

    reports/reproduce-20261130-221500.partial/    rounds.jsonl (probes), results, report
                       |  RunDir.commit(): one rename, once every file is written
                       v
    reports/reproduce-20261130-221500/            complete; only now may history point here

so a killed run never looks finished, and `--out` never overwrites: an existing non-empty
directory is refused before any work starts.
"""

from __future__ import annotations

import json
import os
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

from kvdiag.errors import KvdiagError
from kvdiag.paths import REPORTS

if TYPE_CHECKING:
    from kvdiag.record.summary import Summary

PARTIAL = ".partial"
KEEP_OUT = ("probe.json", "vllm.log", "sglang.log")  # what a run planned or its server said
# Test hook, for the SIGKILL tests only: "POINT:FILE" makes pause(POINT) create FILE and
# sleep, so a test can kill the process exactly there (points: summary, report, commit).
PAUSE_ENV = "KVDIAG_TEST_PAUSE"


class RunDir:
    """One run's directory: `path` (the temporary `.partial` name while the run works) and
    `final` (its name once committed)."""

    def __init__(self, final: Path, path: Path) -> None:
        self.final, self.path = final, path

    @classmethod
    def begin(cls, out: Path | None, name: str) -> RunDir:
        """A new run directory: `out` as given (refused if it exists and is not empty), or
        reports/<name>-<UTC time>. Fails before any work when it cannot be written."""
        if out is not None:
            out = Path(out)
            if out.exists() and (not out.is_dir() or any(out.iterdir())):
                raise KvdiagError(f"--out {out}: already exists and is not empty; kvdiag never "
                                  "overwrites a run (give a new directory)")
            return cls._make(out)
        stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
        for n in range(100):
            final = REPORTS / (f"{name}-{stamp}" + (f"-{n}" if n else ""))
            if not final.exists() and not _partial(final).exists():
                return cls._make(final)
        raise KvdiagError(f"{REPORTS}: could not find a free run directory name for {name}")

    @classmethod
    def _make(cls, final: Path) -> RunDir:
        path = _partial(final)
        try:
            path.mkdir(parents=True)
            probe = path / ".write-test"
            probe.write_text("")
            probe.unlink()
        except FileExistsError:
            raise KvdiagError(f"{path}: an unfinished run is there (resume it, or remove it)") from None
        except OSError as e:
            raise KvdiagError(f"--out {final}: cannot write there ({e.strerror or e})") from None
        return cls(final, path)

    @classmethod
    def resume(cls, run: Path) -> RunDir:
        """An interrupted run: its `.partial` directory, named with or without the suffix."""
        run = Path(run)
        path = run if run.name.endswith(PARTIAL) else _partial(run)
        if not path.is_dir():
            raise KvdiagError(f"{run}: no unfinished run there (looked for {path})")
        return cls(path.with_name(path.name[: -len(PARTIAL)]), path)

    def __enter__(self) -> RunDir:
        return self

    def __exit__(self, kind, error, tb) -> None:
        """A run that failed before measuring anything leaves no directory behind; one that
        measured something keeps it (a probe resumes from it) and says where."""
        if error is None or not self.path.name.endswith(PARTIAL) or not self.path.is_dir():
            return
        measured = [f for f in self.path.iterdir() if f.is_file() and f.stat().st_size
                    and f.name not in KEEP_OUT]
        if not measured:
            import shutil

            shutil.rmtree(self.path, ignore_errors=True)
        elif isinstance(error, KvdiagError):
            raise KvdiagError(f"{str(error).splitlines()[0]} (what was measured is kept in "
                              f"{self.path}: finish it with --resume {self.path})") from None

    def commit(self) -> Path:
        """Rename the finished run to its final name (an empty placeholder is replaced)."""
        if self.final.is_dir() and not any(self.final.iterdir()):
            self.final.rmdir()
        os.replace(self.path, self.final)
        self.path = self.final
        return self.final


def pause(point: str) -> None:
    """The test hook named by PAUSE_ENV; nothing at all unless that variable names `point`."""
    where, _, marker = os.environ.get(PAUSE_ENV, "").partition(":")
    if where == point and marker:
        Path(marker).write_text(point)
        time.sleep(600)


def _partial(final: Path) -> Path:
    return final.with_name(final.name + PARTIAL)


def is_incomplete(run_dir: Path) -> bool:
    return Path(run_dir).name.endswith(PARTIAL)


def check_writable(path: Path | None, option: str) -> None:
    """Before any work: `path` (a file an option names) can be created or written. Tried
    for real, so it holds for root and for a read-only mount alike. KvdiagError otherwise."""
    if path is None:
        return
    path = Path(path)
    parent = path.parent if str(path.parent) else Path(".")
    if path.is_dir():
        raise KvdiagError(f"{option} {path}: is a directory, not a file")
    try:
        parent.mkdir(parents=True, exist_ok=True)
        if path.exists():
            with open(path, "ab"):
                pass
        else:
            probe = parent / f".{path.name}.write-test"
            probe.write_text("")
            probe.unlink()
    except OSError as e:
        raise KvdiagError(f"{option} {path}: cannot write there ({e.strerror or e})") from None


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def write_run(run_dir: Path, frame, summary) -> None:
    """results.parquet (the signature in its schema metadata) and summary.json (a typed
    kvdiag.record.summary.Summary), each written to a temporary name then renamed, so a run killed
    mid-write never leaves a half file."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.Table.from_pandas(frame, preserve_index=False)
    meta = dict(table.schema.metadata or {})
    meta[b"kvdiag.signature"] = summary.signature.encode()
    meta[b"kvdiag.schema_version"] = str(summary.schema_version).encode()
    tmp = run_dir / "results.parquet.tmp"
    pq.write_table(table.replace_schema_metadata(meta), tmp)
    tmp.replace(run_dir / "results.parquet")
    tmp = run_dir / "summary.json.tmp"
    tmp.write_text(summary.to_json())
    tmp.replace(run_dir / "summary.json")


def require_finished(run_dir: Path) -> Path:
    """`run_dir` if it is a finished run; KvdiagError for one that never completed."""
    if is_incomplete(run_dir):
        raise KvdiagError(f"{run_dir}: an unfinished run (it was interrupted: nothing in it is a "
                          "verdict; resume it or run again)")
    return Path(run_dir)


def load_summary(run_dir: Path) -> Summary:
    """RUN_DIR/summary.json as the class of its kind (kvdiag.record.summary), validated, so
    every reader (report, baseline, fleet, history) gets attributes and Verdicts, never raw
    JSON. Fields a newer schema added take their defaults in an older file; KvdiagError names
    the file and the fields that do not fit."""
    from pydantic import ValidationError

    from kvdiag.record.kinds import parse_summary

    path = Path(run_dir) / "summary.json"
    if not path.is_file():
        raise KvdiagError(f"{path}: not found (is {run_dir} a kvdiag run directory?)")
    try:
        return parse_summary(json.loads(path.read_text(encoding="utf-8")))
    except json.JSONDecodeError as exc:
        raise KvdiagError(f"{path}: not valid JSON ({exc})") from None
    except ValidationError as exc:
        raise KvdiagError(f"{path}: not a summary this kvdiag reads ({_bad_fields(exc)})") from None


def _bad_fields(error) -> str:
    """The first few fields of a ValidationError, as `field.path: message` (the location's
    first part, the kind's tag, left out)."""
    errors = error.errors()
    said = [f"{'.'.join(map(str, e['loc'][1:])) or 'kind'}: {e['msg']}" for e in errors[:3]]
    return "; ".join(said) + (f"; and {len(errors) - 3} more" if len(errors) > 3 else "")


class Timer:
    def __init__(self) -> None:
        self.start = time.perf_counter()

    @property
    def seconds(self) -> float:
        return time.perf_counter() - self.start
