"""The sentinel inside vLLM's engine core (v1 scheduler): every step's SchedulerOutput, read
as the workers read it, fed to the ledger before the step's results are applied.

What it reads, all of it handed to the workers or the request's own:
    scheduled_new_reqs      block_ids (the table), num_computed_tokens (a prefix hit)
    scheduled_cached_reqs   new_block_ids (appended; a table of its own for resumed_req_ids),
                            num_computed_tokens
    num_scheduled_tokens    the positions computed this step
    new_block_ids_to_zero   blocks the workers zero before the forward pass (unwritten again)
    kv_cache_block_copies   copy-on-write: the destination holds the source's K/V
    finished_req_ids, preempted_req_ids   tables the workers drop
    reset_prefix_cache()    a reset the scheduler reports done: what was cached is unwritten
    Request                 all_token_ids, cache_salt, lora_request (the namespace)

With the step's results comes each sampled token's attention over its context, where vLLM's
CPU worker measured it (attention.py): weighed by the slots the ledger found read wrong, it is
the request's attention leakage (kvdiag.sentinel.leakage), for a model of one attention group.

It never reads block hashes, ref counts or the free queue. Hooked at update_from_output (the
step's sampled tokens are not appended yet, every token it wrote is known, with or without
async scheduling); requests are remembered from schedule() on, so one aborted in between is
still checked. Every KV cache group of attention is followed, each by a ledger of its own over
one store of slots (a hybrid model's groups share the pool and its tensors): full attention
reads the whole context, a sliding-window group the window a step's queries see, where the
blocks before it are freed and a null block stands in. A group of another kind (a state
space's, say) is counted as unchecked, never passed. kvdiag's vLLM plugin calls install(path).
"""

from __future__ import annotations

import dataclasses
import sys

from kvdiag.engines.vllm.attention import ATTR, SECONDS
from kvdiag.sentinel.facts import Counters, Scheduled, merged, namespace_of
from kvdiag.sentinel.leakage import Leakage
from kvdiag.sentinel.ledger import Ledger
from kvdiag.sentinel.log import SentinelLog
from kvdiag.sentinel.slots import Slots

# what the sentinel reads; a vLLM whose SchedulerOutput lacks one is refused, not half-checked
NEEDED = {
    "SchedulerOutput": ("scheduled_new_reqs", "scheduled_cached_reqs", "num_scheduled_tokens",
                        "finished_req_ids"),
    "NewRequestData": ("req_id", "block_ids", "num_computed_tokens"),
    "CachedRequestData": ("req_ids", "new_block_ids", "num_computed_tokens"),
}


# read where the version has them: a vLLM without one hands the workers no such order (zeroing
# came with 0.17.1's fix), so the sentinel cannot see that event, and every PASS says so
OPTIONAL = {"preempted_req_ids": "preempted requests", "new_block_ids_to_zero": "zeroed blocks",
            "kv_cache_block_copies": "copy-on-write copies"}


def check_version() -> list[str]:
    """What of OPTIONAL this vLLM's scheduler output does not hand over; RuntimeError naming
    vLLM's version when it lacks what is read."""
    import vllm
    from vllm.v1.core.sched import output

    missing = []
    for cls, names in NEEDED.items():
        fields = {f.name for f in dataclasses.fields(getattr(output, cls))}
        missing += [f"{cls}.{n}" for n in names if n not in fields]
    cached = {f.name for f in dataclasses.fields(output.CachedRequestData)}
    if not {"resumed_req_ids", "resumed_from_preemption"} & cached:
        missing.append("CachedRequestData.resumed_req_ids")
    if missing:
        raise RuntimeError(f"kvdiag sentinel: vLLM {vllm.__version__}'s scheduler output lacks "
                           f"{', '.join(missing)}: refusing to run a sentinel that cannot see")
    have = {f.name for f in dataclasses.fields(output.SchedulerOutput)}
    return [f"{what} ({name})" for name, what in OPTIONAL.items() if name not in have]


def attention_groups(scheduler) -> list[tuple[int, int | None] | None]:
    """Per KV cache group, what the sentinel follows: (block size, sliding window or None),
    or None for a group that is not attention over a block table of its own."""
    fallback = scheduler.block_size if hasattr(scheduler, "block_size") else scheduler.cache_config.block_size
    groups = getattr(getattr(scheduler, "kv_cache_config", None), "kv_cache_groups", None)
    if not groups:
        return [(fallback, None)]
    found = []
    for group in groups:
        spec = group.kv_cache_spec
        kind = type(spec).__name__
        if kind in ("FullAttentionSpec", "MLAAttentionSpec"):
            found.append((spec.block_size, None))
        elif kind == "SlidingWindowSpec":
            found.append((spec.block_size, spec.sliding_window))
        else:
            found.append(None)
    return found


class VllmSentinel:
    """The ledger fed from one vLLM scheduler."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.ledgers: list[Ledger | None] = []  # one per KV cache group (None: not followed)
        self.skipped = Counters()  # request-steps no ledger took (unknown request, group not followed)
        self.log: SentinelLog | None = None
        self.requests: dict[str, object] = {}  # rid -> vLLM Request, from schedule() on
        self.waiting_since: dict[str, int] = {}  # rid -> the step it was first seen waiting
        self.chunks: dict[str, int] = {}  # rid -> prefill chunks so far
        self.cancelled: set[str] = set()
        self.step_no = 0
        self.leakage: Leakage | None = None  # where the worker hands over attention
        self.weighing = 0.0  # the worker's seconds weighing it, as it last said
        self.unseen: list[str] = []  # what this vLLM does not hand over (check_version)
        self.cow: dict[int, int] = {}  # this step's copy-on-write copies: destination -> source

    def _start(self, scheduler, attention: bool) -> None:
        vllm = sys.modules.get("vllm")  # the engine's own process has it (a test may not)
        groups = attention_groups(scheduler)
        followed = [g for g in groups if g is not None]
        attention = attention and len(followed) == 1
        self.log = SentinelLog(self.path, {
            "engine": "vllm", "version": getattr(vllm, "__version__", None), "attention": attention,
            "unseen": self.unseen,
            "block_size": followed[0][0] if followed else None,
            "groups": [None if g is None else {"block_size": g[0], "window": g[1]} for g in groups]})
        # one store when the groups' slots line up (a hybrid's groups share a block size)
        shared = Slots() if len({g[0] for g in followed}) == 1 else None
        self.ledgers = [None if g is None else
                        Ledger(g[0], self.log.finding, slots=shared if shared is not None else Slots(),
                               group=k, window=g[1])
                        for k, g in enumerate(groups)]
        self.leakage = Leakage(self.log.leakage) if attention else None

    @property
    def ledger(self) -> Ledger | None:
        """The first followed group's ledger (a model of one group has only that)."""
        return next((led for led in self.ledgers if led is not None), None)

    def scheduled(self, scheduler, output) -> None:
        """After schedule(): remember the requests it scheduled, and who is waiting."""
        self.step_no += 1
        for rid in output.num_scheduled_tokens:
            if rid not in self.requests and rid in scheduler.requests:
                self.requests[rid] = scheduler.requests[rid]
        for request in scheduler.waiting:
            self.waiting_since.setdefault(request.request_id, self.step_no)

    def step(self, scheduler, output, results=None) -> None:
        """Before update_from_output(): the step the workers just ran (`results`: what they
        returned, with each sampled token's attention where attention.py measured it)."""
        weights = getattr(results, ATTR, None)
        if not self.ledgers:
            self._start(scheduler, weights is not None)
        ledgers = [led for led in self.ledgers if led is not None]
        # zeroing and copies act on the pool's blocks, whichever group holds them
        stores = list({id(led.store): led for led in ledgers}.values())
        for rid in output.finished_req_ids:
            for led in ledgers:
                led.finish(rid, cancelled=rid in self.cancelled)
            if self.leakage is not None:
                self.leakage.finish(rid)
            self._forget(rid)
        for rid in getattr(output, "preempted_req_ids", None) or ():
            for led in ledgers:
                led.preempt(rid)
            self.chunks.pop(rid, None)
        for block in getattr(output, "new_block_ids_to_zero", None) or ():
            for led in stores:
                led.zero(block)
        self.cow = {dst: src for src, dst in getattr(output, "kv_cache_block_copies", None) or ()}
        for dst, src in self.cow.items():
            for led in stores:
                led.copy(src, dst)
        items = []
        for new in output.scheduled_new_reqs:
            context = []
            if new.num_computed_tokens:
                context.append(f"prefix-cache hit of {new.num_computed_tokens} tokens")
            waited = self.step_no - self.waiting_since.pop(new.req_id, self.step_no)
            if waited > 0:
                context.append(f"admitted after waiting {waited} steps")
            items.append(self._item(new.req_id, new.block_ids, None, new.num_computed_tokens,
                                    output, context))
        cached = output.scheduled_cached_reqs
        resumed = set(getattr(cached, "resumed_req_ids", ()) or ())
        flags = getattr(cached, "resumed_from_preemption", None)
        for i, rid in enumerate(cached.req_ids):
            again = rid in resumed or bool(flags and flags[i])
            context = ["resumed after preemption"] if again else []
            if again and cached.num_computed_tokens[i]:
                context.append(f"prefix-cache hit of {cached.num_computed_tokens[i]} tokens")
            items.append(self._item(rid, cached.new_block_ids[i], again, cached.num_computed_tokens[i],
                                    output, context))
        for k, led in enumerate(self.ledgers):
            if led is not None:
                led.step([it[k] for it in items if it is not None])
            else:
                self.skipped.unchecked += sum(it is not None for it in items)
        if self.leakage is not None:
            self._leaked([share for it in items if it is not None for share in it if share is not None],
                         ledgers[0], weights or {})
        self.weighing = getattr(results, SECONDS, self.weighing)
        counters = merged(ledgers, self.skipped)
        counters.weighing = self.weighing
        self.log.counters(counters)

    def _leaked(self, shares: list[Scheduled], ledger: Ledger, weights: dict) -> None:
        """Each token sampled this step (its request's known tokens all computed), weighed."""
        for s in shares:
            if s.computed + s.new >= len(s.tokens):
                self.leakage.token(s.rid, ledger.bad_now.get(s.rid), weights.get(s.rid))

    def _item(self, rid: str, block_ids, resumed: bool | None, computed: int, output,
              context: list[str]) -> list[Scheduled | None] | None:
        """The request's share of the step, one Scheduled per KV cache group (None where a
        group is not followed)."""
        request = self.requests.get(rid)
        if request is None:
            self.skipped.unchecked += 1
            return None
        groups = block_ids or ()
        new = output.num_scheduled_tokens[rid]
        prompt = request.num_prompt_tokens
        if computed < prompt:
            k = self.chunks[rid] = self.chunks.get(rid, 0) + 1
            if computed + new < prompt or k > 1:
                context.append(f"prefill chunk {k} ({computed}..{computed + new} of {prompt})")
        else:
            context.append("decode")
        if cow := [b for g in groups for b in (g or ()) if b in self.cow]:  # ordered this step
            context.append(f"copy-on-write target block {cow[0]} (copied from {self.cow[cow[0]]})")
        lora = getattr(request, "lora_request", None)
        namespace = namespace_of(salt=getattr(request, "cache_salt", None),
                                 adapter=getattr(lora, "lora_name", None) if lora else None)
        shares = []
        for k, led in enumerate(self.ledgers):
            if led is None:
                shares.append(None)
                continue
            given = list(groups[k]) if k < len(groups) else []
            # a new or resumed request's table is its own; otherwise appended, as the workers do
            table = given if resumed is None or resumed else led.table_of(rid) + given
            where = context if len(self.ledgers) == 1 else [
                *context, f"KV cache group {k}: " + (f"sliding window {led.window}" if led.window
                                                      else "full attention")]
            shares.append(Scheduled(rid, table, computed, new, request.all_token_ids, namespace,
                                    tuple(where)))
        return shares

    def finishing(self, request_ids, status) -> None:
        """finish_requests() from outside the scheduler: an abort marks the writer cancelled."""
        if "ABORT" in str(status).upper():
            ids = [request_ids] if isinstance(request_ids, str) else list(request_ids or ())
            self.cancelled.update(ids)

    def reset(self) -> None:
        """The scheduler reported its prefix cache reset (a lie is the fault `reset-noop`)."""
        for led in {id(led.store): led for led in self.ledgers if led is not None}.values():
            led.reset()  # once per store of slots (a hybrid's groups share one)

    def _forget(self, rid: str) -> None:
        self.requests.pop(rid, None)
        self.waiting_since.pop(rid, None)
        self.chunks.pop(rid, None)
        self.cancelled.discard(rid)


def install(path: str):
    """Hook a sentinel writing to `path` into this process's vLLM scheduler; returns undo().
    RuntimeError when this vLLM's scheduler output lacks what the sentinel reads."""
    unseen = check_version()
    from vllm.v1.core.sched.scheduler import Scheduler

    from kvdiag.engines.patching import both, swap_attr

    sentinel = VllmSentinel(path)
    sentinel.unseen = unseen
    schedule, update, finish, reset = (Scheduler.schedule, Scheduler.update_from_output,
                                       Scheduler.finish_requests, Scheduler.reset_prefix_cache)

    def schedule_watched(self, *args, **kwargs):
        output = schedule(self, *args, **kwargs)
        sentinel.scheduled(self, output)
        return output

    def update_watched(self, scheduler_output, model_runner_output, *args, **kwargs):
        sentinel.step(self, scheduler_output, model_runner_output)
        return update(self, scheduler_output, model_runner_output, *args, **kwargs)

    def finish_watched(self, request_ids, finished_status, *args, **kwargs):
        sentinel.finishing(request_ids, finished_status)
        return finish(self, request_ids, finished_status, *args, **kwargs)

    def reset_watched(self, *args, **kwargs):
        if done := reset(self, *args, **kwargs):
            sentinel.reset()
        return done

    return both(swap_attr(Scheduler, "schedule", schedule_watched),
                swap_attr(Scheduler, "update_from_output", update_watched),
                swap_attr(Scheduler, "finish_requests", finish_watched),
                swap_attr(Scheduler, "reset_prefix_cache", reset_watched))
