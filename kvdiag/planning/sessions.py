"""A sessions file planned into the CasePlan that generated sessions make, so that every phase
of the probe (shared, isolated, pressure, twins, noise floor, prompt logprobs, the
differential phase) runs on it unchanged.

Replay: round n of a conversation sends everything the file has before its n-th user turn
(system prompt, user turns, the file's own assistant turns, as written) and that user turn.
Where the file has no assistant turn after a user turn, the server answers it first, in
isolation (kvdiag.userdata.history), and that answer is the history from then on. The shared
and the isolated run send the same prompt: the history never depends on what the shared run
answered. Without a server to ask (a local tokenizer), user turns follow one another.

Scale: the suite's case says how many conversations a probe replays (`sessions`, the first
ones of the file, read line by line and no further) and at most how many rounds (`rounds`);
every session of a plan has the same number of rounds, the fewest any kept conversation has
up to that cap (the summary counts the conversations replayed for fewer rounds than they
have). A conversation whose prompt plus `max_tokens` exceeds the server's context
(`max_model_len` of its /v1/models entry) is skipped, never truncated, and counted.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from kvdiag.errors import KvdiagError
from kvdiag.facts import KnowledgeBase, Round
from kvdiag.planning.scenarios import finish_schedule
from kvdiag.userdata.formats import KIND, Conversation, read_conversations
from kvdiag.userdata.history import answering_endpoint, described, fill, missing

EMPTY_KB = KnowledgeBase("user", ())  # free text has no knowledge base: the fact check
# compares the shared answer's entities with the isolated one's (kvdiag.metrics.entities)
SKIPPED_SHOWN = 20  # skipped conversations the summary lists (all are counted)


@dataclass(frozen=True)
class UserSession:
    """One conversation of the file as a probe session (kvdiag.facts.Session's interface)."""

    session_id: str
    style: str
    kb: KnowledgeBase
    rounds: tuple[Round, ...]
    chat: tuple[dict, ...]  # the conversation's messages, as the file has them
    ends: tuple[int, ...]  # [round] -> index in `chat` of the round's user turn
    system: str | None = None

    def messages(self, round_index: int, answers=None) -> list[dict]:
        """Round `round_index`'s request (0-based): the file's messages up to and including its
        user turn. `answers` is not used: the history is the file's."""
        if not 0 <= round_index < len(self.rounds):
            raise IndexError(f"round {round_index} of a {len(self.rounds)}-round session")
        return [dict(m) for m in self.chat[:self.ends[round_index] + 1]]


def user_session(conv: Conversation, rounds: int) -> UserSession:
    """The first `rounds` rounds of `conv`; each round's expected text is the file's
    assistant turn right after its user turn ("" where there is none)."""
    ends = tuple(conv.user_turns[:rounds])
    out = []
    for end in ends:
        nxt = conv.messages[end + 1] if end + 1 < len(conv.messages) else None
        expected = nxt["content"] if nxt and nxt["role"] == "assistant" else ""
        out.append(Round(conv.messages[end]["content"], expected, KIND, (), ()))
    system = conv.messages[0]["content"] if conv.messages[0]["role"] == "system" else None
    return UserSession(f"L{conv.line:05d}", "natural", EMPTY_KB, tuple(out), conv.messages, ends, system)


class UserPlan(NamedTuple):
    """What kvdiag.planning.plan.plan_case makes its CasePlan of, for a sessions file."""

    suite: object  # kvdiag.planning.suites.Suite, at the server's block size
    case: object  # kvdiag.planning.suites.Case, its sessions and rounds as replayed
    sessions: list[UserSession]
    prompts: list[list[list[int]]]  # [session][round] -> prompt token ids
    schedule: object  # kvdiag.planning.scenarios.Schedule
    user: dict  # summary.json's sessions_file: what was read, kept, skipped


def plan_sessions_file(suite, case, tokenizer, block_size: int | None = None, *,
                       context: int | None = None) -> UserPlan:
    """The plan of `suite.sessions` (see the module docstring). `tokenizer`: kvdiag.planning.plan's
    (a PieceEncoder where it can be one); `context`: the server's max_model_len, by default
    read from the server the tokenizer counts with."""
    if block_size and block_size != suite.block_size:
        suite = dataclasses.replace(suite, block_size=block_size)
    context = context if context is not None else server_context(tokenizer)
    endpoint = answering_endpoint(tokenizer)
    kept, prompts, skipped, read, filled, unfilled = [], [], [], 0, 0, 0
    for batch in _batches(read_conversations(suite.sessions, suite.sessions_format), case.sessions, kept):
        read += len(batch)
        unfilled += 0 if endpoint else sum(len(missing(c, case.rounds)) for c in batch)
        batch, n = fill(batch, case.rounds, case.max_tokens, endpoint)
        filled += n
        for conv in batch:
            over = _keep(conv, tokenizer, case, context, kept, prompts)
            if over:
                skipped.append(over)
    if not kept:
        raise KvdiagError(f"{suite.sessions}: none of its first {read} conversations fits the server's "
                          f"context of {context} tokens with max_tokens {case.max_tokens}")
    rounds = min(len(p) for p in prompts)
    sessions = [user_session(conv, rounds) for conv in kept]
    prompts = [p[:rounds] for p in prompts]
    if hasattr(tokenizer, "check"):  # kvdiag.planning.plan.PieceEncoder: its counts checked whole
        tokenizer.check([s.messages(rounds - 1) for s in sessions], prompts)
    case = dataclasses.replace(case, sessions=len(sessions), rounds=rounds, style="natural",
                               pressure_round=min(case.pressure_round, rounds - 1))

    def answer_tokens(text: str) -> int:  # the file's answer as the server would generate it
        if not text:
            return case.max_tokens
        return min(case.max_tokens, len(tokenizer.encode(" " + text, add_special_tokens=False)) + 1)

    first = [p[0] for p in prompts]
    shared = 0
    while all(len(p) > shared and p[shared] == first[0][shared] for p in first):
        shared += 1
    schedule = finish_schedule(case.condition, [[len(p) for p in ps] for ps in prompts],
                               [[answer_tokens(r.expected) for r in s.rounds] for s in sessions],
                               block_size=suite.block_size, shared_prefix=shared,
                               pressure_round=case.pressure_round, max_think=case.max_think,
                               seed=case.seed if case.seed is not None else suite.seed)
    info = {"file": Path(suite.sessions).name, "format": kept[0].format,
            "conversations_read": read, "sessions": len(sessions), "rounds": rounds,
            "replayed_fewer_rounds": sum(len(c.user_turns) > rounds for c in kept),
            "skipped_too_long": len(skipped), "skipped": skipped[:SKIPPED_SHOWN],
            "context": context, "history": described(filled, unfilled),
            "system_prompts": "the file's own (the spread cut of generated sessions does not apply)"}
    return UserPlan(suite, case, sessions, prompts, schedule, info)


def _batches(convs, wanted: int, kept: list):
    """Lists of conversations read from `convs` as the plan still needs them (`wanted` less
    those `kept` so far), so that missing answers are asked for a batch at a time and the file
    is read no further than needed."""
    it = iter(convs)
    while len(kept) < wanted:
        batch = [c for _, c in zip(range(wanted - len(kept)), it)]
        if not batch:
            return
        yield batch


def _keep(conv: Conversation, tokenizer, case, context: int | None, kept: list,
          prompts: list) -> dict | None:
    """Append `conv` and its prompts to `kept` and `prompts`; or, where a round's prompt plus
    max_tokens exceeds the context, leave them and return the skipped conversation's entry."""
    ids = []
    for end in conv.user_turns[:case.rounds]:
        p = tokenizer.encode_chat(list(conv.messages[:end + 1]))
        if context and len(p) + case.max_tokens > context:
            return {"line": conv.line, "round": len(ids) + 1, "prompt_tokens": len(p)}
        ids.append(p)
    kept.append(conv)
    prompts.append(ids)
    return None


def server_context(tokenizer) -> int | None:
    """max_model_len of the served model's /v1/models entry, where the tokenizer counts with
    a server (kvdiag.runners.live.tokenizer.RemoteTokenizer) and the server gives it."""
    endpoint = answering_endpoint(tokenizer)
    if endpoint is None:
        return None
    try:
        r = endpoint.sync.get("/v1/models")
        entries = r.json().get("data", []) if r.status_code == 200 else []
    except Exception:  # noqa: BLE001  (a server that does not say: the context is unknown)
        return None
    for entry in entries:
        if entry.get("id") == endpoint.model and isinstance(entry.get("max_model_len"), int):
            return entry["max_model_len"]
    return None
