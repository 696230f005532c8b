"""The vLLM sentinel's reading of scheduler outputs, without vLLM: steps built with the same
field names as vLLM's SchedulerOutput (v1), checked for what the workers would do with them
(a new request's table, an appended table, a resumed request's own table, zeroed blocks,
finished requests) and what a planted fault looks like through them. The real scheduler is
read in the live tests (tests/kvdiag/engines/test_vllm_lifecycle_live.py)."""

from __future__ import annotations

import json
from types import SimpleNamespace as NS

from kvdiag.engines.vllm.sentinel import VllmSentinel

BS = 4


def request(rid, tokens, prompt=None, salt=None):
    return NS(request_id=rid, all_token_ids=list(tokens), num_prompt_tokens=prompt or len(tokens),
              cache_salt=salt, lora_request=None)


def output(new=(), cached=(), finished=(), preempted=(), zero=None, copies=None):
    """new: (rid, table, computed, scheduled); cached: (rid, new blocks, computed, scheduled,
    resumed)."""
    return NS(scheduled_new_reqs=[NS(req_id=r, block_ids=(t,), num_computed_tokens=c) for r, t, c, _ in new],
              scheduled_cached_reqs=NS(req_ids=[c[0] for c in cached],
                                       new_block_ids=[(c[1],) for c in cached],
                                       num_computed_tokens=[c[2] for c in cached],
                                       resumed_req_ids={c[0] for c in cached if c[4]}),
              num_scheduled_tokens={**{r: n for r, _, _, n in new}, **{c[0]: c[3] for c in cached}},
              finished_req_ids=set(finished), preempted_req_ids=set(preempted),
              new_block_ids_to_zero=zero, kv_cache_block_copies=copies)


class Scheduler:
    block_size = BS

    def __init__(self, *requests):
        self.requests = {r.request_id: r for r in requests}
        self.waiting = []


def run(sentinel, scheduler, out):
    sentinel.scheduled(scheduler, out)
    sentinel.step(scheduler, out)


def test_tables_follow_the_workers_and_a_healthy_run_reads_clean(tmp_path):
    a, b = request("a", range(10)), request("b", [*range(8), 50, 51])
    sched = Scheduler(a, b)
    s = VllmSentinel(str(tmp_path / "s.jsonl"))
    run(s, sched, output(new=[("a", [3, 5, 6], 0, 10)]))
    a.all_token_ids.append(99)
    run(s, sched, output(new=[("b", [3, 5, 9], 8, 2)], cached=[("a", [], 10, 1, False)]))
    a.all_token_ids += [98, 97]
    run(s, sched, output(cached=[("a", [7], 11, 1, False)], finished=["b"]))  # appended
    assert s.ledger.table_of("a") == [3, 5, 6, 7]
    c = s.ledger.counters
    assert (c.foreign, c.unwritten, c.overwrite) == (0, 0, 0) and c.reads == 10 + 10 + 11 + 12


def test_stale_progress_after_preemption_is_an_unwritten_read_in_the_resumed_event(tmp_path):
    a = request("a", range(12), prompt=10)
    sched = Scheduler(a)
    s, found = VllmSentinel(str(tmp_path / "s.jsonl")), []
    run(s, sched, output(new=[("a", [1, 2, 3], 0, 10)]))
    s.ledger.report = found.append
    run(s, sched, output(preempted=["a"]))
    # resumed into fresh blocks with its progress kept: it computes one token, reads the rest
    run(s, sched, output(cached=[("a", [8, 9, 10], 11, 1, True)]))
    (f,) = found
    assert f.kind == "unwritten" and f.positions == [(0, 11)] and "resumed after preemption" in f.context


def test_a_copy_from_the_wrong_block_is_foreign_in_the_copy_on_write_event(tmp_path):
    """A partial-block hit served through a copy the scheduler ordered from another
    request's block: the reader's finding names the copy it read."""
    def served(source: int) -> list:
        a, c = request("a", range(8)), request("c", range(50, 58))
        sched = Scheduler(a, request("b", [*range(6), 90, 91], prompt=8), c)
        s, found = VllmSentinel(str(tmp_path / f"{source}.jsonl")), []
        run(s, sched, output(new=[("a", [1, 2], 0, 8), ("c", [3, 4], 0, 8)]))
        s.ledger.report = found.append
        run(s, sched, output(new=[("b", [1, 5], 6, 2)], copies=[(source, 5)]))
        return found

    assert served(2) == []  # a's block 2: the same tokens at the same positions
    (f,) = served(4)  # FAULT: c's block 4
    assert f.kind == "foreign" and f.positions == [(4, 6)]
    assert "copy-on-write target block 5 (copied from 4)" in f.context


def test_a_zeroed_block_under_a_reader_and_a_finished_writer(tmp_path):
    a, b = request("a", range(8)), request("b", [*range(4), 7, 7, 7, 7])
    sched = Scheduler(a, b)
    s, found = VllmSentinel(str(tmp_path / "s.jsonl")), []
    run(s, sched, output(new=[("a", [1, 2], 0, 8)]))
    s.ledger.report = found.append
    a.all_token_ids.append(5)
    run(s, sched, output(cached=[("a", [4], 8, 1, False)], zero=[2]))  # block 2 zeroed under a
    assert [(f.kind, f.positions) for f in found] == [("unwritten", [(4, 8)])]


def test_a_vllm_whose_scheduler_output_lacks_a_field_is_refused_by_version(monkeypatch):
    """Never a silent sentinel: a SchedulerOutput without what is read stops the plugin,
    naming the vLLM version (a stand-in module: the field set is what is checked)."""
    import dataclasses
    import sys
    import types

    import pytest

    from kvdiag.engines.vllm.sentinel import check_version

    @dataclasses.dataclass
    class SchedulerOutput:  # no num_scheduled_tokens
        scheduled_new_reqs: list
        scheduled_cached_reqs: object
        finished_req_ids: set

    @dataclasses.dataclass
    class NewRequestData:
        req_id: str
        block_ids: tuple
        num_computed_tokens: int

    @dataclasses.dataclass
    class CachedRequestData:
        req_ids: list
        new_block_ids: list
        num_computed_tokens: list
        resumed_req_ids: set

    output = types.ModuleType("vllm.v1.core.sched.output")
    output.SchedulerOutput, output.NewRequestData, output.CachedRequestData = (
        SchedulerOutput, NewRequestData, CachedRequestData)
    vllm = types.ModuleType("vllm")
    vllm.__version__ = "9.9.9"
    modules = {"vllm": vllm, "vllm.v1": types.ModuleType("vllm.v1"),
               "vllm.v1.core": types.ModuleType("vllm.v1.core"),
               "vllm.v1.core.sched": types.ModuleType("vllm.v1.core.sched"),
               "vllm.v1.core.sched.output": output}
    modules["vllm.v1.core.sched"].output = output
    for name, module in modules.items():
        monkeypatch.setitem(sys.modules, name, module)
    with pytest.raises(RuntimeError, match=r"vLLM 9\.9\.9.*SchedulerOutput\.num_scheduled_tokens"):
        check_version()

    @dataclasses.dataclass
    class Complete(SchedulerOutput):  # what is read, but no zeroing and no copy orders
        num_scheduled_tokens: dict
        preempted_req_ids: set

    output.SchedulerOutput = Complete
    assert check_version() == ["zeroed blocks (new_block_ids_to_zero)",
                               "copy-on-write copies (kv_cache_block_copies)"]


def test_a_pass_names_the_orders_this_vllm_does_not_hand_over(tmp_path):
    """The start line's `unseen` reaches the summary's block and the PASS sentence."""
    from kvdiag.runners.live.sentinel import observe
    from kvdiag.verdicts.sentinel import sentinel_covered

    a = request("a", range(10))
    s = VllmSentinel(str(tmp_path / "s.jsonl"))
    s.unseen = ["zeroed blocks (new_block_ids_to_zero)"]
    run(s, Scheduler(a), output(new=[("a", [3, 5, 6], 0, 10)]))
    block, _ = observe(tmp_path / "s.jsonl", 0)  # (waits out the counters' half second)
    assert block.unseen == ["zeroed blocks (new_block_ids_to_zero)"] and block.reads == 10
    assert "hands its workers no zeroed blocks (new_block_ids_to_zero)" in sentinel_covered(block)


# a hybrid model's KV cache groups, as vLLM's kv_cache_config names their specs
class FullAttentionSpec(NS):
    pass


class SlidingWindowSpec(NS):
    pass


class MambaSpec(NS):
    pass


class Hybrid(Scheduler):
    def __init__(self, *requests, specs):
        super().__init__(*requests)
        self.kv_cache_config = NS(kv_cache_groups=[NS(kv_cache_spec=s) for s in specs])


def hybrid_output(new=(), cached=()):
    """new: (rid, tables per group, computed, scheduled); cached: (rid, new blocks per group,
    computed, scheduled)."""
    return NS(scheduled_new_reqs=[NS(req_id=r, block_ids=t, num_computed_tokens=c) for r, t, c, _ in new],
              scheduled_cached_reqs=NS(req_ids=[c[0] for c in cached], new_block_ids=[c[1] for c in cached],
                                       num_computed_tokens=[c[2] for c in cached], resumed_req_ids=set()),
              num_scheduled_tokens={**{r: n for r, _, _, n in new}, **{c[0]: c[3] for c in cached}},
              finished_req_ids=set(), preempted_req_ids=set())


def test_a_hybrid_model_is_followed_in_every_attention_group(tmp_path):
    """Full attention beside a sliding window of 6: the window's out-of-window blocks are
    null in a hit's table and are never read; a block the window needs that holds another
    request's K/V is foreign, named in its group; a group of another kind is unchecked."""
    a, b, c = request("a", range(12)), request("b", [*range(12), 40]), request("c", [*range(12), 41])
    specs = [FullAttentionSpec(block_size=BS), SlidingWindowSpec(block_size=BS, sliding_window=6),
             MambaSpec(block_size=BS)]
    sched = Hybrid(a, b, c, specs=specs)
    s = VllmSentinel(str(tmp_path / "s.jsonl"))
    run(s, sched, hybrid_output(new=[("a", ([1, 2, 3], [4, 5, 6], [9]), 0, 12)]))
    # b hits all 12 tokens: full attention shares a's blocks, the window a null block for 0..3
    run(s, sched, hybrid_output(new=[("b", ([1, 2, 3, 7], [0, 5, 6, 8], [10]), 12, 1)]))
    assert [len(s.ledgers), s.ledgers[2]] == [3, None] and s.ledger.counters.foreign == 0
    full, window = s.ledgers[0].counters, s.ledgers[1].counters
    assert (full.reads, window.reads) == (12 + 13, 12 + 6)  # the window reads positions 7..12
    # c's window table points at a's full-attention block 2 for positions 4..7: foreign
    run(s, sched, hybrid_output(new=[("c", ([1, 2, 3, 11], [0, 2, 6, 12], [13]), 12, 1)]))
    lines = [json.loads(x) for x in (tmp_path / "s.jsonl").read_text().splitlines()]
    found = [x for x in lines if x.get("type") == "finding"]
    assert [(x["kind"], x["request"], x["positions"], x["writers"]) for x in found] == [
        ("foreign", "c", [[7, 8]], ["a"])]
    assert "KV cache group 1: sliding window 6" in found[0]["context"]
    assert window.unchecked == 0 and s.skipped.unchecked == 3  # the state group, each step
