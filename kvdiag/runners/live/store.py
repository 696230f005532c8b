"""rounds.jsonl: every finished request of a probe, one line each, flushed as it lands, so a
killed probe resumes where it stopped (a flushed line is the kernel's once written: a kill
loses none). Not synced per line: fsync blocks the event loop that sends the traffic, for
hundreds of ms on a busy disk, and the lifecycle phase's timing needs that loop (a machine
that loses power may lose the last lines; resume runs them again, and skips a cut one).
Closing syncs the file. `index` numbers the lines in the order they landed (the request
index that slow decay over a long run is read against)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from kvdiag.runners.live.endpoint import ChatResult


class RoundStore:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.done: dict[tuple[str, int, int], dict] = {}
        if path.exists():
            for line in path.read_text().splitlines():
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:
                    continue  # a line cut by a kill: that request runs again
                row.setdefault("index", len(self.done))
                self.done[(row["phase"], row["session"], row["round"])] = row
        self._file = open(path, "a")  # noqa: SIM115 (kept open for the run)

    def add(self, phase: str, session: int, rnd: int, result: ChatResult, **extra) -> dict:
        """Record one finished request; `extra` (e.g. the model it named) is kept with it."""
        row = {"phase": phase, "session": session, "round": rnd, "index": len(self.done),
               "text": result.text, "tokens": result.tokens, "top": result.top,
               "logprobs": result.logprobs, "prompt_tokens": result.prompt_tokens,
               "cached_tokens": result.cached_tokens, "finish_reason": result.finish_reason,
               "seconds": round(result.seconds, 4), "completion_tokens": result.completion_tokens,
               "sent": result.sent, "done": result.done, "request_id": result.request_id, **extra}
        self._file.write(json.dumps(row) + "\n")
        self._file.flush()
        self.done[(phase, session, rnd)] = row
        return row

    def close(self) -> None:
        if self._file is not None and not self._file.closed:
            self._file.flush()
            os.fsync(self._file.fileno())
            self._file.close()

    def __getstate__(self) -> dict:
        """A store travels (a fleet cell's probe, measured on a Ray worker and judged by the
        driver) read-only: its rows, never its open file."""
        return {"path": self.path, "done": self.done, "_file": None}
