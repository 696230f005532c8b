"""The SGLang sentinel's reading of batches, without SGLang: batches with the same field
names as SGLang's ScheduleBatch, launched and processed in the order overlap scheduling uses
(batch t+1 launched before batch t's result is processed), a retraction in between, and a
request that finishes. The real scheduler is read in tests/kvdiag/engines/test_sglang_live.py."""

from __future__ import annotations

from array import array
from types import SimpleNamespace as NS

import torch

from kvdiag.engines.sglang.sentinel import SglangSentinel


class Mode:
    def __init__(self, extend: bool) -> None:
        self.extend = extend

    def is_idle(self):
        return False

    def is_extend(self):
        return self.extend

    def is_decode(self):
        return not self.extend


def req(rid, prompt):
    return NS(rid=rid, origin_input_ids=list(prompt), output_ids=array("q"), extra_key=None,
              lora_id=None, finished_reason=None, finished=lambda: False)


def batch(reqs, rows, seq_lens, prefix=None, extend=None):
    return NS(reqs=reqs, forward_mode=Mode(prefix is not None), seq_lens_cpu=torch.tensor(seq_lens),
              req_pool_indices_cpu=torch.tensor(rows), req_pool_indices=None,
              prefix_lens=prefix, extend_lens=extend)


def test_batches_are_checked_in_launch_order_and_a_retraction_in_between(tmp_path):
    pool = torch.zeros((4, 64), dtype=torch.int64)
    scheduler = NS(req_to_token_pool=NS(req_to_token=pool))
    s = SglangSentinel(str(tmp_path / "s.jsonl"))
    a = req("a", range(10))
    pool[0, :10] = torch.arange(100, 110)
    b1 = batch([a], [0], [10], prefix=[0], extend=[10])
    s.launched(scheduler, b1)
    a.output_ids.append(7)
    pool[0, 10] = 200
    b2 = batch([a], [0], [11])  # decode, launched before b1's result (overlap)
    s.launched(scheduler, b2)
    s.processed(b1)
    assert s.ledger.counters.steps == 1
    s.processed(b2)
    c = s.ledger.counters
    assert (c.steps, c.writes, c.reads, c.foreign + c.unwritten + c.overwrite) == (2, 11, 21, 0)
    # a retracted: its slots go to b, which writes them; a resumes elsewhere, recomputed
    s.retracted_now([a])
    bb = req("b", range(50, 60))
    pool[1, :10] = torch.arange(100, 110)
    b3 = batch([bb], [1], [10], prefix=[0], extend=[10])
    s.launched(scheduler, b3)
    s.processed(b3)
    assert s.ledger.counters.overwrite == 0  # a held nothing once retracted
    # a stale row: c is told a prefix of 10 that b's K/V now fills
    cc = req("c", range(11))
    pool[2, :11] = torch.arange(100, 111)
    b4 = batch([cc], [2], [11], prefix=[10], extend=[1])
    s.launched(scheduler, b4)
    found = []
    s.ledger.report = found.append
    s.processed(b4)
    assert [(f.kind, f.request, f.writers, f.context) for f in found] == [
        ("foreign", "c", ["b"], ["prefix-cache hit of 10 tokens"])]
