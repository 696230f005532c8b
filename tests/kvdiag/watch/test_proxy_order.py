"""The proxy tells the checker a request was sent when it goes out, not when its answer's
headers come back: a non-streamed answer's headers come only once it is done, so a request
the upstream computes beside another must be in the index before the other is judged (else a
healthy hit reads as an over-hit; seen on real vLLM, tests/kvdiag/engines/test_watch_live.py).
In process: a stand-in upstream holds the first answer until the second is out."""

from __future__ import annotations

import asyncio
import json

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from kvdiag.watch.proxy import build_app


def body(who: str) -> dict:
    return {"model": "m", "messages": [{"role": "user", "content": who}], "max_tokens": 1}


ANSWER = {"choices": [{"message": {"role": "assistant", "content": "x"}}],
          "usage": {"prompt_tokens": 5, "completion_tokens": 1, "prompt_tokens_details": {"cached_tokens": 0}}}


class Recorder:
    """A checker that only records what the proxy tells it, in order."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []

    def event(self, kind: str, ex) -> None:
        if ex is not None:
            self.events.append((kind, ex.prompt["messages"][0]["content"]))


def test_a_request_is_in_the_index_before_a_later_one_that_ends_first():
    second_done = asyncio.Event()

    async def upstream(request: Request) -> JSONResponse:
        who = (await request.json())["messages"][0]["content"]
        if who == "first":  # a long answer: its headers come only once the second has ended
            await second_done.wait()
        return JSONResponse(ANSWER)

    recorder = Recorder()

    async def run() -> None:
        served = Starlette(routes=[Route("/v1/chat/completions", upstream, methods=["POST"])])
        client = httpx.AsyncClient(transport=httpx.ASGITransport(app=served), base_url="http://up")
        app = build_app(client, recorder, lambda: {})
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://watch") as c:
            first = asyncio.create_task(c.post("/v1/chat/completions", json=body("first")))
            await asyncio.sleep(0.05)
            second = await c.post("/v1/chat/completions", json=body("second"))
            second_done.set()  # relayed whole: the proxy has told the checker it is done
            assert second.status_code == 200 and (await first).status_code == 200
        await client.aclose()

    asyncio.run(run())
    order = [(kind, who) for kind, who in recorder.events]
    assert order.index(("sent", "first")) < order.index(("done", "second")), order


def test_a_connection_the_upstream_closed_under_a_request_is_tried_once_more():
    """A request that fails before any byte of its answer (ReadError: a pooled connection
    the upstream's keep-alive timeout closed as it was reused) is sent once more and answered;
    a second failure is the client's 502, counted by cause."""

    async def run(fails: int) -> tuple[int, int, dict]:
        tries = 0

        async def send(request: httpx.Request) -> httpx.Response:
            nonlocal tries
            tries += 1
            if tries <= fails:
                raise httpx.ReadError("connection reset by peer", request=request)
            return httpx.Response(200, headers={"content-type": "application/json"},
                                  stream=httpx.ByteStream(json.dumps(ANSWER).encode()))

        client = httpx.AsyncClient(transport=httpx.MockTransport(send), base_url="http://up")
        failures: dict[str, int] = {}
        app = build_app(client, Recorder(), lambda: {}, failures)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://watch") as c:
            r = await c.post("/v1/chat/completions", json=body("one"))
        await client.aclose()
        return r.status_code, tries, failures

    assert asyncio.run(run(0)) == (200, 1, {})
    assert asyncio.run(run(1)) == (200, 2, {})
    assert asyncio.run(run(2)) == (502, 2, {"ReadError": 1})
