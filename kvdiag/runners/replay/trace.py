"""A trace: a case's traffic as plain data, recorded once and replayed through any block
manager (vLLM's KVCacheManager, or one of ours) without a model.

JSONL, one object a line. The first line describes the pool and the scheduler; every other
line is one request (one round of one session), with the prompt the client sent and the
tokens the contiguous reference generated (teacher-forced into every replay):

    {"kvdiag_trace": 1, "suite": "reproduce", "case": "trigger", "block_size": 16,
     "num_blocks": 1489, "max_num_seqs": 16, "max_num_batched_tokens": 8192,
     "enable_prefix_caching": true}
    {"session": "s00", "round": 1, "kind": "question", "prompt_ids": [...],
     "output_ids": [...], "think_steps": 0, "cache_salt": null, ...}

`round` is 1-based; `think_steps` is how many engine steps the session waits, after its
previous round finished, before it sends this one. Reading validates each line with pydantic
(strict) against the dataclasses below, as kvdiag.planning.suites does a suite's keys.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Annotated

from pydantic import BeforeValidator, ConfigDict, Field, TypeAdapter, ValidationError

from kvdiag.errors import KvdiagError
from reference_engine.util import cdiv

TRACE_VERSION = 1
DEFAULT_MAX_NUM_BATCHED_TOKENS = 8192  # reference_engine.config.EngineConfig's default

# checked when a trace is read (read_trace), not when one is built in memory
Positive = Annotated[int, Field(gt=0)]
TokenIds = Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1)]
Name = Annotated[str, Field(min_length=1)]
NanIfNull = Annotated[float, BeforeValidator(lambda v: math.nan if v is None else v)]


@dataclass(frozen=True)
class TraceConfig:
    __pydantic_config__ = ConfigDict(strict=True, extra="ignore")  # "kvdiag_trace": the version

    suite: str
    case: str
    block_size: Positive
    num_blocks: Positive  # usable blocks (vLLM gets one more: its null block)
    max_num_seqs: Positive
    max_num_batched_tokens: Positive = DEFAULT_MAX_NUM_BATCHED_TOKENS
    enable_prefix_caching: bool = True
    model: str | None = None  # the model the outputs came from, with its digest, when known

    def with_model(self, label: str) -> TraceConfig:
        return dataclasses.replace(self, model=label)


@dataclass
class TraceRequest:
    __pydantic_config__ = ConfigDict(strict=True, extra="forbid")

    session: Annotated[str, BeforeValidator(str)]
    round: Positive  # 1-based
    prompt_ids: TokenIds
    output_ids: TokenIds  # the contiguous reference's tokens, stop token included
    think_steps: Annotated[int, Field(ge=0)] = 0
    cache_salt: Name | None = None
    lora: Name | None = None  # the adapter the request names (its K/V are the adapter's)
    prompt_logprobs: bool = False  # asks for prompt logprobs: must not read the prefix cache
    kind: str = "question"
    output_text: str = ""
    expected_text: str = ""
    fact_check_pass: NanIfNull = math.nan  # null in the file
    fact_check_reason: str = ""


@dataclass
class Trace:
    config: TraceConfig
    requests: list[TraceRequest] = field(default_factory=list)

    @property
    def sessions(self) -> list[str]:
        return list(dict.fromkeys(r.session for r in self.requests))

    def by_session(self) -> dict[str, list[TraceRequest]]:
        """Each session's requests in round order."""
        out: dict[str, list[TraceRequest]] = {s: [] for s in self.sessions}
        for r in self.requests:
            out[r.session].append(r)
        for rounds in out.values():
            rounds.sort(key=lambda r: r.round)
        return out

    @property
    def num_operations(self) -> int:
        """Tokens the replay feeds through the block manager (prompts + outputs)."""
        return sum(len(r.prompt_ids) + len(r.output_ids) for r in self.requests)


def twin_id(session: str) -> str:
    return f"t~{session}"


def is_twin(session: str) -> bool:
    return session.startswith("t~")


def from_plan(plan, reference_records, cache_salt: str | None = None, twins: bool = False) -> Trace:
    """The trace of a CasePlan, with the contiguous reference's outputs (Records whose
    allocator is "contiguous", as kvdiag.runners.reference.engine.run_case yields them).
    Each request names the adapter plan.model_for gives it. `twins`: every twinned session
    (plan.has_twin) gets a twin session (twin_id) sending the same prompts at the same times
    for one token with prompt logprobs, as the live probe's twins do."""
    s = plan.schedule
    config = TraceConfig(suite=plan.suite.name, case=plan.case.name, block_size=s.block_size,
                         num_blocks=s.num_blocks, max_num_seqs=plan.suite.max_num_seqs,
                         enable_prefix_caching=s.enable_prefix_caching)
    ref = {(r.session, r.round): r for r in reference_records if r.allocator == "contiguous"}
    requests = []
    for si, session in enumerate(plan.sessions):
        for ri in range(plan.case.rounds):
            rec = ref.get((session.session_id, ri + 1))
            if rec is None:
                raise KvdiagError(f"no reference output for {session.session_id} round {ri + 1}")
            requests.append(TraceRequest(
                session=session.session_id, round=ri + 1, prompt_ids=list(plan.prompts[si][ri]),
                output_ids=list(rec.output_token_ids), think_steps=s.think(si, ri),
                cache_salt=cache_salt, lora=plan.model_for(si, ri), kind=rec.kind,
                output_text=rec.output_text, expected_text=rec.expected_text,
                fact_check_pass=rec.fact_check_pass, fact_check_reason=rec.fact_check_reason))
    if twins:
        twinned = {session.session_id for si, session in enumerate(plan.sessions) if plan.has_twin(si)}
        requests += [dataclasses.replace(r, session=twin_id(r.session), output_ids=r.output_ids[:1],
                                         prompt_logprobs=True, output_text="", expected_text="",
                                         fact_check_pass=math.nan, fact_check_reason="")
                     for r in list(requests) if r.session in twinned]
    return Trace(config, requests)


def from_schedule(schedule, *, max_num_seqs: int = 16, vocab: int = 128, seed: int = 0,
                  suite: str = "synthetic", cache_salt: str | None = None) -> Trace:
    """A trace with random token ids of exactly the schedule's lengths (kvdiag.planning.scenarios):
    every session starts with the same `shared_prefix` tokens, each round's prompt is the
    previous prompt + its whole answer + new user tokens (as tests/sessions_util.py). No model and no tokenizer: for tests and
    benchmarks of the block managers alone."""
    import random

    rng = random.Random(seed)
    shared = [rng.randrange(2, vocab) for _ in range(schedule.shared_prefix)]
    config = TraceConfig(suite=suite, case=schedule.name, block_size=schedule.block_size,
                         num_blocks=schedule.num_blocks, max_num_seqs=max_num_seqs,
                         enable_prefix_caching=schedule.enable_prefix_caching)
    requests = []
    for s, lengths in enumerate(schedule.prompt_lengths):
        history = list(shared)
        for r, length in enumerate(lengths):
            history += [rng.randrange(2, vocab) for _ in range(length - len(history))]
            output = [rng.randrange(2, vocab) for _ in range(schedule.answer_lengths[s][r])]
            requests.append(TraceRequest(session=f"s{s:02d}", round=r + 1, prompt_ids=list(history),
                                         output_ids=output, think_steps=schedule.think(s, r),
                                         cache_salt=cache_salt))
            history += output
    return Trace(config, requests)


def write_trace(trace: Trace, path: Path) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w") as f:
        f.write(json.dumps({"kvdiag_trace": TRACE_VERSION, **asdict(trace.config)}) + "\n")
        for r in trace.requests:
            row = asdict(r)
            if isinstance(row["fact_check_pass"], float) and math.isnan(row["fact_check_pass"]):
                row["fact_check_pass"] = None
            f.write(json.dumps(row) + "\n")
    tmp.replace(path)


def read_trace(path: Path) -> Trace:
    """Load and validate a trace; errors name the file, the line and the key."""
    path = Path(path)
    if not path.is_file():
        raise KvdiagError(f"{path}: no such trace file")
    lines = [(n, line) for n, line in enumerate(path.read_text().splitlines(), 1) if line.strip()]
    if not lines:
        raise KvdiagError(f"{path}: empty trace")
    (n, head), rows = lines[0], lines[1:]
    try:
        version = json.loads(head).get("kvdiag_trace")
    except (json.JSONDecodeError, AttributeError):  # not JSON, or not an object
        version = None
    if version != TRACE_VERSION:
        raise KvdiagError(f"{path}:{n}: first line must be the header "
                          f'{{"kvdiag_trace": {TRACE_VERSION}, ...}}')
    config = _validated(TraceConfig, head, f"{path}:{n}: header")
    if not rows:
        raise KvdiagError(f"{path}: the trace holds no request")
    requests, seen = [], set()
    for n, line in rows:
        request = _validated(TraceRequest, line, f"{path}:{n}")
        key = (request.session, request.round)
        if key in seen:
            raise KvdiagError(f"{path}:{n}: duplicate request {key[0]} round {key[1]}")
        seen.add(key)
        requests.append(request)
    trace = Trace(config, requests)
    for session, rounds in trace.by_session().items():
        if [r.round for r in rounds] != list(range(1, len(rounds) + 1)):
            raise KvdiagError(f"{path}: session {session}: rounds must be 1..n without gaps")
    longest = max(len(r.prompt_ids) + len(r.output_ids) for r in requests)
    if cdiv(longest, config.block_size) > config.num_blocks:
        raise KvdiagError(f"{path}: a request of {longest} tokens needs more than the "
                          f"{config.num_blocks} blocks of the pool (num_blocks)")
    return trace


@functools.cache
def _adapter(cls) -> TypeAdapter:
    return TypeAdapter(cls)


def _validated(cls, line: str, where: str):
    """One JSON line as a `cls` (pydantic, strict: no "1" for 1, no true for 1); one
    KvdiagError naming `where` and the key otherwise."""
    try:
        return _adapter(cls).validate_json(line)
    except ValidationError as e:
        first = e.errors()[0]
    kind, loc = first["type"], first["loc"]
    key = repr(loc[0]) + "".join(f"[{x}]" for x in loc[1:]) if loc else ""
    if kind == "json_invalid":
        message = f"not JSON ({first['msg'].removeprefix('Invalid JSON: ')})"
    elif not loc:
        message = "expected a JSON object"
    elif kind in ("missing", "missing_argument"):
        message = f"missing key {key}"
    elif kind in ("unexpected_keyword_argument", "extra_forbidden"):
        message = f"unknown key {key}"
    else:
        message = f"{key}: {first['msg']} (got {repr(first['input'])[:60]})"
    raise KvdiagError(f"{where}: {message}")
