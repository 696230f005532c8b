"""What SGLang speaks beyond OpenAI's API that vLLM does not: how a request names a LoRA
adapter. SGLang lists each adapter in /v1/models (with `parent`, the base model), as vLLM
does, but a request whose `model` is that name is served by the base model, silently
(sglang 0.5.23, serving_base._resolve_lora_path: only `BASE:ADAPTER` or a `lora_path`
field selects one). So a request for adapter NAME goes out as `model` = the base, with
`lora_path` = NAME; the rest is OpenAIProtocol's (kvdiag.engines.protocol).
"""

from __future__ import annotations

from kvdiag.engines.protocol import Call, OpenAIProtocol


class SglangProtocol(OpenAIProtocol):
    name = "sglang"

    def adapters(self, call: Call) -> dict[str, dict]:
        """Every adapter /v1/models lists (an entry with a parent) -> {"lora_path": its name}."""
        r = call("GET", "/v1/models")
        if r.status_code != 200:
            return {}
        return {m["id"]: {"lora_path": m["id"]} for m in r.json().get("data", [])
                if isinstance(m, dict) and m.get("parent") and m.get("id")}


SGLANG = SglangProtocol()
