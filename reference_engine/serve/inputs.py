"""Request bodies in, token ids out, for the HTTP server: strict JSON parsing and tokenization
that neither blocks the event loop nor spends CPU on a prompt that cannot fit.

- `parse_body` parses with pydantic-core's JSON parser, which rejects what the standard
  library lets through: lone surrogates (`"\\ud800"`, raw bytes ED A0 80), invalid UTF-8 and
  nesting deeper than 200 levels. Every failure is a `RequestValidationError`, which the
  server renders as an OpenAI-shaped 400.
- `encode_text` tokenizes through `encode_batch`, which releases the GIL (`encode` holds it:
  a 3.6 MB prompt froze every thread for 17 s), and stops early once a prefix of the text
  already holds more tokens than `max_model_len`, so a 20 MB prompt costs milliseconds.
- `off_loop` runs such work in the default thread pool.
"""

from __future__ import annotations

import asyncio
import functools

from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError

from reference_engine.errors import PromptTooLongError

# A prefix is tokenized first when the text is longer than this many characters; each
# further try grows the prefix 4x, so the total work is at most 4/3 of one full pass.
_FIRST_PREFIX_CHARS = 1 << 16
# Tokens a cut in the middle of a word may add to a prefix's count: a prefix must exceed
# max_model_len by this much before the whole text is judged too long.
_CUT_SLACK = 64


async def off_loop(fn, *args, **kwargs):
    """Run fn(*args, **kwargs) in the event loop's default thread pool."""
    return await asyncio.get_running_loop().run_in_executor(None, functools.partial(fn, *args, **kwargs))


def parse_body(model: type[BaseModel], body: bytes) -> BaseModel:
    """Validate a JSON body against `model`; raise RequestValidationError on any fault."""
    try:
        return model.model_validate_json(body)
    except ValidationError as e:
        errors = e.errors(include_url=False, include_context=False, include_input=False)
        raise RequestValidationError(errors) from None


def _count(backend, text: str, add_special_tokens: bool) -> list[int]:
    return backend.encode_batch([text], add_special_tokens=add_special_tokens)[0].ids


def _cut(text: str, n: int) -> str:
    """text[:n], moved back to the last space within 256 characters so no word is split."""
    space = text.rfind(" ", max(0, n - 256), n)
    return text[:space] if space > 0 else text[:n]


def encode_text(tok, text: str, max_model_len: int, add_special_tokens: bool = True) -> list[int]:
    """Token ids of text (tok: reference_engine.tokenizer.Tokenizer). Raises
    PromptTooLongError without tokenizing all of text when a prefix already exceeds
    max_model_len by more than a word cut can explain."""
    n = _FIRST_PREFIX_CHARS
    while n < len(text):
        count = len(_count(tok.backend, _cut(text, n), add_special_tokens))
        if count > max_model_len + _CUT_SLACK:
            raise PromptTooLongError(
                f"the prompt holds more than {count - _CUT_SLACK} tokens ({len(text)} characters), "
                f"which exceeds max_model_len {max_model_len}")
        n *= 4
    return _count(tok.backend, text, add_special_tokens)


def encode_chat(tok, messages: list[dict], add_generation_prompt: bool, max_model_len: int) -> list[int]:
    """The chat template rendered, then encode_text'ed without special tokens (as HF does)."""
    return encode_text(tok, tok.render_chat(messages, add_generation_prompt), max_model_len,
                       add_special_tokens=False)
