"""A live probe's evidence blocks, typed: what its runners measured (kvdiag.runners.live), in
the shape the summary stores and every reader (console, page, detect, history, fleet)
reads by attribute. Each block holds statistics only (counts, margins, distances) and the
judge's counts beside them where the summary keeps them (over-hits, top-k departures,
events missing); no label is applied here.

Every field has a default, and a key a block does not declare is ignored on load, so a
summary written by an older kvdiag (which had fewer keys, or a key since renamed) still
loads; what it lacked reads as the default.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from kvdiag.record.summary_rows import EventRow, Num, Opt


class Block(BaseModel):
    model_config = ConfigDict(extra="ignore")


class NoiseFloor(Block):
    """Repeated isolated runs of one request: how many pairs, how many departed, by what
    margins, and the numerics margin a departure is held to."""

    pairs: int = 0
    diverged_pairs: int = 0
    margins: list[float] = Field(default_factory=list)
    margin: float = 0.0
    numerics_margin: float = 0.0


class ServerCache(Block):
    """The server's KV cache as the probe plans for it (runners/live/pressure.py reads it);
    `source` says where the figures came from: `cache_config_info` (vLLM's /metrics),
    `server_info` (SGLang's /server_info), `props` (llama.cpp's /props: its context's cells
    over all slots), `flags` (the user's --block-size / --num-blocks) or `suite` (neither: the
    suite's block size, pool unknown). `flags`: the figures as the server said them."""

    model_config = ConfigDict(extra="ignore", frozen=True)
    block_size: int
    num_blocks: int | None = None
    source: str
    version: str | None = None
    flags: dict[str, str | int | float | bool | None] = Field(default_factory=dict)

    @property
    def hit_unit(self) -> int:
        """The tokens vLLM counts hits in: its block, or a smaller `prefix_match_unit` (hits
        inside a block, beside a Mamba group: canary.mamba_hybrid; elsewhere it only loosens
        the over-hit bound); 1 where the figures are not vLLM's own."""
        if self.source != "cache_config_info":
            return 1
        unit = str(self.flags.get("prefix_match_unit"))  # "None": hits on the block grid
        return min(int(unit), self.block_size) if unit.isdigit() and int(unit) > 0 else self.block_size


class ServerBlock(ServerCache):
    """summary.json's `server`: its cache as the probe planned for it, the suite's own pool,
    which engine and version answered, and the flags kvdiag started it with (if it did)."""

    suite_pool: int | None = None
    engine: str | None = None
    engine_version: str | None = None
    engine_args: list[str] = Field(default_factory=list)


class Recycling(Block):
    """Whether the shared pass recycled blocks, and how it shows (evictions from the
    server's counters, cached fractions that fell, or more conversations than a slotted
    server has slots: `slot_handovers` is the least number of times a slot changed hands)."""

    observed: bool = False
    how: str | None = None
    evictions: Num | None = None
    requests_with_recycled_prefix: int = 0
    slot_handovers: int = 0
    pressure_sessions: int = 0


class FirstDivergence(Block):
    """A shared answer's first token that differs from its isolated twin's (tokens None with
    --no-text); `index`: when the departure could first be seen, the later of the two
    requests' landings among the run's requests."""

    session: str = ""
    round: int = 0
    token_index: int | None = None
    index: int | None = None
    shared_token: str | None = None
    isolated_token: str | None = None
    margin: Opt = None


class IsolatedExample(Block):
    phase: str = ""
    session: str | int | None = None
    round: int | None = None
    cached_tokens: int | None = None
    prompt_tokens: int | None = None


class GroundTruth(Block):
    """Isolated requests (the ground truth): how many, how many reported cached tokens
    (contaminated: must be 0), how many reported no count (unchecked: must be 0)."""

    isolated: int = 0
    contaminated: int = 0
    unchecked: int = 0
    examples: list[IsolatedExample] = Field(default_factory=list)


class Traffic(Block):
    """What the shared traffic held and which phases ran (kvdiag.planning.plan, probe_run)."""

    spread: bool = False
    twins: bool = False
    adapter: str | None = None
    prompt_logprobs: bool = False
    twin_requests: int = 0
    isolation: str | None = None
    namespaces: bool = True
    differential: bool = False
    differential_only: bool = False
    lifecycle: bool = False
    require: list[str] = Field(default_factory=list)


class LogprobExample(Block):
    session: str | int | None = None
    round: int | None = None
    positions: int = 0
    first: int | None = None
    shared: list | dict | str | float | None = None  # the position's logprobs (None: --no-text)
    isolated: list | dict | str | float | None = None


class LogprobPair(Block):
    """One twin's prompt logprobs beside its isolated round's, position by position
    ([token, logprob] or None each), as the runner read them: the judge says which departed
    (kvdiag.verdicts.prompt_logprob_departures)."""

    session: int = 0
    round: int = 0  # 1-based
    shared: list = Field(default_factory=list)
    isolated: list = Field(default_factory=list)


class PromptLogprobs(Block):
    """Twins' prompt logprobs against their isolated rounds': the pairs measured (`pairs`,
    not stored), and the judge's counts of them: checked, departed, where."""

    pairs: list[LogprobPair] = Field(default_factory=list, exclude=True)
    checked: int = 0
    mismatched: int = 0
    examples: list[LogprobExample] = Field(default_factory=list)
    rounds: list[int] = Field(default_factory=list)
    departed: list[int] = Field(default_factory=list)


class BoundedHit(Block):
    """A request the over-hit oracle bounded: what it reported cached, the most any earlier
    request of its namespace could have cached for it, and its answer's margin against its
    isolated twin (None without one). An over-hit where `cached` passes `bound` (the judge
    says so: kvdiag.verdicts.over_hit)."""

    what: str = ""
    phase: str | None = None
    cached: int | None = None
    bound: int | None = None
    prompt_tokens: int | None = None
    index: int | None = None
    margin: Opt = None


class HitAccount(Block):
    """Hit accounting for one group of the oracle's requests (a phase, or a lifecycle group):
    the cached tokens the server reported beside the most it could have (the bounds' sum).
    `short`: requests that reported fewer than their bound; `none`: of those, the ones that
    reported nothing at all. An under-hit costs compute, not correctness: a prefix evicted
    for room is one, and no verdict reads this. It shows where a cache was skipped (llama.cpp
    #28139: a pinned slot never looks its RAM cache up)."""

    group: str = ""
    requests: int = 0
    possible: int = 0
    reported: int = 0
    short: int = 0
    none: int = 0


class Oracle(Block):
    """The over-hit oracle's counts (runners/live/oracle.py), every request it bounded (`hits`:
    the judge's input, not written to summary.json) and the over-hits the judge found."""

    available: bool = False
    checked: int = 0
    unit: int | None = None
    last_token_computed: bool | None = None
    unknown_ids: int = 0
    unreported: int = 0
    # llama.cpp with --cache-reuse N: the N the bound counted chunks of, and the requests
    # whose count ran past the common prefix yet within the chunks (shifted chunks reached)
    reuse_chunk: int = 0
    chunk_hits: int = 0
    hits: list[BoundedHit] = Field(default_factory=list, exclude=True)
    accounting: list[HitAccount] = Field(default_factory=list)
    over_hits: int = 0
    examples: list[BoundedHit] = Field(default_factory=list)


class DifferentialPair(Block):
    """One request of the differential phase: its pair's name and family, what it reported
    cached, the most it could have, its answer's margin against its isolated twin."""

    name: str | None = None
    family: str | None = None
    cached: int | None = None
    bound: int | None = None
    margin: Opt = None


class KeyCoverage(Block):
    oracle: Oracle = Field(default_factory=Oracle)
    differential: list[DifferentialPair] = Field(default_factory=list)
    differential_skipped: list[str] = Field(default_factory=list)


class LifeDivergence(Block):
    """A lifecycle request against its isolated twin: where it first departed (None: it did
    not), by what margin (NaN: no departure), when a departure could first be seen (`index`:
    the later of its and its twin's landings among the run's requests), and the judge's class of its departure (`label`: kvdiag.verdicts, written
    back by the probe's judge; None where it did not depart)."""

    request: int = 0
    group: str | None = None
    first_divergence: int | None = None
    margin: float = float("nan")
    cached_tokens: int | None = None
    prompt_tokens: int | None = None
    index: int | None = None
    label: str | None = None


class Lifecycle(Block):
    """The lifecycle phase: its requests, how it was sized from the server, the groups it
    could not send and why, the events required and those missing. `divergences` (every
    request against its twin) and `events` (the coverage table, summary.json's `events`)
    are the judge's input, not written here."""

    requests: int = 0
    divergences: list[LifeDivergence] = Field(default_factory=list, exclude=True)
    events: list[EventRow] = Field(default_factory=list, exclude=True)
    sizing: dict[str, int | float | None] = Field(default_factory=dict)
    skipped: dict[str, str] = Field(default_factory=dict)
    required: list[str] = Field(default_factory=list)
    missing: list[str] = Field(default_factory=list)


class TopK(Block):
    """The second channel: the first tokens' top-k logprob shifts against the isolated runs,
    their noise floor, the judge's threshold and the departures beyond it. `shifts` (what,
    nats) per request and `floor_shifts` between isolated repeats are the judge's input, not
    written to summary.json."""

    positions: int | None = None
    shifts: list[tuple[str, float]] = Field(default_factory=list, exclude=True)
    floor_shifts: list[float] = Field(default_factory=list, exclude=True)
    compared: int = 0
    floor: Opt = None
    threshold: Opt = None
    departed: int = 0
    largest: Opt = None


class FactCheck(Block):
    pipeline: str | None = None
    rows_checked: int = 0
    entities: str | None = None
    compared: str | None = None


class SessionsFile(Block):
    """--sessions: the file, what was read, kept and skipped (over the context), the rounds
    replayed, the histories' source, and the free-text fact check (kvdiag.userdata)."""

    file: str | None = None
    format: str | None = None
    conversations_read: int = 0
    sessions: int = 0
    rounds: int = 0
    replayed_fewer_rounds: int = 0
    skipped_too_long: int = 0
    skipped: list[str | dict[str, str | int | None]] = Field(default_factory=list)
    context: int | None = None
    history: str | None = None
    system_prompts: str | None = None
    fact_check: FactCheck | None = None
