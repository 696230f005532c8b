"""Multi-turn sessions on either engine: each session submits its next turn when its
previous one finishes, after a think time counted in engine steps (a closed loop, like chat
users), so sessions at different rounds share the batch and the block pool."""

from __future__ import annotations

import heapq
from collections.abc import Callable, Hashable
from dataclasses import dataclass

from reference_engine.sequence import Sequence

# next_prompt(session, round_index, finished turns of this session) -> prompt ids, or None when done
NextPrompt = Callable[[Hashable, int, list[Sequence]], "list[int] | None"]


@dataclass
class TurnRequest:
    session: Hashable
    round: int  # 0-based


def fixed_prompts(prompts: dict[Hashable, list[list[int]]]) -> NextPrompt:
    """Teacher-forced sessions: every round's prompt is known in advance."""

    def next_prompt(session, round_index, _turns):
        rounds = prompts[session]
        return rounds[round_index] if round_index < len(rounds) else None

    return next_prompt


def run_sessions(engine, sessions: list[Hashable], next_prompt: NextPrompt, *,
                 max_tokens: int | Callable[[Hashable, int], int],
                 think_steps: Callable[[Hashable, int], int] | None = None,
                 on_step: Callable[[], None] | None = None,
                 on_finish: Callable[[Sequence], None] | None = None,
                 **request_kw) -> dict[Hashable, list[Sequence]]:
    """Drive every session to its end on `engine` (LLMEngine or ContiguousEngine).

    max_tokens: a number, or max_tokens(session, round). think_steps(session, round): engine
    steps a session waits before sending that round (0 if None). Extra keyword arguments go
    to add_request (cache_salt, stop_ids, ...). Returns each session's turns in round order.
    """
    turns: dict[Hashable, list[Sequence]] = {s: [] for s in sessions}
    pending: list[tuple[int, int, int]] = []  # (ready step, order, session index)
    index = {s: i for i, s in enumerate(sessions)}
    step = 0

    def schedule(session, round_index: int) -> None:
        wait = think_steps(session, round_index) if think_steps else 0
        heapq.heappush(pending, (step + wait, len(turns[session]) * len(sessions) + index[session],
                                 index[session]))

    def submit(session) -> None:
        round_index = len(turns[session])
        prompt = next_prompt(session, round_index, turns[session])
        if prompt is None:
            return
        limit = max_tokens(session, round_index) if callable(max_tokens) else max_tokens
        engine.add_request(prompt, limit, tag=TurnRequest(session, round_index), session=session,
                           **request_kw)

    for s in sessions:
        schedule(s, 0)
    while pending or engine.has_unfinished():
        if pending and not engine.has_unfinished():
            step = max(step, pending[0][0])  # nothing running: skip the idle time
        while pending and pending[0][0] <= step:
            submit(sessions[heapq.heappop(pending)[2]])
        if not engine.has_unfinished():
            continue
        for seq in engine.step():
            tag: TurnRequest = seq.tag
            turns[tag.session].append(seq)
            if on_finish:
                on_finish(seq)
            schedule(tag.session, tag.round + 1)
        step += 1
        if on_step:
            on_step()
    return turns
