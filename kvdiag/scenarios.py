"""Trigger schedules: per session and round, how long the prompt (the whole history) is,
and the ablations that each remove one condition of the trigger.

The trigger, as reported: prefix caching on; a session history that jumps across a block
boundary (4095 -> 4112 with 16-token blocks); uneven per-turn growth; and enough sessions
that freed blocks get recycled. In block terms (bs = 16):

    round r prompt   4095 = 255 full blocks + 15 tokens      ..|###############.|
    answer (3 tok)   K/V computed to 4097: block 255 fills, block 256 partial
    round r+1        4112: the partial block is recomputed and a new one appended
                     in the same step -- the jump path

Ablations (each keeps everything else of the trigger):
    no-caching   prefix caching off
    no-jump      every history ends on a block boundary, so no turn recomputes a
                 partial block (growth stays uneven)
    uniform      every turn grows the history by exactly one block, ending one token
                 short of a boundary (4095 -> 4111 -> 4127 ...)
    big-pool     a pool that holds every session's whole history: nothing recycled

The pool of every schedule except big-pool holds the sessions' histories as they stand
after `pressure_round`: recycling starts there and grows round by round. Sessions think
for a random number of engine steps between turns (as chat users do), so they come back
in shuffled order; with a fixed order, LRU would evict exactly the session due next and
the pool would thrash into a total miss instead of a steady, partial recycling.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

CONDITIONS = ("trigger", "no-caching", "no-jump", "uniform", "big-pool")


@dataclass(frozen=True)
class Schedule:
    name: str
    block_size: int
    shared_prefix: int  # tokens every session's prompt starts with (a shared system prompt)
    prompt_lengths: tuple[tuple[int, ...], ...]  # [session][round]
    answer_lengths: tuple[tuple[int, ...], ...]  # [session][round], generated tokens incl. stop
    num_blocks: int
    enable_prefix_caching: bool = True
    think_steps: tuple[tuple[int, ...], ...] = ()  # [session][round]: engine steps before sending

    def think(self, session: int, round_index: int) -> int:
        steps = self.think_steps[session] if self.think_steps else ()
        return steps[round_index] if round_index < len(steps) else 0

    @property
    def num_sessions(self) -> int:
        return len(self.prompt_lengths)

    @property
    def num_rounds(self) -> int:
        return len(self.prompt_lengths[0])

    def footprint(self, round_index: int) -> int:
        """Blocks that all sessions' histories occupy after `round_index` (shared prefix once)."""
        bs = self.block_size
        shared = self.shared_prefix // bs
        total = shared
        for p, a in zip(self.prompt_lengths, self.answer_lengths):
            computed = p[round_index] + a[round_index] - 1
            total += -(-computed // bs) - shared
        return total

    def crossings(self, boundary: int) -> list[tuple[int, int, int]]:
        """(session, round, prompt before) where a history crosses `boundary` into round+1."""
        out = []
        for s, p in enumerate(self.prompt_lengths):
            for r in range(len(p) - 1):
                if p[r] < boundary <= p[r + 1]:
                    out.append((s, r + 1, p[r]))
        return out


def _growths(rng: random.Random, n: int, min_user: int, answers: Sequence[int]) -> list[int]:
    """Uneven user-turn lengths (chat template included): mostly short, sometimes long."""
    choices = [0, 2, 4, 7, 11, 17, 26, 40, 55]
    return [min_user + rng.choice(choices) for _ in range(n)]


def make_schedule(condition: str, answer_lengths: Sequence[Sequence[int]], *, min_user: int,
                  seed: int = 0, block_size: int = 16, shared_prefix: int = 3072,
                  boundary: int = 4096, start_range: tuple[int, int] = (3780, 4040),
                  pressure_round: int = 3, headroom_blocks: int | None = None,
                  max_think: int = 40) -> Schedule:
    """Prompt lengths for every session and round under `condition` (see module doc).

    answer_lengths[s][r]: tokens the model generates in round r (stop token included);
    min_user: the fewest tokens a user turn adds to the history (template + question).
    """
    if condition not in CONDITIONS:
        raise ValueError(f"unknown condition {condition!r} (known: {', '.join(CONDITIONS)})")
    rng = random.Random(seed)
    bs = block_size
    prompts = []
    for s, answers in enumerate(answer_lengths):
        rounds = len(answers)
        if condition == "uniform":
            if max(answers) + min_user > bs:
                raise ValueError(f"uniform: session {s} answers up to {max(answers)} tokens; "
                                 f"a one-block turn holds at most {bs - min_user}")
            first = (rng.randint(*start_range) // bs) * bs + bs - 1
            prompts.append(tuple(first + bs * r for r in range(rounds)))
            continue
        if condition == "no-jump":
            first = rng.randint(*start_range)
            first += (-(first + answers[0] - 1)) % bs  # history end lands on a boundary
            lens = [first]
            for r in range(1, rounds):
                end = lens[-1] + answers[r - 1]  # next history starts here (stop token included)
                nxt = end + min_user + bs * rng.choice([0, 0, 1, 2, 3])
                nxt += (-(nxt + answers[r] - 1)) % bs
                lens.append(nxt)
            prompts.append(tuple(lens))
            continue
        growth = _growths(rng, rounds - 1, min_user, answers)
        lens = [0]
        for r in range(1, rounds):
            lens.append(lens[-1] + answers[r - 1] + growth[r - 1])
        if s % 2 == 0:
            # the reported jump: one token short of the boundary, then past it by a block
            j = 1 + (s // 2) % max(1, rounds - 2)
            need = boundary + bs - (boundary - 1) - answers[j]  # user turn for 4095 -> 4112
            if need >= min_user:
                delta = lens[j + 1] - lens[j] - answers[j]
                lens = lens[: j + 1] + [x - delta + need for x in lens[j + 1:]]
            offset = boundary - 1 - lens[j]
        else:
            offset = rng.randint(*start_range)
        prompts.append(tuple(offset + x for x in lens))
    answers_t = tuple(tuple(a) for a in answer_lengths)
    think_rng = random.Random(seed + 1)
    think = tuple(tuple(0 if r == 0 else think_rng.randint(0, max_think) for r in range(len(a)))
                  for a in answer_lengths)
    base = Schedule(condition, bs, shared_prefix, tuple(prompts), answers_t, 0,
                    enable_prefix_caching=condition != "no-caching", think_steps=think)
    headroom = headroom_blocks if headroom_blocks is not None else 2 * len(prompts)
    last = base.num_rounds - 1
    fit = last if condition == "big-pool" else min(pressure_round, last)
    num_blocks = base.footprint(fit) + headroom
    if condition == "big-pool":  # also every partial and decode block ever replaced: nothing recycled
        num_blocks += 2 * len(prompts) * base.num_rounds
    if min(min(p) for p in prompts) <= shared_prefix:
        raise ValueError(f"{condition}: a prompt is not longer than the shared prefix ({shared_prefix})")
    return Schedule(condition, bs, shared_prefix, tuple(prompts), answers_t, num_blocks,
                    base.enable_prefix_caching, think)
