"""One server process that kvdiag starts, health-checks and stops: `kvdiag serve`, a real vLLM
or a real SGLang, each listening on a free loopback port.

    with ServerProcess("vLLM", lambda port: [...argv...], env, log_path) as server:
        ...  # server.base_url; healthy here

The server runs in its own process group, so its workers die with it: killed on __exit__,
at interpreter exit and on SIGTERM/SIGINT/SIGHUP. Start-up waits until GET `health_path`
answers 200; a server that exits or stays unhealthy past `timeout` raises KvdiagError
(exit 2) ending with the log's last exception, or its tail.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

from kvdiag.errors import KvdiagError

_LIVE: set[subprocess.Popen] = set()
_HANDLED: dict[int, object] = {}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stop(proc: subprocess.Popen, grace: float = 20.0) -> None:
    """SIGTERM the process group, SIGKILL after `grace` seconds."""
    _LIVE.discard(proc)
    if proc.poll() is not None:
        return
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            break
        except subprocess.TimeoutExpired:
            continue
    with contextlib.suppress(ProcessLookupError):  # children that outlived the leader
        os.killpg(proc.pid, signal.SIGKILL)


def _stop_all() -> None:
    for proc in list(_LIVE):
        _stop(proc, grace=5.0)


def _on_signal(signum, frame) -> None:
    _stop_all()
    previous = _HANDLED.get(signum)
    if callable(previous):
        previous(signum, frame)
    else:
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)


def _guard() -> None:
    """Register the atexit hook and the signal handlers once (main thread only)."""
    if _HANDLED:
        return
    atexit.register(_stop_all)
    _HANDLED[0] = None  # registered, even where signals cannot be hooked
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            _HANDLED[sig] = signal.signal(sig, _on_signal)


class ServerProcess:
    """`command(port)` -> argv, run with `env`, its output in `log_path`; healthy inside the
    `with` block. `name` is what errors call it."""

    def __init__(self, name: str, command: Callable[[int], list[str]], env: dict[str, str],
                 log_path: Path, *, health_path: str = "/health", timeout: float = 900.0,
                 poll: float = 1.0, error_line: str = r"[\w.]*(Error|Exception)\b.*:") -> None:
        self.name, self.command, self.env = name, command, env
        self.error_line = error_line  # what the log's reason line looks like (Python's exceptions)
        self.log_path, self.health_path = Path(log_path), health_path
        self.timeout, self.poll = timeout, poll
        self.port = 0
        self._proc: subprocess.Popen | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> ServerProcess:
        _guard()
        self.port = free_port()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self._proc = subprocess.Popen(self.command(self.port), stdout=log,
                                          stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                          env=self.env, start_new_session=True)
        _LIVE.add(self._proc)
        try:
            self._wait_healthy()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        if self._proc is not None:
            _stop(self._proc)

    def kill(self) -> None:
        """SIGKILL the whole process group at once, as a crash would (for tests of a server
        that dies mid-run; stop() is the clean way)."""
        if self._proc is not None and self._proc.poll() is None:
            _LIVE.discard(self._proc)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._proc.pid, signal.SIGKILL)
            self._proc.wait(timeout=30)

    def log_lines(self) -> list[str]:
        try:
            return [x.strip() for x in self.log_path.read_text(errors="replace").splitlines() if x.strip()]
        except OSError:
            return []

    def log_tail(self, lines: int = 15) -> str:
        return " | ".join(self.log_lines()[-lines:])

    def log_error(self) -> str | None:
        """The log's last exception ("ValueError: ...", with the line after it, where
        pydantic puts the reason), the one that says why the server stopped, or None.
        `error_line` says what such a line starts with (a C++ server's differ)."""
        lines = self.log_lines()
        at = next((i for i in reversed(range(len(lines)))
                   if re.match(self.error_line, lines[i])), None)
        return None if at is None else " ".join(lines[at:at + 2])

    def get(self, path: str, timeout: float = 5.0):
        import httpx

        return httpx.get(self.base_url + path, timeout=timeout)

    def _wait_healthy(self) -> None:
        import httpx

        deadline = time.monotonic() + self.timeout
        while True:
            if self._proc.poll() is not None:
                raise KvdiagError(f"{self.name} exited with code {self._proc.returncode} before it "
                                  f"was healthy (log {self.log_path}): "
                                  f"{self.log_error() or self.log_tail()}")
            try:
                if self.get(self.health_path, timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise KvdiagError(f"{self.name} was not healthy after {self.timeout:.0f} s (log "
                                  f"{self.log_path}): {self.log_tail()}")
            time.sleep(self.poll)
