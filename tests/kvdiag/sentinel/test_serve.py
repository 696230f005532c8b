"""The sentinel's file over HTTP (kvdiag.sentinel.serve): what a plugin serves is read as the
file is, the engine's sibling processes share the port, a port held by anything else is
refused, and a URL that is no sentinel is bad input before a probe starts."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from kvdiag.errors import KvdiagError
from kvdiag.sentinel.facts import Counters, Finding
from kvdiag.sentinel.log import SentinelLog, read_report, size_of
from kvdiag.sentinel.serve import address, serve


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_served_file_reads_as_the_file(tmp_path):
    path = tmp_path / "s.jsonl"
    port = free_port()
    server = serve(path, f"127.0.0.1:{port}")
    url = f"http://127.0.0.1:{port}/"
    try:
        assert size_of(url) == 0  # no step yet: an empty file
        log = SentinelLog(path, {"engine": "vllm"}, every=0.0)
        log.counters(Counters(steps=3, requests=2, reads=40))
        since = size_of(url)
        log.finding(Finding("foreign", 3, "r1", [(4, 8)], 4, 9, ["r0"]))
        log.counters(Counters(steps=5, requests=2, reads=70, foreign=4))
        by_url, by_file = read_report(url, since), read_report(path, since)
        assert by_url.findings == by_file.findings and len(by_url.findings) == 1
        assert by_url.counters == by_file.counters and by_url.counters.reads == 30
        # a second process of the same engine finds the port serving this file: no error
        assert serve(path, f"127.0.0.1:{port}") is None
        # another file at that port is refused
        with pytest.raises(RuntimeError, match="cannot serve"):
            serve(tmp_path / "other.jsonl", f"127.0.0.1:{port}")
    finally:
        server.shutdown()


def test_a_port_held_by_something_else_is_refused(tmp_path):
    class Other(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args):
            pass

    other = ThreadingHTTPServer(("127.0.0.1", 0), Other)
    threading.Thread(target=other.serve_forever, daemon=True).start()
    try:
        with pytest.raises(RuntimeError, match="cannot serve"):
            serve(tmp_path / "s.jsonl", f"127.0.0.1:{other.server_address[1]}")
        from kvdiag.commands.probe import sentinel_path
        from kvdiag.targets import endpoint_target

        remote = endpoint_target("http://127.0.0.1:9", None, "m")
        with pytest.raises(KvdiagError, match="not as a kvdiag sentinel"):
            sentinel_path(remote, f"http://127.0.0.1:{other.server_address[1]}/")
    finally:
        other.shutdown()
    with pytest.raises(ValueError, match="HOST:PORT"):
        address("9477")


@pytest.mark.e2e
def test_probe_refuses_a_dead_sentinel_url_before_it_starts(tmp_path):
    port = free_port()
    run = subprocess.run([sys.executable, "-m", "kvdiag", "probe", "--base-url", "http://127.0.0.1:9",
                          "--model", "m", "--sentinel", f"http://127.0.0.1:{port}/", "--out", str(tmp_path)],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and f"127.0.0.1:{port}" in run.stderr, run.stderr[-800:]
    assert not list(tmp_path.iterdir())  # refused before any run directory
