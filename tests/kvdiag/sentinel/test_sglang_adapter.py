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


def req(rid, prompt, cache_salt=None):
    return NS(rid=rid, origin_input_ids=list(prompt), output_ids=array("q"), extra_key=None,
              cache_salt=cache_salt, lora_id=None, finished_reason=None, finished=lambda: False)


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
    s.processed()
    assert s.ledger.counters.steps == 1
    s.processed()
    c = s.ledger.counters
    assert (c.steps, c.writes, c.reads, c.foreign + c.unwritten + c.overwrite) == (2, 11, 21, 0)
    # a retracted: its slots go to b, which writes them; a resumes elsewhere, recomputed
    s.retracted_now([a])
    bb = req("b", range(50, 60))
    pool[1, :10] = torch.arange(100, 110)
    b3 = batch([bb], [1], [10], prefix=[0], extend=[10])
    s.launched(scheduler, b3)
    s.processed()
    assert s.ledger.counters.overwrite == 0  # a held nothing once retracted
    # a stale row: c is told a prefix of 10 that b's K/V now fills
    cc = req("c", range(11))
    pool[2, :11] = torch.arange(100, 111)
    b4 = batch([cc], [2], [11], prefix=[10], extend=[1])
    s.launched(scheduler, b4)
    found = []
    s.ledger.report = found.append
    s.processed()
    assert [(f.kind, f.request, f.writers, f.context) for f in found] == [
        ("foreign", "c", ["b"], ["prefix-cache hit of 10 tokens"])]


def test_a_finished_request_leaves_whatever_batch_it_was_in(tmp_path):
    """Overlap scheduling: batch t+1 is launched with a request that batch t's result then
    finishes; SGLang drops its token but the forward pass wrote its K/V (checked, then let
    go), and its slots go to the next request without any overwrite."""
    pool = torch.zeros((4, 64), dtype=torch.int64)
    scheduler = NS(req_to_token_pool=NS(req_to_token=pool))
    s = SglangSentinel(str(tmp_path / "s.jsonl"))
    found = []
    a = req("a", range(6))
    pool[0, :6] = torch.arange(10, 16)
    b1 = batch([a], [0], [6], prefix=[0], extend=[6])
    s.launched(scheduler, b1)
    pool[0, 6] = 16
    a.output_ids.append(3)
    b2 = batch([a], [0], [7])  # launched before b1's result said a is done
    s.launched(scheduler, b2)
    s.processed()
    s.ledger.report = found.append
    a.finished_reason, a.finished = NS(), (lambda: True)
    s.left()
    s.processed()  # a finished: its write is recorded all the same, then it leaves
    s.left()
    b = req("b", range(40, 47))
    pool[1, :7] = torch.arange(10, 17)  # a's slots, handed to b
    b3 = batch([b], [1], [7], prefix=[0], extend=[7])
    s.launched(scheduler, b3)
    s.processed()
    assert found == [] and s.ledger.counters.writes == 6 + 1 + 7 and "a" not in s.ledger.live


def test_a_cached_prefix_under_another_cache_salt_is_foreign(tmp_path):
    """SGLang keeps a request's cache_salt apart from its extra_key (the LoRA's): the
    sentinel keys by both, so a prefix served across salts (`salt-ignored`) reads foreign."""
    pool = torch.zeros((2, 16), dtype=torch.int64)
    scheduler = NS(req_to_token_pool=NS(req_to_token=pool))
    s = SglangSentinel(str(tmp_path / "s.jsonl"))
    pool[0, :8] = pool[1, :8] = torch.arange(100, 108)  # b's row maps a's 8 slots
    s.launched(scheduler, batch([req("a", range(8), "tenant-a")], [0], [8], prefix=[0], extend=[8]))
    s.processed()
    found = []
    s.ledger.report = found.append
    pool[1, 8] = 108
    s.launched(scheduler, batch([req("b", range(9), "tenant-b")], [1], [9], prefix=[8], extend=[1]))
    s.processed()
    assert [(f.kind, f.request, f.writers, f.count) for f in found] == [("foreign", "b", ["a"], 8)]
