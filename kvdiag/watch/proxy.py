"""The reverse proxy: Starlette in uvicorn, httpx to the upstream. Every request and response
passes unchanged, streaming included (bytes relayed as they arrive, headers and auth as
sent, hop-by-hop headers excepted). A generation request is also copied, as it passes, into
an Exchange, and the checker (kvdiag.watch.checker) is told it was sent and when it ended:
the checks never sit between the client and the upstream.

    client --> proxy --(same bytes)--> upstream
                 |  sent / done events (put_nowait)
                 v
              checker: tokenize, oracle, twins, windows, file, metrics

Its own routes: GET /kvdiag/metrics (Prometheus) and GET /kvdiag/status (JSON)."""

from __future__ import annotations

import time

import anyio
import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from kvdiag.engines import routes
from kvdiag.watch.checker import Checker
from kvdiag.watch.exchange import Exchange
from kvdiag.watch.metrics import PATH as METRICS_PATH

# A pooled connection the upstream closed as the proxy reused it (its keep-alive timeout, 5 s
# in uvicorn, vLLM, SGLang and llama-server, against the pool's own expiry): the request fails
# before any byte of an answer, and is sent once more. The pool's expiry is kept shorter than
# theirs (run.py), which makes this rare: 1 of about 950 streamed requests in a run of
# benchmarks/watch_cost.py before it, a 502 the client saw.
STALE = (httpx.ReadError, httpx.RemoteProtocolError, httpx.WriteError)
HOP = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te",
       "trailer", "transfer-encoding", "upgrade", "host", "content-length"}


def _headers(items, keep: tuple[str, ...] = ()) -> list[tuple[str, str]]:
    return [(k, v) for k, v in items if k.lower() not in HOP or k.lower() in keep]


def build_app(upstream: httpx.AsyncClient, checker: Checker, status,
              failures: dict[str, int] | None = None) -> Starlette:
    """`upstream`: a client whose base_url is the upstream; `status()`: the /kvdiag/status JSON;
    `failures`: counted here, by what failed, where the upstream could not be reached (a 502)."""
    failures = {} if failures is None else failures

    def _unread(ex: Exchange, status: int) -> None:
        """A request indexed at send whose answer is not read: done, never judged (it stays in
        the index with any output length, so it can explain later hits)."""
        ex.finish(status, time.time(), False)
        checker.event("done", ex)

    async def relay(request: Request) -> Response:
        body = await request.body()
        path = request.url.path
        ex = Exchange.of(path, body, request.headers, time.time()) if request.method == "POST" else None
        outgoing = upstream.build_request(
            request.method, httpx.URL(path=path, query=request.url.query.encode()),
            headers=_headers(request.headers.items()), content=body)
        if ex is not None:
            # indexed before it goes out, not when its headers come back: a non-streamed answer's
            # headers come only once it is done, and a request the upstream computes beside
            # another must be in the index when the other is judged (else a healthy hit reads
            # as an over-hit)
            checker.event("sent", ex)
        try:
            try:
                response = await upstream.send(outgoing, stream=True)
            except STALE:  # once more, on a fresh connection: see STALE
                response = await upstream.send(outgoing, stream=True)
        except httpx.HTTPError as e:
            failures[type(e).__name__] = failures.get(type(e).__name__, 0) + 1
            if ex is not None:
                _unread(ex, 502)
            return JSONResponse({"error": {"message": f"kvdiag watch: the upstream is unreachable "
                                           f"({type(e).__name__})", "type": "bad_gateway"}}, 502)
        if ex is not None and response.headers.get("content-encoding"):
            _unread(ex, response.status_code)  # compressed: relayed, not read
            ex = None
        if path in routes.RESET and response.status_code == 200:  # a reset empties the index
            checker.event("reset", None)

        async def stream():
            complete = False
            try:
                async for chunk in response.aiter_raw():
                    if ex is not None:
                        ex.feed(chunk)
                    yield chunk
                complete = True
            finally:  # the last byte sent, or the client or the upstream cut it
                await response.aclose()
                if ex is not None:
                    ex.finish(response.status_code, time.time(), complete)
                    checker.event("done", ex)

        relayed = _Relay(stream(), status_code=response.status_code)
        relayed.raw_headers = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in
                               _headers(response.headers.multi_items(), keep=("content-length",))]
        return relayed

    async def metrics(_: Request) -> Response:
        return Response(checker.metrics.render(), media_type="text/plain; version=0.0.4")

    async def status_route(_: Request) -> Response:
        return JSONResponse(status())

    methods = ["GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "HEAD"]
    return Starlette(routes=[Route(METRICS_PATH, metrics), Route("/kvdiag/status", status_route),
                             Route("/{path:path}", relay, methods=methods)])


class _Relay(StreamingResponse):
    """A StreamingResponse that closes its body however the relay ends, so a client that
    disconnects mid-stream leaves no upstream connection and no request in flight behind."""

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            with anyio.CancelScope(shield=True):
                await self.body_iterator.aclose()
