"""The sentinel's file: JSON lines, append-only, flushed as they are written, so what a killed
server found is still there. Four kinds of line:

    {"type": "start", "engine", "version", "block_size", "pid", "time"}   once per server start
                                   ("attention": true where sampled tokens' attention is weighed;
                                   "trusts": what the engine's sentinel takes on trust, where it
                                   says so itself: llama.cpp's)
    {"type": "finding", "kind", "step", "request", "positions", ...}    facts.Finding
    {"type": "leakage", "request", "tokens", "mass", "unmeasured"}      a request that
                                   attended to slots read wrong (leakage.py): its totals so far,
                                   with the counters while it runs, then once when it finishes;
                                   the last line of a request holds
    {"type": "counters", "steps", "requests", "reads", ...}             cumulative, every
                                                                         half second of work

`read_report(path)` sums a file that several server starts appended to: each start's last
counters, every finding. A line cut by a kill is skipped. `path` may be the URL a sentinel
serves its file at (serve.py).
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from kvdiag.sentinel.facts import Counters, Finding
from kvdiag.sentinel.serve import fetch, is_url

ENV = "KVDIAG_SENTINEL"  # the path an engine's kvdiag plugin writes its sentinel file to


def check_writable(path: str | Path) -> Path:
    """The sentinel file's path, made sure of before any server starts: its folder is
    created, the file opened for appending. OSError names what failed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a"):
        pass
    return path


class SentinelLog:
    """Writes one server's lines. `counters(c)` may be called every step: it writes at most
    every `every` seconds, and a timer thread writes the last state once work stops."""

    def __init__(self, path: str | Path, header: dict, every: float = 0.5) -> None:
        self._file = open(path, "a", buffering=1)  # noqa: SIM115 (kept for the server's life)
        self._lock = threading.Lock()
        self._every, self._last, self._pending = every, 0.0, None
        self._leaks: dict[str, dict] = {}  # running requests' leakage lines not yet written
        self._line({"type": "start", **header, "pid": os.getpid(), "time": time.time()})
        threading.Thread(target=self._flush_idle, daemon=True, name="kvdiag-sentinel").start()

    def _line(self, *rows: dict) -> None:
        with self._lock:
            self._write(rows)

    def _write(self, rows) -> None:  # the lock held
        self._file.write("".join(json.dumps(row, separators=(",", ":")) + "\n" for row in rows))
        self._file.flush()

    def finding(self, finding: Finding) -> None:
        self._line(finding.as_dict())

    def leakage(self, request: str, tokens: int, mass: float, unmeasured: int,
                final: bool = True) -> None:
        """A request's leakage totals: written now when `final` (it finished), else kept and
        written with the next counters line (a request the server never finishes while the
        file is read is then still there, a few hundred milliseconds behind)."""
        row = {"type": "leakage", "request": request, "tokens": tokens, "mass": mass,
               "unmeasured": unmeasured}
        with self._lock:  # one lock for both: a kept line is never written after the final one
            self._leaks.pop(request, None)
            if final:
                self._write([row])
            else:
                self._leaks[request] = row

    def _counters_line(self, counters: Counters) -> None:
        with self._lock:
            leaks, self._leaks = list(self._leaks.values()), {}
            self._write([*leaks, {"type": "counters", **asdict(counters)}])

    def counters(self, counters: Counters) -> None:
        now = time.monotonic()
        if now - self._last >= self._every:
            self._last, self._pending = now, None
            self._counters_line(counters)
        else:
            self._pending = counters

    def _flush_idle(self) -> None:
        while True:
            time.sleep(self._every)
            pending = self._pending
            if pending is not None and time.monotonic() - self._last >= self._every:
                self._last, self._pending = time.monotonic(), None
                self._counters_line(pending)


@dataclass
class SentinelReport:
    """What a sentinel file holds: its servers' starts, the counters summed over them, and
    every finding as written."""

    path: str
    starts: list[dict] = field(default_factory=list)
    counters: Counters = field(default_factory=Counters)
    findings: list[dict] = field(default_factory=list)
    leakage: dict[str, dict] = field(default_factory=dict)  # request -> its last leakage line

    @property
    def checked(self) -> bool:
        """Whether it checked anything at all (a sentinel that saw no read is no evidence)."""
        return self.counters.reads > 0


def read_report(path: str | Path, since: int = 0) -> SentinelReport:
    """The sentinel file at `path`, from byte `since` on (its size when a run began: counters
    are then taken relative to what they were there); FileNotFoundError when there is none."""
    report = SentinelReport(str(path))
    names = tuple(Counters.__dataclass_fields__)
    last: dict | None = None  # the current start's last counters
    base: dict | None = None  # ... as they were at `since`, when that start began before it

    def close_start() -> None:
        if last is not None:
            for k in names:
                kind = type(getattr(report.counters, k))
                got = kind(last.get(k, 0)) - kind((base or {}).get(k, 0))
                setattr(report.counters, k, getattr(report.counters, k) + got)

    at, start = 0, None
    for raw in _content(path).splitlines(keepends=True):
        before, at = at, at + len(raw)
        try:
            row = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError):
            continue
        kind = row.get("type") if isinstance(row, dict) else None
        if kind == "start":
            close_start()
            last = base = None
            start = row
        elif (kind in ("counters", "finding", "leakage") and before >= since and start is not None
              and (not report.starts or report.starts[-1] is not start)):
            report.starts.append(start)  # a server start the run saw at work
        if kind == "counters":
            last = row
            if before < since:
                base = row
        elif kind == "finding" and before >= since:
            report.findings.append(row)
        elif kind == "leakage" and before >= since:
            report.leakage[row["request"]] = row
    close_start()
    return report


def size_of(path: str | Path) -> int:
    """Where a run that begins now starts reading the file (0 when there is none yet).
    KvdiagError when a sentinel's URL stopped answering."""
    if is_url(path):
        try:
            return len(_content(path))
        except OSError as e:
            from kvdiag.errors import KvdiagError

            raise KvdiagError(f"sentinel at {path}: {e}") from None
    try:
        return Path(path).stat().st_size
    except FileNotFoundError:
        return 0


def _content(path: str | Path) -> bytes:
    """The file's bytes, from disk or from the URL a sentinel serves it at (serve.py)."""
    return fetch(str(path)) if is_url(path) else Path(path).read_bytes()
