"""The server's front door, as plain ASGI middleware (Starlette's BaseHTTPMiddleware would
hide client disconnects from the app): a bearer API key and a request-body size limit.

- With an API key set, every path except /health and /metrics needs
  `Authorization: Bearer KEY`, else 401 (vLLM's --api-key covers /v1 only; here the admin
  endpoints /reset_prefix_cache, /tokenize and /detokenize are covered too).
- A body longer than max_body_bytes (by Content-Length, or counted for chunked uploads)
  gets 413 without reaching the app: it is read and dropped, never kept. A body within the
  limit is buffered here and replayed to the app; later receive() calls reach the server,
  so the app still sees http.disconnect.
Errors use the OpenAI shape {"error": {"message", "type", "param", "code"}}.
"""

from __future__ import annotations

import hmac
import json

OPEN_PATHS = frozenset({"/health", "/metrics"})
DRAIN_BYTES = 256 << 20  # an oversized body is read and dropped up to here, then cut off


def error_body(status: int, message: str, kind: str, param: str | None = None) -> bytes:
    return json.dumps({"error": {"message": message, "type": kind, "param": param,
                                 "code": status}}).encode()


async def _send_error(send, status: int, message: str, kind: str) -> None:
    body = error_body(status, message, kind)
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if status == 401:
        headers.append((b"www-authenticate", b"Bearer"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class HttpGuard:
    def __init__(self, app, *, max_body_bytes: int, api_key: str | None = None) -> None:
        self.app, self.max_body_bytes = app, max_body_bytes
        self._key = f"Bearer {api_key}".encode() if api_key else None

    def __repr__(self) -> str:  # never show the key
        return f"HttpGuard(max_body_bytes={self.max_body_bytes}, api_key={'set' if self._key else None})"

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope["headers"])
        if self._key is not None and scope["path"] not in OPEN_PATHS:
            given = headers.get(b"authorization", b"")
            if not hmac.compare_digest(given, self._key):
                return await _send_error(send, 401, "invalid or missing API key: send "
                                         "'Authorization: Bearer KEY'", "authentication_error")
        declared = headers.get(b"content-length")
        too_large = declared is not None and declared.isdigit() and int(declared) > self.max_body_bytes
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return  # the client left before its body arrived: nothing to answer
            chunk = message.get("body", b"")
            size += len(chunk)
            too_large = too_large or size > self.max_body_bytes
            if too_large:
                chunks = []
            else:
                chunks.append(chunk)
            # Over the limit the rest is read and dropped (up to DRAIN_BYTES), so the client
            # gets its 413 rather than a connection reset in the middle of its upload.
            if not message.get("more_body", False) or size > DRAIN_BYTES:
                break
        if too_large:
            return await self._too_large(send, int(declared) if declared and declared.isdigit() else size)
        await self.app(scope, _replay(b"".join(chunks), receive), send)

    async def _too_large(self, send, got: int) -> None:
        got = f"{got} bytes" if got <= DRAIN_BYTES else f"over {DRAIN_BYTES} bytes"
        await _send_error(send, 413, f"the request body is too large ({got}); the limit is "
                          f"{self.max_body_bytes} bytes (kvdiag serve --max-body-bytes)",
                          "invalid_request_error")


def _replay(body: bytes, receive):
    """A receive() that yields the buffered body once, then defers to the server's."""
    sent = False

    async def replay():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay
