"""What one Ray task runs: the measurement of one fleet cell, returned as data.

The task writes nothing the driver owns: a URL probe keeps its working files (probe.json,
rounds.jsonl) in a scratch directory on the worker, and their bytes come back with the
result, which the driver writes into the cell's run directory. The task enforces its own
time limit (SIGALRM, so even a stuck call inside the engine is interrupted).
"""

from __future__ import annotations

import os
import signal
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from kvdiag.errors import KvdiagError

# Test hook, for the worker-kill test only: a directory where each task attempt leaves a file
# named <cell id>.<pid> as it starts, so the test can kill exactly that worker process.
PID_DIR_ENV = "KVDIAG_FLEET_TEST_PIDS"


class CellTimeout(KvdiagError):
    """The cell ran past its time limit."""


@dataclass
class CellResult:
    """What a cell's task sends back to the driver (kvdiag.fleet.driver records it)."""

    result: object  # what kvdiag.commands.regress.measure returned, for regress_record.record
    cold: bool  # the server's prefix cache was reset first (always, in-process)
    seconds: float  # the measurement's wall time on the worker
    files: dict[str, bytes] = field(default_factory=dict)  # the probe's working files: name -> bytes
    pid: int = 0  # the worker process that measured it


def measure_cell(prepared, opts, cell_id: str, time_limit: float, num_cpus: float,
                 pid_dir: str | None = None) -> CellResult:
    """Run one prepared regression cell (kvdiag.commands.regress.prepare, done by the driver)
    and return what it measured (CellResult). Raises CellTimeout past `time_limit` seconds,
    and whatever the run raises."""
    from kvdiag.commands import regress as job

    if pid_dir:
        Path(pid_dir, f"{cell_id}.{os.getpid()}").write_text(str(time.time()))
    if prepared.target.is_reference:
        import torch  # the engine uses the cores the task declared, not every core

        torch.set_num_threads(max(1, int(num_cpus)))
    start = time.perf_counter()
    with _time_limit(time_limit, cell_id), tempfile.TemporaryDirectory(prefix="kvdiag-cell-") as scratch:
        cold = prepared.target.is_reference or job.reset_cache(prepared, opts)
        result = job.measure(prepared, opts, Path(scratch), lambda **_: None)
        files = {f.name: f.read_bytes() for f in Path(scratch).iterdir() if f.is_file()}
    return CellResult(result=result, cold=cold, seconds=time.perf_counter() - start,
                      files=files, pid=os.getpid())


class _time_limit:
    def __init__(self, seconds: float, cell_id: str) -> None:
        self.seconds, self.cell_id = seconds, cell_id
        # signals reach only the main thread; elsewhere the driver's backstop applies
        self.armed = threading.current_thread() is threading.main_thread()

    def _fire(self, *_):
        raise CellTimeout(f"cell {self.cell_id}: ran past its time limit of {self.seconds:g} s")

    def __enter__(self):
        if self.armed:
            self.previous = signal.signal(signal.SIGALRM, self._fire)
            signal.setitimer(signal.ITIMER_REAL, self.seconds)
        return self

    def __exit__(self, *exc):
        if self.armed:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, self.previous)
