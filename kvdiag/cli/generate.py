"""kvdiag generate: greedy generation with the reference engine on a local model."""

from __future__ import annotations

from typing import Annotated

import typer

from kvdiag.cli.common import (
    DEFAULT_MODEL,
    AllocatorOpt,
    DeviceOpt,
    DtypeOpt,
    JsonOpt,
    ModelOpt,
    Output,
    enable_engine_log,
    handle_errors,
)
from kvdiag.errors import KvdiagError


def _parse_ids(text: str) -> list[int]:
    try:
        return [int(t) for t in text.replace(" ", "").split(",") if t]
    except ValueError:
        raise KvdiagError(f"--prompt-ids must be comma-separated integers, got {text!r}") from None


@handle_errors
def generate(
    model: ModelOpt = DEFAULT_MODEL,
    prompt: Annotated[str | None, typer.Option("--prompt", help="Prompt text (tokenized as is, "
                                               "special tokens added as the tokenizer does).")] = None,
    prompt_ids: Annotated[str | None, typer.Option("--prompt-ids", help="Prompt token ids, e.g. 1,2,3.")] = None,
    chat: Annotated[bool, typer.Option("--chat", help="Wrap --prompt as one user message in the "
                                       "model's chat template.")] = False,
    max_tokens: Annotated[int, typer.Option("--max-tokens", min=1, help="Tokens to generate at most.")] = 64,
    allocator: AllocatorOpt = "prefix-cache",
    device: DeviceOpt = "cpu",
    dtype: DtypeOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Greedy generation with the reference engine on any supported local HF model directory.

    With --json prints {"token_ids": [...], "text": "..."} for the generated tokens only.
    --prompt-ids needs no tokenizer: on a model directory without one, "text" is null.
    The engine's start-up lines go to stderr.

    Example: kvdiag generate --model fixtures/canary --prompt-ids 1,2,3 --json
    """
    from reference_engine.engine import complete

    out = Output(as_json)
    if (prompt is None) == (prompt_ids is None):
        raise KvdiagError("give exactly one of --prompt or --prompt-ids")
    given = prompt if prompt_ids is None else _parse_ids(prompt_ids)
    enable_engine_log()
    ids, text = complete(model, given, chat=chat, max_tokens=max_tokens, allocator=allocator,
                         device=device, dtype=dtype)
    out.show({"token_ids": ids, "text": text}, " ".join(map(str, ids)) if text is None else text)
