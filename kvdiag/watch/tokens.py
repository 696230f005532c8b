"""A prompt's token ids, asked of the upstream itself (its own chat template and tokenizer),
in the shape its server speaks:

    openai    vLLM, kvdiag serve: POST /tokenize {model, messages | prompt} -> {tokens}
    llamacpp  llama.cpp's llama-server: POST /apply-template {messages} -> {prompt}, then
              POST /tokenize {content, add_special, parse_special} -> {tokens}, as its
              completion endpoints tokenize (special tokens added and parsed)

`detect` tells them apart by llama-server's GET /props. Whatever the shape, the checker holds
the ids' count against the server's own `usage.prompt_tokens` before it trusts them."""

from __future__ import annotations

import httpx

from kvdiag.engines.llamacpp.protocol import LLAMACPP
from kvdiag.engines.protocol import OPENAI
from kvdiag.watch.exchange import Exchange

PROTOCOLS = {p.name: p for p in (OPENAI, LLAMACPP)}  # a shape's protocol (engines/protocol.py)
SHAPES = tuple(PROTOCOLS)


async def detect(client: httpx.AsyncClient) -> str:
    try:
        r = await client.get("/props", timeout=5)
        if r.status_code == 200 and "default_generation_settings" in r.json():
            return "llamacpp"
    except (httpx.HTTPError, ValueError, TypeError):
        pass
    return "openai"


async def prompt_ids(client: httpx.AsyncClient, ex: Exchange, shape: str) -> tuple[int, ...] | None:
    """The ids, or None where the upstream would not say (the checker then re-warms)."""
    prompt = ex.prompt.get("prompt")
    if isinstance(prompt, list):
        return tuple(prompt) if all(isinstance(t, int) for t in prompt) else None
    headers = {"Authorization": ex.auth} if ex.auth else {}
    try:
        if shape == "openai":
            r = await client.post("/tokenize", json={"model": ex.model} | ex.prompt,
                                  headers=headers)
            return tuple(r.json()["tokens"]) if r.status_code == 200 else None
        if "messages" in ex.prompt:
            r = await client.post("/apply-template", json=ex.prompt, headers=headers)
            if r.status_code != 200:
                return None
            prompt = r.json()["prompt"]
        r = await client.post("/tokenize", json={"content": prompt, "add_special": True,
                                                 "parse_special": True}, headers=headers)
        return tuple(r.json()["tokens"]) if r.status_code == 200 else None
    except (httpx.HTTPError, ValueError, KeyError, TypeError):
        return None
