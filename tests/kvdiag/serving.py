"""Start `kvdiag serve` (and `kvdiag watch` in front of a server) as real subprocesses on free
loopback ports; run a probe until the server it talks to is killed."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_up(proc: subprocess.Popen, url: str, what: str, timeout: float) -> None:
    """Until GET `url` answers 200; RuntimeError with its output if the process exits first,
    TimeoutError past `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            out = proc.stdout.read() if proc.stdout else ""
            raise RuntimeError(f"{what} exited: {out}")
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} did not come up")
        time.sleep(0.2)


@contextmanager
def running(argv, health: str, what: str, timeout: float, *, env: dict[str, str] | None = None,
            output: bool = True, stop_wait: float = 10.0, port: int | None = None):
    """`argv(port)` as a subprocess on `port` (else a free one), once GET `health` answers
    200: (its URL, the process). Its output is kept for the error when it exits early
    (`output`), else dropped. Terminated on the way out, killed after `stop_wait` seconds."""
    port = port or free_port()
    sink = subprocess.PIPE if output else subprocess.DEVNULL
    proc = subprocess.Popen(argv(port), stdout=sink, stderr=subprocess.STDOUT if output else sink,
                            text=True, env=dict(os.environ, PYTHONUNBUFFERED="1", **(env or {})))
    url = f"http://127.0.0.1:{port}"
    try:
        wait_up(proc, url + health, what, timeout)
        yield url, proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=stop_wait)
        except subprocess.TimeoutExpired:
            proc.kill()


@contextmanager
def served(*args: str, timeout: float = 120.0, env: dict[str, str] | None = None,
           port: int | None = None):
    with running(lambda port: [sys.executable, "-m", "kvdiag", "serve", "--port", str(port), *args],
                 "/health", "kvdiag serve", timeout, env=env, port=port) as up:
        yield up


@contextmanager
def watching(upstream: str, *args: str, timeout: float = 30.0):
    """`kvdiag watch --upstream UPSTREAM ARGS` on a free port, once /kvdiag/status answers:
    its URL. Stopped (its last window written) on the way out."""
    with running(lambda port: [sys.executable, "-m", "kvdiag", "watch", "--upstream", upstream,
                               "--listen", f"127.0.0.1:{port}", *args],
                 "/kvdiag/status", "kvdiag watch", timeout, stop_wait=30) as (url, _):
        yield url


def smoke_pool() -> int:
    """The pool the smoke suite's trigger case recycles in (as the in-process runner sizes it)."""
    from kvdiag.planning.plan import plan_case
    from kvdiag.planning.suites import load_suite
    from reference_engine.tokenizer import Tokenizer

    suite = load_suite("smoke")
    return plan_case(suite, suite.cases[0], Tokenizer.from_dir("fixtures/canary")).schedule.num_blocks


def sigkill_when(proc: subprocess.Popen, ready, what: str, timeout: float) -> None:
    """SIGKILL `proc` once ready() holds, failing if it exits or stalls `timeout` seconds
    before `what`; the process is reaped either way."""
    try:
        deadline = time.monotonic() + timeout
        while not ready():
            assert proc.poll() is None, f"it exited before {what}"
            assert time.monotonic() < deadline, f"it stalled before {what}"
            time.sleep(0.1)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()


def probe_until_server_dies(cmd: list[str], out: Path, kill, min_rounds: int = 20,
                            timeout: float = 900.0) -> tuple[int, str, list[dict]]:
    """Run the probe `cmd` (writing to `out`), call kill() once `min_rounds` rounds are
    recorded, and return the probe's exit code, its stderr and the rounds it kept."""
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    rounds = out.with_name(out.name + ".partial") / "rounds.jsonl"  # unfinished: not yet `out`
    deadline = time.monotonic() + timeout
    while not (rounds.exists() and len(rounds.read_text().splitlines()) >= min_rounds):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"the probe ended or stalled before {min_rounds} rounds: "
                                 f"{proc.communicate()[1][-2000:]}")
        time.sleep(0.2)
    kill()
    _, err = proc.communicate(timeout=timeout)
    return proc.returncode, err, [json.loads(x) for x in rounds.read_text().splitlines() if x.strip()]


def assert_died_and_kept(code: int, err: str, url: str, kept: list[dict], out: Path) -> None:
    """What probe_until_server_dies must show: exit 2 with a last line naming the server, the
    finished rounds kept, and no run shown as finished."""
    assert code == 2, err[-2000:]
    last = [line for line in err.splitlines() if line.strip()][-1]
    assert "cannot reach" in last or url in last, last
    assert len(kept) >= 20 and not out.exists()


def resumed_keys(out: Path, kept: list[dict]) -> list[tuple]:
    """The (phase, session, round) of every round of the resumed run `out`, after checking
    that none was asked twice and that every kept round is among them."""
    rows = [json.loads(line) for line in (out / "rounds.jsonl").read_text().splitlines()]
    keys = [(r["phase"], r["session"], r["round"]) for r in rows]
    assert len(keys) == len(set(keys))
    assert {(r["phase"], r["session"], r["round"]) for r in kept} <= set(keys)
    return keys
