"""OpenAI-compatible request bodies (the subset the reference server implements), validated
by pydantic: wrong types, unknown roles, bad numbers become 400s with an OpenAI-style body."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, field_validator


class _Base(BaseModel):
    model_config = ConfigDict(extra="ignore")


class ChatMessage(_Base):
    role: Literal["system", "user", "assistant"]
    content: StrictStr


class StreamOptions(_Base):
    include_usage: StrictBool = False  # a last chunk with no choices and the usage, as vLLM's


class _Sampling(_Base):
    model: StrictStr
    max_tokens: StrictInt | None = None
    temperature: float | None = None  # accepted; the engine decodes greedily
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    cache_salt: StrictStr | None = None
    n: StrictInt = 1
    ignore_eos: StrictBool = False  # vLLM's and SGLang's: decode all max_tokens past any stop token

    @field_validator("max_tokens")
    @classmethod
    def _positive(cls, v):
        if v is not None and v < 1:
            raise ValueError("max_tokens must be at least 1")
        return v

    @field_validator("cache_salt")
    @classmethod
    def _salt(cls, v):
        if v is not None and not v:
            raise ValueError("cache_salt must be a non-empty string")
        return v

    @field_validator("n")
    @classmethod
    def _one(cls, v):
        if v != 1:
            raise ValueError("only n = 1 is supported")
        return v


class CompletionRequest(_Sampling):
    prompt: StrictStr | list[StrictInt]
    logprobs: StrictInt | None = Field(default=None, ge=0, le=20)
    echo: StrictBool = False


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: StrictInt | None = None
    logprobs: StrictBool = False
    top_logprobs: StrictInt | None = Field(default=None, ge=0, le=20)
    add_generation_prompt: StrictBool = True


class TokenizeRequest(_Base):
    model: StrictStr | None = None
    prompt: StrictStr | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: StrictBool = True
    add_generation_prompt: StrictBool = True


class DetokenizeRequest(_Base):
    model: StrictStr | None = None
    tokens: list[StrictInt]
