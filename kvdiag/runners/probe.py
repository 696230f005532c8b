"""Probe a live endpoint for cache corruption.

Every round of the suite's sessions is sent twice: sharing the server's prefix cache
(`shared`, the system under test, sessions in a closed loop with think times), and
isolated with a fresh cache_salt per request (`isolated`, the ground truth: no block of
it can come from the cache). A few isolated rounds are repeated to measure the server's
noise floor: the largest logprob margin at which two isolated runs of the same request
still diverge (batch-dependent kernels, nondeterminism). A shared answer that departs from
its isolated twin is
    numerics     if the isolated run preferred its own token there by no more than
                 max(noise floor, --numerics-margin) nats: a near-tie that numerics can flip;
    corruption   otherwise: a decisive answer changed, which numerics do not do.
Every finished request is appended to rounds.jsonl at once, so a killed probe resumes.
The probe plans for the server it meets (pressure.py): its block size places the jump, and
pressure sessions fill a pool too big for the suite alone to recycle; a run where recycling
was not observed is `inconclusive`, never a pass.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import random
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kvdiag.errors import EndpointError
from kvdiag.runners.endpoint import ChatResult, Endpoint
from kvdiag.runners.plan import CasePlan
from kvdiag.runners.pressure import (
    ServerCache,
    observe_recycling,
    pressure_sessions,
    read_server_cache,
)
from kvdiag.runners.records import Checker, Record

SHARED, ISOLATED, FLOOR, PRESSURE = "shared", "isolated", "floor", "pressure"


class RemoteTokenizer:
    """The endpoint's own tokenizer and chat template, behind the interface plan_case uses.
    Counts come from /tokenize; a server without it (HTTP 404), or `use_usage=True`, counts
    by usage.prompt_tokens of one-token requests instead (token ids are then placeholders:
    only the counts are known)."""

    def __init__(self, endpoint: Endpoint, use_usage: bool = False) -> None:
        self.endpoint, self.use_usage = endpoint, use_usage

    def encode_chat(self, messages: list[dict], add_generation_prompt: bool = True) -> list[int]:
        if not self.use_usage:
            try:
                return self.endpoint.tokenize_chat(messages, add_generation_prompt)
            except EndpointError:
                if self.endpoint.has_tokenize:
                    raise
                self.use_usage = True
        return [0] * self.endpoint.count_by_usage(messages=messages)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        if not self.use_usage:
            return self.endpoint.tokenize(text, add_special_tokens)
        # a completion prompt carries the tokenizer's special tokens, if any: count the text
        # after a one-word anchor and subtract the anchor alone
        anchor = self.endpoint.count_by_usage(prompt="x")
        return [0] * (self.endpoint.count_by_usage(prompt="x" + text) - anchor)


class RoundStore:
    """rounds.jsonl: one line per finished request, flushed and synced as it lands."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.done: dict[tuple[str, int, int], dict] = {}
        if path.exists():
            for line in path.read_text().splitlines():
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:
                    continue  # a line cut by a kill: that request runs again
                self.done[(row["phase"], row["session"], row["round"])] = row
        self._file = open(path, "a")  # noqa: SIM115 (kept open for the run)

    def add(self, phase: str, session: int, rnd: int, result: ChatResult) -> dict:
        row = {"phase": phase, "session": session, "round": rnd, "text": result.text,
               "tokens": result.tokens, "top": result.top, "logprobs": result.logprobs,
               "prompt_tokens": result.prompt_tokens, "cached_tokens": result.cached_tokens,
               "finish_reason": result.finish_reason, "seconds": round(result.seconds, 4)}
        self._file.write(json.dumps(row) + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())
        self.done[(phase, session, rnd)] = row
        return row

    def close(self) -> None:
        self._file.close()


@dataclass
class ProbeSettings:
    concurrency: int = 16
    think_scale: float = 0.02  # seconds per schedule think step
    floor_sessions: int = 4  # sessions whose isolated rounds are repeated for the noise floor
    numerics_margin: float = 1.0  # nats: the least margin a divergence needs to be corruption
    top_logprobs: int = 5
    # The server's cache where its /metrics has no vllm:cache_config_info (--block-size,
    # --num-blocks); the server's own figures win where it has.
    block_size: int | None = None
    num_blocks: int | None = None
    max_pressure_sessions: int = 256  # at most this many pressure sessions (see pressure.py)


def divergence(a: list[str], b: list[str]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def margin_at(reference: dict, other_tokens: list[str], i: int) -> float:
    """How much the reference run preferred its own token at position i over the other
    run's (from its top logprobs; a lower bound when the other token is not among them)."""
    if i >= len(reference["tokens"]) or i >= len(reference["top"]):
        return math.inf  # the reference stopped or went on: a length difference, not a near-tie
    own = reference["logprobs"][i]
    top = dict((t, lp) for t, lp in reference["top"][i])
    other = other_tokens[i] if i < len(other_tokens) else None
    if other in top:
        return own - top[other]
    return own - min(top.values()) if top else math.inf


async def _phase_shared(endpoint: Endpoint, plan: CasePlan, store: RoundStore, s: ProbeSettings,
                        tick: Callable[[], None], pressure: list[int] = ()) -> None:
    """The suite's sessions in a closed loop, and beside them the pressure sessions: pressure
    session j replays suite session pressure[j] under its own cache_salt (sharing no block
    with anything else), answers and think times included, so the cache sees more sessions
    of the same traffic. Its answers are checked against that session's isolated twin."""
    sem = asyncio.Semaphore(s.concurrency)
    run_salt = uuid.uuid4().hex[:12]

    async def session(phase: str, j: int, k: int) -> None:
        for r in range(plan.case.rounds):
            if (phase, j, r) in store.done:
                continue
            await asyncio.sleep(plan.schedule.think(k, r) * s.think_scale)
            salt = f"kvdiag-pressure-{run_salt}-{j}" if phase == PRESSURE else None
            async with sem:
                res = await endpoint.chat(plan.sessions[k].messages(r), plan.case.max_tokens,
                                          top_logprobs=s.top_logprobs, cache_salt=salt)
            store.add(phase, j, r, res)
            tick()

    await asyncio.gather(*(session(SHARED, k, k) for k in range(len(plan.sessions))),
                         *(session(PRESSURE, j, k) for j, k in enumerate(pressure)))


def plan_pressure(plan: CasePlan, server: ServerCache, salted: bool, s: ProbeSettings) -> list[int]:
    """The pressure sessions this server needs (none without cache_salt to keep them apart,
    and none for a case that must not recycle)."""
    if not salted or not plan.schedule.enable_prefix_caching or plan.case.condition == "big-pool":
        return []
    return pressure_sessions(plan.schedule, server.num_blocks, plan.case.pressure_round,
                             limit=s.max_pressure_sessions)


def server_summary(store: RoundStore, plan: CasePlan, server: ServerCache, pressure: list[int],
                   before: dict, after: dict, corrupt) -> dict:
    """The summary fields that describe the server and its recycling, the first divergent
    token of each corrupted request (`corrupt`: its rows of the records frame), and the
    verdict: fail on corruption; pass only where recycling was observed; inconclusive
    otherwise."""
    shared = {(phase, k, r): row for (phase, k, r), row in store.done.items()
              if phase in (SHARED, PRESSURE)}
    recycling = observe_recycling(shared, server.block_size, before, after)
    recycling["pressure_sessions"] = len(pressure)
    out = {"server": server.as_dict() | {"suite_pool": plan.schedule.num_blocks},
           "recycling": recycling}
    if len(corrupt):
        index = {ses.session_id: (SHARED, k, k) for k, ses in enumerate(plan.sessions)}
        index |= {pressure_id(plan, j, k): (PRESSURE, j, k) for j, k in enumerate(pressure)}
        firsts = []
        for row in corrupt.sort_values(["round", "session"]).itertuples():
            (phase, j, k), r, i = index[row.session], int(row.round) - 1, int(row.first_divergence)
            got, want = store.done[(phase, j, r)]["tokens"], store.done[(ISOLATED, k, r)]["tokens"]
            firsts.append({"session": row.session, "round": r + 1, "token_index": i,
                           "shared_token": got[i] if i < len(got) else None,
                           "isolated_token": want[i] if i < len(want) else None,
                           "margin": float(row.divergence_margin)})
        return out | {"verdict": "fail", "first_divergences": firsts}
    if recycling["observed"]:
        return out | {"verdict": "pass"}
    pool = "unknown" if server.num_blocks is None else f"{server.num_blocks} blocks"
    return out | {"verdict": "inconclusive",
                  "inconclusive_reason": f"trigger not reached: no recycling observed "
                                         f"({recycling['how']}; server pool {pool} of {server.block_size} "
                                         f"tokens, {len(pressure)} pressure sessions)"}


async def _phase_isolated(endpoint: Endpoint, plan: CasePlan, store: RoundStore, s: ProbeSettings,
                          phase: str, jobs: list[tuple[int, int]], salted: bool,
                          tick: Callable[[], None]) -> None:
    sem = asyncio.Semaphore(s.concurrency if salted else 1)

    async def one(k: int, r: int) -> None:
        if (phase, k, r) in store.done:
            return
        async with sem:
            if not salted:  # documented fallback: empty the cache, one request at a time
                endpoint.reset_prefix_cache()
            res = await endpoint.chat(plan.sessions[k].messages(r), plan.case.max_tokens,
                                      cache_salt=f"kvdiag-{uuid.uuid4().hex}" if salted else None,
                                      top_logprobs=s.top_logprobs)
        store.add(phase, k, r, res)
        tick()

    await asyncio.gather(*(one(k, r) for k, r in jobs))


def noise_floor(store: RoundStore) -> tuple[float, int, int]:
    """(largest margin at which two isolated runs diverged, divergent pairs, pairs)."""
    worst, diverged, pairs = 0.0, 0, 0
    for (phase, k, r), row in store.done.items():
        if phase != FLOOR or (ISOLATED, k, r) not in store.done:
            continue
        pairs += 1
        ref = store.done[(ISOLATED, k, r)]
        i = divergence(ref["tokens"], row["tokens"])
        if i is not None:
            diverged += 1
            m = margin_at(ref, row["tokens"], i)
            worst = max(worst, m if math.isfinite(m) else 0.0)
    return worst, diverged, pairs


def pressure_id(plan: CasePlan, j: int, k: int) -> str:
    """The session id of pressure session j, a salted replay of suite session k."""
    return f"p{j:03d}~{plan.sessions[k].session_id}"


def records(plan: CasePlan, store: RoundStore, target: str, threshold: float, style: str,
            block_size: int, pressure: list[int] = ()) -> list[Record]:
    """Per round: the isolated row and the shared row of every suite session, and a shared
    row for every pressure session (judged against the isolated twin of the session it replays)."""
    checker = Checker(style)
    out = []
    runs = [(session.session_id, SHARED, k, k, True) for k, session in enumerate(plan.sessions)]
    runs += [(pressure_id(plan, j, k), PRESSURE, j, k, False) for j, k in enumerate(pressure)]
    for sid, shared_phase, j, k, with_iso in runs:
        session = plan.sessions[k]
        for r, rnd in enumerate(session.rounds):
            iso, shared = store.done.get((ISOLATED, k, r)), store.done.get((shared_phase, j, r))
            if iso is None or shared is None:
                continue
            for phase, row in ((ISOLATED, iso), (SHARED, shared))[0 if with_iso else 1:]:
                text = row["text"].strip()
                passed, reason = checker.check(session.kb, rnd, text)
                i = divergence(row["tokens"], iso["tokens"]) if phase == SHARED else None
                margin = margin_at(iso, row["tokens"], i) if i is not None else math.nan
                label = ("match" if i is None else
                         "numerics" if margin <= threshold else "corruption")
                cached = row["cached_tokens"]
                needed = -(-row["prompt_tokens"] // block_size)
                out.append(Record(
                    case=plan.case.name, target=target, allocator=phase,
                    session=sid, round=r + 1, kind=rnd.kind,
                    prompt_tokens=row["prompt_tokens"], cached_tokens=cached or 0,
                    blocks_needed=needed, blocks_hit=min(needed, (cached or 0) // block_size),
                    output_text=text, reference_text=iso["text"].strip(), expected_text=rnd.expected,
                    first_divergence=i, fact_check_pass=passed, fact_check_reason=reason,
                    divergence_margin=margin, classification=label if phase == SHARED else ""))
    return out


def floor_jobs(plan: CasePlan, sessions: int) -> list[tuple[int, int]]:
    rng = random.Random(f"floor:{plan.seed}")
    chosen = rng.sample(range(len(plan.sessions)), min(sessions, len(plan.sessions)))
    return [(k, r) for k in sorted(chosen) for r in range(plan.case.rounds)]


__all__ = ["SHARED", "ISOLATED", "FLOOR", "PRESSURE", "EndpointError", "plan_pressure", "server_summary", "read_server_cache", "ProbeSettings", "RemoteTokenizer",
           "RoundStore", "noise_floor", "records", "floor_jobs", "divergence", "margin_at"]
