"""What SGLang speaks beyond OpenAI's API that vLLM does not: how a request names a LoRA
adapter. SGLang lists each adapter in /v1/models (with `parent`, the base model), as vLLM
does, but a request whose `model` is that name is served by the base model, silently
(sglang 0.5.23, serving_base._resolve_lora_path: only `BASE:ADAPTER` or a `lora_path`
field selects one). So a request for adapter NAME goes out as `model` = the base, with
`lora_path` = NAME.

And how a request is made to decode all its tokens. SGLang's scheduler takes `ignore_eos`
as "fixed length" and reserves the request's whole remaining decode when it admits others
(schedule_policy.PrefillAdder._get_running_request_total_token_offset: ratio 1.0), so a
flood of such requests is admitted only as far as every one of them can finish: SGLang never
retracts (kvdiag's probe floods, 0.5.23, on 2 CPU cores: 0 retractions in every run). A
chat request is reserved at the scheduler's new-token ratio instead, the estimate that
real traffic overruns. So the probe asks SGLang with `min_tokens` = `max_tokens`: the same
decode, EOS suppressed until the last token, admitted as real traffic is. The rest is
OpenAIProtocol's (kvdiag.engines.protocol).
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

    def decode_all(self, body: dict) -> None:
        """`min_tokens` = `max_tokens`, not `ignore_eos` (the module's docstring says why)."""
        body["min_tokens"] = body["max_tokens"]


SGLANG = SglangProtocol()
