"""One generation request as the proxy saw it: what the client asked (read from its body,
never changed) and what the upstream answered (read from the bytes relayed, JSON or
server-sent events), reduced to what the checks need. No prompt or answer text is kept here
past the tokenizer call: the checker holds ids and counts only."""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass, field

GENERATION_PATHS = ("/v1/chat/completions", "/v1/completions")
MAX_BODY = 64 << 20  # a JSON response larger than this is relayed, not parsed
HEAD, TAIL = 4096, 65536  # a stream keeps its first bytes (the id) and its last (the usage)
_SEQ = itertools.count()


@dataclass
class Exchange:
    """`namespace`: what a prefix cache must keep apart (model or adapter, cache_salt, a
    llama.cpp `lora` list or SGLang `lora_path`). `prompt`: the body's fields that make the
    prompt (messages, or a prompt as text or ids), for /tokenize. `request_id`: the client's X-Request-Id, if any."""

    path: str
    namespace: tuple
    prompt: dict
    request_id: str
    stream: bool
    sent: float
    done: float = 0.0
    status: int = 0
    complete: bool = False  # the whole response was relayed and parsed
    cached: int | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    model: str | None = None  # as the client named it (the namespace may drop it)
    rounds: int = 1  # user turns in a chat's messages: the round of a conversation
    # the exchange's key in the index, never reused: id() of a finished exchange comes back
    # for a later one, which then skipped the earlier one's prompt as its own (false over-hits)
    seq: int = field(default_factory=_SEQ.__next__)
    auth: str | None = field(default=None, repr=False)  # the client's Authorization, for
    # the tokenizer and the twins (held in memory while they need it, never written)
    _buf: bytearray = field(default_factory=bytearray, repr=False)
    _over: bool = False

    @classmethod
    def of(cls, path: str, body: bytes, headers, now: float) -> Exchange | None:
        """The exchange to watch, or None for anything that is not a well-formed generation
        request (it is relayed all the same)."""
        if path not in GENERATION_PATHS:
            return None
        try:
            req = json.loads(body)
        except ValueError:
            return None
        if not isinstance(req, dict) or int(req.get("n") or 1) != 1:
            return None  # n > 1: the children's counts are not one request's
        if path.endswith("chat/completions"):
            if not isinstance(req.get("messages"), list):
                return None
            keys = ("messages", "tools", "chat_template", "chat_template_kwargs",
                    "add_generation_prompt", "continue_final_message")
            rounds = max(1, sum(isinstance(m, dict) and m.get("role") == "user"
                                for m in req["messages"]))
        else:
            if not isinstance(req.get("prompt"), (str, list)):
                return None
            keys, rounds = ("prompt",), 1
        # an adapter named by a field: llama.cpp's `lora` list, SGLang's `lora_path`
        named = {k: req[k] for k in ("lora", "lora_path") if req.get(k) is not None}
        lora = json.dumps(named, sort_keys=True) if named else None
        return cls(path=path, namespace=(req.get("model"), req.get("cache_salt"), lora),
                   prompt={k: req[k] for k in keys if k in req},
                   request_id=headers.get("x-request-id") or str(req.get("rid") or ""),
                   stream=bool(req.get("stream")), sent=now, rounds=rounds, model=req.get("model"),
                   auth=headers.get("authorization"))

    def feed(self, chunk: bytes) -> None:
        if self._over:
            return
        self._buf += chunk
        if self.stream and len(self._buf) > HEAD + 2 * TAIL:  # bounded, however long it streams
            self._buf[HEAD:len(self._buf) - TAIL] = b"\n"
        elif len(self._buf) > MAX_BODY:
            self._over, self._buf = True, bytearray()

    def finish(self, status: int, now: float, complete: bool) -> None:
        """The relay ended (`complete`: every byte reached the client): read the usage."""
        self.status, self.done = status, now
        self.complete = complete and status == 200 and not self._over
        if self.complete:
            usage, rid = _usage_of(bytes(self._buf), self.stream)
            self.request_id = self.request_id or rid  # else the server's own response id
            if usage is not None:
                self.prompt_tokens = _int(usage.get("prompt_tokens"))
                self.completion_tokens = _int(usage.get("completion_tokens"))
                details = usage.get("prompt_tokens_details") or {}
                self.cached = _int(details.get("cached_tokens"))
        self._buf = bytearray()


def _int(x) -> int | None:
    return int(x) if isinstance(x, (int, float)) else None


def _usage_of(body: bytes, stream: bool) -> tuple[dict | None, str]:
    """The response's usage and id: the JSON body's, or from the server-sent events (a
    streaming client that did not ask for stream_options.include_usage gets no usage)."""
    if not stream:
        try:
            data = json.loads(body)
        except ValueError:
            return None, ""
        return (data.get("usage"), str(data.get("id") or "")) if isinstance(data, dict) else (None, "")
    usage, rid = None, ""
    for line in body.split(b"\n"):
        if line.startswith(b"data:") and (not rid or b'"usage"' in line):
            try:
                event = json.loads(line[5:])
            except ValueError:
                continue
            if isinstance(event, dict):
                rid = rid or str(event.get("id") or "")
                usage = event.get("usage") or usage
    return usage, rid
