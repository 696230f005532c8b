"""The sentinel's ledger, step by step: what a healthy schedule reads, and each way a read
goes wrong (a block rewritten under a reader, a hit on a block nobody wrote, a namespace
crossed), the engine's zeroing and copies, preemption, and the file it writes."""

from __future__ import annotations

import json

from kvdiag.sentinel.facts import Scheduled, namespace_of
from kvdiag.sentinel.ledger import Ledger
from kvdiag.sentinel.log import SentinelLog, read_report
from kvdiag.sentinel.slots import Slots

BS = 4


def ledger():
    found = []
    return Ledger(BS, found.append), found


def test_a_healthy_shared_prefix_reads_clean():
    led, found = ledger()
    a = list(range(10))
    led.step([Scheduled("a", [3, 5, 6], 0, 10, a)])
    b = a[:8] + [99, 98]  # shares the first two blocks, computes the rest
    led.step([Scheduled("b", [3, 5, 9], 8, 2, b), Scheduled("a", [3, 5, 6], 10, 1, a + [7])])
    assert found == []
    c = led.counters
    assert (c.steps, c.requests, c.reads, c.writes) == (2, 2, 10 + 10 + 11, 10 + 2 + 1)


def test_a_block_rewritten_under_its_reader_is_an_overwrite_then_a_foreign_read():
    led, found = ledger()
    a = list(range(8))
    led.step([Scheduled("a", [1, 2], 0, 8, a)])
    led.step([Scheduled("b", [2], 0, 4, [50, 51, 52, 53])])  # block 2 handed out while a maps it
    assert [(f.kind, f.request, f.writers, f.positions) for f in found] == [
        ("overwrite", "a", ["b"], [(4, 8)])]
    led.step([Scheduled("a", [1, 2, 7], 8, 1, a + [8])])
    kinds = {(f.kind, f.request) for f in found}
    assert ("foreign", "a") in kinds
    foreign = next(f for f in found if f.kind == "foreign")
    assert foreign.writers == ["b"] and foreign.positions == [(4, 8)] and foreign.count == 4
    assert foreign.writer_context == ["live"] and foreign.context_len == 9
    led.step([Scheduled("a", [1, 2, 7], 9, 1, a + [8, 9])])  # the same positions: reported once
    assert sum(f.kind == "foreign" for f in found) == 1


def hybrid(window=6):
    """A full-attention group and a sliding-window group over one pool (vLLM's hybrid model)."""
    found, store = [], Slots()
    return (Ledger(BS, found.append, slots=store, group=0),
            Ledger(BS, found.append, slots=store, group=1, window=window), found)


def test_a_sliding_window_reads_only_its_window_and_its_freed_blocks_may_go_to_others():
    full, sliding, found = hybrid(window=6)
    a = list(range(12))
    sliding.step([Scheduled("a", [1, 2, 3], 0, 12, a)])
    # positions 0..3 fell out of a's window: block 1 is freed and handed to b, which writes it
    sliding.step([Scheduled("b", [1], 0, 4, [60, 61, 62, 63])])
    sliding.step([Scheduled("a", [1, 2, 3, 4], 12, 1, a + [12])])  # reads 7..12 only
    assert found == [] and sliding.counters.reads == 12 + 4 + 6
    # the same steps read as full attention would see another request's K/V at 0..3
    flat, seen = ledger()
    flat.step([Scheduled("a", [1, 2, 3], 0, 12, a)])
    flat.step([Scheduled("b", [1], 0, 4, [60, 61, 62, 63])])
    flat.step([Scheduled("a", [1, 2, 3, 4], 12, 1, a + [12])])
    assert [f.kind for f in seen] == ["overwrite", "foreign"]


def test_a_prefix_hit_in_a_sliding_group_reads_the_window_behind_a_null_block():
    full, sliding, found = hybrid(window=6)
    a = list(range(12))
    sliding.step([Scheduled("a", [1, 2, 3], 0, 12, a)])
    # b hits a's 12 tokens: vLLM's table holds the null block (0) for what is out of window
    sliding.step([Scheduled("b", [0, 2, 3, 5], 12, 1, a + [40])])
    assert found == []
    # a table with the null block inside the window (position 7) and a block nobody wrote
    sliding.step([Scheduled("c", [0, 0, 7, 5], 12, 1, a + [41])])
    assert [(f.kind, f.request, f.positions) for f in found] == [("unwritten", "c", [(7, 12)])]


def test_a_block_one_group_wrote_read_by_another_group_is_foreign():
    full, sliding, found = hybrid()
    a = list(range(8))
    full.step([Scheduled("a", [1, 2], 0, 8, a)])
    # block 2 freed from the full group and handed to the sliding group's b, which writes it;
    # then the full group's c hits a's prefix over block 2: the same tokens, another layer's K/V
    sliding.step([Scheduled("b", [2], 0, 4, [4, 5, 6, 7])])
    full.step([Scheduled("c", [1, 2, 9], 8, 1, a + [8], context=("prefix-cache hit of 8 tokens",))])
    (f,) = [f for f in found if f.request == "c"]
    assert (f.kind, f.positions, f.writers) == ("foreign", [(4, 8)], ["b"])
    assert full.counters.requests + sliding.counters.requests == 3  # each request counted once


def test_a_hit_on_a_block_nobody_wrote_is_unwritten():
    led, found = ledger()
    tokens = list(range(9))
    led.step([Scheduled("a", [4, 6, 8], 8, 1, tokens, context=("prefix-cache hit of 8 tokens",))])
    (f,) = found
    assert (f.kind, f.positions, f.count, f.context) == ("unwritten", [(0, 8)], 8,
                                                         ["prefix-cache hit of 8 tokens"])


def test_a_cancelled_writer_is_named_as_such():
    led, found = ledger()
    led.step([Scheduled("w", [1], 0, 4, [1, 2, 3, 4])])
    led.finish("w", cancelled=True)
    led.step([Scheduled("r", [1, 2], 4, 1, [9, 9, 9, 9, 9])])  # hits w's block: other tokens
    (f,) = found
    assert f.kind == "foreign" and f.writers == ["w"] and f.writer_context == ["cancelled"]


def test_another_namespace_is_another_prefix():
    led, found = ledger()
    tokens = list(range(5))
    led.step([Scheduled("a", [1, 2], 0, 5, tokens, namespace_of(salt="salt-a"))])
    led.step([Scheduled("b", [1, 3], 4, 1, tokens, namespace_of(salt="salt-b"))])
    assert [(f.kind, f.request, f.positions) for f in found] == [("foreign", "b", [(0, 4)])]
    assert namespace_of(salt=None, adapter="") == 0
    assert namespace_of(salt="x") != namespace_of(salt="x", adapter="lora")


def test_a_salt_named_like_an_adapter_is_another_namespace():
    """The sentinel's own key tags what each part is: a base request whose cache_salt equals
    an adapter's name reads the adapter's K/V as foreign (vLLM #44701, `tags-dropped`)."""
    led, found = ledger()
    tokens = list(range(5))
    led.step([Scheduled("lora", [1, 2], 0, 5, tokens, namespace_of(adapter="tenant-x"))])
    led.step([Scheduled("base", [1, 3], 4, 1, tokens, namespace_of(salt="tenant-x"))])
    assert [(f.kind, f.request, f.writers) for f in found] == [("foreign", "base", ["lora"])]


def test_zeroed_blocks_are_unwritten_and_copies_carry_their_writer():
    led, found = ledger()
    tokens = list(range(8))
    led.step([Scheduled("a", [1, 2], 0, 8, tokens)])
    led.copy(1, 5)
    led.step([Scheduled("b", [5, 6], 4, 1, tokens[:5])])  # reads the copy: a's K/V, same tokens
    assert found == []
    led.zero(2)
    led.step([Scheduled("a", [1, 2, 3], 8, 1, tokens + [8])])
    assert [(f.kind, f.positions) for f in found] == [("unwritten", [(4, 8)])]


def test_a_preempted_request_maps_nothing_until_it_resumes():
    led, found = ledger()
    a = list(range(8))
    led.step([Scheduled("a", [1, 2], 0, 8, a)])
    led.preempt("a")
    led.step([Scheduled("b", [2], 0, 4, [7, 7, 7, 7])])  # a's freed block reused: no overwrite
    assert found == []
    led.step([Scheduled("a", [3, 4], 0, 8, a)])  # resumed: recomputed into fresh blocks
    assert found == []
    led.step([Scheduled("c", [5, 6], 4, 4, a)])  # resumed with stale progress: reads block 5
    assert [(f.kind, f.request) for f in found] == [("unwritten", "c")]


def test_too_few_tokens_is_unchecked_not_passed():
    led, found = ledger()
    led.step([Scheduled("a", [1], 0, 4, [1, 2])])
    assert led.counters.unchecked == 1 and led.counters.reads == 0 and found == []


def test_the_file_survives_a_cut_line_and_sums_server_starts(tmp_path):
    path = tmp_path / "s.jsonl"
    for start in range(2):
        log = SentinelLog(path, {"engine": "test", "block_size": BS}, every=0)
        led = Ledger(BS, log.finding)
        led.step([Scheduled(f"a{start}", [1], 0, 4, [1, 2, 3, 4])])
        led.step([Scheduled(f"b{start}", [1, 2], 4, 1, [5, 5, 5, 5, 5])])
        log.counters(led.counters)
    with open(path, "a") as f:
        f.write('{"type": "finding", "kind"')  # a kill mid-line
    report = read_report(path)
    assert len(report.starts) == 2 and report.checked
    assert report.counters.steps == 4 and report.counters.foreign == 8
    assert [f["request"] for f in report.findings] == ["b0", "b1"]
    assert all(json.loads(line)["type"] for line in path.read_text().splitlines()[:-1])


def test_a_run_reads_from_where_it_began(tmp_path):
    path = tmp_path / "s.jsonl"
    log = SentinelLog(path, {"engine": "test", "block_size": BS}, every=0)
    led = Ledger(BS, log.finding)
    led.step([Scheduled("a", [1], 0, 4, [1, 2, 3, 4])])
    led.step([Scheduled("b", [1, 2], 4, 1, [5, 5, 5, 5, 5])])
    log.counters(led.counters)
    since = path.stat().st_size
    led.step([Scheduled("c", [3], 0, 4, [1, 2, 3, 4])])
    log.counters(led.counters)
    report = read_report(path, since)
    assert report.findings == [] and report.counters.steps == 1 and report.counters.reads == 4
    assert report.counters.foreign == 0 and read_report(path).counters.foreign == 4
