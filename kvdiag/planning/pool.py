"""The KV pool and context a server kvdiag starts gets for a suite's case (vLLM's and
SGLang's launchers take them; kvdiag.engines.local passes them): planned here, with the
model's own tokenizer, once, before any server starts.

The pool holds as many tokens as the suite's own schedule needs (the size at which its
sessions recycle freed blocks; the probe adds pressure beyond it); the context covers the
longest request with two blocks to spare (the probe moves jumps to the server's block
boundaries), within the model's."""

from __future__ import annotations

import json
from pathlib import Path

from kvdiag.errors import KvdiagError
from reference_engine.util import cdiv


def model_context(model_dir: str | Path) -> int | None:
    """The model's context (max_position_embeddings in config.json), or None when it names
    none: an engine refuses a max_model_len beyond it."""
    return json.loads((Path(model_dir) / "config.json").read_text()).get("max_position_embeddings")


def server_pool(suite, case, model_dir: Path, block_size: int) -> dict:
    """{"num_blocks", "max_model_len"} for a server of `block_size`-token blocks serving
    `model_dir`. KvdiagError, before any server starts, when the case does not fit the model."""
    from kvdiag.planning.plan import plan_case
    from reference_engine.tokenizer import Tokenizer

    schedule = plan_case(suite, case, Tokenizer.from_dir(model_dir)).schedule
    pool = cdiv(schedule.num_blocks * suite.block_size, block_size)
    longest = max(max(p) for p in schedule.prompt_lengths) + case.max_tokens
    context = model_context(model_dir)
    if context and longest > context:
        raise KvdiagError(f"{suite.name}/{case.name}: its longest request ({longest} tokens) exceeds "
                          f"{Path(model_dir).name}'s context ({context})")
    spare = cdiv(longest + 2 * block_size, block_size) * block_size
    return {"num_blocks": pool, "max_model_len": min(spare, context or spare)}
