"""A prompt's token ids, asked of the upstream itself (its own chat template and tokenizer),
in the shape its server speaks: its protocol's tokenize steps (kvdiag.engines.protocol;
llama.cpp's through /apply-template and /tokenize {content}), driven with async calls.

`detect` tells llama-server apart by its GET /props. Whatever the shape, the checker holds
the ids' count against the server's own `usage.prompt_tokens` before it trusts them.

`LocalTokenizer` (`kvdiag watch --tokenizer DIR`) asks nothing of the upstream: the prompt is
tokenized in the proxy's own process by the model's Hugging Face tokenizer and chat template.
The upstream then carries no extra request per request (what a /tokenize call per request
costs is measured in docs/watch.md). A template that differs from the server's gives counts
that differ from its usage, so those requests are unjudged: less coverage, never a finding."""

from __future__ import annotations

from pathlib import Path

import httpx

from kvdiag.engines import routes
from kvdiag.engines.llamacpp.protocol import LLAMACPP, is_llamacpp
from kvdiag.engines.protocol import OPENAI
from kvdiag.errors import KvdiagError
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


def check_tokenizer(path: str | Path) -> Path:
    """`path`, or KvdiagError (bad input) when it holds no tokenizer: checked before
    transformers is imported, and before the proxy binds its port."""
    path = Path(path)
    if not (path / "tokenizer_config.json").is_file():
        raise KvdiagError(f"--tokenizer {path}: no tokenizer_config.json there (give the "
                          "served model's directory, or one with its tokenizer and chat template)")
    return path


class LocalTokenizer:
    def __init__(self, path: str | Path) -> None:
        path = check_tokenizer(path)
        from transformers import AutoTokenizer

        self.path = str(path)
        self.tok = AutoTokenizer.from_pretrained(path, local_files_only=True)

    def ids(self, ex: Exchange) -> tuple[int, ...] | None:
        """The ids as a vLLM-style server makes them (chat: the template with the generation
        prompt, unless the request says otherwise; text: the tokenizer's special tokens), or
        None where the template cannot render the request."""
        p = ex.prompt
        try:
            if "messages" in p:
                out = self.tok.apply_chat_template(
                    p["messages"], tools=p.get("tools"), chat_template=p.get("chat_template"),
                    add_generation_prompt=p.get("add_generation_prompt", True),
                    continue_final_message=p.get("continue_final_message", False),
                    tokenize=True, **(p.get("chat_template_kwargs") or {}))
                out = out["input_ids"] if hasattr(out, "keys") else out
            elif isinstance(p.get("prompt"), str):
                out = self.tok.encode(p["prompt"])
            else:
                out = p.get("prompt")
            return tuple(out) if all(isinstance(t, int) for t in out) else None
        except Exception:  # noqa: BLE001 (a client's template arguments can raise anything jinja does)
            return None
