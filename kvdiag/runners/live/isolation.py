"""The tenant-isolation audit: does a live server's prefix cache leak one tenant's prompt
prefixes to another, by content (cached_tokens) or by timing (time to first token)?

A "victim" tenant sends a secret prefix; an "attacker" tenant then sends, in random order,
the correct guess (the same prefix) and a wrong guess of equal length, each followed by the
attacker's own suffix. Each (trial, prefix length, configuration) cell uses a fresh random
secret and fresh wrong guesses, so no probe can warm the cache for a later one: a correct
guess can only hit what this cell's victim planted, and a wrong guess was never sent before.
The configurations differ only in the cache_salt each tenant sends:

    no-salt     victim -        attacker -        shared cache: the exposure, leaks by design
    per-tenant  victim salt V   attacker salt A   the isolation under test (judged)
    same-salt   victim salt S   attacker salt S   the positive control: must hit
    adapter     victim model=ADAPTER, no salt; attacker salt=ADAPTER  (judged; only with an
                adapter name: vLLM #44701, salt and LoRA name in one untagged hash key)

Prompts are token ids (POST /v1/completions with a list of ints) drawn from the server's own
tokenizer, so every secret is exactly `length` tokens and starts at position 0: a correct
guess can hit exactly `length` tokens, a wrong one none beyond what the attacker's own earlier
prompts share with it (each row keeps that prefix, `own_prefix`: a cache kept by the token,
as SGLang's, hits a first token two random guesses share). Everything is sequential (one
request in flight) so each TTFT and each /metrics delta belongs to one request. The runner
keeps statistics only (kvdiag.runners.live.isolation_cells); which cells leak, and the
verdict, are kvdiag.verdicts.judge_isolation's.
"""

from __future__ import annotations

import json
import random
import secrets
import string
import time
from dataclasses import asdict, dataclass

from kvdiag.errors import EndpointError, KvdiagError
from kvdiag.record.isolation_rows import IsolationCell, IsolationPlanBlock, IsolationServer
from kvdiag.runners.live.endpoint import Endpoint
from kvdiag.runners.live.isolation_cells import analyse
from kvdiag.runners.live.isolation_plan import CONFIGS, LENGTH_BLOCKS, IsolationPlan
from kvdiag.runners.live.oracle import lcp


@dataclass
class IsolationResult:
    """What the audit measured; kvdiag.verdicts.judge_isolation judges it."""

    cells: list[IsolationCell]  # one per (configuration, length): cached tokens, AUC, p; unjudged
    rows: list[dict]  # one per request
    server: IsolationServer
    plan: IsolationPlanBlock  # the plan as run: lengths, seed and configurations resolved
    requests: int = 0
    wall_seconds: float = 0.0
    error: str | None = None  # why the audit stopped early, if it did


class _Prober:
    """Sends the audit's requests over one connection, one at a time."""

    def __init__(self, ep: Endpoint, plan: IsolationPlan) -> None:
        self.ep, self.plan, self.requests = ep, plan, 0
        self.cached_from = "usage"
        self.sent: dict[tuple, list[list[int]]] = {}  # (tenant, salt, model) -> its prompts so far

    def own_prefix(self, tenant: str, salt: str | None, model: str | None, ids: list[int]) -> int:
        """The longest prefix `ids` shares with a prompt `tenant` sent before under the same
        salt and model: what its own history may hit (an engine that caches by the token, as
        SGLang does, hits a first token two random guesses share). Remembers `ids`."""
        earlier = self.sent.setdefault((tenant, salt, model), [])
        best = max((lcp(ids, p) for p in earlier), default=0)
        earlier.append(ids)
        return best

    def send(self, ids: list[int], salt: str | None, model: str | None = None) -> tuple[float, int | None]:
        """Stream one 1-token completion; (TTFT seconds, cached prompt tokens)."""
        body = {"model": model or self.ep.model, "prompt": ids, "max_tokens": 1, "temperature": 0.0,
                "stream": True, "stream_options": {"include_usage": True}}
        if salt is not None:
            body["cache_salt"] = salt
        before = self.hits() if self.cached_from == "metrics" else 0.0
        self.requests += 1
        ttft, usage = None, None
        t0 = time.perf_counter()
        try:
            with self.ep.sync.stream("POST", "/v1/completions", json=body) as r:
                if r.status_code != 200:
                    r.read()
                    raise EndpointError(f"/v1/completions answered HTTP {r.status_code}: {r.text[:200]}")
                for line in r.iter_lines():
                    if not line.startswith("data:") or line.strip() == "data: [DONE]":
                        continue
                    chunk = json.loads(line[5:])
                    if "error" in chunk:
                        raise EndpointError(f"stream error: {chunk['error'].get('message', chunk)}")
                    if ttft is None and chunk.get("choices"):
                        ttft = time.perf_counter() - t0
                    usage = chunk.get("usage") or usage
        except Exception as e:  # httpx errors: the endpoint went away mid-run
            if isinstance(e, EndpointError):
                raise
            raise EndpointError(f"request to {self.ep.base} failed: {type(e).__name__}") from None
        if ttft is None:
            raise EndpointError("a streamed completion returned no token")
        cached = ((usage or {}).get("prompt_tokens_details") or {}).get("cached_tokens")
        if self.cached_from == "metrics":
            cached = int(round(self.hits() - before))
        return ttft, cached

    def hits(self) -> float:
        return self.ep.metrics().get(self.ep.counters.hits, 0.0)


def server_facts(ep: Endpoint, block_size: int | None) -> IsolationServer:
    """Block size (from /metrics vllm:cache_config_info, else `block_size`, else 16) and
    max_model_len (from /v1/models when given)."""
    facts = IsolationServer(block_size=block_size, block_size_source="option")
    labels = ep.cache_config()
    if labels.get("block_size"):
        facts.block_size = int(labels["block_size"])
        facts.block_size_source = "vllm:cache_config_info"
    if facts.block_size is None:
        facts.block_size, facts.block_size_source = 16, "assumed (no vllm:cache_config_info)"
    if (entry := ep.model_entry()).get("max_model_len"):
        facts.max_model_len = int(entry["max_model_len"])
    return facts


def run_isolation(ep: Endpoint, plan: IsolationPlan, *, block_size: int | None = None,
                  progress=None) -> IsolationResult:
    """Run the audit against `ep` (checked first: EndpointError when down or the model is not
    served; ValueError when the plan does not fit the budget or the server). A failure after
    the first measured request does not raise: the result says what was measured.
    `progress(done_cells, total_cells)` is called before each measured cell."""
    t0 = time.perf_counter()
    served = ep.check()
    if plan.adapter is not None and plan.adapter not in served:
        raise EndpointError(f"{ep.base} does not serve the adapter {plan.adapter!r} (it serves: "
                            f"{', '.join(map(str, served))})")
    server = server_facts(ep, block_size)
    bs, seed = server.block_size, plan.seed if plan.seed is not None else secrets.randbits(48)
    rng = random.Random(seed)
    limit = (server.max_model_len or 10**9) - plan.suffix_tokens - 2
    lengths = plan.lengths or tuple(n * bs for n in LENGTH_BLOCKS if n * bs <= limit)
    if not lengths or max(lengths) > limit:
        raise KvdiagError(f"--lengths: the server's max_model_len ({server.max_model_len}) "
                         f"leaves room for prefixes up to {limit} tokens")
    configs = CONFIGS + (("adapter",) if plan.adapter else ())
    planned = 3 * len(lengths) * (plan.warmup + plan.trials * len(configs))
    if planned > plan.max_requests:
        raise KvdiagError(f"the audit needs {planned} requests, over --max-requests {plan.max_requests}: "
                         "lower --trials or --lengths")
    pool = sorted(set(ep.tokenize(" ".join(_word(rng) for _ in range(800)), add_special_tokens=False)))
    salts = {c: (f"kvdiag-{c}-victim-{rng.getrandbits(64):016x}",
                 f"kvdiag-{c}-attacker-{rng.getrandbits(64):016x}") for c in CONFIGS}
    salts["no-salt"], salts["same-salt"] = (None, None), (salts["same-salt"][0],) * 2
    salts["adapter"] = (None, plan.adapter)
    victim_tail = [rng.choice(pool) for _ in range(plan.suffix_tokens)]
    attacker_tail = [rng.choice(pool) for _ in range(plan.suffix_tokens)]
    prober = _Prober(ep, plan)
    rows, error = [], None
    cells = [(t, n, c) for t in range(plan.trials) for n in rng.sample(lengths, len(lengths))
             for c in rng.sample(configs, len(configs))]
    try:
        prober.cached_from = _cached_source(prober, pool, rng)
        for i in range(plan.warmup * len(lengths)):  # first requests of each length run slow
            _cell(prober, rng, pool, lengths[i % len(lengths)], "no-salt", (None, None), victim_tail,
                  attacker_tail, None, -1, rows)
        for done, (trial, length, config) in enumerate(cells):
            if progress is not None:
                progress(done, len(cells))
            if time.perf_counter() - t0 > plan.max_seconds:
                error = f"stopped at --max-seconds {plan.max_seconds:g} after {prober.requests} requests"
                break
            _cell(prober, rng, pool, length, config, salts[config], victim_tail, attacker_tail,
                  plan.adapter if config == "adapter" else None, trial, rows)
    except EndpointError as e:
        if not rows:
            raise
        error = f"the endpoint failed after {prober.requests} requests: {e}"
    server.cached_tokens_source = prober.cached_from
    plan_out = IsolationPlanBlock(**asdict(plan) | {"lengths": list(lengths), "seed": seed,
                                                    "configurations": list(configs)})
    return IsolationResult(analyse(rows, bs), rows, server, plan_out, prober.requests,
                           time.perf_counter() - t0, error)


def _word(rng: random.Random) -> str:
    return "".join(rng.choice(string.ascii_lowercase + string.digits) for _ in range(rng.randint(2, 7)))


def _cached_source(prober: _Prober, pool: list[int], rng: random.Random) -> str:
    """'usage' when the server reports usage.prompt_tokens_details.cached_tokens in the stream,
    else 'metrics' (the prefix-cache hits counter's delta around each request); EndpointError if
    neither is there."""
    _, cached = prober.send([rng.choice(pool) for _ in range(8)], None)
    if cached is not None:
        return "usage"
    hits = prober.ep.counters.hits
    if hits not in prober.ep.metrics():
        raise EndpointError("the server reports neither usage.prompt_tokens_details.cached_tokens "
                            f"nor {hits} (vLLM: --enable-prompt-tokens-details; SGLang: "
                            "--enable-cache-report)")
    return "metrics"


def _cell(prober, rng, pool, length, config, salts, victim_tail, attacker_tail, adapter, trial, rows):
    """Plant a fresh secret as the victim, then probe it (correct) and a fresh guess (wrong)
    as the attacker, in random order."""
    secret = [rng.choice(pool) for _ in range(length)]
    own = prober.own_prefix("victim", salts[0], adapter, secret + victim_tail)
    ttft, cached = prober.send(secret + victim_tail, salts[0], model=adapter)
    base = {"config": config, "length": length, "trial": trial}
    rows.append(base | {"role": "plant", "ttft_s": ttft, "cached_tokens": cached, "own_prefix": own})
    guesses = [("correct", secret), ("wrong", [rng.choice(pool) for _ in range(length)])]
    for role, guess in rng.sample(guesses, 2):
        own = prober.own_prefix("attacker", salts[1], None, guess + attacker_tail)
        ttft, cached = prober.send(guess + attacker_tail, salts[1])
        rows.append(base | {"role": role, "ttft_s": ttft, "cached_tokens": cached, "own_prefix": own})
