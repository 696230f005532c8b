"""The watch file: JSON lines, append-only, flushed as written (a killed proxy loses nothing
already found). No prompt or answer text is ever written: requests are named by their
X-Request-Id, namespaces by kvdiag.watch.stats.namespace_label.

    {"type": "start", "upstream", "sample", "budget", "time", ...}   once per proxy start
    {"type": "finding", "kind", "time", "lag", "request", "namespace", ...}   over_hit |
                                   warmup | departure; `time`: when the request ended, `lag`:
                                   seconds from then until the finding was written
    {"type": "window", "start", "end", "all": Tally, "namespaces"}    every --window seconds
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

KINDS = ("over_hit", "departure", "warmup")


class WatchLog:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "a", buffering=1)  # noqa: SIM115 (kept for the proxy's life)

    def write(self, row: dict) -> None:
        self._file.write(json.dumps(row, separators=(",", ":"), allow_nan=False) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


@dataclass
class WatchFile:
    """What a watch file holds, in order; a line cut by a kill is skipped."""

    path: str
    starts: list[dict] = field(default_factory=list)
    findings: list[dict] = field(default_factory=list)
    windows: list[dict] = field(default_factory=list)

    def counted(self, kind: str) -> int:
        return sum(f["kind"] == kind for f in self.findings)

    def total(self, key: str) -> int:
        return sum(int(w["all"].get(key) or 0) for w in self.windows)


def read_watch(path: str | Path) -> WatchFile:
    out = WatchFile(str(path))
    for line in Path(path).read_text().splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        kind = row.get("type") if isinstance(row, dict) else None
        {"start": out.starts, "finding": out.findings, "window": out.windows}.get(
            kind, []).append(row)
    return out
