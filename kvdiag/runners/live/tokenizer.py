"""The endpoint's own tokenizer and chat template, behind the interface plan_case uses."""

from __future__ import annotations

from kvdiag.errors import EndpointError
from kvdiag.runners.live.endpoint import Endpoint


class RemoteTokenizer:
    """Counts come from /tokenize; a server without it (HTTP 404), or `use_usage=True`, counts
    by usage.prompt_tokens of one-token requests instead (token ids are then placeholders:
    only the counts are known)."""

    def __init__(self, endpoint: Endpoint, use_usage: bool = False) -> None:
        self.endpoint, self.use_usage = endpoint, use_usage

    def encode_chat(self, messages: list[dict], add_generation_prompt: bool = True) -> list[int]:
        if not self.use_usage:
            try:
                return self.endpoint.tokenize_chat(messages, add_generation_prompt)
            except EndpointError:
                if self.endpoint.has_tokenize:
                    raise
                self.use_usage = True
        return [0] * self.endpoint.count_by_usage(messages=messages)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        if not self.use_usage:
            return self.endpoint.tokenize(text, add_special_tokens)
        # a completion prompt carries the tokenizer's special tokens, if any: count the text
        # after a one-word anchor and subtract the anchor alone
        anchor = self.endpoint.count_by_usage(prompt="x")
        return [0] * (self.endpoint.count_by_usage(prompt="x" + text) - anchor)
