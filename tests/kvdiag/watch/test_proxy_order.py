"""The proxy tells the checker a request was sent when it goes out, not when its answer's
headers come back: a non-streamed answer's headers come only once it is done, so a request
the upstream computes beside another must be in the index before the other is judged (else a
healthy hit reads as an over-hit; seen on real vLLM, tests/kvdiag/engines/test_watch_live.py).
In process: a stand-in upstream holds the first answer until the second is out."""

from __future__ import annotations

import asyncio

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
