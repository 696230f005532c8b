"""The sentinel inside SGLang's scheduler process: every batch it runs, read as the model
runner reads it, fed to the ledger (kvdiag.sentinel.ledger) in the order the batches ran.

What it reads, per request of a batch (all of it what the forward pass is handed, or the
request's own):
    req_to_token[req_pool_indices, :seq_len]  the slots its attention reads (token-granular: the
                                           ledger's block is one slot, whatever the page size)
    prefix_lens, extend_lens (extend)      the positions already there and those written
    seq_lens (decode)                      one position written, the last
    origin_input_ids + output_ids          its tokens; cache_salt, lora_id and extra_key
    retract_decode()                       requests that lost their slots and will recompute
    finished_reason                        a request that left (FINISH_ABORT: cancelled)
    flush_cache()                          a flush it reports done: what was cached is unwritten

With `weigh`, each sampled token's attention over its context (attention.py, measured in this
process, where SGLang's model runs) is weighed by the positions read wrong: the request's
attention leakage (kvdiag.sentinel.leakage).

It never reads the radix tree, its locks or the allocator's free list: those are the code
under test. The batch's geometry is taken when run_batch() starts and checked when its result
is processed (every token it wrote is known then, with or without overlap scheduling), in
the order the batches ran (SGLang processes results in launch order, on a copy of each
batch); a retraction is applied in that order too.

    undo = install("reports/run/sentinel.jsonl")   # from kvdiag's SGLang plugin
"""

from __future__ import annotations

import sys
from collections import deque

from kvdiag.engines.sglang import attention  # torch-free at import: its hooks import SGLang
from kvdiag.sentinel.facts import Scheduled, namespace_of
from kvdiag.sentinel.leakage import Leakage
from kvdiag.sentinel.ledger import Ledger
from kvdiag.sentinel.log import SentinelLog


class SglangSentinel:
    """The ledger fed from one SGLang scheduler."""

    def __init__(self, path: str, weigh: bool = False) -> None:
        self.path = path
        self.weigh = weigh  # attention.py weighs each sampled token's attention
        self.leakage: Leakage | None = None
        self.ledger: Ledger | None = None
        self.log: SentinelLog | None = None
        self.pending: deque = deque()  # ("step", items, unchecked) | ("retract", rids)
        self.chunks: dict[str, int] = {}
        self.retracted: set[str] = set()
        self.reqs: dict = {}  # rid -> SGLang Req, for every request the ledger holds

    def _start(self) -> None:
        sglang = sys.modules.get("sglang")  # the engine's own process has it (a test may not)
        self.log = SentinelLog(self.path, {"engine": "sglang",
                                           "version": getattr(sglang, "__version__", None),
                                           "block_size": 1, "attention": self.weigh})
        # SGLang remaps a running request's row to the tree's slots when it frees the
        # request's own duplicate of a prefix (cache_unfinished_req), after the next batch
        # was launched with the old row: reads are judged, writes over such slots are not
        self.ledger = Ledger(1, self.log.finding, overwrites=False)
        self.leakage = Leakage(self.log.leakage) if self.weigh else None

    def launched(self, scheduler, batch) -> None:
        """run_batch() starts: take what the forward pass reads. Every launch queues one step
        (an idle batch an empty one): SGLang processes results in launch order, each exactly
        once, and hands process_batch_result() a copy of the batch, so steps pair by order."""
        mode = batch.forward_mode
        if batch.reqs is None or not len(batch.reqs) or mode.is_idle():
            self.pending.append(("step", [], 0))
            return
        extend = mode.is_extend()
        if not extend and not mode.is_decode():
            self.pending.append(("step", [], len(batch.reqs)))  # counted unchecked
            return
        rows = scheduler.req_to_token_pool.req_to_token
        seq_lens = batch.seq_lens_cpu.tolist()
        pool = (batch.req_pool_indices_cpu if batch.req_pool_indices_cpu is not None
                else batch.req_pool_indices).tolist()
        items = []
        for i, req in enumerate(batch.reqs):
            end = int(seq_lens[i])
            if extend:
                computed, new = int(batch.prefix_lens[i]), int(batch.extend_lens[i])
            else:
                computed, new = end - 1, 1
            table = rows[pool[i], :end].tolist()
            # it samples a token unless it is a prefill chunk short of its known tokens
            samples = not extend or end >= len(req.origin_input_ids) + len(req.output_ids)
            items.append((req, table, computed, new, self._context(req, computed, new, extend),
                          (pool[i], end), samples))
        self.pending.append(("step", items, 0))

    def _context(self, req, computed: int, new: int, extend: bool) -> tuple[str, ...]:
        context = []
        prompt = len(req.origin_input_ids)
        if req.rid in self.retracted:
            context.append("after retraction")
        if extend and computed < prompt:
            k = self.chunks[req.rid] = self.chunks.get(req.rid, 0) + 1
            if k == 1 and computed:
                context.append(f"prefix-cache hit of {computed} tokens")
            if computed + new < prompt or k > 1:
                context.append(f"prefill chunk {k} ({computed}..{computed + new} of {prompt})")
        else:
            context.append("decode" if new == 1 else f"extend {computed}..{computed + new}")
        return tuple(context)

    def retracted_now(self, reqs) -> None:
        rids = [r.rid for r in reqs]
        self.retracted.update(rids)
        self.pending.append(("retract", rids))

    def processed(self) -> None:
        """A batch's result is about to be processed: check the oldest launched step, and the
        retractions queued before it. A request that finished since its batch was launched
        (overlap scheduling launches the next batch first) is checked all the same: SGLang
        drops its token, but the forward pass wrote its K/V, and the tree may serve it
        (left() lets it go after)."""
        if self.ledger is None:
            self._start()
        while self.pending:
            entry = self.pending.popleft()
            if entry[0] == "retract":
                for rid in entry[1]:
                    self.ledger.preempt(rid)
                    self.chunks.pop(rid, None)
                continue
            _, items, unchecked = entry
            self.ledger.counters.unchecked += unchecked
            if items:
                self.ledger.step([self._scheduled(*item[:5]) for item in items])
                self.reqs.update((item[0].rid, item[0]) for item in items)
                if self.leakage is not None:
                    self._weigh(items)
            if self.leakage is not None:
                self.ledger.counters.weighing = attention.WEIGH.seconds  # in this process, so far
            self.log.counters(self.ledger.counters)
            return

    def _weigh(self, items) -> None:
        """Each token the step sampled, weighed by its attention (attention.py) over the
        positions the ledger found it read wrong."""
        for req, *_, row, samples in items:
            weights = attention.take(*row)  # taken either way: a row and length may come again
            if samples:
                self.leakage.token(req.rid, self.ledger.bad_now.get(req.rid), weights)

    @staticmethod
    def _scheduled(req, table, computed, new, context) -> Scheduled:
        tokens = list(req.origin_input_ids) + list(req.output_ids)
        return Scheduled(req.rid, table, computed, new, tokens,
                         namespace_of(salt=getattr(req, "cache_salt", None),
                                      adapter=getattr(req, "lora_id", None),
                                      extra=getattr(req, "extra_key", None)),
                         context)

    def left(self) -> None:
        """After each result: every request the ledger holds that has finished leaves (its
        slots are the pool's again), whichever batch it was in, an abort included."""
        for rid, req in list(self.reqs.items()):
            if req.finished():
                cancelled = type(req.finished_reason).__name__ == "FINISH_ABORT"
                self.ledger.finish(rid, cancelled)
                if self.leakage is not None:
                    self.leakage.finish(rid)
                del self.reqs[rid]
                self.chunks.pop(rid, None)
                self.retracted.discard(rid)


def install(path: str, weigh: bool = False):
    """Hook a sentinel writing to `path` into this process's SGLang scheduler; returns undo().
    `weigh`: attention.py is installed, so sampled tokens' attention is weighed (leakage).
    RuntimeError when this SGLang lacks what the sentinel reads."""
    import sglang
    from sglang.srt.managers.schedule_batch import ScheduleBatch
    from sglang.srt.managers.scheduler import Scheduler

    from kvdiag.engines.patching import both, swap_attr

    needed = [(Scheduler, "run_batch"), (Scheduler, "process_batch_result"),
              (ScheduleBatch, "retract_decode")]
    missing = [f"{c.__name__}.{n}" for c, n in needed if n not in c.__dict__]
    if missing:
        raise RuntimeError(f"kvdiag sentinel: SGLang {sglang.__version__} lacks {', '.join(missing)}: "
                           "refusing to run a sentinel that cannot see")
    sentinel = SglangSentinel(path, weigh)
    run, process, retract = Scheduler.run_batch, Scheduler.process_batch_result, ScheduleBatch.retract_decode
    flush = Scheduler.flush_cache

    def run_watched(self, batch, *args, **kwargs):
        sentinel.launched(self, batch)
        return run(self, batch, *args, **kwargs)

    def process_watched(self, batch, *args, **kwargs):
        sentinel.processed()
        out = process(self, batch, *args, **kwargs)
        sentinel.left()
        return out

    def retract_watched(self, *args, **kwargs):
        out = retract(self, *args, **kwargs)
        sentinel.retracted_now(out[0])
        return out

    def flush_watched(self, *args, **kwargs):  # /flush_cache: a reset it reports done
        if (done := flush(self, *args, **kwargs)) and sentinel.ledger is not None:
            sentinel.ledger.reset()
        return done

    return both(swap_attr(Scheduler, "run_batch", run_watched),
                swap_attr(Scheduler, "process_batch_result", process_watched),
                swap_attr(ScheduleBatch, "retract_decode", retract_watched),
                swap_attr(Scheduler, "flush_cache", flush_watched))
