"""A prompt's token ids, asked of the upstream itself (its own chat template and tokenizer),
in the shape its server speaks: its protocol's tokenize steps (kvdiag.engines.protocol;
llama.cpp's through /apply-template and /tokenize {content}), driven with async calls.

`detect` tells llama-server apart by its GET /props. Whatever the shape, the checker holds
the ids' count against the server's own `usage.prompt_tokens` before it trusts them."""

from __future__ import annotations

import httpx

from kvdiag.engines import routes
from kvdiag.engines.llamacpp.protocol import LLAMACPP, is_llamacpp
from kvdiag.engines.protocol import OPENAI
from kvdiag.watch.exchange import Exchange

PROTOCOLS = {p.name: p for p in (OPENAI, LLAMACPP)}  # a shape's protocol (engines/protocol.py)
SHAPES = tuple(PROTOCOLS)


async def detect(client: httpx.AsyncClient) -> str:
    try:
        r = await client.get(routes.PROPS, timeout=5)
        if r.status_code == 200 and is_llamacpp(r.json()):
            return LLAMACPP.name
    except (httpx.HTTPError, ValueError, TypeError):
        pass
    return OPENAI.name


async def prompt_ids(client: httpx.AsyncClient, ex: Exchange, shape: str) -> tuple[int, ...] | None:
    """The ids, or None where the upstream would not say (the checker then re-warms)."""
    prompt = ex.prompt.get("prompt")
    if isinstance(prompt, list):
        return tuple(prompt) if all(isinstance(t, int) for t in prompt) else None
    headers = {"Authorization": ex.auth} if ex.auth else {}
    steps = PROTOCOLS[shape].tokenize(ex.model, ex.prompt)
    try:
        path, body = next(steps)
        while True:
            r = await client.post(path, json=body, headers=headers)
            if r.status_code != 200:
                return None
            try:
                path, body = steps.send(r.json())
            except StopIteration as done:
                return tuple(done.value)
    except (httpx.HTTPError, ValueError, KeyError, TypeError):
        return None
