"""Start `kvdiag serve` as a real subprocess on a free loopback port."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from contextlib import contextmanager

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def served(*args: str, timeout: float = 120.0, env: dict[str, str] | None = None):
    port = free_port()
    env = dict(os.environ, PYTHONUNBUFFERED="1", **(env or {}))
    proc = subprocess.Popen([sys.executable, "-m", "kvdiag", "serve", "--port", str(port), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"kvdiag serve exited: {proc.stdout.read()}")
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError("kvdiag serve did not come up")
            time.sleep(0.2)
        yield url, proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


def smoke_pool() -> int:
    """The pool the smoke suite's trigger case recycles in (as the in-process runner sizes it)."""
    from kvdiag.runners.plan import plan_case
    from kvdiag.suites import load_suite
    from reference_engine.tokenizer import Tokenizer

    suite = load_suite("smoke")
    return plan_case(suite, suite.cases[0], Tokenizer.from_dir("fixtures/canary")).schedule.num_blocks
