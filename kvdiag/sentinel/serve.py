"""The sentinel's file over HTTP, for a server kvdiag does not run on its own machine. With
$KVDIAG_SENTINEL_ADDR=HOST:PORT beside $KVDIAG_SENTINEL, the engine's kvdiag plugin serves
the file, read-only, at http://HOST:PORT/ (GET: the whole file as it is now), and kvdiag
reads that URL wherever it reads the file:

    KVDIAG_SENTINEL=$PWD/sentinel.jsonl KVDIAG_SENTINEL_ADDR=0.0.0.0:9477 vllm serve ...
    kvdiag probe --base-url http://staging:8000 --sentinel http://staging:9477/
    kvdiag sentinel http://staging:9477/

An engine starts several processes that each load the plugin: the first binds the port, and
the others find it answering with this file's name. A port held by anything else stops the
engine (never a sentinel nobody can read).
"""

from __future__ import annotations

import errno
import threading
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ADDR_ENV = "KVDIAG_SENTINEL_ADDR"
HEADER = "X-Kvdiag-Sentinel"  # the served file's path: what tells kvdiag's server apart


def is_url(source: object) -> bool:
    return str(source).startswith(("http://", "https://"))


def address(value: str) -> tuple[str, int]:
    """HOST:PORT as given in $KVDIAG_SENTINEL_ADDR; ValueError for anything else."""
    host, sep, port = value.strip().rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{ADDR_ENV}={value!r}: expected HOST:PORT")
    return host.strip("[]"), int(port)


def serve_if_asked(path: str | Path) -> str | None:
    """For an engine's kvdiag plugin: serve `path` where $KVDIAG_SENTINEL_ADDR says; the
    address when this process serves it, None when none is asked or a sibling serves it."""
    import os

    addr = os.environ.get(ADDR_ENV, "").strip()
    return addr if addr and serve(path, addr) is not None else None


def serve(path: str | Path, addr: str) -> ThreadingHTTPServer | None:
    """Serve `path` at `addr` from a daemon thread of this process; None when a sibling process
    of the same engine already does. RuntimeError when the port is held by anything else."""
    path = str(Path(path).resolve())
    host, port = address(addr)

    class File(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            try:
                data = Path(path).read_bytes()
            except FileNotFoundError:
                data = b""  # no step run yet: an empty file, not an error
            self.send_response(200)
            self.send_header("Content-Type", "application/x-ndjson")
            self.send_header("Content-Length", str(len(data)))
            self.send_header(HEADER, path)
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args) -> None:  # the engine's log stays the engine's
            pass

    try:
        server = ThreadingHTTPServer((host, port), File)
    except OSError as e:
        if e.errno == errno.EADDRINUSE and _serving(host, port) == path:
            return None
        raise RuntimeError(f"kvdiag sentinel: cannot serve {path} at {host}:{port}: {e.strerror or e}") from None
    threading.Thread(target=server.serve_forever, daemon=True, name="kvdiag-sentinel-http").start()
    return server


def _serving(host: str, port: int) -> str | None:
    """The file a kvdiag sentinel at host:port serves, or None (nothing there, or not one)."""
    near = "127.0.0.1" if host in ("0.0.0.0", "") else "::1" if host == "::" else host
    try:
        with urllib.request.urlopen(f"http://{near}:{port}/", timeout=5) as reply:
            return reply.headers.get(HEADER)
    except (OSError, ValueError):
        return None


def fetch(url: str, timeout: float = 30.0) -> bytes:
    """The sentinel's file from its URL. OSError naming the URL when nothing answers there, or
    what answers is not a kvdiag sentinel."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as reply:
            if reply.headers.get(HEADER) is None:
                raise OSError(f"{url} answered, but not as a kvdiag sentinel (no {HEADER} header)")
            return reply.read()
    except urllib.error.URLError as e:
        raise OSError(f"{url}: {e.reason}") from None
