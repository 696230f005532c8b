"""What the canary's HF-side tests share: a session of chat prompts of given lengths, its
token ids, and greedy answers read from a transformers KV cache, with one block's K/V taken
from another cache (the corruption a recycled block makes)."""

from __future__ import annotations

import copy

from kvdiag.facts import SessionPlan, build_session, make_knowledge_base

BLOCK = 16


def chat_ids(tok, messages) -> list[int]:
    return tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                   return_dict=False)


def session(tok, i: int, lengths: list[int], first_round_facts: int = 8):
    """Session `t{i}` of the canary style whose rounds' prompts have exactly `lengths` tokens."""
    kb = make_knowledge_base(("financial", "legal", "clinical")[i % 3], 60, seed=100 + i)
    return build_session(SessionPlan(kb, style="canary", seed=100 + i, prompt_lengths=lengths,
                                     count_tokens=lambda m: len(chat_ids(tok, m)), session_id=f"t{i}",
                                     first_round_facts=first_round_facts))


def with_block_from(cache, donor, block: int):
    """A copy of `cache` whose K/V in block `block` (every layer) are `donor`'s."""
    out, sl = copy.deepcopy(cache), slice(block * BLOCK, (block + 1) * BLOCK)
    for layer, other in zip(out.layers, donor.layers):
        layer.keys[:, :, sl] = other.keys[:, :, sl]
        layer.values[:, :, sl] = other.values[:, :, sl]
    return out


def greedy(model, cache, suffix: list[int], end_ids: set[int], max_new: int = 10) -> list[int]:
    """Greedy tokens after `suffix`, read on a copy of `cache`, up to an end id."""
    import torch

    cache, out, x = copy.deepcopy(cache), [], torch.tensor([suffix])
    start = cache.get_seq_length()
    with torch.no_grad():
        for _ in range(max_new):
            pos = torch.arange(start, start + x.shape[1])[None]
            t = int(model(x, past_key_values=cache, position_ids=pos).logits[0, -1].argmax())
            start += x.shape[1]
            if t in end_ids:
                break
            out.append(t)
            x = torch.tensor([[t]])
    return out
