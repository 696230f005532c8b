"""The sentinel on the reference engine (`kvdiag serve --sentinel PATH`): the same ledger and
file as inside vLLM, fed from the reference scheduler's output, so all engines answer the
same question the same way. The engine keeps a ledger of its own (kv_cache.py), which the
tests hold this one against.

    sentinel = ReferenceSentinel(engine, "sentinel.jsonl")   # engine.observers gets it
"""

from __future__ import annotations

from kvdiag.sentinel.facts import Scheduled, namespace_of
from kvdiag.sentinel.ledger import Ledger
from kvdiag.sentinel.log import SentinelLog


def request_name(seq) -> str:
    """How a finding names a reference sequence: the tag its caller gave (the serve layer's
    request id), else its seq_id."""
    return str(seq.tag) if seq.tag is not None else f"seq-{seq.seq_id}"


class ReferenceSentinel:
    def __init__(self, engine, path=None, report=None) -> None:
        """Watch `engine` (a reference_engine LLMEngine): findings go to `report(finding)`,
        and with `path`, to a sentinel file."""
        from reference_engine import __version__

        self.log = None if path is None else SentinelLog(path, {
            "engine": "reference", "version": __version__, "block_size": engine.config.block_size})
        sinks = [s for s in (report, self.log and self.log.finding) if s]
        self.ledger = Ledger(engine.config.block_size, lambda f: [s(f) for s in sinks])
        engine.observers.append(self)

    def scheduled(self, out, zeroed: bool) -> None:
        ledger = self.ledger
        for seq in out.preempted:
            ledger.preempt(request_name(seq))
        if zeroed:
            for new in out.new_blocks:
                for block in new.new_block_ids:
                    ledger.zero(block)
        items = []
        for s in out.scheduled:
            seq = s.seq
            context = ["decode"] if seq.num_computed_tokens >= seq.num_prompt_tokens else [
                f"prefill {seq.num_computed_tokens}..{seq.num_computed_tokens + s.num_tokens} "
                f"of {seq.num_prompt_tokens}"]
            if seq.stats.preemptions:
                context.append(f"after {seq.stats.preemptions} preemption(s)")
            items.append(Scheduled(request_name(seq), seq.block_table, seq.num_computed_tokens,
                                   s.num_tokens, seq.token_ids,
                                   namespace_of(salt=seq.cache_salt, adapter=seq.lora_name), tuple(context)))
        if items:
            ledger.step(items)
        if self.log is not None:
            self.log.counters(ledger.counters)

    def reset(self) -> None:
        self.ledger.reset()

    def finished(self, seq, cancelled: bool) -> None:
        self.ledger.finish(request_name(seq), cancelled)
