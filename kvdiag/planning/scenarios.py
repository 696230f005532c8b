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

import dataclasses
import random
from collections.abc import Sequence
from dataclasses import dataclass

from kvdiag.errors import KvdiagError
from reference_engine.util import cdiv

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
            total += cdiv(computed, bs) - shared
        return total

    def crossings(self, boundary: int) -> list[tuple[int, int, int]]:
        """(session, round, prompt before) where a history crosses `boundary` into round+1."""
        out = []
        for s, p in enumerate(self.prompt_lengths):
            for r in range(len(p) - 1):
                if p[r] < boundary <= p[r + 1]:
                    out.append((s, r + 1, p[r]))
        return out


EXTRA = (0, 2, 4, 7, 11, 17, 26, 40, 55)  # uneven growth beyond the shortest user turn


class LengthPlanner:
    """Chooses each round's prompt length for one session under a condition, once the
    round's shortest feasible length and its answer length are known (a session builder
    calls it round by round). Deterministic by (seed, session)."""

    def __init__(self, condition: str, session_index: int, *, seed: int = 0, block_size: int = 16,
                 boundary: int = 4096, start_range: tuple[int, int] = (3780, 4040),
                 min_turn: int = 0) -> None:
        if condition not in CONDITIONS:
            raise KvdiagError(f"unknown condition {condition!r} (known: {', '.join(CONDITIONS)})")
        self.condition, self.bs, self.boundary = condition, block_size, boundary
        self.rng = random.Random(f"lengths:{seed}:{session_index}")
        self.start_range = start_range
        # Every other session takes the reported jump (one short of the boundary, then past it).
        self.jumps = session_index % 2 == 0
        self.jumped = False
        self.prev: int | None = None
        self.min_turn = min_turn  # the fewest tokens a later round's prompt adds

    def limit(self, r: int) -> int | None:
        """The longest prompt round r may have, before its request is chosen."""
        return self.prev + self.bs if self.condition == "uniform" and r > 0 else None

    def __call__(self, r: int, min_len: int, answer: int) -> int:
        if r and self.min_turn:
            min_len = max(min_len, self.prev + self.min_turn)
        target = getattr(self, "_" + self.condition.replace("-", "_"), self._trigger)(r, min_len, answer)
        if target < min_len:
            raise KvdiagError(f"{self.condition}: round {r} needs at least {min_len} tokens, "
                             f"the schedule allows {target}")
        self.prev = target
        return target

    def _trigger(self, r: int, min_len: int, answer: int) -> int:
        bs, edge = self.bs, self.boundary - 1
        if r == 0:
            lo, hi = self.start_range
            back = self.min_turn  # long turns: start further back, so a turn can land on the edge
            start = (self.rng.randint(edge - 220 - back, edge - 40 - back) if self.jumps
                     else self.rng.randint(lo, hi))
            return max(start, min_len)
        target = min_len + self.rng.choice(EXTRA)
        if self.jumps and not self.jumped:
            if self.prev == edge:  # 4095 -> 4112, or the next boundary that fits
                self.jumped = True
                return max(self.boundary + bs, cdiv(min_len, bs) * bs)
            if min_len <= edge and (target >= edge or edge < target + self.min_turn) and answer + 8 <= bs:
                return edge
        return target

    _no_caching = _big_pool = _trigger

    def _no_jump(self, r: int, min_len: int, answer: int) -> int:
        base = self.rng.randint(*self.start_range) if r == 0 else min_len + self.bs * self.rng.choice((0, 0, 1, 2, 3))
        base = max(base, min_len)
        return base + (-(base + answer - 1)) % self.bs  # the history ends on a boundary

    def _uniform(self, r: int, min_len: int, answer: int) -> int:
        if r == 0:  # one token short of a boundary, reaching 4095 within the run
            first = self.boundary - 1 - self.bs * self.rng.randint(1, 10)
            return first + self.bs * max(0, cdiv(min_len - first, self.bs))
        return self.prev + self.bs


def finish_schedule(condition: str, prompt_lengths, answer_lengths, *, block_size: int = 16,
                    shared_prefix: int, pressure_round: int = 3, max_think: int = 40,
                    seed: int = 0, headroom_blocks: int | None = None) -> Schedule:
    """Size the pool and draw think times for sessions whose lengths are known."""
    prompts = tuple(tuple(p) for p in prompt_lengths)
    answers = tuple(tuple(a) for a in answer_lengths)
    think_rng = random.Random(f"think:{seed}")
    think = tuple(tuple(0 if r == 0 else think_rng.randint(0, max_think) for r in range(len(a)))
                  for a in answers)
    base = Schedule(condition, block_size, shared_prefix, prompts, answers, 0,
                    enable_prefix_caching=condition != "no-caching", think_steps=think)
    headroom = headroom_blocks if headroom_blocks is not None else 2 * len(prompts)
    last = base.num_rounds - 1
    fit = last if condition == "big-pool" else min(pressure_round, last)
    num_blocks = base.footprint(fit) + headroom
    if condition == "big-pool":  # also every partial and decode block ever replaced: nothing recycled
        num_blocks += 2 * len(prompts) * base.num_rounds
    return dataclasses.replace(base, num_blocks=num_blocks)


def make_schedule(condition: str, answer_lengths: Sequence[Sequence[int]], *, min_user: int,
                  seed: int = 0, block_size: int = 16, shared_prefix: int = 3072,
                  boundary: int = 4096, start_range: tuple[int, int] = (3780, 4040),
                  pressure_round: int = 3, headroom_blocks: int | None = None,
                  max_think: int = 40) -> Schedule:
    """Token-level schedule for known answer lengths (stop token included): a user turn adds
    at least `min_user` tokens to the history."""
    prompts = []
    for s, answers in enumerate(answer_lengths):
        plan = LengthPlanner(condition, s, seed=seed, block_size=block_size, boundary=boundary,
                             start_range=start_range)
        lens: list[int] = []
        for r, a in enumerate(answers):
            min_len = lens[-1] + answers[r - 1] + min_user if r else shared_prefix + min_user
            lens.append(plan(r, min_len, a))
        prompts.append(lens)
    return finish_schedule(condition, prompts, answer_lengths, block_size=block_size,
                           shared_prefix=shared_prefix, pressure_round=pressure_round,
                           max_think=max_think, seed=seed, headroom_blocks=headroom_blocks)
