"""What a server's JSON answer says, as kvdiag keeps it: `ChatResult` from a chat or a
completion (its logprobs in either shape), the usage counts and cached tokens, vLLM's
prompt_logprobs; the endpoint (endpoint.py) sends, these read."""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

REQUEST_ID = "kvdiag_request_id"  # where the endpoint leaves the id a request was sent under


@dataclass
class ChatResult:
    text: str
    tokens: list[str]  # generated tokens, from logprobs (empty when the server gives none)
    top: list[list[tuple[str, float]]]  # per token: the top alternatives, best first
    logprobs: list[float]
    prompt_tokens: int
    cached_tokens: int | None
    finish_reason: str | None
    seconds: float = 0.0
    extra: dict = field(default_factory=dict)
    completion_tokens: int = 0
    sent: float = 0.0  # wall-clock times the request went out and its answer came back (the
    done: float = 0.0  # over-hit oracle orders requests by them, across a resumed run too)
    request_id: str = ""  # the X-Request-Id it was sent with (a sentinel's findings name it)


def usage_fields(data: dict) -> dict:
    """ChatResult's fields from a response's usage: prompt and completion tokens, and the
    cached tokens (None when the server reports no count); and the id it was sent under."""
    usage = data.get("usage") or {}
    return {"prompt_tokens": int(usage.get("prompt_tokens") or 0),
            "completion_tokens": int(usage.get("completion_tokens") or 0),
            "cached_tokens": (usage.get("prompt_tokens_details") or {}).get("cached_tokens"),
            "request_id": data.get(REQUEST_ID, "")}


def chat_result(data: dict) -> ChatResult:
    choice = data["choices"][0]
    return ChatResult(text=(choice.get("message") or {}).get("content") or "",
                      **content_logprobs((choice.get("logprobs") or {}).get("content") or []),
                      finish_reason=choice.get("finish_reason"), **usage_fields(data))


def content_logprobs(content: list[dict]) -> dict:
    """The chat shape of logprobs: one {token, logprob, top_logprobs} per generated token."""
    return {"tokens": [c["token"] for c in content],
            "top": [[(t["token"], t["logprob"]) for t in c.get("top_logprobs") or []] for c in content],
            "logprobs": [c["logprob"] for c in content]}


def completion_result(data: dict, i: int = 0) -> ChatResult:
    """A completion's answer (choice `i`); its logprobs in the legacy shape (tokens,
    token_logprobs, top_logprobs), or in the chat shape, as llama-server gives them for a
    completion too."""
    choice = data["choices"][i]
    lp = choice.get("logprobs") or {}
    if "content" in lp:
        return ChatResult(text=choice.get("text") or "", **content_logprobs(lp["content"] or []),
                          finish_reason=choice.get("finish_reason"), **usage_fields(data))
    tops = lp.get("top_logprobs") or []
    return ChatResult(
        text=choice.get("text") or "", tokens=list(lp.get("tokens") or []),
        top=[sorted((top or {}).items(), key=lambda kv: -kv[1]) for top in tops],
        logprobs=[x if x is not None else 0.0 for x in lp.get("token_logprobs") or []],
        finish_reason=choice.get("finish_reason"), **usage_fields(data))


def timed(result: ChatResult, sent: float) -> ChatResult:
    done = time.time()
    return replace(result, sent=sent, done=done, seconds=done - sent)


def prompt_logprobs_of(data: dict) -> list:
    """vLLM's prompt_logprobs (per position None or {token id: {"logprob", ...}}; top level
    or in the choice) as [token id, logprob] per position (None for the first)."""
    found = data.get("prompt_logprobs") or ((data.get("choices") or [{}])[0].get("prompt_logprobs"))
    out = []
    for position in found or []:
        if not position:
            out.append(None)
            continue
        token, entry = next(iter(position.items()))
        out.append([int(token), float(entry["logprob"] if isinstance(entry, dict) else entry)])
    return out

