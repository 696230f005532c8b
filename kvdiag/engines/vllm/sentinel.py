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
    Request                 all_token_ids, cache_salt, lora_request (the namespace)

It never reads block hashes, ref counts or the free queue. Hooked at update_from_output (the
step's sampled tokens are not appended yet, every token it wrote is known, with or without
async scheduling); requests are remembered from schedule() on, so one aborted in between is
still checked. Only the first KV cache group (full attention) is followed: a hybrid model's
other groups are counted as unchecked, never passed.

    undo = install("reports/run/sentinel.jsonl")   # from kvdiag's vLLM plugin
"""

from __future__ import annotations

import dataclasses
import sys

from kvdiag.sentinel.facts import Scheduled, namespace_of
from kvdiag.sentinel.ledger import Ledger
from kvdiag.sentinel.log import SentinelLog

# what the sentinel reads; a vLLM whose SchedulerOutput lacks one is refused, not half-checked
NEEDED = {
    "SchedulerOutput": ("scheduled_new_reqs", "scheduled_cached_reqs", "num_scheduled_tokens",
                        "finished_req_ids"),
    "NewRequestData": ("req_id", "block_ids", "num_computed_tokens"),
    "CachedRequestData": ("req_ids", "new_block_ids", "num_computed_tokens"),
}


def check_version() -> None:
    """RuntimeError naming vLLM's version when its scheduler output lacks what is read."""
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


class VllmSentinel:
    """The ledger fed from one vLLM scheduler."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.ledger: Ledger | None = None
        self.log: SentinelLog | None = None
        self.requests: dict[str, object] = {}  # rid -> vLLM Request, from schedule() on
        self.waiting_since: dict[str, int] = {}  # rid -> the step it was first seen waiting
        self.chunks: dict[str, int] = {}  # rid -> prefill chunks so far
        self.cancelled: set[str] = set()
        self.step_no = 0

    def _start(self, scheduler) -> None:
        vllm = sys.modules.get("vllm")  # the engine's own process has it (a test may not)
        block_size = scheduler.block_size if hasattr(scheduler, "block_size") else \
            scheduler.cache_config.block_size
        self.log = SentinelLog(self.path, {"engine": "vllm", "version": getattr(vllm, "__version__", None),
                                           "block_size": block_size})
        self.ledger = Ledger(block_size, self.log.finding)

    def scheduled(self, scheduler, output) -> None:
        """After schedule(): remember the requests it scheduled, and who is waiting."""
        self.step_no += 1
        for rid in output.num_scheduled_tokens:
            if rid not in self.requests and rid in scheduler.requests:
                self.requests[rid] = scheduler.requests[rid]
        for request in scheduler.waiting:
            self.waiting_since.setdefault(request.request_id, self.step_no)

    def step(self, scheduler, output) -> None:
        """Before update_from_output(): the step the workers just ran."""
        if self.ledger is None:
            self._start(scheduler)
        ledger = self.ledger
        for rid in output.finished_req_ids:
            ledger.finish(rid, cancelled=rid in self.cancelled)
            self._forget(rid)
        for rid in getattr(output, "preempted_req_ids", None) or ():
            ledger.preempt(rid)
            self.chunks.pop(rid, None)
        for block in getattr(output, "new_block_ids_to_zero", None) or ():
            ledger.zero(block)
        for copy in getattr(output, "kv_cache_block_copies", None) or ():
            ledger.copy(copy[0], copy[1])
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
        ledger.step([it for it in items if it is not None])
        self.log.counters(ledger.counters)

    def _item(self, rid: str, block_ids, resumed: bool | None, computed: int, output,
              context: list[str]) -> Scheduled | None:
        request = self.requests.get(rid)
        if request is None:
            self.ledger.counters.unchecked += 1
            return None
        ledger = self.ledger
        groups = block_ids or ()
        if resumed is None or resumed:  # a table of its own: a new request, or a resumed one
            table = list(groups[0]) if groups else []
        else:  # appended, as the workers append it
            table = ledger.table_of(rid) + (list(groups[0]) if groups else [])
        if len(groups) > 1:
            ledger.counters.unchecked += len(groups) - 1  # a hybrid model's other groups
        new = output.num_scheduled_tokens[rid]
        prompt = request.num_prompt_tokens
        if computed < prompt:
            k = self.chunks[rid] = self.chunks.get(rid, 0) + 1
            if computed + new < prompt or k > 1:
                context.append(f"prefill chunk {k} ({computed}..{computed + new} of {prompt})")
        else:
            context.append("decode")
        lora = getattr(request, "lora_request", None)
        namespace = namespace_of(getattr(request, "cache_salt", None),
                                 getattr(lora, "lora_name", None) if lora else None)
        return Scheduled(rid, table, computed, new, request.all_token_ids, namespace, tuple(context))

    def finishing(self, request_ids, status) -> None:
        """finish_requests() from outside the scheduler: an abort marks the writer cancelled."""
        if "ABORT" in str(status).upper():
            ids = [request_ids] if isinstance(request_ids, str) else list(request_ids or ())
            self.cancelled.update(ids)

    def _forget(self, rid: str) -> None:
        self.requests.pop(rid, None)
        self.waiting_since.pop(rid, None)
        self.chunks.pop(rid, None)
        self.cancelled.discard(rid)


def install(path: str):
    """Hook a sentinel writing to `path` into this process's vLLM scheduler; returns undo().
    RuntimeError when this vLLM's scheduler output lacks what the sentinel reads."""
    check_version()
    from vllm.v1.core.sched.scheduler import Scheduler

    from kvdiag.engines.patching import both, swap_attr

    sentinel = VllmSentinel(path)
    schedule, update, finish = (Scheduler.schedule, Scheduler.update_from_output,
                                Scheduler.finish_requests)

    def schedule_watched(self, *args, **kwargs):
        output = schedule(self, *args, **kwargs)
        sentinel.scheduled(self, output)
        return output

    def update_watched(self, scheduler_output, model_runner_output, *args, **kwargs):
        sentinel.step(self, scheduler_output)
        return update(self, scheduler_output, model_runner_output, *args, **kwargs)

    def finish_watched(self, request_ids, finished_status, *args, **kwargs):
        sentinel.finishing(request_ids, finished_status)
        return finish(self, request_ids, finished_status, *args, **kwargs)

    return both(swap_attr(Scheduler, "schedule", schedule_watched),
                swap_attr(Scheduler, "update_from_output", update_watched),
                swap_attr(Scheduler, "finish_requests", finish_watched))
