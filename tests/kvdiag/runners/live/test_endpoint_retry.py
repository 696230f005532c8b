"""The endpoint's retries against a real loopback HTTP server that answers 429 / 503 with
Retry-After, then 200: the wait the server asked for is honoured (capped), and a server that
never recovers hands its last answer back instead of hanging the run."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone
from email.utils import format_datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from kvdiag.errors import EndpointError
from kvdiag.runners.live.endpoint import Endpoint
from kvdiag.runners.live.retry import retry_after_seconds

MODELS = {"data": [{"id": "canary"}]}


@contextmanager
def scripted_server(answers: list[tuple[int, dict]]) -> Iterator[tuple[str, list[float]]]:
    """A server on 127.0.0.1 that gives `answers` (status, headers) in order, then 200 with
    MODELS forever; yields its URL and the arrival time of every request."""
    arrivals: list[float] = []
    queue = list(answers)

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
            arrivals.append(time.monotonic())
            status, headers = queue.pop(0) if queue else (200, {})
            body = json.dumps(MODELS if status == 200 else {"error": "busy"}).encode()
            self.send_response(status)
            for key, value in {**headers, "Content-Type": "application/json"}.items():
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", arrivals
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def test_retry_after_seconds_reads_both_forms() -> None:
    now = datetime(2026, 1, 1, tzinfo=timezone.utc)

    def after(value: str | None) -> float | None:
        headers = {} if value is None else {"Retry-After": value}
        return retry_after_seconds(httpx.Response(429, headers=headers), now=now)

    assert after("2") == 2.0
    assert after(format_datetime(now + timedelta(seconds=7), usegmt=True)) == 7.0
    assert after(format_datetime(now - timedelta(seconds=7), usegmt=True)) == 0.0
    assert after("soon") is None and after(None) is None


def test_sync_request_waits_as_long_as_retry_after_says() -> None:
    answers = [(429, {"Retry-After": "1"}), (503, {"Retry-After": "1"})]
    with scripted_server(answers) as (url, arrivals):
        endpoint = Endpoint(url, "canary", retries=3)
        try:
            assert endpoint.check() == ["canary"]
        finally:
            asyncio.run(endpoint.aclose())
    assert len(arrivals) == 3
    gaps = [b - a for a, b in zip(arrivals, arrivals[1:])]
    assert all(g >= 0.95 for g in gaps), gaps  # our own backoff would be 0.5 s, then 1 s


def test_async_request_honours_retry_after_too() -> None:
    async def main(url: str) -> httpx.Response:
        endpoint = Endpoint(url, "canary", retries=2)
        try:
            return await endpoint._async("GET", "/v1/models")
        finally:
            await endpoint.aclose()

    with scripted_server([(503, {"Retry-After": "1"})]) as (url, arrivals):
        response = asyncio.run(main(url))
    assert response.status_code == 200 and len(arrivals) == 2
    assert arrivals[1] - arrivals[0] >= 0.95


def test_a_huge_retry_after_is_capped_and_the_last_answer_returned() -> None:
    answers = [(429, {"Retry-After": "3600"})] * 3
    with scripted_server(answers) as (url, arrivals):
        endpoint = Endpoint(url, "canary", retries=2, max_wait=0.2)
        try:
            with pytest.raises(EndpointError, match="HTTP 429"):
                endpoint.check()  # three 429s: the last one is the answer
        finally:
            asyncio.run(endpoint.aclose())
    assert len(arrivals) == 3


def test_an_unreachable_endpoint_is_an_endpoint_error() -> None:
    with scripted_server([]) as (url, _):
        pass  # the port is closed again: nothing listens there now
    endpoint = Endpoint(url, "canary", retries=1, max_wait=0.05)
    try:
        with pytest.raises(EndpointError, match="cannot reach"):
            endpoint.check()
    finally:
        asyncio.run(endpoint.aclose())
