"""Token-level multi-turn runs for engine tests: random content, histories of the exact
lengths a kvdiag schedule asks for, teacher-forced with the contiguous reference's answers."""

from __future__ import annotations

import random

from reference_engine.config import EngineConfig
from reference_engine.contiguous import ContiguousEngine
from reference_engine.engine import LLMEngine
from reference_engine.sessions import run_sessions


def reference_turns(model_dir, schedule, vocab: int = 128, seed: int = 0):
    rng = random.Random(seed)
    shared = [rng.randrange(2, vocab) for _ in range(schedule.shared_prefix)]

    def next_prompt(s, r, turns):
        if r >= schedule.num_rounds:
            return None
        length = schedule.prompt_lengths[s][r]
        if r == 0:
            return shared + [rng.randrange(2, vocab) for _ in range(length - len(shared))]
        prev = turns[-1].token_ids
        return prev + [rng.randrange(2, vocab) for _ in range(length - len(prev))]

    engine = ContiguousEngine(model_dir, EngineConfig())
    return run_sessions(engine, list(range(schedule.num_sessions)), next_prompt,
                        max_tokens=lambda s, r: schedule.answer_lengths[s][r], stop_ids=())


def paged_turns(model_dir, schedule, reference, allocator: str, on_step=None, on_engine=None,
                **config):
    engine = LLMEngine(model_dir, EngineConfig(
        num_blocks=schedule.num_blocks, max_num_seqs=16, allocator=allocator,
        enable_prefix_caching=schedule.enable_prefix_caching, **config))
    if on_engine is not None:  # before the first step (a watcher of every step)
        on_engine(engine)

    def next_prompt(s, r, _turns):
        return reference[s][r].prompt_ids if r < schedule.num_rounds else None

    turns = run_sessions(engine, list(range(schedule.num_sessions)), next_prompt,
                         max_tokens=lambda s, r: schedule.answer_lengths[s][r],
                         think_steps=schedule.think, stop_ids=(),
                         on_step=(lambda: on_step(engine)) if on_step else None)
    return engine, turns


def answer_lengths(num_sessions: int, num_rounds: int, seed: int = 1, long_every: int = 4,
                   long: int = 14) -> list[list[int]]:
    rng = random.Random(seed)
    return [[long if long_every and r % long_every == long_every - 1 else rng.choice([2, 3, 4])
             for r in range(num_rounds)] for _ in range(num_sessions)]
