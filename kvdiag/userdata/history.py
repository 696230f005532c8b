"""Histories for a sessions file that has no answers: where a conversation's file has no
assistant turn after one of its user turns, the turn is filled with what the server answers
in isolation (a fresh cache_salt per request, greedy; a plain request where the server
takes no salt), round after round, before anything is
planned. The shared and the isolated run then send the same prompt, as they do for a file
with its own answers: the history never depends on what the shared run answered.

Why before planning and not during the run: every phase of the probe (pressure, twins,
lifecycle, the over-hit oracle) plans from prompt token ids known in advance, so a history
that waited for the isolated run's answers would leave the plan unknowable. Answering first
costs one greedy request per missing turn, conversations in parallel.

Without a server to answer (a plan made with a local tokenizer) nothing is invented: user
turns follow one another, and the plan's description says so.
"""

from __future__ import annotations

import asyncio
import dataclasses

from kvdiag.userdata.formats import Conversation

CONCURRENCY = 8  # conversations answered at once (rounds of one conversation go in order)
FILE = "the file's own turns"
ANSWERED = "the file's own turns; {n} missing answers filled by the server in isolation"
UNFILLED = "the file's own turns; {n} missing answers left out (no server to answer them)"


def missing(conv: Conversation, rounds: int) -> list[int]:
    """The user turns among the first `rounds` but the last that no assistant turn follows
    (the last round's answer is what the probe measures, never history)."""
    turns = conv.user_turns[:rounds]
    msgs = conv.messages
    return [end for end in turns[:-1] if msgs[end + 1]["role"] != "assistant"]


def answering_endpoint(tokenizer):
    """The Endpoint the tokenizer counts with (kvdiag.runners.live.tokenizer.RemoteTokenizer),
    or None for a local tokenizer."""
    inner = getattr(tokenizer, "tokenizer", tokenizer)
    return getattr(inner, "endpoint", None)


def fill(convs: list[Conversation], rounds: int, max_tokens: int, endpoint) -> tuple[list[Conversation], int]:
    """(`convs` with every missing answer filled by `endpoint` in isolation, answers filled).
    With no endpoint, `convs` as they are and 0."""
    if endpoint is None or not any(missing(c, rounds) for c in convs):
        return convs, 0
    salted = endpoint.salt_supported()[0]

    async def answer_all() -> list[tuple[Conversation, int]]:
        gate = asyncio.Semaphore(CONCURRENCY)

        async def one(conv: Conversation) -> tuple[Conversation, int]:
            async with gate:
                return await _answer(conv, rounds, max_tokens, endpoint, salted)

        try:
            return await asyncio.gather(*(one(c) for c in convs))
        finally:
            await endpoint.new_loop()

    done = asyncio.run(answer_all())
    return [c for c, _ in done], sum(n for _, n in done)


async def _answer(conv: Conversation, rounds: int, max_tokens: int, endpoint,
                  salted: bool) -> tuple[Conversation, int]:
    """`conv` with its missing answers, asked in order (each one's prompt holds the answers
    filled before it; each filled answer moves the later turns one place on)."""
    msgs, gaps = list(conv.messages), missing(conv, rounds)
    for shift, end in enumerate(gaps):
        at = end + shift
        result = await endpoint.chat([dict(m) for m in msgs[:at + 1]], max_tokens, isolated=salted)
        msgs.insert(at + 1, {"role": "assistant", "content": result.text})
    return dataclasses.replace(conv, messages=tuple(msgs)), len(gaps)


def described(filled: int, unfilled: int) -> str:
    """The plan's description of its histories (summary.json's sessions_file.history)."""
    if filled:
        return ANSWERED.format(n=filled)
    return UNFILLED.format(n=unfilled) if unfilled else FILE
