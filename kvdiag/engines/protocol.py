"""What a server speaks beyond OpenAI's API, owned by its engine: how it tokenizes, how one
request is kept off the prefix cache (the probe's isolated ground truth), whether it keys the
cache by namespace, how its cache is emptied, and how its counters read. The endpoint
(runners/live/endpoint.py) asks its server's protocol, and never an engine's name.

    OpenAI   vLLM, SGLang, kvdiag serve   /tokenize {model, prompt | messages} -> {tokens};
             isolation and namespaces by cache_salt; reset by POST /reset_prefix_cache
             (vLLM, kvdiag serve) or /flush_cache (SGLang)
    llama.cpp (engines/llamacpp/protocol.py): /apply-template then /tokenize {content};
             isolation by cache_prompt: false; no namespaces; no reset

A salt is sent for two reasons, and a protocol keeps them apart: `isolate` (a request that
must read nothing cached: its twin's ground truth) and `namespace` (requests that must share
nothing with other salts: pressure, tenants, the differential's namespace pair). An engine
without namespaces serves every request from one cache, so the probe neither claims the
namespace checks nor keeps the over-hit oracle's bounds apart by salt.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Generator

import httpx

from kvdiag.engines import routes
from kvdiag.errors import KvdiagError

Call = Callable[..., httpx.Response]  # Endpoint._sync: (method, path, **kw) -> response
# the requests that tokenize one prompt, without I/O: each (path, body) is answered with its
# JSON; the generator returns the ids (the endpoint drives it with sync calls, kvdiag watch
# with async ones, so the shapes live here once)
Steps = Generator[tuple[str, dict], dict, list[int]]


class OpenAIProtocol:
    name = "openai"
    isolation = "cache_salt"  # how an isolated request is kept off the cache (as recorded)
    namespaces = True  # requests under different salts share no cached block
    reset_paths = routes.RESET
    prompt_logprobs = True  # it may give vLLM's prompt_logprobs (the probe asks before using them)
    slots = False  # a fixed set of slots a request may be pinned to, saved and restored (llama.cpp)

    def tokenize(self, model: str, prompt: dict, add_special: bool = True) -> Steps:
        """The ids of `prompt`: {"messages": [...][, "add_generation_prompt"]} (through the
        server's chat template) or {"prompt": text} (special tokens added where
        `add_special`), as the server's own tokenizer gives them."""
        body = {"model": model} | prompt
        if "messages" not in prompt:
            body["add_special_tokens"] = add_special
        data = yield "/tokenize", body
        return list(data["tokens"])

    def isolate(self, body: dict) -> None:
        """Keep this request off the prefix cache: a salt nobody else sends."""
        body["cache_salt"] = f"kvdiag-{uuid.uuid4().hex}"

    def namespace(self, body: dict, salt: str) -> None:
        body["cache_salt"] = salt

    def pin_reuse(self, body: dict, reuse_chunk: int) -> None:
        """Fix, per request, how far past the common prefix the server may reuse cached
        tokens, where the server takes that per request (llama.cpp); nothing here."""

    def adapters(self, call: Call) -> dict[str, dict]:
        """LoRA adapters the server serves beside its models: name -> the fields a request
        asks for it with. {} here: vLLM and SGLang serve an adapter as a model (`model`)."""
        return {}

    def decode_all(self, body: dict) -> None:
        """Make this request decode all its max_tokens, whatever it generates (an extra
        parameter vLLM, SGLang and llama.cpp take)."""
        body["ignore_eos"] = True

    def pin_slot(self, body: dict, slot: int) -> None:
        """Run this request on one slot, where the server has slots (llama.cpp)."""
        raise KvdiagError(f"{self.name}: the server has no slots to pin a request to")

    def slot_action(self, call: Call, slot: int, action: str, filename: str | None) -> dict:
        """Save, restore or erase a slot, where the server has slots (llama.cpp)."""
        return {"ok": False, "error": f"{self.name} servers have no slots"}

    def broken_slot_file(self, data: bytes) -> bytes | None:
        """A saved slot file made to fail partway through its restore; None where this
        engine's files are not known (or have no slots)."""
        return None

    def isolation_works(self, call: Call, model: str) -> tuple[bool, str]:
        """Does the server take isolation per request? (a one-token request with a salt)"""
        body = {"model": model, "messages": [{"role": "user", "content": "hello"}],
                "max_tokens": 1, "cache_salt": "kvdiag-salt-check"}
        r = call("POST", "/v1/chat/completions", json=body)
        return (True, "") if r.status_code == 200 else (False, f"HTTP {r.status_code}: {r.text[:160]}")

    def reset(self, call: Call) -> bool:
        """Empty the prefix cache; False where no reset works (or requests are in flight)."""
        for path in self.reset_paths:
            r = call("POST", path)
            if r.status_code != 404:
                return r.status_code == 200
        return False

    def counters(self, samples: dict[str, float]) -> dict[str, float]:
        """/metrics' counters as the engine's CacheCounters name them (as they are here)."""
        return samples


OPENAI = OpenAIProtocol()
