"""llama-server's shapes (b11434, tools/server), beside OpenAI's (kvdiag.engines.protocol):

    tokenize    POST /apply-template {messages} -> {prompt}, then POST /tokenize {content,
                add_special, parse_special} -> {tokens}: what its chat endpoint does
    isolate     cache_prompt: false (the request reuses nothing a slot or the RAM prompt
                cache holds; it reports 0 cached tokens)
    namespaces  none: one cache for every request (no cache_salt; an adapter switch clears
                the slot). The probe's salts are dropped, not sent.
    reuse       n_cache_reuse sent with every request (0 unless the probe was told N): the
                shortest chunk past the common prefix it may shift into place and count
    slots       id_slot pins a request to a slot; POST /slots/ID?action=save|restore|erase
                ({filename}, under --slot-save-path) saves, restores and erases one; a
                saved file is broken to fail partway through its restore (slotfile.py)
    adapters    GET /lora-adapters: each adapter loaded (--lora-scaled FILE:0) by id, named
                here by its file's stem; a request asks for one with "lora": [{id, scale: 1}],
                and one without the field runs the server's list as loaded
    reset       none: erasing slots (POST /slots/ID?action=erase) leaves the RAM prompt
                cache, so no request can empty the whole cache
    counters    llamacpp:prompt_tokens_total counts prompt tokens *excluding* cached ones;
                the tokens looked up are that plus llamacpp:prompt_tokens_cached_total
"""

from __future__ import annotations

from pathlib import PurePath

from kvdiag.engines import routes
from kvdiag.engines.protocol import Call, OpenAIProtocol, Steps

PROMPT, CACHED = "llamacpp:prompt_tokens_total", "llamacpp:prompt_tokens_cached_total"
QUERIED = "llamacpp:prompt_tokens_queried_total"  # kvdiag's sum of the two (not llama.cpp's)


def is_llamacpp(props: dict | None) -> bool:
    """Whether a server's GET /props answer is llama-server's."""
    return isinstance(props, dict) and "default_generation_settings" in props


class LlamacppProtocol(OpenAIProtocol):
    name = "llamacpp"
    isolation = "cache_prompt"
    namespaces = False
    reset_paths = ()
    prompt_logprobs = False  # llama.cpp has no prompt logprobs (it ignores the field)
    slots = True

    def tokenize(self, model: str, prompt: dict, add_special: bool = True) -> Steps:
        """A chat goes through /apply-template first; /tokenize then adds and parses special
        tokens as llama.cpp's completion endpoints do (its pieces form read as ids)."""
        text = prompt.get("prompt")
        if "messages" in prompt:
            data = yield "/apply-template", {k: v for k, v in prompt.items() if k != "model"}
            text, add_special = data["prompt"], True
        data = yield "/tokenize", {"content": text, "add_special": add_special, "parse_special": True}
        return [t if isinstance(t, int) else t["id"] for t in data["tokens"]]

    def isolate(self, body: dict) -> None:
        body["cache_prompt"] = False

    def namespace(self, body: dict, salt: str) -> None:
        pass  # llama.cpp keys its cache by tokens only

    def pin_reuse(self, body: dict, reuse_chunk: int) -> None:
        """n_cache_reuse on every request: a server started with --cache-reuse N would
        otherwise shift chunks past the common prefix that the probe cannot know of (/props
        does not say N), and the over-hit oracle would read them as over-hits."""
        body.setdefault("n_cache_reuse", reuse_chunk)

    def pin_slot(self, body: dict, slot: int) -> None:
        body["id_slot"] = slot

    def adapters(self, call: Call) -> dict[str, dict]:
        r = call("GET", routes.LORA_ADAPTERS)
        if r.status_code != 200:
            return {}
        return {PurePath(a["path"]).stem: {"lora": [{"id": a["id"], "scale": 1.0}]}
                for a in r.json() if isinstance(a, dict) and "path" in a and "id" in a}

    def slot_action(self, call: Call, slot: int, action: str, filename: str | None) -> dict:
        """POST /slots/ID?action=save|restore|erase ({filename} for the first two: a plain
        name under the server's --slot-save-path, which it needs for them): its answer
        (n_saved, n_restored, n_erased) with ok True, or ok False and why."""
        r = call("POST", f"/slots/{slot}", params={"action": action},
                 json={"filename": filename} if filename else {})
        if r.status_code != 200:
            try:
                why = r.json().get("error", {}).get("message") or r.text
            except ValueError:
                why = r.text
            return {"ok": False, "error": f"HTTP {r.status_code}: {str(why)[:200]}"}
        data = r.json()
        return {k: v for k, v in data.items() if k in ("n_saved", "n_restored", "n_erased")} | {"ok": True}

    def broken_slot_file(self, data: bytes) -> bytes | None:
        """Its first value layer's type made one no cache has (slotfile.py): the restore
        writes every layer's keys, then fails."""
        from kvdiag.engines.llamacpp.slotfile import break_values

        return break_values(data)

    def isolation_works(self, call: Call, model: str) -> tuple[bool, str]:
        """A one-token request with cache_prompt: false, sent twice: the second must report
        no cached token (a server that ignored the flag would serve it from its slot). Its
        prompt is raw text no chat prompt starts with, so what it leaves in a slot is no
        source of hits for the over-hit oracle to miss."""
        body = {"model": model, "prompt": " kvdiag: isolation check", "max_tokens": 1,
                "cache_prompt": False}
        for _ in range(2):
            r = call("POST", "/v1/completions", json=body)
            if r.status_code != 200:
                return False, f"HTTP {r.status_code}: {r.text[:160]}"
        cached = ((r.json().get("usage") or {}).get("prompt_tokens_details") or {}).get("cached_tokens")
        if cached:
            return False, f"a cache_prompt: false request reported {cached} cached tokens"
        return True, ""

    def reset(self, call: Call) -> bool:
        return False

    def counters(self, samples: dict[str, float]) -> dict[str, float]:
        if PROMPT in samples:
            samples[QUERIED] = samples[PROMPT] + samples.get(CACHED, 0.0)
        return samples


LLAMACPP = LlamacppProtocol()
