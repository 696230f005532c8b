"""A small reverse proxy in front of a real `kvdiag serve`, as a subprocess on a free loopback
port, that breaks one thing a probe relies on:

    drop-count         removes usage.prompt_tokens_details from every answer (most proxies, a
                       vLLM without --enable-prompt-tokens-details, SGLang without
                       --enable-cache-report)
    perturb-repeats    changes the first token of a cache-isolated chat answer (a fresh
                       kvdiag-<hex> salt) whose request, salt aside, was answered before: two
                       isolated runs of one request then decisively disagree

Run as `python -m tests.kvdiag.proxy UPSTREAM PORT MODE`.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
from contextlib import contextmanager

import httpx

ISOLATED_SALT = re.compile(r"^kvdiag-[0-9a-f]{32}$")


def app(upstream: str, mode: str):
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    client = httpx.AsyncClient(base_url=upstream, timeout=300)
    seen: set[str] = set()

    async def forward(request: Request) -> Response:
        body = await request.body()
        r = await client.request(request.method, request.url.path, content=body,
                                 headers={"content-type": request.headers.get("content-type", "")})
        out = r.content
        if r.headers.get("content-type", "").startswith("application/json") and r.status_code == 200:
            data = r.json()
            if mode == "drop-count" and isinstance(data.get("usage"), dict):
                data["usage"].pop("prompt_tokens_details", None)
            if mode == "perturb-repeats" and request.url.path == "/v1/chat/completions":
                sent = json.loads(body)
                if ISOLATED_SALT.match(str(sent.pop("cache_salt", ""))):
                    key = hashlib.sha256(json.dumps(sent, sort_keys=True).encode()).hexdigest()
                    if key in seen:
                        _perturb(data)
                    seen.add(key)
            out = json.dumps(data).encode()
        return Response(out, status_code=r.status_code,
                        media_type=r.headers.get("content-type", "application/json"))

    return Starlette(routes=[Route("/{path:path}", forward, methods=["GET", "POST"])])


def _perturb(data: dict) -> None:
    choice = data["choices"][0]
    content = (choice.get("logprobs") or {}).get("content") or []
    if content:
        content[0]["token"] = "\N{SNOWMAN}"
        choice["message"]["content"] = "\N{SNOWMAN}" + (choice["message"].get("content") or "")


@contextmanager
def proxied(upstream: str, mode: str, timeout: float = 60.0):
    """The proxy's URL while it runs."""
    from tests.kvdiag.serving import running

    with running(lambda port: [sys.executable, "-m", "tests.kvdiag.proxy", upstream, str(port), mode],
                 "/health", "the proxy", timeout, output=False) as (url, _):
        yield url


if __name__ == "__main__":
    import uvicorn

    upstream, port, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    uvicorn.run(app(upstream, mode), host="127.0.0.1", port=port, log_level="warning")
