"""The probe's phases against a live endpoint, and their settings.

Every round of the suite's sessions is sent twice: sharing the server's prefix cache
(`shared`, the system under test, sessions in a closed loop with think times), and
isolated with a fresh cache_salt per request (`isolated`, the ground truth: no block of
it can come from the cache). A few isolated rounds are repeated to measure the server's
noise floor: the largest logprob margin at which two isolated runs of the same request
still diverge (batch-dependent kernels, nondeterminism). A shared answer that departs from
its isolated twin is
    numerics     if the isolated run preferred its own token there by no more than
                 max(noise floor, --numerics-margin) nats: a near-tie that numerics can flip;
    corruption   otherwise: a decisive answer changed, which numerics do not do
(compare.py). Every finished request is appended to rounds.jsonl at once, so a killed probe resumes.
The probe plans for the server it meets (pressure.py): its block size places the jump, and
pressure sessions fill a pool too big for the suite alone to recycle; a run where recycling
was not observed is `inconclusive`, never a pass.
"""

from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from kvdiag.planning.plan import CasePlan
from kvdiag.runners.live.endpoint import Endpoint
from kvdiag.runners.live.pressure import ServerCache, pressure_sessions
from kvdiag.runners.live.store import RoundStore

SHARED, ISOLATED, FLOOR, PRESSURE, TWIN = "shared", "isolated", "floor", "pressure", "twin"
PLP, PLP_ISOLATED = "plp", "plp-isolated"  # short prompt-logprob requests, shared and isolated
PLP_EVERY, PLP_BLOCKS = 4, 8  # every 4th round of a session; its prompt's first 8 blocks


def isolated(phase: str) -> bool:
    """Whether a phase's requests are the ground truth, each sent isolated (a fresh cache_salt,
    or a reset): the suite's isolated rounds, the floor's repeats, every '<phase>-isolated'."""
    return phase in (ISOLATED, FLOOR) or phase.endswith("-isolated")


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
    # traffic that reaches more fault classes (kvdiag.planning.plan's module docstring):
    spread: bool = True  # sessions diverge at every slot offset of a block
    twins: bool = True  # each shared request has a one-token twin sent with it (twin_of)
    adapter: str | None = None  # rounds alternate between the base model and this adapter
    isolation: str = "auto"  # auto (cache_salt where the server takes it), salt, or reset
    prompt_logprobs: bool = True  # every PLP_EVERY-th round, the first PLP_BLOCKS blocks of its
    # prompt (mostly cached by then) are sent for their prompt logprobs, shared and isolated,
    # where the server gives them: the two must agree at every position (plp_jobs)
    differential: bool = True  # the key-coverage pairs first (differential.py)
    differential_only: bool = False  # only them: a quick check of a production server
    differential_tokens: int = 8  # greedy tokens each pair's answer is compared over
    lifecycle: bool = True  # drive every event of a block's life (lifecycle.py)
    prefill_chunk: int | None = None  # the server's prefill chunk where it does not report it
    reuse_chunk: int = 0  # llama.cpp's n_cache_reuse, sent with every request (the bound's chunks)
    slot_files: str | None = None  # the folder a server kvdiag started saves its slots in (llama.cpp)
    require: tuple[str, ...] = ()  # events a run must reach, or be inconclusive
    sentinel: str | None = None  # the file a sentinel inside the server writes (kvdiag.sentinel)


async def shared_phase(endpoint: Endpoint, plan: CasePlan, store: RoundStore, s: ProbeSettings,
                       tick: Callable[[], None], pressure: list[int] = (),
                       shared_salt: str | None = None) -> None:
    """The suite's sessions in a closed loop, and beside them the pressure sessions: pressure
    session j replays suite session pressure[j] under its own cache_salt (sharing no block
    with anything else), answers and think times included, so the cache sees more sessions
    of the same traffic. Its answers are checked against that session's isolated twin.

    With `twins`, each shared request of a twinned session (CasePlan.has_twin: every other
    one) goes out together with a copy that asks for one token:
    the two share their blocks, and the copy finishes (and frees them) while the request
    still decodes, which is when a block freed too early (use-after-free) is recycled under
    a reader. The copies are traffic only: nothing judges their one token."""
    sem = asyncio.Semaphore(s.concurrency)
    run_salt = uuid.uuid4().hex[:12]

    async def one(phase: str, j: int, k: int, r: int, max_tokens: int, salt: str | None) -> None:
        model = plan.model_for(k, r)
        async with sem:
            res = await endpoint.chat(plan.sessions[k].messages(r), max_tokens, model=model,
                                      top_logprobs=s.top_logprobs, cache_salt=salt)
        store.add(phase, j, r, res, model=model, salt=salt)

    async def plp(k: int, r: int) -> None:  # after the round: its prefix is cached by now
        if (PLP, k, r) not in store.done:
            model = plan.model_for(k, r)
            async with sem:
                res = await endpoint.prompt_logprobs(plp_ids(plan, k, r), model=model,
                                                     cache_salt=shared_salt)
            store.add(PLP, k, r, res, model=model, salt=shared_salt, **res.extra)

    async def session(phase: str, j: int, k: int) -> None:
        for r in range(plan.case.rounds):
            if (phase, j, r) in store.done:
                continue
            await asyncio.sleep(plan.schedule.think(k, r) * s.think_scale)
            salt = f"kvdiag-pressure-{run_salt}-{j}" if phase == PRESSURE else shared_salt
            twin = s.twins and phase == SHARED and plan.has_twin(k) and (TWIN, j, r) not in store.done
            await asyncio.gather(one(phase, j, k, r, plan.case.max_tokens, salt),
                                 *([one(TWIN, j, k, r, 1, salt)] if twin else []))
            if s.prompt_logprobs and phase == SHARED and (k, r) in plp_jobs(plan):
                await plp(k, r)
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


async def isolated_phase(endpoint: Endpoint, plan: CasePlan, store: RoundStore, s: ProbeSettings,
                          phase: str, jobs: list[tuple[int, int]], salted: bool,
                          tick: Callable[[], None]) -> None:
    sem = asyncio.Semaphore(s.concurrency if salted else 1)

    async def one(k: int, r: int) -> None:
        if (phase, k, r) in store.done:
            return
        model = plan.model_for(k, r)
        async with sem:
            if not salted:  # documented fallback: empty the cache, one request at a time
                endpoint.reset_prefix_cache()
            if phase == PLP_ISOLATED:
                res = await endpoint.prompt_logprobs(plp_ids(plan, k, r), isolated=salted, model=model)
            else:
                res = await endpoint.chat(plan.sessions[k].messages(r), plan.case.max_tokens,
                                          isolated=salted, top_logprobs=s.top_logprobs, model=model)
        store.add(phase, k, r, res, model=model, **res.extra)
        tick()

    await asyncio.gather(*(one(k, r) for k, r in jobs))


def plp_jobs(plan: CasePlan) -> list[tuple[int, int]]:
    """The (session, round) whose prompts' first blocks are sent for prompt logprobs."""
    return [(k, r) for k in range(len(plan.sessions)) for r in range(plan.case.rounds)
            if r % PLP_EVERY == 1]


def plp_ids(plan: CasePlan, k: int, r: int) -> list[int]:
    return list(plan.prompts[k][r][:PLP_BLOCKS * plan.suite.block_size])


def pressure_id(plan: CasePlan, j: int, k: int) -> str:
    """The session id of pressure session j, a salted replay of suite session k."""
    return f"p{j:03d}~{plan.sessions[k].session_id}"


def floor_jobs(plan: CasePlan, sessions: int) -> list[tuple[int, int]]:
    rng = random.Random(f"floor:{plan.seed}")
    chosen = rng.sample(range(len(plan.sessions)), min(sessions, len(plan.sessions)))
    return [(k, r) for k in sorted(chosen) for r in range(plan.case.rounds)]
